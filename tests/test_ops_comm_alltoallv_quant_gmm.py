"""npu_alltoallv_quant_gmm / npu_quant_gmm_alltoallv (MX path) on one rank against a float64
reference."""
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import torch_npu

from _op_helpers import DEVICES, e8m0, small_int_fp8 as fp8


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
