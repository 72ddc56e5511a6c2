"""SwiGLU-quant / dequant ops (torch_npu/op_plugin/quant/swiglu_quant.py).

References are written here from the op-plugin goldens / CANN kernel formulas in float64 with
explicit per-row / per-group loops on CPU tensors; the emulation computes in float32, so int8
results may land on the other side of a rounding boundary (at most 1 apart, nearly all equal).
"""
import math

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode

from _op_helpers import DEVICES, assert_int8_close_97 as _assert_int8_close

FLOATS = [torch.float32, torch.float16, torch.bfloat16]


def _silu(v):
    return v / (1.0 + math.exp(-v))


def _dynamic_row(values):
    """float64 int8 row quantisation: factor 127/max, round half to even, saturate."""
    peak = max(abs(v) for v in values)
    if peak == 0:
        return [0.0] * len(values), peak
    q = [min(127.0, max(-128.0, float(round(v * 127.0 / peak)))) for v in values]
    return q, peak


# ------------------------------------------------------------------ npu_swiglu_quant


def _swiglu_quant_ref(x, smooth, group_index, group_list_type, activate_left):
    """The op-plugin golden's dynamic path, as float64 loops over rows."""
    rows = x.double().reshape(-1, x.shape[-1]).tolist()
    n = x.shape[-1] // 2
    ends = None
    if group_index is not None:
        gi = [int(v) for v in group_index.tolist()]
        ends = gi if group_list_type == 0 else [sum(gi[:k + 1]) for k in range(len(gi))]
    ys, scales = [], []
    for r, row in enumerate(rows):
        a, b = row[:n], row[n:]
        s = [_silu(a[j]) * b[j] if activate_left else a[j] * _silu(b[j]) for j in range(n)]
        if smooth is not None:
            g = 0 if ends is None else sum(1 for e in ends if e <= r)
            if g < smooth.shape[0]:   # rows past the last group keep factor 1 (the golden)
                f = smooth.double()[g].reshape(-1).tolist()
                s = [s[j] * (f[j] if len(f) > 1 else f[0]) for j in range(n)]
        q, peak = _dynamic_row(s)
        ys.append(q)
        scales.append(127.0 / peak if peak else math.inf)
    lead = list(x.shape[:-1])
    ys = torch.tensor(ys, dtype=torch.float64).reshape(lead + [n])
    return ys, torch.tensor(scales, dtype=torch.float64).reshape(lead)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("activate_left", [False, True])
def test_swiglu_quant_dynamic_no_groups(device, dtype, activate_left):
    torch.manual_seed(0)
    x = torch.randn(2, 5, 32).to(dtype)
    smooth = torch.rand(1, 16) + 0.5
    y, scale = torch.ops.npu.npu_swiglu_quant(x.to(device), smooth_scales=smooth.to(device),
                                              activate_left=activate_left, quant_mode=1)
    ref_y, ref_scale = _swiglu_quant_ref(x, smooth, None, 0, activate_left)
    assert y.device.type == device and y.shape == (2, 5, 16) and scale.shape == (2, 5)
    assert scale.dtype == torch.float32
    _assert_int8_close(y, ref_y)
    torch.testing.assert_close(scale.cpu().double(), ref_scale, rtol=1e-5, atol=0)
    # no smooth_scales: plain SwiGLU; per-tensor smooth [1]
    y2, s2 = torch.ops.npu.npu_swiglu_quant(x.to(device), quant_mode=1, activate_left=activate_left)
    r2, rs2 = _swiglu_quant_ref(x, None, None, 0, activate_left)
    _assert_int8_close(y2, r2)
    torch.testing.assert_close(s2.cpu().double(), rs2, rtol=1e-5, atol=0)
    y3, _ = torch.ops.npu.npu_swiglu_quant(x.to(device), smooth_scales=torch.tensor([2.0], device=device),
                                           quant_mode=1, activate_left=activate_left)
    _assert_int8_close(y3, r2)   # a uniform factor does not change the quantised values


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("group_list_type", [0, 1])
def test_swiglu_quant_groups(device, group_list_type):
    torch.manual_seed(1)
    x = torch.randn(9, 16)
    smooth = torch.randn(3, 8)
    counts = [2, 4, 1]          # rows 7 and 8 lie past the last group
    gi = torch.tensor(counts if group_list_type == 1 else [2, 6, 7], dtype=torch.int32)
    offsets = torch.randn(3, 8)   # no effect in the dynamic mode
    y, scale = torch.ops.npu.npu_swiglu_quant(x.to(device), smooth_scales=smooth.to(device), offsets=offsets.to(device),
                                              group_index=gi.to(device), quant_mode=1,
                                              group_list_type=group_list_type, dst_type=torch.int8)
    ref_y, ref_scale = _swiglu_quant_ref(x, smooth, gi, group_list_type, False)
    _assert_int8_close(y, ref_y)
    torch.testing.assert_close(scale.cpu().double(), ref_scale, rtol=1e-5, atol=0)
    # per-tensor smooth factors [G]
    smooth_t = torch.tensor([0.5, 3.0, -1.0])
    y, scale = torch.ops.npu.npu_swiglu_quant(x.to(device), smooth_scales=smooth_t.to(device),
                                              group_index=gi.to(device), quant_mode=1,
                                              group_list_type=group_list_type)
    ref_y, ref_scale = _swiglu_quant_ref(x, smooth_t, gi, group_list_type, False)
    _assert_int8_close(y, ref_y)
    torch.testing.assert_close(scale.cpu().double(), ref_scale, rtol=1e-5, atol=0)


