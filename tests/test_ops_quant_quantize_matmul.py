"""Quantisation ops (torch_npu/op_plugin/quant/quantize.py): npu_quantize, npu_anti_quant,
npu_dynamic_quant, npu_dynamic_quant_asymmetric, npu_quant_matmul,
npu_weight_quant_batchmatmul.

References are float64/int64 torch math written here from the documented formulas (never
calling the implementation). Inputs for rounding ops are built away from .5 ties so
float32 vs float64 evaluation cannot flip a rounding.
"""
import pytest
import torch

import torch_npu

from _op_helpers import DEVICES, generator as gen

dev = pytest.mark.parametrize("device", DEVICES)


def ints(shape, low, high, seed, device):
    return torch.randint(low, high, shape, generator=gen(seed), dtype=torch.int64).to(torch.int8).to(device)


def check_exact(actual, expected, dtype, device):
    assert actual.dtype == dtype, (actual.dtype, dtype)
    assert actual.device.type == device
    assert tuple(actual.shape) == tuple(expected.shape)
    assert torch.equal(actual.cpu().long(), expected.long())


def check_close(actual, expected, dtype, device, rtol, atol):
    assert actual.dtype == dtype, (actual.dtype, dtype)
    assert actual.device.type == device
    assert tuple(actual.shape) == tuple(expected.shape)
    torch.testing.assert_close(actual.cpu().double(), expected.double(), rtol=rtol, atol=atol)


# ------------------------------------------------------------------ npu_quantize


def quantize_inputs(shape, axis, per_channel, seed):
    """x = (q + frac) * s with power-of-two scales and |frac| <= 0.4: exact, no ties."""
    g = gen(seed)
    c = shape[axis] if per_channel else 1
    s = 2.0 ** torch.randint(-3, 2, (c,), generator=g).double()
    zp = torch.randint(-5, 6, (c,), generator=g).double()
    q = torch.randint(-150, 150, shape, generator=g).double()
    frac = (torch.rand(shape, generator=g, dtype=torch.float64) - 0.5) * 0.8
    bshape = [1] * len(shape)
    bshape[axis] = c
    x = (q + frac) * s.reshape(bshape)
    return x, s, zp, bshape


@dev
@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("axis", [1, -1])
@pytest.mark.parametrize("qdtype,out,lo,hi", [(torch.qint8, torch.int8, -128, 127),
                                              (torch.quint8, torch.uint8, 0, 255),
                                              (torch.qint32, torch.int32, -2 ** 31, 2 ** 31 - 1)])
def test_quantize_div(device, per_channel, axis, qdtype, out, lo, hi):
    shape = (3, 4, 5)
    x, s, zp, bshape = quantize_inputs(shape, axis, per_channel, seed=1)
    ref = torch.round(x / s.reshape(bshape) + zp.reshape(bshape)).clamp(lo, hi)
    y = torch_npu.npu_quantize(x.float().to(device), s.float().to(device), zp.float().to(device), qdtype,
                               axis=axis, div_mode=True)
    check_exact(y, ref, out, device)


@dev
def test_quantize_mul_mode_and_no_zero_point(device):
    x, s, zp, bshape = quantize_inputs((4, 6), -1, True, seed=2)
    inv = 1.0 / s  # multiplying by 1/s (power of two) is exact
    ref = torch.round(x * inv.reshape(bshape)).clamp(-128, 127)
    y = torch_npu.npu_quantize(x.float().to(device), inv.float().to(device), None, torch.qint8,
                               axis=-1, div_mode=False)
    check_exact(y, ref, torch.int8, device)
    # float16 input, per-tensor
    x16 = (torch.arange(-20, 20, dtype=torch.float64) + 0.25) * 0.5
    ref = torch.round(x16 / 0.5 + 3).clamp(-128, 127)
    y = torch_npu.npu_quantize(x16.half().to(device), torch.tensor([0.5], device=device),
                               torch.tensor([3.0], device=device), torch.int8, axis=0)
    check_exact(y, ref, torch.int8, device)


def test_quantize_unsupported_and_meta():
    x = torch.randn(2, 3)
    with pytest.raises(NotImplementedError, match="dtype"):
        torch_npu.npu_quantize(x, torch.ones(1), None, torch.quint4x2)
    m = torch_npu.npu_quantize(torch.empty(2, 3, device="meta"), torch.empty(3, device="meta"),
                               None, torch.quint8, axis=1)
    assert m.shape == (2, 3) and m.dtype == torch.uint8 and m.device.type == "meta"


