"""MX quantisation ops (torch_npu/op_plugin/quant/mx_quant.py).

The reference below is written from the CANN ops-nn docs / op-plugin goldens, in plain
Python floats (float64), one block at a time: shared exponent per block, element =
round-half-to-even onto the float8 grid (subnormals included), clipped to the largest
finite value. Results are compared bit for bit.
"""
import math

import re

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import torch_npu

from _op_helpers import DEVICES


# dst -> (mantissa bits, smallest private exponent, emax, largest finite), from the docs' tables
FP8 = {torch.float8_e4m3fn: (3, -6, 8, 448.0), torch.float8_e5m2: (2, -14, 15, 57344.0)}
FP4 = {296: (1, 0, 2, 6.0), 297: (2, 0, 0, 1.75)}
FORMATS = {**FP8, **FP4}
# float4 magnitudes in code order (OCP e2m1: bias 1; e1m2: value = code / 4)
FP4_VALUES = {296: [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], 297: [c / 4 for c in range(8)]}


def _rand(*shape, seed=0, dtype=torch.bfloat16, spread=True):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g, dtype=torch.float64)
    if spread:   # blocks of very different magnitudes
        x = x * torch.exp2(torch.randint(-20, 20, shape, generator=g).double())
    return x.to(dtype)


def _ref_scale_exp(amax, dst, scale_alg):
    """Unbiased shared exponent of one block (None for a non-finite block), clamped at -127."""
    _, _, emax, dmax = FORMATS[dst]
    if not math.isfinite(amax):
        return None
    if amax == 0:
        return -127
    if scale_alg == 0:
        e = math.floor(math.log2(amax)) - emax
    else:
        s = torch.tensor(amax, dtype=torch.float32) / dmax          # fp32 division, as documented
        bits = int(s.view(torch.int32))
        biased, mant = (bits >> 23) & 0xFF, bits & 0x7FFFFF
        if (0 < biased < 254 and mant > 0) or (biased == 0 and mant > (1 << 22)):
            biased += 1
        e = biased - 127
    return max(e, -127)


def _ref_round(q, mode):
    if mode == "rint":
        r = float(round(q))                      # Python round is half-to-even
    elif mode == "floor":
        r = float(math.floor(q))
    else:                                        # 'round': half away from zero
        r = float(math.floor(abs(q) + 0.5))
    return math.copysign(r, q)                   # keep -0, as numpy's rint/floor do


def _ref_element(v, dst, mode="rint"):
    """v rounded at its own exponent (>= the format's smallest) to the format's mantissa bits,
    clipped to +-max (op-plugin's golden)."""
    mbits, min_exp, _, dmax = FORMATS[dst]
    if v == 0:
        return v
    p = max(math.floor(math.log2(abs(v))), min_exp)
    r = _ref_round(v / 2.0 ** p * 2 ** mbits, mode)
    return max(-dmax, min(dmax, r / 2 ** mbits * 2.0 ** p))


def _ref_mx_1d(values, dst, scale_alg, block=32, mode="rint"):
    """(elements, scale bytes) of one line of values along the quantised axis."""
    out, scales = [], []
    for start in range(0, len(values), block):
        chunk = values[start:start + block]
        amax = max(abs(v) for v in chunk) if all(math.isfinite(v) for v in chunk) else float("inf")
        e = _ref_scale_exp(amax, dst, scale_alg)
        if e is None:
            scales.append(255)
            out += [0.0] * len(chunk)
        elif e == -127:
            scales.append(0)
            out += [math.copysign(0.0, v) for v in chunk]
        else:
            scales.append(e + 127)
            out += [_ref_element(v / 2.0 ** e, dst, mode) for v in chunk]
    if len(scales) % 2:
        scales.append(0)
    return out, scales


def _fp4_pack_ref(values, dst):
    """float4 codes (sign bit 3, magnitude = index in the value table), two per byte along the
    last dim: even element in the low nibble (op-plugin's golden)."""
    table = FP4_VALUES[dst]
    codes = [[(8 if math.copysign(1.0, v) < 0 else 0) + table.index(abs(v)) for v in row] for row in values]
    return [[row[i] | (row[i + 1] << 4) for i in range(0, len(row), 2)] for row in codes]


def _ref_mx(x, axis, dst, scale_alg, block=32, mode="rint"):
    """Reference ``(y bits uint8, scale uint8)`` of x quantised along ``axis``."""
    xd = x.double().movedim(axis, -1)
    lead = xd.shape[:-1]
    rows = xd.reshape(-1, xd.shape[-1]).tolist()
    ys, ss = [], []
    for row in rows:
        y, s = _ref_mx_1d(row, dst, scale_alg, block, mode)
        ys.append(y)
        ss.append(s)
    y = torch.tensor(ys, dtype=torch.float64).reshape(*lead, -1).movedim(-1, axis)
    s = torch.tensor(ss, dtype=torch.uint8).reshape(*lead, -1, 2).movedim(-2, axis % x.dim())
    if dst in FP4:
        flat = y.reshape(-1, y.shape[-1]).tolist()
        return torch.tensor(_fp4_pack_ref(flat, dst), dtype=torch.uint8).reshape(*y.shape[:-1], -1), s
    # every reference value is exactly representable: the cast only encodes it
    return y.to(dst).view(torch.uint8), s


def _bits(t):
    return t.cpu().view(torch.uint8)


# ------------------------------------------------------------------ npu_dynamic_mx_quant