def test_swiglu_quant_zero_row_and_errors():
    x = torch.zeros(2, 8)
    x[1] = torch.arange(8.0)
    y, scale = torch.ops.npu.npu_swiglu_quant(x, quant_mode=1)
    assert y[0].eq(0).all() and math.isinf(float(scale[0]))
    with pytest.raises(NotImplementedError, match="quant_mode=0"):
        torch.ops.npu.npu_swiglu_quant(x)
    with pytest.raises(NotImplementedError, match="quint4x2"):
        torch.ops.npu.npu_swiglu_quant(x, quant_mode=1, dst_type=torch.quint4x2)
    with pytest.raises(RuntimeError, match="dtype must be torch.int8"):
        torch.ops.npu.npu_swiglu_quant(x, quant_mode=1, dst_type=torch.float16)
    with pytest.raises(RuntimeError, match="quant_mode only support"):
        torch.ops.npu.npu_swiglu_quant(x, quant_mode=2)
    with pytest.raises(RuntimeError, match="even"):
        torch.ops.npu.npu_swiglu_quant(torch.zeros(2, 7), quant_mode=1)
    with pytest.raises(RuntimeError, match="one group"):
        torch.ops.npu.npu_swiglu_quant(x, quant_mode=1, smooth_scales=torch.ones(2, 4))
    with pytest.raises(RuntimeError, match="group_index must be 1-D of length 2"):
        torch.ops.npu.npu_swiglu_quant(x, quant_mode=1, smooth_scales=torch.ones(2, 4),
                                       group_index=torch.tensor([2], dtype=torch.int32))


# ------------------------------------------------------------------ npu_dequant_swiglu_quant


def _dequant_swiglu_ref(x, ws, act, qs, activate_left):
    """The op-plugin golden (dynamic), float64 loops."""
    two_h = x.shape[-1]
    h = two_h // 2
    xs = x.reshape(-1, two_h).tolist()
    w = ws.double().reshape(-1).tolist()
    a = act.double().reshape(-1).tolist()
    q = qs.double().reshape(-1).tolist()
    ys, scales = [], []
    for r, row in enumerate(xs):
        d = [row[j] * w[j] * a[r] for j in range(two_h)]
        first, second = d[:h], d[h:]
        s = [(_silu(first[j]) * second[j] if activate_left else _silu(second[j]) * first[j]) * q[j] for j in range(h)]
        yq, peak = _dynamic_row(s)
        ys.append(yq)
        scales.append(peak / 127.0)
    lead = list(x.shape[:-1])
    ys = torch.tensor(ys, dtype=torch.float64).reshape(lead + [h])
    return ys, torch.tensor(scales, dtype=torch.float64).reshape(lead)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("activate_left", [False, True])
