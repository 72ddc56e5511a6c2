"""Round 6 quant ops (issue 3): npu_transpose_quant_batchmatmul against float64 loops of the
documented K-C and MX formulas (aclnnTransposeQuantBatchMatMul, CANN ops-nn kernel golden)."""
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import torch_npu

DEVICES = ["cpu", "npu"]
FLOAT8 = [torch.float8_e4m3fn, torch.float8_e5m2]
OUT = [torch.float16, torch.bfloat16]


def fp8(shape, dtype, gen):
    # small integers are exact in both float8 formats
    return torch.randint(-5, 6, shape, generator=gen).to(dtype)


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


def e8m0(raw):
    return 2.0 ** (raw - 127)


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


def mx_rows_matmul_reference(x, sx_raw, w, sw_raw):
    """(x * sx) @ (w * sw) with scale [row, k // 64, (k % 64) // 32] and [k // 64, col, (k % 64) // 32]."""
    rows, k = x.shape
    n = w.shape[1]
    y = torch.zeros(rows, n, dtype=torch.float64)
    xd, wd = x.double(), w.double()
    for t in range(rows):
        for c in range(n):
            total = 0.0
            for kk in range(k):
                g, p = kk // 64, (kk % 64) // 32
                total += float(xd[t, kk]) * e8m0(int(sx_raw[t, g, p])) * float(wd[kk, c]) * e8m0(int(sw_raw[g, c, p]))
            y[t, c] = total
    return y


def mx_gmm_inputs(gen, counts, e, h1, n1, x_dtype, w_dtype):
    rows = sum(counts)
    g = (h1 + 63) // 64
    x = fp8((rows, h1), x_dtype, gen)
    w = fp8((e, h1, n1), w_dtype, gen)
    sx = torch.randint(124, 131, (rows, g, 2), generator=gen, dtype=torch.uint8)
    sw = torch.randint(124, 131, (e, g, n1, 2), generator=gen, dtype=torch.uint8)
    return x, w, sx, sw


def grouped_reference(x, w, sx, sw, counts):
    out, start = [], 0
    for j, c in enumerate(counts):
        out.append(mx_rows_matmul_reference(x[start:start + c], sx[start:start + c], w[j], sw[j]))
        start += c
    return torch.cat(out)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op_name", ["npu_alltoallv_quant_gmm", "npu_quant_gmm_alltoallv"])
def test_alltoallv_quant_gmm_single_rank_mx(device, op_name):
    gen = torch.Generator().manual_seed(7)
    counts, e, h1, n1, h2, n2 = [3, 2], 2, 96, 4, 64, 3        # H1 = 96: a partial last 64-block
    x, w, sx, sw = mx_gmm_inputs(gen, counts, e, h1, n1, torch.float8_e4m3fn, torch.float8_e5m2)
    mm_x, mm_w = fp8((2, h2), torch.float8_e4m3fn, gen), fp8((h2, n2), torch.float8_e5m2, gen)
    msx = torch.randint(124, 131, (2, 1, 2), generator=gen, dtype=torch.uint8)
    msw = torch.randint(124, 131, (1, n2, 2), generator=gen, dtype=torch.uint8)
    e8 = torch.float8_e8m0fnu
    kwargs = dict(mm_x=mm_x.to(device), mm_weight=mm_w.to(device), mm_x_scale=msx.view(e8).to(device),
                  mm_weight_scale=msw.view(e8).to(device), gmm_x_quant_mode=6, gmm_weight_quant_mode=6,
                  mm_x_quant_mode=6, mm_weight_quant_mode=6, group_size=[1, 1, 32], mm_y_dtype=torch.bfloat16)
    if op_name == "npu_alltoallv_quant_gmm":
        kwargs["permute_out_flag"] = True
    outs = getattr(torch_npu, op_name)(x.to(device), w.to(device), sx.view(e8).to(device), sw.view(e8).to(device),
                                       "", 1, counts, counts, torch.bfloat16, **kwargs)
    gmm_y, mm_y = outs[0], outs[1]
    assert gmm_y.dtype == mm_y.dtype == torch.bfloat16 and gmm_y.shape == (5, n1) and mm_y.shape == (2, n2)
    torch.testing.assert_close(gmm_y.cpu().double(), grouped_reference(x, w, sx, sw, counts), rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(mm_y.cpu().double(), mx_rows_matmul_reference(mm_x, msx, mm_w, msw),
                               rtol=1e-2, atol=1e-2)
    if op_name == "npu_alltoallv_quant_gmm":
        # one rank: the exchange and the (rank, expert) -> (expert, rank) permute are identities
        assert outs[2].dtype == x.dtype and torch.equal(outs[2].cpu().view(torch.uint8), x.view(torch.uint8))


def test_alltoallv_quant_gmm_fake_and_rejects():
    e8 = torch.float8_e8m0fnu
    with FakeTensorMode():
        x = torch.empty(5, 64, dtype=torch.float8_e4m3fn)
        w = torch.empty(2, 64, 3, dtype=torch.float8_e4m3fn)
        sx, sw = torch.empty(5, 1, 2, dtype=e8), torch.empty(2, 1, 3, 2, dtype=e8)
        gmm_y, mm_y, perm = torch_npu.npu_alltoallv_quant_gmm(x, w, sx, sw, "", 1, [3, 2], [3, 2], torch.float16,
                                                              permute_out_flag=True)
        assert gmm_y.shape == (5, 3) and gmm_y.dtype == torch.float16 and perm.shape == (5, 64)
        y, _ = torch_npu.npu_quant_gmm_alltoallv(x, w, sx, sw, "", 1, [3, 2], [3, 2], torch.float16)
        assert y.shape == (5, 3) and y.dtype == torch.float16
    x = torch.zeros(2, 64, dtype=torch.float8_e4m3fn)
    w = torch.zeros(1, 64, 2, dtype=torch.float8_e4m3fn)
    with pytest.raises(NotImplementedError, match="gmm_x_quant_mode=1"):
        torch_npu.npu_alltoallv_quant_gmm(x, w, torch.ones(1), torch.ones(1), "", 1, [2], [2], torch.float16,
                                          gmm_x_quant_mode=1, gmm_weight_quant_mode=1)
    with pytest.raises(NotImplementedError, match="comm_quant_scale"):
        torch_npu.npu_quant_gmm_alltoallv(x, w, torch.ones(2, 1, 2).to(e8), torch.ones(1, 1, 2, 2).to(e8), "", 1,
                                          [2], [2], torch.float16, comm_quant_scale=torch.ones(1))