def test_documented_example():
    """aclnnDynamicMxQuant's example: bf16 (0, 8, 64, 512) -> e4m3fn (0, 4, 32, 256), scale byte 128."""
    x = torch.tensor([[0.0, 8.0, 64.0, 512.0]], dtype=torch.bfloat16)
    y, s = torch_npu.npu_dynamic_mx_quant(x, dst_type=torch_npu.float8_e4m3fn)
    assert y.dtype == torch.float8_e4m3fn and s.dtype == torch.uint8
    assert _bits(y).tolist() == [[0, 72, 96, 120]]
    assert s.tolist() == [[[128, 0]]]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("xdtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("dst_code,dst", [(24, torch.float8_e4m3fn), (291, torch.float8_e5m2)])
@pytest.mark.parametrize("scale_alg", [0, 1])
def test_dynamic_mx_quant_last_axis(device, xdtype, dst_code, dst, scale_alg):
    x = _rand(3, 100, seed=1, dtype=xdtype)
    y, s = torch_npu.npu_dynamic_mx_quant(x.to(device), dst_type=dst_code, scale_alg=scale_alg)
    ry, rs = _ref_mx(x, -1, dst, scale_alg)
    assert y.device.type == device and y.dtype == dst
    assert s.shape == (3, 2, 2)
    assert torch.equal(s.cpu(), rs)
    assert torch.equal(_bits(y), ry)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("axis,block", [(0, 32), (1, 64), (-3, 96)])
def test_dynamic_mx_quant_other_axes_and_blocks(device, axis, block):
    x = _rand(70, 130, 3, seed=2, dtype=torch.float16)
    y, s = torch_npu.npu_dynamic_mx_quant(x.to(device), axis=axis, dst_type=torch.float8_e4m3fn, block_size=block)
    ry, rs = _ref_mx(x, axis, torch.float8_e4m3fn, 0, block)
    expect = list(x.shape) + [2]
    expect[axis % 3] = (-(-x.shape[axis] // block) + 1) // 2
    assert list(s.shape) == expect
    assert torch.equal(s.cpu(), rs)
    assert torch.equal(_bits(y), ry)


def test_saturation_zero_and_special_blocks():
    x = torch.zeros(2, 128, dtype=torch.bfloat16)
    x[0, :32] = torch.tensor([500.0] + [1.0] * 31)        # amax 500: scale 2**0 for e4m3fn, 500 -> 448
    x[0, 32] = -(2.0 ** -130)                                # tiny block: byte 0 -> signed zeros
    x[0, 64] = float("nan")                                  # NaN block: byte 255, +0 elements
    x[0, 65] = 3.0
    x[1, 96] = float("-inf")
    x[1, 97] = 2.0
    y, s = torch_npu.npu_dynamic_mx_quant(x, dst_type=torch.float8_e4m3fn)
    assert s[0].tolist() == [[127, 0], [255, 0]]
    assert s[1].tolist() == [[0, 0], [0, 255]]
    assert y[0, 0].float().item() == 448.0
    assert _bits(y)[0, 32].item() == 0x80                     # -0
    assert (_bits(y)[0, 64:96] == 0).all() and (_bits(y)[1, 96:] == 0).all()
    ry, rs = _ref_mx(x, -1, torch.float8_e4m3fn, 0)
    assert torch.equal(s, rs) and torch.equal(_bits(y), ry)
    # e5m2 saturates at 57344 instead of overflowing to inf
    big = torch.tensor([[65000.0] + [1.0] * 31], dtype=torch.float32)
    y5, s5 = torch_npu.npu_dynamic_mx_quant(big, dst_type=torch.float8_e5m2)
    assert y5[0, 0].float().item() == 57344.0 and s5[0, 0, 0].item() == 127


def test_max_low_bound_scale_alg_1():
    """op-plugin's golden: the cuBLAS-style scale uses max(amax, max_low_bound)."""
    x = _rand(2, 64, seed=3, dtype=torch.bfloat16, spread=False) * 1e-3
    y, s = torch_npu.npu_dynamic_mx_quant(x, dst_type=torch.float8_e4m3fn, scale_alg=1, max_low_bound=448.0)
    assert (s[..., :].flatten() == 127).all()                 # 448 / 448 = 1 -> 2**0
    expect = torch.tensor([_ref_element(v, torch.float8_e4m3fn) for v in x.double().flatten().tolist()],
                          dtype=torch.float64).reshape(2, 64).to(torch.float8_e4m3fn).view(torch.uint8)
    assert torch.equal(_bits(y), expect)


def test_dynamic_mx_quant_errors():
    x = torch.randn(4, 64, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="block_size must be divisible by 32"):
        torch_npu.npu_dynamic_mx_quant(x, block_size=48, dst_type=24)
    # the registry's range check of dimension arguments, before the kernel
    with pytest.raises(RuntimeError, match=re.escape("npu_dynamic_mx_quant: axis=2 is out of range for input of "
                                                     "rank 2 (expected in [-2, 1])")):
        torch_npu.npu_dynamic_mx_quant(x, axis=2, dst_type=24)
    with pytest.raises(RuntimeError, match="round_mode only supports 'rint'"):
        torch_npu.npu_dynamic_mx_quant(x, dst_type=24, round_mode="floor")
    with pytest.raises(RuntimeError, match="float32 x only supports block_size=32"):
        torch_npu.npu_dynamic_mx_quant(x.float(), dst_type=24, block_size=64)
    with pytest.raises(RuntimeError, match="x dtype must be"):
        torch_npu.npu_dynamic_mx_quant(x.double(), dst_type=24)
    with pytest.raises(NotImplementedError, match="dst_type=12345"):
        torch_npu.npu_dynamic_mx_quant(x, dst_type=12345)
    with pytest.raises(NotImplementedError, match="dst_type_max"):
        torch_npu.npu_dynamic_mx_quant(x, dst_type=24, dst_type_max=6.0)
    with pytest.raises(NotImplementedError, match="max_low_bound"):
        torch_npu.npu_dynamic_mx_quant(x, dst_type=24, max_low_bound=1.0)


# ------------------------------------------------------------------ npu_dynamic_mx_quant_with_dual_axis


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dst", [torch.float8_e4m3fn, torch.float8_e5m2])
@pytest.mark.parametrize("scale_alg", [0, 1])
def test_dual_axis(device, dst, scale_alg):
    x = _rand(2, 70, 40, seed=4, dtype=torch.float16)
    y1, s1, y2, s2 = torch_npu.npu_dynamic_mx_quant_with_dual_axis(x.to(device), dst_type=dst, scale_alg=scale_alg)
    r1, q1 = _ref_mx(x, -1, dst, scale_alg)
    r2, q2 = _ref_mx(x, -2, dst, scale_alg)
    assert s1.shape == (2, 70, 1, 2) and s2.shape == (2, 2, 40, 2)
    assert torch.equal(s1.cpu(), q1) and torch.equal(s2.cpu(), q2)
    assert torch.equal(_bits(y1), r1) and torch.equal(_bits(y2), r2)


def test_dual_axis_op_plugin_zero_case():
    """op-plugin's test: bf16 zeros [1, 2, 2] -> zero elements and zero scale bytes."""
    y1, s1, y2, s2 = torch_npu.npu_dynamic_mx_quant_with_dual_axis(torch.zeros(1, 2, 2, dtype=torch.bfloat16),
                                                                   dst_type=23)
    assert s1.shape == (1, 2, 1, 2) and s2.shape == (1, 1, 2, 2)
    for t in (y1, s1, y2, s2):
        assert (t.view(torch.uint8) == 0).all()


def test_dual_axis_errors():
    with pytest.raises(RuntimeError, match="at least 2-D"):
        torch_npu.npu_dynamic_mx_quant_with_dual_axis(torch.zeros(64, dtype=torch.float16), dst_type=24)
    with pytest.raises(RuntimeError, match="float16 or bfloat16"):
        torch_npu.npu_dynamic_mx_quant_with_dual_axis(torch.zeros(4, 64), dst_type=24)
    with pytest.raises(RuntimeError, match="scale_alg only supports 0 and 1 for float8"):
        torch_npu.npu_dynamic_mx_quant_with_dual_axis(torch.zeros(4, 64, dtype=torch.float16), dst_type=24,
                                                      scale_alg=2)
    with pytest.raises(NotImplementedError, match="scale_alg=2"):
        torch_npu.npu_dynamic_mx_quant_with_dual_axis(torch.zeros(4, 64, dtype=torch.float16), scale_alg=2)


# ------------------------------------------------------------------ FakeTensor shapes


E5M2_NPU = 291


def _sig(outs):
    return [(tuple(o.shape), o.dtype) for o in outs]


FAKE_CASES = [
    (lambda f: torch.ops.npu.npu_dynamic_mx_quant(f(8, 130), dst_type=23),
     [((8, 130), torch.float8_e5m2), ((8, 3, 2), torch.uint8)]),
    (lambda f: torch.ops.npu.npu_dynamic_mx_quant(f(128, 6), axis=0, dst_type=torch.float8_e4m3fn, block_size=64),
     [((128, 6), torch.float8_e4m3fn), ((1, 6, 2), torch.uint8)]),
    (lambda f: torch.ops.npu.npu_dynamic_mx_quant_with_dual_axis(f(96, 64), dst_type=E5M2_NPU),
     [((96, 64), torch.float8_e5m2), ((96, 1, 2), torch.uint8), ((96, 64), torch.float8_e5m2),
      ((2, 64, 2), torch.uint8)]),
]


@pytest.mark.parametrize("call,expected", FAKE_CASES)
def test_fake_shapes(call, expected):
    with FakeTensorMode():
        got = call(lambda *shape: torch.empty(*shape, dtype=torch.float16))
    assert _sig(got) == expected


def test_compile_matches_eager():
    x = _rand(4, 96, seed=5)
    fn = torch.compile(lambda t: torch.ops.npu.npu_dynamic_mx_quant(t, dst_type=24), backend="eager", fullgraph=True)
    y, s = fn(x)
    ey, es = torch_npu.npu_dynamic_mx_quant(x, dst_type=24)
    assert torch.equal(s, es) and torch.equal(_bits(y), _bits(ey))


# ------------------------------------------------------------------ RmsNorm + MX quantisation


def _ref_rms_norm_mx(x, gamma, beta, eps, dst, scale_alg):
    """ops-nn golden: norm in float (here float64), cast to x's dtype, then MX along the last dim."""
    xd = x.double()
    rstd = 1.0 / torch.sqrt((xd * xd).mean(-1, keepdim=True) + eps)
    normed = xd * rstd * gamma.double()
    if beta is not None:
        normed = normed + beta.double()
    y, s = _ref_mx(normed.to(x.dtype), -1, dst, scale_alg)
    return y, s, rstd


def _assert_mostly_equal_bits(actual, expected, frac=0.995):
    """The norm is float32 on the device and float64 here: a value whose rounding to x's dtype
    sits on a tie may land one ulp away, so allow a tiny fraction of 1-ulp differences."""
    a, e = actual.cpu().to(torch.int16), expected.to(torch.int16)
    assert (a - e).abs().max() <= 1
    assert (a == e).float().mean() >= frac


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("xdtype,gdtype", [(torch.bfloat16, torch.bfloat16), (torch.float16, torch.float32)])
@pytest.mark.parametrize("dst,scale_alg", [(torch.float8_e4m3fn, 0), (torch.float8_e5m2, 1)])
def test_rms_norm_dynamic_mx_quant(device, xdtype, gdtype, dst, scale_alg):
    x = _rand(3, 5, 96, seed=6, dtype=xdtype, spread=False)
    gamma = _rand(96, seed=7, dtype=gdtype, spread=False)
    beta = _rand(96, seed=8, dtype=gdtype, spread=False)
    y, s, rstd = torch_npu.npu_rms_norm_dynamic_mx_quant(x.to(device), gamma.to(device), beta=beta.to(device),
                                                         epsilon=1e-5, scale_alg=scale_alg, dst_type=dst)
    ry, rs, _ = _ref_rms_norm_mx(x, gamma, beta, 1e-5, dst, scale_alg)
    assert y.dtype == dst and s.shape == (3, 5, 2, 2) and rstd.shape == (0,)
    assert (s.cpu().int() - rs.int()).abs().max() <= 1 and (s.cpu() == rs).float().mean() >= 0.95
    _assert_mostly_equal_bits(_bits(y), ry)


@pytest.mark.parametrize("device", DEVICES)
def test_rms_norm_dynamic_mx_quant_rstd_when_requires_grad(device):
    x = _rand(4, 64, seed=9, dtype=torch.bfloat16, spread=False)
    gamma = _rand(64, seed=10, dtype=torch.bfloat16, spread=False)
    xr = x.to(device).requires_grad_(True)
    y, s, rstd = torch_npu.npu_rms_norm_dynamic_mx_quant(xr, gamma.to(device), dst_type=24)
    _, _, rref = _ref_rms_norm_mx(x, gamma, None, 1e-6, torch.float8_e4m3fn, 0)
    assert rstd.shape == (4, 1) and rstd.dtype == torch.float32
    torch.testing.assert_close(rstd.detach().cpu().double(), rref, rtol=1e-6, atol=0)


@pytest.mark.parametrize("device", DEVICES)
def test_add_rms_norm_dynamic_mx_quant(device):
    x1 = _rand(2, 3, 160, seed=11, dtype=torch.float16, spread=False)
    x2 = _rand(2, 3, 160, seed=12, dtype=torch.float16, spread=False)
    gamma = _rand(160, seed=13, dtype=torch.float16, spread=False)
    y, x, s, rstd = torch_npu.npu_add_rms_norm_dynamic_mx_quant(x1.to(device), x2.to(device), gamma.to(device),
                                                                 dst_type=torch_npu.float8_e5m2)
    xsum = x1.double() + x2.double()
    assert torch.equal(x.cpu(), xsum.to(torch.float16))                 # the float32 sum, cast once
    # the norm uses the unrounded sum: reference from the float64 sum
    rstd_ref = 1.0 / torch.sqrt((xsum * xsum).mean(-1, keepdim=True) + 1e-6)
    ry, rs = _ref_mx((xsum * rstd_ref * gamma.double()).to(torch.float16), -1, torch.float8_e5m2, 0)
    assert s.shape == (2, 3, 3, 2) and rstd.shape == (0,)
    assert (s.cpu().int() - rs.int()).abs().max() <= 1
    _assert_mostly_equal_bits(_bits(y), ry)
    # rstd when both inputs require grad
    outs = torch_npu.npu_add_rms_norm_dynamic_mx_quant(x1.to(device).requires_grad_(), x2.to(device).requires_grad_(),
                                                       gamma.to(device), dst_type=24)
    torch.testing.assert_close(outs[3].detach().cpu().double(), rstd_ref, rtol=1e-6, atol=0)


def test_rms_norm_mx_errors():
    x = torch.randn(4, 64, dtype=torch.bfloat16)
    g = torch.randn(64, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="gamma must be 1-D"):
        torch_npu.npu_rms_norm_dynamic_mx_quant(x, g[:32], dst_type=24)
    with pytest.raises(RuntimeError, match="beta must have gamma's shape"):
        torch_npu.npu_rms_norm_dynamic_mx_quant(x, g, beta=g.float(), dst_type=24)
    with pytest.raises(RuntimeError, match="x dtype must be float16 or bfloat16"):
        torch_npu.npu_rms_norm_dynamic_mx_quant(x.float(), g.float(), dst_type=24)
    with pytest.raises(RuntimeError, match="The shape of x1 and x2 must be the same"):
        torch_npu.npu_add_rms_norm_dynamic_mx_quant(x, x[:2], g, dst_type=24)
    with pytest.raises(RuntimeError, match="requires_grad of x1 and x2"):
        torch_npu.npu_add_rms_norm_dynamic_mx_quant(x.clone().requires_grad_(), x, g, dst_type=24)
    with pytest.raises(RuntimeError, match="round_mode only supports 'rint'"):
        torch_npu.npu_rms_norm_dynamic_mx_quant(x, g, dst_type=24, round_mode="round")


NORM_FAKE_CASES = [
    (lambda f: torch.ops.npu.npu_rms_norm_dynamic_mx_quant(f(2, 4, 96), f(96), dst_type=torch.float8_e4m3fn),
     [((2, 4, 96), torch.float8_e4m3fn), ((2, 4, 2, 2), torch.uint8), ((0,), torch.float32)]),
    (lambda f: torch.ops.npu.npu_add_rms_norm_dynamic_mx_quant(f(3, 256, grad=True), f(3, 256, grad=True), f(256),
                                                               dst_type=E5M2_NPU),
     [((3, 256), torch.float8_e5m2), ((3, 256), torch.float16), ((3, 4, 2), torch.uint8), ((3, 1), torch.float32)]),
]


@pytest.mark.parametrize("call,expected", NORM_FAKE_CASES)
def test_norm_fake_shapes(call, expected):
    def fake(*shape, grad=False):
        return torch.empty(*shape, dtype=torch.float16).requires_grad_(grad)
    with FakeTensorMode():
        got = call(fake)
    assert _sig(got) == expected


# ------------------------------------------------------------------ float4 destinations


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dst", [296, 297])
@pytest.mark.parametrize("mode", ["rint", "floor", "round"])
def test_dynamic_mx_quant_float4(device, dst, mode):
    x = _rand(3, 2, 100, seed=14, dtype=torch.bfloat16)
    y, s = torch_npu.npu_dynamic_mx_quant(x.to(device), dst_type=dst, round_mode=mode)
    ry, rs = _ref_mx(x, -1, dst, 0, mode=mode)
    assert y.dtype == torch.uint8 and y.shape == (3, 2, 50) and s.shape == (3, 2, 2, 2)
    assert torch.equal(s.cpu(), rs) and torch.equal(y.cpu(), ry)
    # along a non-last axis the packing stays along the last dim
    y0, s0 = torch_npu.npu_dynamic_mx_quant(x.to(device), axis=0, dst_type=dst, round_mode=mode)
    ry0, rs0 = _ref_mx(x, 0, dst, 0, mode=mode)
    assert torch.equal(s0.cpu(), rs0) and torch.equal(y0.cpu(), ry0)


def test_float4_hand_values():
    """amax 7 -> scale 2**0 for e2m1; 5 is a tie between 4 and 6 (rint -> 4, round -> 6);
    -7 clips to -6; the byte holds the first element in its low nibble."""
    x = torch.tensor([[0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, -7.0] + [0.0] * 24])
    y, s = torch_npu.npu_dynamic_mx_quant(x, dst_type=torch.float4_e2m1fn_x2)
    assert s.tolist() == [[[127, 0]]]
    assert y[0, :4].tolist() == [0x20, 0x54, 0x66, 0xF7]
    y, _ = torch_npu.npu_dynamic_mx_quant(x, round_mode="round")
    assert y[0, 2].item() == 0x76


@pytest.mark.parametrize("device", DEVICES)
def test_dual_axis_and_norm_float4(device):
    x = _rand(64, 40, seed=15, dtype=torch.float16)
    y1, s1, y2, s2 = torch_npu.npu_dynamic_mx_quant_with_dual_axis(x.to(device))
    r1, q1 = _ref_mx(x, -1, 296, 0)
    r2, q2 = _ref_mx(x, -2, 296, 0)
    assert y1.shape == (64, 20) and torch.equal(y1.cpu(), r1) and torch.equal(s1.cpu(), q1)
    assert torch.equal(y2.cpu(), r2) and torch.equal(s2.cpu(), q2)
    g = _rand(40, seed=16, dtype=torch.float16, spread=False)
    xn = _rand(6, 40, seed=17, dtype=torch.float16, spread=False)
    y, s, _ = torch_npu.npu_rms_norm_dynamic_mx_quant(xn.to(device), g.to(device), dst_type=297)
    xd = xn.double()
    normed = (xd / torch.sqrt((xd * xd).mean(-1, keepdim=True) + 1e-6) * g.double()).to(torch.float16)
    ry, rs = _ref_mx(normed, -1, 297, 0)
    assert y.shape == (6, 20)
    assert (s.cpu().int() - rs.int()).abs().max() <= 1
    assert (y.cpu() == ry).float().mean() >= 0.95


def test_float4_errors():
    x = torch.randn(4, 63, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="divisible by 2"):
        torch_npu.npu_dynamic_mx_quant(x)
    with pytest.raises(RuntimeError, match="scale_alg only supports 0 for float4"):
        torch_npu.npu_dynamic_mx_quant(x[:, :62], scale_alg=1)
    with pytest.raises(RuntimeError, match="round_mode only supports"):
        torch_npu.npu_dynamic_mx_quant(x[:, :62], round_mode="ceil")
    with pytest.raises(NotImplementedError, match="scale_alg=2"):
        torch_npu.npu_dynamic_mx_quant(x[:, :62], scale_alg=2)
    with pytest.raises(NotImplementedError, match="dst_type_max"):
        torch_npu.npu_dynamic_mx_quant(x[:, :62], dst_type_max=6.0)


FP4_FAKE_CASES = [
    (lambda f: torch.ops.npu.npu_dynamic_mx_quant(f(8, 130)), [((8, 65), torch.uint8), ((8, 3, 2), torch.uint8)]),
    (lambda f: torch.ops.npu.npu_add_rms_norm_dynamic_mx_quant(f(3, 100), f(3, 100), f(100)),
     [((3, 50), torch.uint8), ((3, 100), torch.float16), ((3, 2, 2), torch.uint8), ((0,), torch.float32)]),
    (lambda f: torch.ops.npu.npu_dynamic_mx_quant_with_dual_axis(f(96, 64)),
     [((96, 32), torch.uint8), ((96, 1, 2), torch.uint8), ((96, 32), torch.uint8), ((2, 64, 2), torch.uint8)]),
]


@pytest.mark.parametrize("call,expected", FP4_FAKE_CASES)
def test_float4_fake_shapes(call, expected):
    with FakeTensorMode():
        got = call(lambda *shape: torch.empty(*shape, dtype=torch.float16))
    assert _sig(got) == expected


# ------------------------------------------------------------------ npu_grouped_dynamic_mx_quant


def _ref_grouped(x, ends, dst, scale_alg):
    """op-plugin golden, written out: per group of rows, MX along the rows per column; group g's
    scale rows start at (end[g-1] // 64 + g) * 2, odd counts padded with byte 0, then byte 127
    up to the next group's start; rows paired into the trailing dim."""
    m, n = x.shape
    g_count = len(ends)
    y = torch.zeros(m, n, dtype=torch.float64)
    rows = [[127] * n for _ in range((m // 64 + g_count) * 2)]
    prev = 0
    for g, end in enumerate(ends):
        first = (prev // 64 + g) * 2
        for col in range(n):
            vals = x[prev:end, col].double().tolist()
            out, scales = _ref_mx_1d(vals, dst, scale_alg) if vals else ([], [])
            y[prev:end, col] = torch.tensor(out, dtype=torch.float64)
            for k, b in enumerate(scales):
                rows[first + k][col] = b
        prev = end
    s = torch.tensor(rows, dtype=torch.uint8).reshape(-1, 2, n).transpose(1, 2)
    return y.to(dst).view(torch.uint8), s


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dst,scale_alg", [(torch.float8_e5m2, 0), (torch.float8_e4m3fn, 1)])
@pytest.mark.parametrize("ends", [[10, 10, 80, 150], [64, 128, 150]])
def test_grouped_dynamic_mx_quant(device, dst, scale_alg, ends):
    x = _rand(150, 6, seed=18, dtype=torch.bfloat16)
    gi = torch.tensor(ends, dtype=torch.int64)
    y, s = torch_npu.npu_grouped_dynamic_mx_quant(x.to(device), gi.to(device), dst_type=dst, scale_alg=scale_alg)
    ry, rs = _ref_grouped(x, ends, dst, scale_alg)
    assert s.shape == (150 // 64 + len(ends), 6, 2) and y.dtype == dst
    assert torch.equal(s.cpu(), rs)
    assert torch.equal(_bits(y), ry)


def test_grouped_dynamic_mx_quant_errors_and_fake():
    x = torch.randn(64, 8, dtype=torch.float16)
    gi = torch.tensor([64], dtype=torch.int32)
    with pytest.raises(RuntimeError, match="blocksize only supports 32"):
        torch_npu.npu_grouped_dynamic_mx_quant(x, gi, blocksize=64)
    with pytest.raises(RuntimeError, match="must be 2-dimensional"):
        torch_npu.npu_grouped_dynamic_mx_quant(x[0], gi)
    with pytest.raises(RuntimeError, match="dst_type only supports"):
        torch_npu.npu_grouped_dynamic_mx_quant(x, gi, dst_type=296)
    with FakeTensorMode():
        got = torch.ops.npu.npu_grouped_dynamic_mx_quant(torch.empty(256, 40, dtype=torch.float16),
                                                         torch.empty(3, dtype=torch.int32))
    assert _sig(got) == [((256, 40), torch.float8_e5m2), ((7, 40, 2), torch.uint8)]


# ------------------------------------------------------------------ npu_dynamic_block_mx_quant


def _ref_block_mx(x, dst, mode="rint"):
    """One scale per 32 x 32 block of the last two dims (aclnnDynamicBlockMxQuant), broadcast
    to scale1 [.., M, pairs(N), 2] and scale2 [.., pairs(M), N, 2]."""
    x3 = x.double().reshape(-1, *x.shape[-2:])
    m, n = x.shape[-2:]
    mb, nb = -(-m // 32), -(-n // 32)
    y = torch.zeros_like(x3)
    blk = torch.zeros(x3.shape[0], mb + mb % 2, nb + nb % 2, dtype=torch.int64)
    for b in range(x3.shape[0]):
        for i in range(mb):
            for j in range(nb):
                tile = x3[b, i * 32:(i + 1) * 32, j * 32:(j + 1) * 32]
                vals = tile.flatten().tolist()
                out, scales = _ref_mx_1d(vals, dst, 0, block=len(vals), mode=mode)
                y[b, i * 32:(i + 1) * 32, j * 32:(j + 1) * 32] = torch.tensor(out).reshape(tile.shape)
                blk[b, i, j] = scales[0]
    s1 = blk[:, :mb].repeat_interleave(32, 1)[:, :m].reshape(-1, m, blk.shape[2] // 2, 2)
    s2 = blk[:, :, :nb].repeat_interleave(32, 2)[:, :, :n].reshape(-1, blk.shape[1] // 2, 2, n).transpose(-1, -2)
    lead = x.shape[:-2]
    y = y.reshape(x.shape)
    if dst in FP4:
        yb = torch.tensor(_fp4_pack_ref(y.reshape(-1, n).tolist(), dst), dtype=torch.uint8).reshape(*lead, m, n // 2)
    else:
        yb = y.to(dst).view(torch.uint8)
    return yb, s1.reshape(*lead, *s1.shape[1:]).to(torch.uint8), s2.reshape(*lead, *s2.shape[1:]).to(torch.uint8)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape,dst", [((70, 40), torch.float8_e4m3fn), ((2, 33, 96), torch.float8_e5m2),
                                       ((40, 66), 296), ((2, 64, 40), 297)])
def test_dynamic_block_mx_quant(device, shape, dst):
    x = _rand(*shape, seed=19, dtype=torch.bfloat16)
    y, s1, s2 = torch_npu.npu_dynamic_block_mx_quant(x.to(device), dst_type=dst)
    ry, r1, r2 = _ref_block_mx(x, dst)
    assert torch.equal(s1.cpu(), r1) and torch.equal(s2.cpu(), r2)
    assert torch.equal(_bits(y), ry)


def test_dynamic_block_mx_quant_documented_example_and_errors():
    x = torch.tensor([[0.0, 8.0, 64.0, 512.0]], dtype=torch.bfloat16)
    y, s1, s2 = torch_npu.npu_dynamic_block_mx_quant(x, dst_type=24)
    assert _bits(y).tolist() == [[0, 72, 96, 120]]
    assert s1.tolist() == [[[128, 0]]] and s2.tolist() == [[[128, 0]] * 4]
    with pytest.raises(RuntimeError, match="2-D or 3-D"):
        torch_npu.npu_dynamic_block_mx_quant(torch.zeros(2, 2, 2, 2, dtype=torch.float16), dst_type=24)
    with pytest.raises(RuntimeError, match="scale_alg only supports 0"):
        torch_npu.npu_dynamic_block_mx_quant(x, dst_type=24, scale_alg=1)
    with pytest.raises(NotImplementedError, match="scale_alg=2"):
        torch_npu.npu_dynamic_block_mx_quant(x, scale_alg=2)
    with FakeTensorMode():
        got = torch.ops.npu.npu_dynamic_block_mx_quant(torch.empty(2, 64, 130, dtype=torch.float16))
    assert _sig(got) == [((2, 64, 65), torch.uint8), ((2, 64, 3, 2), torch.uint8), ((2, 1, 130, 2), torch.uint8)]


# ------------------------------------------------------------------ npu_swiglu_mx_quant


def _nibbles(packed):
    return torch.stack([packed & 0xF, packed >> 4], -1).flatten(-2)


def _ref_swiglu(x, dim, mode, left, limit=7.0, alpha=1.702, bias=1.0):
    """The aclnnSwigluMxQuant variants in float64, cast to x's dtype (the golden's intermediate);
    mode 1 splits even/odd elements and ignores activate_left."""
    xd = x.double()
    sig = lambda t: 1.0 / (1.0 + torch.exp(-t))
    if mode == 1:
        glu, lin = xd[..., 0::2], xd[..., 1::2]
    else:
        a, b = xd.chunk(2, dim)
        glu, lin = (a, b) if left else (b, a)
    if mode == 0:
        out = glu * sig(glu) * lin
    else:
        g = glu.clamp(max=limit)
        out = g * sig(alpha * g) * (lin.clamp(-limit, limit) + bias)
    return out.to(x.dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode,left,dst", [(0, False, 296), (0, True, torch.float8_e4m3fn), (1, False, 297),
                                           (1, True, torch.float8_e5m2)])
def test_swiglu_mx_quant_modes(device, mode, left, dst):
    x = _rand(6, 256, seed=20, dtype=torch.bfloat16, spread=False) * 3
    y, s = torch_npu.npu_swiglu_mx_quant(x.to(device), swiglu_mode=mode, activate_left=left, dst_type=dst,
                                         clamp_limit=5.0, glu_alpha=1.5, glu_bias=0.5)
    ry, rs = _ref_mx(_ref_swiglu(x, -1, mode, left, 5.0, 1.5, 0.5), -1, dst, 0)
    assert s.shape == (6, 2, 2)
    assert (s.cpu().int() - rs.int()).abs().max() <= 1 and (s.cpu() == rs).float().mean() >= 0.95
    if dst in FP4:   # compare the two nibbles of each byte as separate codes
        y, ry = _nibbles(y.cpu()), _nibbles(ry)
    _assert_mostly_equal_bits(_bits(y), ry, frac=0.98)


@pytest.mark.parametrize("device", DEVICES)
def test_swiglu_mx_quant_non_last_dims(device):
    x = _rand(128, 40, seed=21, dtype=torch.float16, spread=False)
    y, s = torch_npu.npu_swiglu_mx_quant(x.to(device), activate_dim=0, axis=0, dst_type=24, scale_alg=1)
    ry, rs = _ref_mx(_ref_swiglu(x, 0, 0, False), 0, torch.float8_e4m3fn, 1)
    assert y.shape == (64, 40) and s.shape == (1, 40, 2)
    assert (s.cpu().int() - rs.int()).abs().max() <= 1
    _assert_mostly_equal_bits(_bits(y), ry, frac=0.98)


def test_swiglu_mx_quant_errors_and_fake():
    x = torch.randn(4, 64, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="swiglu_mode only support 0 or 1"):
        torch_npu.npu_swiglu_mx_quant(x, swiglu_mode=2)
    with pytest.raises(RuntimeError, match="clamp_limit should be positive finite"):
        torch_npu.npu_swiglu_mx_quant(x, clamp_limit=0.0)
    with pytest.raises(RuntimeError, match="x dim should be 2 to 7"):
        torch_npu.npu_swiglu_mx_quant(x[0])
    with pytest.raises(NotImplementedError, match="group_index"):
        torch_npu.npu_swiglu_mx_quant(x, group_index=torch.tensor([4]), axis=0, dst_type=24)
    with FakeTensorMode():
        got = torch.ops.npu.npu_swiglu_mx_quant(torch.empty(4, 256, dtype=torch.float16))
    assert _sig(got) == [((4, 64), torch.uint8), ((4, 2, 2), torch.uint8)]


def test_outputs_do_not_require_grad():
    """The MX quantisers have no backward (no *_backward op in the schema list): outputs of
    inputs that require grad are plain tensors."""
    x = torch.randn(4, 64, dtype=torch.bfloat16, requires_grad=True)
    outs = [*torch_npu.npu_dynamic_mx_quant(x, dst_type=24), *torch_npu.npu_dynamic_block_mx_quant(x),
            *torch_npu.npu_add_rms_norm_dynamic_mx_quant(x, x, torch.ones(64, dtype=torch.bfloat16))]
    assert not any(t.requires_grad for t in outs)


# ------------------------------------------------------------------ npu_swiglu_mx_quant_with_dual_axis


def test_swiglu_dual_axis_op_plugin_case():
    """op-plugin's test: bf16 ones [4, 8], group_index [2, 4] -> every scale byte 118, y 384
    (its golden compares y cast to uint8: 384 -> 128)."""
    x = torch.ones(4, 8, dtype=torch.bfloat16)
    y1, s1, y2, s2 = torch_npu.npu_swiglu_mx_quant_with_dual_axis(x, group_index=torch.tensor([2, 4]))
    assert (y1.to(torch.uint8) == 128).all() and (y2.to(torch.uint8) == 128).all()
    assert s1.tolist() == [[[118, 0]]] * 4
    assert s2.tolist() == [[[118, 0]] * 4] * 2


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("left", [True, False])
def test_swiglu_dual_axis(device, left):
    x = _rand(150, 80, seed=22, dtype=torch.float16, spread=False) * 2
    ends = [10, 10, 100, 150]
    gi = torch.tensor(ends)
    y1, s1, y2, s2 = torch_npu.npu_swiglu_mx_quant_with_dual_axis(x.to(device), group_index=gi.to(device),
                                                                   activate_left=left)
    act = _ref_swiglu(x, -1, 0, left)
    r1, q1 = _ref_mx(act, -1, torch.float8_e4m3fn, 1)
    r2, q2 = _ref_grouped(act, ends, torch.float8_e4m3fn, 1)
    assert s1.shape == (150, 1, 2) and s2.shape == (150 // 64 + 4, 40, 2)
    assert (s1.cpu().int() - q1.int()).abs().max() <= 1 and (s2.cpu().int() - q2.int()).abs().max() <= 1
    _assert_mostly_equal_bits(_bits(y1), r1, frac=0.98)
    _assert_mostly_equal_bits(_bits(y2), r2, frac=0.98)


def test_swiglu_dual_axis_errors_and_fake():
    x = torch.randn(64, 64, dtype=torch.bfloat16)
    gi = torch.tensor([64])
    with pytest.raises(NotImplementedError, match="group_index=None"):
        torch_npu.npu_swiglu_mx_quant_with_dual_axis(x)
    with pytest.raises(NotImplementedError, match="float8_e4m3fn with scale_alg=1 only"):
        torch_npu.npu_swiglu_mx_quant_with_dual_axis(x, group_index=gi, scale_alg=0)
    with pytest.raises(RuntimeError, match="divisible by 2"):
        torch_npu.npu_swiglu_mx_quant_with_dual_axis(x[:, :63], group_index=gi)
    with FakeTensorMode():
        got = torch.ops.npu.npu_swiglu_mx_quant_with_dual_axis(torch.empty(130, 256, dtype=torch.float16),
                                                               group_index=torch.empty(2, dtype=torch.int64))
    assert _sig(got) == [((130, 128), torch.float8_e4m3fn), ((130, 2, 2), torch.uint8),
                         ((130, 128), torch.float8_e4m3fn), ((4, 128, 2), torch.uint8)]


# ------------------------------------------------------------------ _npu_swiglu_backward_mx_quant_with_dual_axis


def _ref_swiglu_grad(x, dy, left):
    """d/dx of silu(A) * B (A the activated half) in float64 by autograd, cast to x's dtype."""
    xd = x.double().requires_grad_(True)
    a, b = xd.chunk(2, -1)
    act, other = (a, b) if left else (b, a)
    (act * torch.sigmoid(act) * other).backward(dy.double())
    return xd.grad.to(x.dtype)


def test_swiglu_backward_dual_axis_op_plugin_case():
    """op-plugin's test: x = y_grad = 1 (bf16 [4, 64] / [4, 32]), groups [2, 4]: y (as uint8
    values) 240 | 128, mxscale1 [119, 118], mxscale2 per column 119 / 118 then the pad 0."""
    x, dy = torch.ones(4, 64, dtype=torch.bfloat16), torch.ones(4, 32, dtype=torch.bfloat16)
    y1, s1, y2, s2 = torch_npu._npu_swiglu_backward_mx_quant_with_dual_axis(x, dy, group_index=torch.tensor([2, 4]))
    row = [240] * 32 + [128] * 32
    assert y1.to(torch.uint8).tolist() == [row] * 4 and y2.to(torch.uint8).tolist() == [row] * 4
    assert s1.tolist() == [[[119, 118]]] * 4
    assert s2.tolist() == [[[119, 0]] * 32 + [[118, 0]] * 32] * 2


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("left,grouped", [(True, True), (False, False)])
def test_swiglu_backward_dual_axis(device, left, grouped):
    x = _rand(100, 128, seed=23, dtype=torch.bfloat16, spread=False) * 2
    dy = _rand(100, 64, seed=24, dtype=torch.bfloat16, spread=False)
    ends = [30, 30, 100]
    gi = torch.tensor(ends).to(device) if grouped else None
    y1, s1, y2, s2 = torch_npu._npu_swiglu_backward_mx_quant_with_dual_axis(x.to(device), dy.to(device),
                                                                           group_index=gi, activate_left=left)
    grad = _ref_swiglu_grad(x, dy, left)
    r1, q1 = _ref_mx(grad, -1, torch.float8_e4m3fn, 1)
    r2, q2 = _ref_grouped(grad, ends, torch.float8_e4m3fn, 1) if grouped else _ref_mx(grad, -2, torch.float8_e4m3fn, 1)
    assert s2.shape == ((100 // 64 + 3) if grouped else 2, 128, 2)
    assert (s1.cpu().int() - q1.int()).abs().max() <= 1 and (s2.cpu().int() - q2.int()).abs().max() <= 1
    _assert_mostly_equal_bits(_bits(y1), r1, frac=0.98)
    _assert_mostly_equal_bits(_bits(y2), r2, frac=0.98)


def test_swiglu_backward_dual_axis_errors_and_fake():
    x, dy = torch.ones(64, 64, dtype=torch.bfloat16), torch.ones(64, 32, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="with the last dim halved"):
        torch_npu._npu_swiglu_backward_mx_quant_with_dual_axis(x, dy[:, :16])
    with pytest.raises(NotImplementedError, match="float8_e4m3fn with scale_alg=1"):
        torch_npu._npu_swiglu_backward_mx_quant_with_dual_axis(x, dy, dst_type=23)
    with FakeTensorMode():
        got = torch.ops.npu._npu_swiglu_backward_mx_quant_with_dual_axis(torch.empty(128, 128, dtype=torch.bfloat16),
                                                                         torch.empty(128, 64, dtype=torch.bfloat16))
    assert _sig(got) == [((128, 128), torch.float8_e4m3fn), ((128, 2, 2), torch.uint8),
                         ((128, 128), torch.float8_e4m3fn), ((2, 128, 2), torch.uint8)]