def test_dequant_swiglu_quant_golden_path(device, activate_left):
    torch.manual_seed(2)
    x = torch.randint(-10, 10, (6, 32), dtype=torch.int32)
    ws = torch.randn(32) * 0.1
    act = torch.randn(6, 1) * 0.5
    qs = torch.randn(1, 16)
    y, scale = torch.ops.npu.npu_dequant_swiglu_quant(x.to(device), weight_scale=ws.to(device),
                                                      activation_scale=act.to(device), quant_scale=qs.to(device),
                                                      activate_left=activate_left, quant_mode=1)
    ref_y, ref_scale = _dequant_swiglu_ref(x, ws, act, qs, activate_left)
    assert y.device.type == device and y.shape == (6, 16) and scale.dtype == torch.float32
    _assert_int8_close(y, ref_y)
    torch.testing.assert_close(scale.cpu().double(), ref_scale, rtol=1e-5, atol=1e-12)
    # 3-D x, [2H]-shaped quant scale given as [1, 2H] weight scale, [tokens] activation scale
    x3 = x.reshape(2, 3, 32)
    y3, s3 = torch.ops.npu.npu_dequant_swiglu_quant(x3.to(device), weight_scale=ws.reshape(1, 32).to(device),
                                                    activation_scale=act.reshape(6).to(device),
                                                    quant_scale=qs.reshape(16).to(device),
                                                    activate_left=activate_left, quant_mode=1, activate_dim=-1)
    assert y3.shape == (2, 3, 16) and s3.shape == (2, 3)
    _assert_int8_close(y3, ref_y.reshape(2, 3, 16))


def test_dequant_swiglu_quant_not_emulated_modes():
    x = torch.randint(-5, 5, (4, 8), dtype=torch.int32)
    kw = dict(weight_scale=torch.ones(8), activation_scale=torch.ones(4, 1), quant_mode=1)
    op = torch.ops.npu.npu_dequant_swiglu_quant
    with pytest.raises(NotImplementedError, match="quant_mode=0"):
        op(x, weight_scale=torch.ones(8), activation_scale=torch.ones(4, 1))
    for extra, word in [(dict(bias=torch.ones(8)), "bias"), (dict(quant_offset=torch.ones(4)), "quant_offset"),
                        (dict(group_index=torch.tensor([4])), "group_index"), (dict(swiglu_mode=1), "swiglu_mode"),
                        (dict(dst_type=296), "dst_type"), (dict(round_mode=4), "round_mode"),
                        (dict(activate_dim=0), "activate_dim")]:
        with pytest.raises(NotImplementedError, match=word):
            op(x, **kw, **extra)
    with pytest.raises(NotImplementedError, match="float16"):
        op(x.half(), **kw)
    with pytest.raises(RuntimeError, match="weight_scale must be"):
        op(x, weight_scale=torch.ones(4), activation_scale=torch.ones(4, 1), quant_mode=1)


# ------------------------------------------------------------------ npu_dequant_bias


