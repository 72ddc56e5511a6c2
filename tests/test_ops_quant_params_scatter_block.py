"""npu_trans_quant_param (+ its int64 scale in npu_quant_matmul), npu_quant_scatter(_),
npu_dynamic_block_quant, npu_quant_matmul_reduce_sum.

References are written here from the documented formulas: the bit layout with Python's
``struct``, the scatter with plain Python loops over the CANN golden's index rule, block
quantisation and matmuls in float64 (inputs built away from rounding ties).
"""
import struct

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import torch_npu

from _op_helpers import DEVICES, generator as gen

dev = pytest.mark.parametrize("device", DEVICES)


def f32_bits(v):
    return struct.unpack("<I", struct.pack("<f", v))[0]


def bits_f32(b):
    return struct.unpack("<f", struct.pack("<I", b))[0]


def packed_ref(scale, offset, round_mode):
    """Documented layout: fp19 scale in bits 0-31, 1 << 46, 9-bit offset in bits 37-45."""
    b = f32_bits(scale)
    if round_mode == 1:
        low = b & 0x1FFF
        b = (b & ~0x1FFF) + (0x2000 if low > 0x1000 else 0)
    out = (b & 0xFFFFE000) | (1 << 46)
    if offset is not None:
        o = max(min(int(round(offset)), 255), -256)
        out = (out & 0x4000FFFFFFFF) | ((o & 0x1FF) << 37)
    return out


# ------------------------------------------------------------------ npu_trans_quant_param


@dev
@pytest.mark.parametrize("round_mode", [0, 1])
@pytest.mark.parametrize("with_offset", [False, True])
def test_trans_quant_param_bits(device, round_mode, with_offset):
    g = gen(1)
    scale = torch.randn(16, generator=g) * 3
    offset = (torch.rand(16, generator=g) - 0.5) * 700 if with_offset else None   # covers the clamp
    if offset is not None:
        offset = torch.where((offset.frac().abs() - 0.5).abs() < 1e-3, offset + 0.25, offset)
    out = torch_npu.npu_trans_quant_param(scale.to(device), None if offset is None else offset.to(device),
                                          round_mode)
    assert out.dtype == torch.int64 and out.device.type == device and out.shape == (16,)
    ref = [packed_ref(s, None if offset is None else o, round_mode)
           for s, o in zip(scale.tolist(), offset.tolist() if offset is not None else [None] * 16)]
    assert out.cpu().tolist() == ref


def test_trans_quant_param_doc_example_layout():
    # The documented output 70507248869376 = 0x40203f85e000: flag, offset 1, scale bits 0x3f85e000.
    v = 70507248869376
    s, o = bits_f32(v & 0xFFFFFFFF), (v >> 37) & 0x1FF
    out = torch_npu.npu_trans_quant_param(torch.tensor([s]), torch.tensor([float(o)]), 1)
    assert out.tolist() == [v]


def test_trans_quant_param_shapes_and_errors():
    s1 = torch.tensor([0.5])
    off = torch.tensor([1.0, 2.0, -3.0])
    assert torch_npu.npu_trans_quant_param(s1, off).shape == (3,)
    out = torch_npu.npu_trans_quant_param(torch.full((3,), 0.5), torch.tensor([7.0]))
    assert out.tolist() == [packed_ref(0.5, 7.0, 0)] * 3
    assert torch_npu.npu_trans_quant_param(torch.ones(1, 5)).shape == (1, 5)
    with pytest.raises(RuntimeError, match="same shape"):
        torch_npu.npu_trans_quant_param(torch.ones(1, 5), torch.ones(1, 4))
    tie = bits_f32(0x3F801000)          # exactly halfway between two fp19 values
    with pytest.raises(NotImplementedError, match="halfway"):
        torch_npu.npu_trans_quant_param(torch.tensor([tie]), None, 1)
    assert torch_npu.npu_trans_quant_param(torch.tensor([tie]), None, 0).tolist() == [0x3F800000 | (1 << 46)]
    with pytest.raises(NotImplementedError, match="round_mode"):
        torch_npu.npu_trans_quant_param(s1, None, 2)
    with FakeTensorMode():
        f = torch_npu.npu_trans_quant_param(torch.empty(4), torch.empty(4), 1)
        assert f.shape == (4,) and f.dtype == torch.int64