# ------------------------------------------------------------------ npu_anti_quant


@dev
@pytest.mark.parametrize("dst", [None, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("use_offset", [False, True])
def test_anti_quant(device, dst, use_offset):
    x = ints((4, 8), -128, 128, 3, "cpu")
    scale = torch.rand(8, generator=gen(4), dtype=torch.float64) + 0.1
    offset = torch.randint(-4, 5, (8,), generator=gen(5)).double()
    ref = (x.double() + (offset if use_offset else 0)) * scale.float().double()
    kw = {"dst_dtype": dst} if dst is not None else {}
    if use_offset:
        kw["offset"] = offset.float().to(device)
    y = torch_npu.npu_anti_quant(x.to(device), scale.float().to(device), **kw)
    out = dst or torch.float16
    tol = 8e-3 if out == torch.bfloat16 else 1e-3
    check_close(y, ref, out, device, rtol=tol, atol=tol)


def test_anti_quant_unsupported():
    with pytest.raises(NotImplementedError, match="dst_dtype"):
        torch_npu.npu_anti_quant(torch.zeros(2, 3, dtype=torch.int8), torch.ones(3), dst_dtype=torch.int32)
    with pytest.raises(NotImplementedError, match="x dtype"):
        torch_npu.npu_anti_quant(torch.zeros(2, 3, dtype=torch.int32), torch.ones(3))
    m = torch_npu.npu_anti_quant(torch.empty(2, 3, dtype=torch.int8, device="meta"),
                                 torch.empty(3, device="meta"), dst_dtype=torch.bfloat16)
    assert m.shape == (2, 3) and m.dtype == torch.bfloat16


# ------------------------------------------------------------------ dynamic quant


def dyn_input(device, dtype, shape=(2, 3, 16), seed=6):
    x = torch.randn(shape, generator=gen(seed), dtype=torch.float64)
    return x.to(dtype)


@dev
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("smooth", [False, True])
def test_dynamic_quant(device, dtype, smooth):
    x = dyn_input(device, dtype)
    sm = torch.rand(16, generator=gen(7), dtype=torch.float64).float() + 0.5
    xs = x.double() * (sm.double() if smooth else 1.0)
    ref_scale = xs.abs().amax(-1) / 127.0
    ref_y = torch.round(xs / ref_scale.unsqueeze(-1)).clamp(-128, 127)
    kw = {"smooth_scales": sm.to(device)} if smooth else {}
    y, scale = torch_npu.npu_dynamic_quant(x.to(device), **kw)
    check_close(scale, ref_scale, torch.float32, device, rtol=1e-6, atol=0)
    assert y.dtype == torch.int8 and y.device.type == device and y.shape == x.shape
    # float32 vs float64 evaluation may only move a value sitting on a .5 boundary by one step
    assert (y.cpu().long() - ref_y.long()).abs().max() <= 1
    assert (y.cpu().long() != ref_y.long()).float().mean() < 0.02
    assert y.cpu().abs().amax(-1).eq(127).all()  # each row's max maps to +-127


@dev
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_dynamic_quant_asymmetric(device, dtype):
    x = dyn_input(device, dtype, seed=8)
    xs = x.double()
    mx, mn = xs.amax(-1), xs.amin(-1)
    ref_scale = (mx - mn) / 255.0
    ref_offset = 127.0 - mx / ref_scale
    ref_y = torch.round(xs / ref_scale.unsqueeze(-1) + ref_offset.unsqueeze(-1)).clamp(-128, 127)
    y, scale, offset = torch_npu.npu_dynamic_quant_asymmetric(x.to(device))
    check_close(scale, ref_scale, torch.float32, device, rtol=1e-6, atol=0)
    check_close(offset, ref_offset, torch.float32, device, rtol=1e-5, atol=1e-4)
    assert y.dtype == torch.int8 and y.shape == x.shape
    assert (y.cpu().long() - ref_y.long()).abs().max() <= 1
    assert y.cpu().amax(-1).eq(127).all() and y.cpu().amin(-1).eq(-128).all()


def test_dynamic_quant_zero_row_and_meta_and_unsupported():
    x = torch.zeros(2, 4)
    x[1] = torch.tensor([1.0, -2.0, 0.5, 0.0])
    y, s = torch_npu.npu_dynamic_quant(x)
    assert torch.equal(y[0], torch.zeros(4, dtype=torch.int8)) and s[0] == 0
    assert y[1].tolist() == [64, -127, 32, 0]  # 1/(2/127)=63.5 -> 64 (half-to-even), 0.5 -> 31.75 -> 32
    ym, sm = torch_npu.npu_dynamic_quant(torch.empty(3, 5, 8, device="meta"))
    assert ym.shape == (3, 5, 8) and ym.dtype == torch.int8 and sm.shape == (3, 5) and sm.dtype == torch.float32
    outs = torch_npu.npu_dynamic_quant_asymmetric(torch.empty(3, 8, device="meta"))
    assert [tuple(o.shape) for o in outs] == [(3, 8), (3,), (3,)]
    with pytest.raises(NotImplementedError, match="group_index"):
        torch_npu.npu_dynamic_quant(torch.randn(2, 4), group_index=torch.tensor([2]))
    with pytest.raises(NotImplementedError, match="quant_mode"):
        torch_npu.npu_dynamic_quant(torch.randn(2, 4), quant_mode="pertensor")
    with pytest.raises(NotImplementedError, match="dst_type"):
        torch_npu.npu_dynamic_quant_asymmetric(torch.randn(2, 4), dst_type=torch.quint4x2)


# ------------------------------------------------------------------ npu_quant_matmul


def qmm_inputs(device, m=5, k=32, n=6, batch=()):
    x1 = ints(batch + (m, k), -128, 128, 10, device)
    x2 = ints((k, n), -128, 128, 11, device)
    return x1, x2


@dev
@pytest.mark.parametrize("out", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("bias_kind", [None, "int32", "float32"])
@pytest.mark.parametrize("pertoken", [False, True])
def test_quant_matmul_float_out(device, out, per_channel, bias_kind, pertoken):
    x1, x2 = qmm_inputs(device, batch=(2,))
    n, m = 6, 5
    scale = (torch.rand(n if per_channel else 1, generator=gen(12), dtype=torch.float64) * 1e-3).float()
    pts = (torch.rand(m, generator=gen(13), dtype=torch.float64) + 0.5).float()
    acc = x1.cpu().long() @ x2.cpu().long()
    kw = {"output_dtype": out}
    if bias_kind == "int32":
        bias = torch.randint(-1000, 1000, (n,), generator=gen(14)).to(torch.int32)
        v = (acc + bias.long()).double() * scale.double()
    else:
        v = acc.double() * scale.double()
    if pertoken:
        v = v * pts.double().unsqueeze(-1)
        kw["pertoken_scale"] = pts.to(device)
    if bias_kind == "float32":
        bias = torch.randn(n, generator=gen(15)).float()
        v = v + bias.double()
    if bias_kind is not None:
        kw["bias"] = bias.to(device)
    y = torch_npu.npu_quant_matmul(x1, x2, scale.to(device), **kw)
    tol = 8e-3 if out == torch.bfloat16 else 1e-3
    check_close(y, v, out, device, rtol=tol, atol=tol)


@dev
def test_quant_matmul_int8_out(device):
    x1, x2 = qmm_inputs(device)
    n = 6
    # power-of-two scale, integer offset -> exact quarter values, compare exactly (ties -> even)
    scale = torch.full((n,), 2.0 ** -9)
    offset = torch.arange(n).float() - 3
    bias = torch.arange(n, dtype=torch.int32) * 7
    acc = (x1.cpu().long() @ x2.cpu().long() + bias.long()).double()
    ref = torch.round(acc * 2.0 ** -9 + offset.double()).clamp(-128, 127)
    y = torch_npu.npu_quant_matmul(x1, x2, scale.to(device), offset=offset.to(device), bias=bias.to(device))
    check_exact(y, ref, torch.int8, device)
    y2 = torch_npu.npu_quant_matmul(x1, x2, scale.to(device), offset=offset.to(device), bias=bias.to(device),
                                    output_dtype=torch.int8)
    check_exact(y2, ref, torch.int8, device)


def test_quant_matmul_unsupported_and_meta():
    x1 = torch.zeros(2, 4, dtype=torch.int8)
    x2 = torch.zeros(4, 3, dtype=torch.int8)
    s = torch.ones(3)
    with pytest.raises(NotImplementedError, match="output_dtype"):
        torch_npu.npu_quant_matmul(x1, x2, s, output_dtype=torch.int32)
    with pytest.raises(NotImplementedError, match="scale dtype"):
        torch_npu.npu_quant_matmul(x1, x2, torch.ones(3, dtype=torch.int32), output_dtype=torch.float16)
    with pytest.raises(NotImplementedError, match="group_sizes"):
        torch_npu.npu_quant_matmul(x1, x2, s, output_dtype=torch.float16, group_sizes=[1, 1, 1])
    with pytest.raises(NotImplementedError, match="x1_dtype"):
        torch_npu.npu_quant_matmul(x1, x2, s, x1_dtype=torch.int8)
    with pytest.raises(NotImplementedError, match="x1/x2"):
        torch_npu.npu_quant_matmul(x1.int(), x2.int(), s)
    m = torch_npu.npu_quant_matmul(torch.empty(3, 2, 4, dtype=torch.int8, device="meta"),
                                   torch.empty(4, 7, dtype=torch.int8, device="meta"),
                                   torch.empty(7, device="meta"), output_dtype=torch.bfloat16)
    assert m.shape == (3, 2, 7) and m.dtype == torch.bfloat16


# ------------------------------------------------------------------ npu_weight_quant_batchmatmul


@dev
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("mode", ["tensor", "channel", "channel2d", "group"])
@pytest.mark.parametrize("use_offset,use_bias", [(False, False), (True, True)])
def test_weight_quant_batchmatmul(device, dtype, mode, use_offset, use_bias):
    m, k, n, gsize = 3, 16, 5, 4
    x = torch.randn(2, m, k, generator=gen(20)).to(dtype)
    w = ints((k, n), -128, 128, 21, "cpu")
    sshape = {"tensor": (1,), "channel": (n,), "channel2d": (1, n), "group": (k // gsize, n)}[mode]
    scale = (torch.rand(sshape, generator=gen(22)) * 0.02 + 0.001).to(dtype)
    off = torch.randint(-3, 4, sshape, generator=gen(23)).to(dtype)
    bias = torch.randn(n, generator=gen(24)).to(dtype)
    # reference dequantised weight, element by element from the formula
    wd = torch.empty(k, n, dtype=torch.float64)
    for i in range(k):
        for j in range(n):
            if mode == "tensor":
                idx = (0,)
            elif mode == "channel":
                idx = (j,)
            elif mode == "channel2d":
                idx = (0, j)
            else:
                idx = (i // gsize, j)
            o = off[idx].double() if use_offset else 0.0
            wd[i, j] = (w[i, j].double() + o) * scale[idx].double()
    ref = x.double() @ wd + (bias.double() if use_bias else 0.0)
    args = [x.to(device), w.to(device), scale.to(device)]
    kw = {"antiquant_group_size": gsize if mode == "group" else 0}
    if use_offset:
        kw["antiquant_offset"] = off.to(device)
    if use_bias:
        kw["bias"] = bias.to(device)
    y = torch_npu.npu_weight_quant_batchmatmul(*args, **kw)
    tol = 3e-2 if dtype == torch.bfloat16 else 5e-3
    check_close(y, ref, dtype, device, rtol=tol, atol=tol)


def test_weight_quant_batchmatmul_unsupported_and_meta():
    x = torch.randn(2, 8).half()
    w = torch.zeros(8, 3, dtype=torch.int8)
    s = torch.ones(3).half()
    with pytest.raises(NotImplementedError, match="quant_scale"):
        torch_npu.npu_weight_quant_batchmatmul(x, w, s, quant_scale=torch.ones(3))
    with pytest.raises(NotImplementedError, match="weight dtype"):
        torch_npu.npu_weight_quant_batchmatmul(x, w.short(), s)
    with pytest.raises(NotImplementedError, match="weight_dtype"):
        torch_npu.npu_weight_quant_batchmatmul(x, w, s, weight_dtype=1)
    y = torch_npu.npu_weight_quant_batchmatmul(torch.empty(4, 2, 8, dtype=torch.bfloat16, device="meta"),
                                               torch.empty(8, 3, dtype=torch.int8, device="meta"),
                                               torch.empty(2, 3, dtype=torch.bfloat16, device="meta"),
                                               antiquant_group_size=4)
    assert y.shape == (4, 2, 3) and y.dtype == torch.bfloat16