def _dequant_bias_ref(x, ws, act, bias, out_dtype):
    """CANN DequantBias: int32 bias added before scaling, float bias after; float64 loops."""
    m, n = x.shape
    out = torch.empty(m, n, dtype=torch.float64)
    for i in range(m):
        for j in range(n):
            v = int(x[i, j])
            if bias is not None and bias.dtype == torch.int32:
                v += int(bias[j])
            v = float(v) * float(ws[j].double())
            if act is not None:
                v *= float(act[i])
            if bias is not None and bias.dtype != torch.int32:
                v += float(bias[j].double())
            out[i, j] = v
    return out.to(out_dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("out_dtype", [None, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("bias_dtype", [None, torch.int32, torch.float32, torch.float16, torch.bfloat16])
def test_dequant_bias(device, out_dtype, bias_dtype):
    torch.manual_seed(3)
    x = torch.randint(-300, 300, (5, 7), dtype=torch.int32)
    ws = torch.rand(7) * 0.1
    act = torch.rand(5) + 0.5
    bias = None
    if bias_dtype is torch.int32:
        bias = torch.randint(-50, 50, (7,), dtype=torch.int32)
    elif bias_dtype is not None:
        bias = torch.randn(7).to(bias_dtype)
    got = torch.ops.npu.npu_dequant_bias(x.to(device), ws.to(device), act.to(device),
                                         None if bias is None else bias.to(device), output_dtype=out_dtype)
    dt = torch.float16 if out_dtype is None else out_dtype
    ref = _dequant_bias_ref(x, ws, act, bias, dt)
    assert got.device.type == device and got.dtype == dt and got.shape == (5, 7)
    # float32 arithmetic then one rounding vs float64 then one rounding: at most one ulp apart
    tol = 1e-3 if dt == torch.float16 else 8e-3
    torch.testing.assert_close(got.cpu().double(), ref.double(), rtol=tol, atol=1e-3)


@pytest.mark.parametrize("device", DEVICES)
def test_dequant_bias_golden_no_optionals_and_bf16_scale(device):
    x = torch.randint(0, 255, (4, 5), dtype=torch.int32)
    ws = torch.rand(5)
    got = torch.ops.npu.npu_dequant_bias(x.to(device), ws.to(device), None, None, output_dtype=torch.float16)
    torch.testing.assert_close(got.cpu(), (x.double() * ws.double()).half(), rtol=1e-3, atol=0)
    ws_bf = ws.bfloat16()
    got = torch.ops.npu.npu_dequant_bias(x.to(device), ws_bf.to(device), None, None, output_dtype=torch.bfloat16)
    torch.testing.assert_close(got.cpu(), (x.double() * ws_bf.double()).bfloat16(), rtol=8e-3, atol=0)
    # int32 bias really goes in before the scaling: (x + b) * s differs from x * s + b
    b = torch.full((5,), 10, dtype=torch.int32)
    got = torch.ops.npu.npu_dequant_bias(x.to(device), ws.to(device), None, b.to(device), output_dtype=torch.float16)
    torch.testing.assert_close(got.cpu(), ((x + 10).double() * ws.double()).half(), rtol=1e-3, atol=0)


def test_dequant_bias_errors():
    x = torch.zeros(3, 4, dtype=torch.int32)
    op = torch.ops.npu.npu_dequant_bias
    with pytest.raises(RuntimeError, match="half or bfloat16"):
        op(x, torch.ones(4), None, None, output_dtype=torch.float32)
    with pytest.raises(RuntimeError, match="weight_scale must be \\[4\\]"):
        op(x, torch.ones(3), None, None)
    with pytest.raises(RuntimeError, match="activation_scale must be \\[3\\]"):
        op(x, torch.ones(4), torch.ones(4), None)
    with pytest.raises(RuntimeError, match="x must be int32"):
        op(x.float(), torch.ones(4), None, None)
    with pytest.raises(RuntimeError, match="bias must be int32"):
        op(x, torch.ones(4), None, torch.ones(4, dtype=torch.int64))


# ------------------------------------------------------------------ FakeTensor / compile


def test_fake_tensor_shapes():
    with FakeTensorMode():
        y, s = torch.ops.npu.npu_swiglu_quant(torch.empty(3, 5, 16), quant_mode=1,
                                              smooth_scales=torch.empty(2, 8),
                                              group_index=torch.empty(2, dtype=torch.int32))
        assert (tuple(y.shape), y.dtype, tuple(s.shape), s.dtype) == ((3, 5, 8), torch.int8, (3, 5), torch.float32)
        y, s = torch.ops.npu.npu_dequant_swiglu_quant(torch.empty(4, 10, 32, dtype=torch.int32),
                                                      weight_scale=torch.empty(32), activation_scale=torch.empty(40),
                                                      quant_mode=1)
        assert (tuple(y.shape), y.dtype, tuple(s.shape)) == ((4, 10, 16), torch.int8, (4, 10))
        out = torch.ops.npu.npu_dequant_bias(torch.empty(4, 8, dtype=torch.int32), torch.empty(8), None, None,
                                             output_dtype=torch.bfloat16)
        assert (tuple(out.shape), out.dtype) == ((4, 8), torch.bfloat16)
    with FakeTensorMode():
        with pytest.raises(RuntimeError, match="dtype must be torch.int8"):
            torch.ops.npu.npu_swiglu_quant(torch.empty(4, 64), dst_type=torch.float16)


# ------------------------------------------------------------------ npu_rms_norm_quant_v2


# ------------------------------------------------------------------ npu_quant_matmul_dequant


def _quant_matmul_dequant_ref(x, w_nk, ws, mode, x_scale=None, smooth=None):
    """The op-plugin golden (per-token dynamic / per-tensor static), float64 loops."""
    m, k = x.shape
    n = w_nk.shape[0]
    xs = x.double().tolist()
    w = w_nk.tolist()
    out = torch.empty(m, n, dtype=torch.float64)
    for i in range(m):
        row = xs[i] if smooth is None else [xs[i][c] * float(smooth[c]) for c in range(k)]
        t = max(abs(v) for v in row) / 127.0 if mode == 'pertoken' else float(x_scale)
        q = [min(127.0, max(-128.0, float(round(v / t)))) if t else 0.0 for v in row]
        for j in range(n):
            out[i, j] = sum(q[c] * w[j][c] for c in range(k)) * float(ws[j]) * t
    return out


@pytest.mark.parametrize("device", DEVICES)
def test_quant_matmul_dequant(device):
    torch.manual_seed(5)
    m, k, n = 5, 24, 7
    x = torch.randn(m, k).half()
    x[2] = 0                                    # a zero row: zero result
    w = torch.randint(-128, 128, (n, k), dtype=torch.int8)
    ws = torch.rand(n) * 0.01
    got = torch.ops.npu.npu_quant_matmul_dequant(x.to(device), w.to(device), ws.to(device), quant_mode='pertoken')
    ref = _quant_matmul_dequant_ref(x, w, ws, 'pertoken')
    assert got.dtype == torch.float16 and got.shape == (m, n) and got.device.type == device
    # an int8 rounding flip changes one product by |w| * ws * t at most
    bound = float(128 * ws.max() * (x.float().abs().amax(1).max() / 127)) + 1e-3
    diff = (got.cpu().double() - ref).abs()
    assert float(diff.max()) <= bound
    assert float((diff <= 2e-3 * ref.abs() + 1e-3).double().mean()) >= 0.9
    assert got[2].eq(0).all()
    x_scale = torch.tensor([0.02])
    smooth = (torch.rand(k) + 0.5).half()
    got = torch.ops.npu.npu_quant_matmul_dequant(x.to(device), w.to(device), ws.to(device), x_scale=x_scale.to(device),
                                                 smooth_scale=smooth.to(device), quant_mode='pertensor')
    ref = _quant_matmul_dequant_ref(x, w, ws, 'pertensor', x_scale=0.02, smooth=smooth.double())
    diff = (got.cpu().double() - ref).abs()
    assert float(diff.max()) <= float(128 * ws.max() * 0.02) + 1e-3
    assert float((diff <= 2e-3 * ref.abs() + 1e-3).double().mean()) >= 0.9


def test_quant_matmul_dequant_errors():
    x, w, ws = torch.randn(2, 8).half(), torch.zeros(3, 8, dtype=torch.int8), torch.ones(3)
    op = torch.ops.npu.npu_quant_matmul_dequant
    with pytest.raises(NotImplementedError, match="bias"):
        op(x, w, ws, bias=torch.ones(3))
    with pytest.raises(NotImplementedError, match="x_offset"):
        op(x, w, ws, x_offset=torch.ones(1))
    with pytest.raises(NotImplementedError, match="quant_mode='perchannel'"):
        op(x, w, ws, quant_mode='perchannel')
    with pytest.raises(RuntimeError, match="x_scale is required"):
        op(x, w, ws, quant_mode='pertensor')
    with pytest.raises(RuntimeError, match="x dtype support only float16"):
        op(x.float(), w, ws)
    with pytest.raises(RuntimeError, match="not equal to quantized_weight"):
        op(x, torch.zeros(3, 4, dtype=torch.int8), ws)


def test_fake_tensor_shapes_norm_and_matmul():
    with FakeTensorMode():
        y, r = torch.ops.npu.npu_rms_norm_quant_v2(torch.empty(2, 5, 16, requires_grad=True), torch.empty(16),
                                                   torch.empty(16))
        assert (tuple(y.shape), y.dtype, tuple(r.shape), r.dtype) == ((2, 5, 16), torch.int8, (2, 5, 1), torch.float32)
        out = torch.ops.npu.npu_quant_matmul_dequant(torch.empty(4, 8, dtype=torch.float16),
                                                     torch.empty(6, 8, dtype=torch.int8), torch.empty(6))
        assert (tuple(out.shape), out.dtype) == ((4, 6), torch.float16)


# ------------------------------------------------------------------ npu_quant_grouped_matmul_dequant


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode", ["pertoken", "pertensor"])
def test_quant_grouped_matmul_dequant(device, mode):
    torch.manual_seed(6)
    m, k, n, g = 9, 16, 5, 3
    x = torch.randn(m, k).half()
    w = torch.randint(-128, 128, (g, n, k), dtype=torch.int8)
    ws = torch.rand(g, n) * 0.01
    ends = torch.tensor([2, 2, 7])             # an empty group; rows 7, 8 past the last end
    kw = {}
    smooth = None
    if mode == "pertensor":
        smooth = (torch.rand(k) + 0.5).half()
        kw = dict(x_scale=torch.tensor([0.03]).to(device), smooth_scale=smooth.to(device))
    got = torch.ops.npu.npu_quant_grouped_matmul_dequant(x.to(device), w.to(device), ws.to(device), ends.to(device),
                                                         quant_mode=mode, **kw)
    assert got.dtype == torch.float16 and got.shape == (m, n) and got.device.type == device
    ref = torch.zeros(m, n, dtype=torch.float64)
    start = 0
    for grp, end in enumerate(ends.tolist()):   # the golden's per-group loop
        if end > start:
            ref[start:end] = _quant_matmul_dequant_ref(x[start:end], w[grp], ws[grp], mode, x_scale=0.03,
                                                       smooth=None if smooth is None else smooth.double())
        start = end
    t_max = float(x.float().abs().amax(1).max() / 127) if mode == "pertoken" else 0.03
    diff = (got.cpu().double() - ref).abs()
    assert float(diff.max()) <= float(128 * ws.max() * t_max) + 1e-3
    assert float((diff <= 2e-3 * ref.abs() + 1e-3).double().mean()) >= 0.9
    assert got[7:].eq(0).all()


def test_quant_grouped_matmul_dequant_errors():
    x, w, ws = torch.randn(4, 8).half(), torch.zeros(2, 3, 8, dtype=torch.int8), torch.ones(2, 3)
    op = torch.ops.npu.npu_quant_grouped_matmul_dequant
    with pytest.raises(RuntimeError, match="group_list must be 1-D of length 2"):
        op(x, w, ws, torch.tensor([4]))
    with pytest.raises(RuntimeError, match="weight_scale shape must equal"):
        op(x, w, torch.ones(2, 4), torch.tensor([2, 4]))
    with pytest.raises(NotImplementedError, match="bias"):
        op(x, w, ws, torch.tensor([2, 4]), bias=torch.ones(3))


# ------------------------------------------------------------------ _npu_rms_norm_backward_quant


def test_fake_tensor_shapes_grouped_and_backward_quant():
    with FakeTensorMode():
        out = torch.ops.npu.npu_quant_grouped_matmul_dequant(torch.empty(4, 8, dtype=torch.float16),
                                                             torch.empty(2, 6, 8, dtype=torch.int8),
                                                             torch.empty(2, 6), torch.empty(2, dtype=torch.int64))
        assert (tuple(out.shape), out.dtype) == ((4, 6), torch.float16)
        dq, dg = torch.ops.npu._npu_rms_norm_backward_quant(torch.empty(3, 8), torch.empty(3, 8), torch.empty(3, 1),
                                                            torch.empty(8, dtype=torch.float16), torch.empty(1))
        assert (tuple(dq.shape), dq.dtype, tuple(dg.shape), dg.dtype) == ((3, 8), torch.int8, (8,), torch.float32)


# ------------------------------------------------------------------ npu_swiglu_group_quant_backward


def _swiglu_group_backward_ref(grad_y, x, weight, y_origin, rows_kept, clamp):
    """The op-plugin golden, float64 loops per element."""
    rows, two_h = x.reshape(-1, x.shape[-1]).shape
    h = two_h // 2
    gy = grad_y.double().reshape(rows, h).tolist()
    xs = x.double().reshape(rows, two_h).tolist()
    w = None if weight is None else weight.double().reshape(-1).tolist()
    yo = None if y_origin is None else y_origin.double().reshape(rows, h).tolist()
    gx = torch.zeros(rows, two_h, dtype=torch.float64)
    gw = torch.zeros(rows, dtype=torch.float64)
    for r in range(min(rows, rows_kept)):
        if w is not None:
            gw[r] = sum(gy[r][j] * yo[r][j] for j in range(h))
        for j in range(h):
            g = gy[r][j] * (w[r] if w is not None else 1.0)
            a0, b0 = xs[r][j], xs[r][h + j]
            a, b = (min(a0, clamp), min(max(b0, -clamp), clamp)) if clamp else (a0, b0)
            sig = 1.0 / (1.0 + math.exp(-a))
            ga = g * b * sig * (1 + a * (1 - sig))
            gb = g * a * sig
            if clamp:
                ga = ga if a0 < clamp else 0.0
                gb = gb if -clamp < b0 < clamp else 0.0
            gx[r, j], gx[r, h + j] = ga, gb
    return gx.reshape(x.shape), gw


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("clamp", [0.0, 1.5])
def test_swiglu_group_quant_backward(device, dtype, clamp):
    torch.manual_seed(8)
    x = (torch.randn(6, 16) * 2).to(dtype)
    grad_y = torch.randn(6, 8)
    weight = torch.randn(6, 1)
    y_origin = torch.randn(6, 8)
    gx, gw = torch.ops.npu.npu_swiglu_group_quant_backward(grad_y.to(device), x.to(device), weight=weight.to(device),
                                                          y_origin=y_origin.to(device), clamp_limit=clamp)
    ref_gx, ref_gw = _swiglu_group_backward_ref(grad_y, x, weight, y_origin, 6, clamp)
    assert gx.dtype == dtype and gx.shape == x.shape and gw.shape == (6, 1) and gw.dtype == torch.float32
    tol = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}[dtype]
    torch.testing.assert_close(gx.cpu().double(), ref_gx, rtol=tol, atol=tol)
    torch.testing.assert_close(gw.cpu().double().reshape(-1), ref_gw, rtol=1e-5, atol=1e-5)
    # group_index (count): rows past sum(group_index) = 4 get zero gradients; no weight: empty grad_weight
    gx, gw = torch.ops.npu.npu_swiglu_group_quant_backward(grad_y.to(device), x.to(device),
                                                          group_index=torch.tensor([1, 3]).to(device),
                                                          clamp_limit=clamp)
    ref_gx, _ = _swiglu_group_backward_ref(grad_y, x, None, None, 4, clamp)
    torch.testing.assert_close(gx.cpu().double(), ref_gx, rtol=tol, atol=tol)
    assert gw.shape == (0,) and gw.dtype == torch.float32


def test_swiglu_group_quant_backward_is_the_swiglu_gradient():
    """Without clamping, grad_x is autograd's gradient of weight * silu(A) * B (float64)."""
    torch.manual_seed(9)
    x = torch.randn(5, 12, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(5, 1, dtype=torch.float64)
    grad_y = torch.randn(5, 6, dtype=torch.float64)
    a, b = x.chunk(2, dim=-1)
    (weight * F.silu(a) * b).backward(grad_y)
    gx, _ = torch.ops.npu.npu_swiglu_group_quant_backward(grad_y.float(), x.detach().float(), weight=weight.float(),
                                                         y_origin=torch.zeros(5, 6))
    torch.testing.assert_close(gx.double(), x.grad, rtol=1e-5, atol=1e-5)


def test_swiglu_group_quant_backward_errors_and_fake():
    op = torch.ops.npu.npu_swiglu_group_quant_backward
    with pytest.raises(RuntimeError, match="even"):
        op(torch.randn(2, 3), torch.randn(2, 7))
    with pytest.raises(RuntimeError, match="y_origin is required"):
        op(torch.randn(2, 4), torch.randn(2, 8), weight=torch.ones(2))
    with pytest.raises(RuntimeError, match="grad_y must have"):
        op(torch.randn(2, 3), torch.randn(2, 8))
    with FakeTensorMode():
        gx, gw = op(torch.empty(6, 16, dtype=torch.float16), torch.empty(6, 32, dtype=torch.float16),
                    weight=torch.empty(6), y_origin=torch.empty(6, 16))
        assert (tuple(gx.shape), gx.dtype, tuple(gw.shape), gw.dtype) == ((6, 32), torch.float16, (6,), torch.float32)


# ------------------------------------------------------------------ npu_qkv_rms_norm_rope_cache