@dev
def test_quant_matmul_with_packed_scale(device):
    g = gen(2)
    x1 = torch.randint(-20, 20, (3, 5, 32), generator=g).to(torch.int8)
    x2 = torch.randint(-20, 20, (32, 8), generator=g).to(torch.int8)
    scale = torch.rand(8, generator=g) * 0.01 + 0.001
    packed = torch_npu.npu_trans_quant_param(scale.to(device))
    y = torch_npu.npu_quant_matmul(x1.to(device), x2.to(device), packed, output_dtype=torch.float16)
    fp19 = torch.tensor([bits_f32(f32_bits(s) & 0xFFFFE000) for s in scale.tolist()], dtype=torch.float64)
    ref = (x1.double() @ x2.double()) * fp19
    assert y.dtype == torch.float16 and y.device.type == device
    torch.testing.assert_close(y.cpu().double(), ref, rtol=1e-3, atol=1e-3)
    with pytest.raises(NotImplementedError, match="packed offset"):
        torch_npu.npu_quant_matmul(x1, x2, torch_npu.npu_trans_quant_param(scale, torch.ones(8)),
                                   output_dtype=torch.float16)


# ------------------------------------------------------------------ npu_quant_scatter


def scatter_ref(var, indices, updates, scales, zps, axis):
    """Python loops over the documented rule (float64 quantisation, rint via round-half-even)."""
    nd = var.dim()
    ax = axis % nd
    q = updates.double() / scales.double().reshape(-1)
    if zps is not None:
        q = q + zps.double().reshape(-1)
    q = torch.round(q).clamp(-128, 127).to(torch.int8)
    out = var.clone()
    idx = indices.tolist()
    for i in range(updates.shape[0]):
        row, start = (i, idx[i]) if indices.dim() == 1 else (idx[i][0], idx[i][1])
        for k in range(updates.shape[ax]):
            dst = [row] + [slice(None)] * (nd - 1)
            dst[ax] = start + k
            src = [i] + [slice(None)] * (nd - 1)
            src[ax] = k
            out[tuple(dst)] = q[tuple(src)]
    return out


@dev
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("two_d_index", [False, True])
@pytest.mark.parametrize("shape,axis", [((4, 6, 16), -2), ((3, 2, 5, 16), 2), ((3, 5, 2, 16), 1)])
def test_quant_scatter(device, dtype, two_d_index, shape, axis):
    g = gen(3)
    nd = len(shape)
    ax = axis % nd
    var = torch.randint(-100, 100, shape, generator=g).to(torch.int8)
    ushape = list(shape)
    ushape[ax] = 2
    ushape[0] = 2
    updates = ((torch.randint(-60, 60, ushape, generator=g) + 0.3) * 0.25).to(dtype)
    scales = (2.0 ** torch.randint(-2, 2, (16,), generator=g)).to(dtype if dtype == torch.bfloat16 else torch.float32)
    zps = torch.randint(-3, 4, (16,), generator=g).to(torch.bfloat16 if dtype == torch.bfloat16 else torch.int32)
    if two_d_index:
        indices = torch.tensor([[shape[0] - 1, 0], [0, shape[ax] - 2]], dtype=torch.int32)
    else:
        indices = torch.tensor([shape[ax] - 2, 1], dtype=torch.int32)
    ref = scatter_ref(var, indices, updates, scales, zps, axis)
    args = [t.to(device) for t in (indices, updates, scales, zps)]
    var_d = var.to(device)
    out = torch_npu.npu_quant_scatter(var_d, *args, axis=axis, quant_axis=-1)
    assert out.dtype == torch.int8 and out.device.type == device
    assert torch.equal(out.cpu(), ref)
    assert torch.equal(var_d.cpu(), var), "out-of-place form changed its input"
    ret = torch_npu.npu_quant_scatter_(var_d, *args, axis=axis, quant_axis=-1)
    assert ret is var_d and torch.equal(var_d.cpu(), ref)


def test_quant_scatter_errors_and_meta():
    var = torch.zeros(2, 4, 16, dtype=torch.int8)
    upd = torch.zeros(2, 1, 16, dtype=torch.float16)
    idx = torch.zeros(2, dtype=torch.int32)
    sc = torch.ones(16)
    with pytest.raises(NotImplementedError, match="reduce"):
        torch_npu.npu_quant_scatter(var, idx, upd, sc, reduce="add")
    with pytest.raises(NotImplementedError, match="round_mode"):
        torch_npu.npu_quant_scatter(var, idx, upd, sc, round_mode="floor")
    with pytest.raises(RuntimeError, match="first nor the last"):
        torch_npu.npu_quant_scatter(var, idx, upd, sc, axis=-1)
    with pytest.raises(RuntimeError, match="quant_scales"):
        torch_npu.npu_quant_scatter(var, idx, upd, torch.ones(8))
    with FakeTensorMode():
        out = torch_npu.npu_quant_scatter(torch.empty(2, 4, 16, dtype=torch.int8), torch.empty(2, dtype=torch.int32),
                                          torch.empty(2, 1, 16, dtype=torch.float16), torch.empty(16))
        assert out.shape == (2, 4, 16) and out.dtype == torch.int8


