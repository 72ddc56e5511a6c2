"""Quantisation ops: npu_transpose_quant_batchmatmul and npu_rotate_quant against float64 loops of the
documented K-C and MX formulas (aclnnTransposeQuantBatchMatMul, CANN ops-nn kernel golden)."""
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import torch_npu

from _op_helpers import DEVICES, e8m0, small_int_fp8 as fp8

FLOAT8 = [torch.float8_e4m3fn, torch.float8_e5m2]
OUT = [torch.float16, torch.bfloat16]


def kc_reference(x1, x2, s1, s2):
    """y[m, b, n] = sum_k x1[m, b, k] * x2[b, k, n] * s2[n] * s1[m], float64 loops."""
    a, w = x1.double(), x2.double()
    m, b, k = a.shape
    n = w.shape[2]
    y = torch.zeros(m, b, n, dtype=torch.float64)
    for i in range(m):
        for j in range(b):
            for c in range(n):
                y[i, j, c] = (a[i, j, :] * w[j, :, c]).sum() * float(s2[c]) * float(s1[i])
    return y


def mx_reference(x1, x2, s1_raw, s2_raw, x2_is_bnk):
    """MX: each K index k uses scale pair element (k // 64, (k % 64) // 32) of its row/column."""
    a = x1.double()
    w = x2.double().transpose(1, 2) if x2_is_bnk else x2.double()     # (B, K, N)
    m, b, k = a.shape
    n = w.shape[2]
    y = torch.zeros(m, b, n, dtype=torch.float64)
    for i in range(m):
        for j in range(b):
            for c in range(n):
                total = 0.0
                for kk in range(k):
                    g, p = kk // 64, (kk % 64) // 32
                    r2 = s2_raw[j, c, g, p] if x2_is_bnk else s2_raw[j, g, c, p]
                    total += float(a[i, j, kk]) * e8m0(int(s1_raw[i, j, g, p])) * \
                        float(w[j, kk, c]) * e8m0(int(r2))
                y[i, j, c] = total
    return y


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("in_dtype", FLOAT8)
@pytest.mark.parametrize("out_dtype", OUT)
def test_transpose_quant_batchmatmul_kc(device, in_dtype, out_dtype):
    gen = torch.Generator().manual_seed(3)
    m, b, k, n = 3, 2, 16, 5
    x1, x2 = fp8((m, b, k), in_dtype, gen), fp8((b, k, n), in_dtype, gen)
    s1 = torch.rand(m, generator=gen) * 2 - 1
    s2 = torch.rand(n, generator=gen) * 2 - 1
    y = torch_npu.npu_transpose_quant_batchmatmul(x1.to(device), x2.to(device), out_dtype, x1_scale=s1.to(device),
                                                  x2_scale=s2.to(device), perm_x1=[1, 0, 2], perm_x2=[0, 1, 2],
                                                  perm_y=[1, 0, 2])
    assert y.device.type == device and y.dtype == out_dtype and y.shape == (m, b, n)
    ref = kc_reference(x1, x2, s1, s2)
    tol = 1e-2 if out_dtype == torch.bfloat16 else 2e-3
    torch.testing.assert_close(y.cpu().double(), ref, rtol=tol, atol=tol)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("x2_is_bnk", [False, True])
