"""npu_group_norm_silu against F.group_norm followed by SiLU."""
import math

import pytest
import torch

import torch_npu

from _op_helpers import DEVICES, close_ref as close


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_group_norm_silu(device, dtype):
    g = torch.Generator().manual_seed(9)
    x = torch.randn(2, 6, 3, 2, generator=g, dtype=torch.float64)
    w, b = torch.randn(6, generator=g, dtype=torch.float64), torch.randn(6, generator=g, dtype=torch.float64)
    xq, wq, bq = x.to(dtype), w.to(dtype), b.to(dtype)
    y, mean, rstd = torch_npu.npu_group_norm_silu(xq.to(device), wq.to(device), bq.to(device), 3, 1e-5)
    xd, wd, bd = xq.double(), wq.double(), bq.double()
    ey = torch.empty_like(xd)
    em = torch.empty(2, 3, dtype=torch.float64)
    er = torch.empty(2, 3, dtype=torch.float64)
    for n in range(2):
        for gi in range(3):
            vals = xd[n, 2 * gi:2 * gi + 2].flatten().tolist()
            mu = sum(vals) / len(vals)
            var = sum((v - mu) ** 2 for v in vals) / len(vals)
            r = 1 / math.sqrt(var + 1e-5)
            em[n, gi], er[n, gi] = mu, r
            for c in range(2 * gi, 2 * gi + 2):
                z = (xd[n, c] - mu) * r * wd[c] + bd[c]
                ey[n, c] = z / (1 + torch.exp(-z))
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-3, atol=2e-3)
    close(y, ey, dtype, device, **tol)
    close(mean, em, dtype, device, **tol)
    close(rstd, er, dtype, device, **tol)
    ym, mm, rm = torch_npu.npu_group_norm_silu(torch.empty(2, 6, 4, device="meta"), None, None, 2)
    assert ym.shape == (2, 6, 4) and mm.shape == (2, 2) and rm.shape == (2, 2)