# ------------------------------------------------------------------ npu_dynamic_block_quant


@dev
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape", [(3, 4), (5, 300), (2, 3, 130)])
def test_dynamic_block_quant(device, dtype, shape):
    g = gen(4)
    x = (torch.randn(shape, generator=g) * 4).to(dtype)
    n = shape[-1]
    xd = x.double()
    y_ref = torch.empty(shape, dtype=torch.int64)
    blocks = -(-n // 128)
    s_ref = torch.empty(*shape[:-1], blocks, dtype=torch.float64)
    for b in range(blocks):
        sl = slice(b * 128, min(n, (b + 1) * 128))
        amax = xd[..., sl].abs().amax(-1, keepdim=True)
        s_ref[..., b] = amax[..., 0] / 127
        y_ref[..., sl] = torch.round(xd[..., sl] * 127 / amax).long()
    y, s = torch_npu.npu_dynamic_block_quant(x.to(device))
    assert y.dtype == torch.int8 and s.dtype == torch.float32 and y.device.type == device
    assert s.shape == s_ref.shape
    torch.testing.assert_close(s.cpu().double(), s_ref, rtol=1e-6, atol=0)
    # float32 vs float64 evaluation may move a value sitting within 1e-5 of a .5 tie
    assert (y.cpu().long() - y_ref).abs().max() <= 1
    assert (y.cpu().long() != y_ref).float().mean() < 0.01
    assert (y.cpu().long().abs().amax(-1) == 127).all()


def test_dynamic_block_quant_doc_example_and_edges():
    x = torch.tensor([[0.0, 0.0], [0.5, -1.0]], dtype=torch.float16)
    y, s = torch_npu.npu_dynamic_block_quant(x)
    assert y.tolist() == [[0, 0], [64, -127]] and s.tolist() == [[0.0], [pytest.approx(1 / 127)]]
    with pytest.raises(NotImplementedError, match="col_block_size"):
        torch_npu.npu_dynamic_block_quant(x, col_block_size=64)
    with FakeTensorMode():
        fy, fs = torch_npu.npu_dynamic_block_quant(torch.empty(2, 7, 260, dtype=torch.bfloat16))
        assert fy.shape == (2, 7, 260) and fs.shape == (2, 7, 3)


# ------------------------------------------------------------------ npu_transpose_batchmatmul


# ------------------------------------------------------------------ npu_quant_matmul_reduce_sum


@dev
def test_quant_matmul_reduce_sum(device):
    g = gen(7)
    b, m, k, n = 3, 4, 32, 5
    x1 = torch.randint(-128, 128, (b, m, k), generator=g).to(torch.int8)
    x2 = torch.randint(-128, 128, (b, k, n), generator=g).to(torch.int8)
    s1 = torch.rand(b, m, generator=g) * 0.01
    s2 = (torch.rand(n, generator=g) * 0.01).to(torch.bfloat16)
    ref = sum((x1[i].double() @ x2[i].double()) * s1[i].double()[:, None] * s2.double()[None, :] for i in range(b))
    y = torch_npu.npu_quant_matmul_reduce_sum(x1.to(device), x2.to(device), x1_scale=s1.to(device),
                                              x2_scale=s2.to(device))
    assert y.dtype == torch.bfloat16 and y.shape == (m, n) and y.device.type == device
    torch.testing.assert_close(y.cpu().double(), ref, rtol=8e-3, atol=1e-2)
    ones = torch_npu.npu_quant_matmul_reduce_sum(torch.ones(2, 3, 4, dtype=torch.int8),
                                                 torch.ones(2, 4, 5, dtype=torch.int8),
                                                 x1_scale=torch.ones(2, 3), x2_scale=torch.ones(5, dtype=torch.bfloat16))
    assert torch.equal(ones, torch.full((3, 5), 8.0, dtype=torch.bfloat16))   # documented example: 2 * 4
    with pytest.raises(RuntimeError, match="x2_scale"):
        torch_npu.npu_quant_matmul_reduce_sum(x1, x2, x1_scale=s1, x2_scale=s2.float())