def test_transpose_quant_batchmatmul_mx(device, x2_is_bnk):
    gen = torch.Generator().manual_seed(4)
    m, b, k, n = 2, 2, 128, 3
    x1 = fp8((m, b, k), torch.float8_e4m3fn, gen)
    x2 = fp8((b, n, k) if x2_is_bnk else (b, k, n), torch.float8_e4m3fn, gen)
    s1_raw = torch.randint(124, 131, (m, b, k // 64, 2), generator=gen, dtype=torch.uint8)
    s2_shape = (b, n, k // 64, 2) if x2_is_bnk else (b, k // 64, n, 2)
    s2_raw = torch.randint(124, 131, s2_shape, generator=gen, dtype=torch.uint8)
    y = torch_npu.npu_transpose_quant_batchmatmul(
        x1.to(device), x2.to(device), torch.bfloat16, group_sizes=[0, 0, 32],
        x1_scale=s1_raw.view(torch.float8_e8m0fnu).to(device), x2_scale=s2_raw.view(torch.float8_e8m0fnu).to(device),
        perm_x2=[0, 2, 1] if x2_is_bnk else [0, 1, 2])
    assert y.dtype == torch.bfloat16 and y.shape == (m, b, n)
    ref = mx_reference(x1, x2, s1_raw, s2_raw, x2_is_bnk)
    torch.testing.assert_close(y.cpu().double(), ref, rtol=1e-2, atol=1e-2)


def test_transpose_quant_batchmatmul_mx_nan_scale():
    # raw 255 decodes to NaN and poisons the rows it scales
    gen = torch.Generator().manual_seed(5)
    x1, x2 = fp8((2, 1, 64), torch.float8_e4m3fn, gen), fp8((1, 64, 2), torch.float8_e4m3fn, gen)
    s1 = torch.full((2, 1, 1, 2), 127, dtype=torch.uint8)
    s1[1, 0, 0, 1] = 255
    s2 = torch.full((1, 1, 2, 2), 127, dtype=torch.uint8)
    y = torch_npu.npu_transpose_quant_batchmatmul(x1, x2, torch.float16, x1_scale=s1.view(torch.float8_e8m0fnu),
                                                  x2_scale=s2.view(torch.float8_e8m0fnu))
    assert not y[0].isnan().any() and y[1].isnan().all()
    torch.testing.assert_close(y[0].double(), mx_reference(x1, x2, s1, s2, False)[0], rtol=1e-3, atol=1e-3)


def test_transpose_quant_batchmatmul_fake_shapes():
    with FakeTensorMode():
        x1 = torch.empty(4, 3, 64, dtype=torch.float8_e5m2)
        x2 = torch.empty(3, 64, 7, dtype=torch.float8_e5m2)
        y = torch_npu.npu_transpose_quant_batchmatmul(x1, x2, torch.float16, x1_scale=torch.empty(4),
                                                      x2_scale=torch.empty(7))
        assert y.shape == (4, 3, 7) and y.dtype == torch.float16
        y = torch_npu.npu_transpose_quant_batchmatmul(
            x1, x2, torch.bfloat16, x1_scale=torch.empty(4, 3, 1, 2, dtype=torch.float8_e8m0fnu),
            x2_scale=torch.empty(3, 1, 7, 2, dtype=torch.float8_e8m0fnu))
        assert y.shape == (4, 3, 7) and y.dtype == torch.bfloat16


def test_transpose_quant_batchmatmul_rejects():
    x1 = torch.ones(2, 1, 64, dtype=torch.float8_e4m3fn)
    x2 = torch.ones(1, 64, 2, dtype=torch.float8_e4m3fn)
    s1, s2 = torch.ones(2), torch.ones(2)
    with pytest.raises(RuntimeError, match="x1's type supported for float8_e5m2 or float8_e4m3fn"):
        torch_npu.npu_transpose_quant_batchmatmul(x1.float(), x2, torch.float16, x1_scale=s1, x2_scale=s2)
    with pytest.raises(NotImplementedError, match="perm_x1"):
        torch_npu.npu_transpose_quant_batchmatmul(x1, x2, torch.float16, x1_scale=s1, x2_scale=s2, perm_x1=[0, 1, 2])
    with pytest.raises(NotImplementedError, match="bias"):
        torch_npu.npu_transpose_quant_batchmatmul(x1, x2, torch.float16, x1_scale=s1, x2_scale=s2, bias=s2)
    with pytest.raises(NotImplementedError, match="batch_split_factor"):
        torch_npu.npu_transpose_quant_batchmatmul(x1, x2, torch.float16, x1_scale=s1, x2_scale=s2,
                                                  batch_split_factor=2)
    with pytest.raises(NotImplementedError, match="dtype"):
        torch_npu.npu_transpose_quant_batchmatmul(x1, x2, torch.int8, x1_scale=s1, x2_scale=s2)


def rotate_quant_reference(x, rotation):
    """Blocks of k along each row times rotation (float64, cast to x's dtype), then
    scale = max|row| / 127 and y = round(row / scale) with ties to even, float64 loops."""
    m, n = x.shape
    k = rotation.shape[0]
    r = rotation.double()
    rotated = torch.zeros(m, n, dtype=torch.float64)
    for i in range(m):
        for blk in range(n // k):
            v = x[i, blk * k:(blk + 1) * k].double()
            rotated[i, blk * k:(blk + 1) * k] = v @ r
    rotated = rotated.to(x.dtype).double()
    scale = rotated.abs().amax(-1) / 127.0
    y = torch.zeros(m, n, dtype=torch.int64)
    for i in range(m):
        for j in range(n):
            y[i, j] = max(-128, min(127, round(float(rotated[i, j]) / float(scale[i]))))
    return y, scale


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", OUT)
def test_rotate_quant_int8(device, dtype):
    gen = torch.Generator().manual_seed(6)
    m, n, k = 4, 32, 8
    x = torch.randn(m, n, generator=gen).to(dtype)
    rotation = torch.randn(k, k, generator=gen)
    rotation = (rotation / rotation.norm(dim=1, keepdim=True)).to(dtype)
    y, scale = torch_npu.npu_rotate_quant(x.to(device), rotation.to(device), dst_dtype=torch.int8)
    assert y.dtype == torch.int8 and y.shape == (m, n) and scale.dtype == torch.float32 and scale.shape == (m,)
    ref_y, ref_scale = rotate_quant_reference(x, rotation)
    torch.testing.assert_close(scale.cpu().double(), ref_scale, rtol=1e-6, atol=0)
    # float32 vs float64 accumulation may flip the dtype rounding of a rotated value: off by one at most
    assert (y.cpu().long() - ref_y).abs().max() <= 1
    assert (y.cpu().long() == ref_y).float().mean() > 0.95


def test_rotate_quant_fake_and_rejects():
    with FakeTensorMode():
        y, scale = torch_npu.npu_rotate_quant(torch.empty(3, 16, dtype=torch.float16),
                                              torch.empty(4, 4, dtype=torch.float16))
        assert y.shape == (3, 16) and y.dtype == torch.int8 and scale.shape == (3,)
    x, r = torch.ones(2, 8, dtype=torch.float16), torch.eye(4, dtype=torch.float16)
    with pytest.raises(NotImplementedError, match="dst_dtype"):
        torch_npu.npu_rotate_quant(x, r, dst_dtype=torch.quint4x2)
    with pytest.raises(NotImplementedError, match="round_mode"):
        torch_npu.npu_rotate_quant(x, r, round_mode="round")
    with pytest.raises(RuntimeError, match="divisible"):
        torch_npu.npu_rotate_quant(torch.ones(2, 6, dtype=torch.float16), r)
