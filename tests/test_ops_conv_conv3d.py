"""npu_conv3d against F.conv3d."""
import pytest
import torch

import torch_npu

from _op_helpers import DEVICES


def ref_conv3d(x, w, b, stride, padding, dilation, groups):
    """Direct sum over kernel offsets of the zero-padded input."""
    n, c, *sp = x.shape
    o, cg, *k = w.shape
    xp = torch.zeros(n, c, *[s + 2 * p for s, p in zip(sp, padding)], dtype=x.dtype)
    xp[:, :, padding[0]:padding[0] + sp[0], padding[1]:padding[1] + sp[1], padding[2]:padding[2] + sp[2]] = x
    osz = [(s + 2 * p - d * (kk - 1) - 1) // st + 1 for s, p, d, kk, st in zip(sp, padding, dilation, k, stride)]
    out = torch.zeros(n, o, *osz, dtype=x.dtype)
    og = o // groups
    for g in range(groups):
        for kd in range(k[0]):
            for kh in range(k[1]):
                for kw in range(k[2]):
                    win = xp[:, g * cg:(g + 1) * cg,
                             kd * dilation[0]: kd * dilation[0] + stride[0] * (osz[0] - 1) + 1: stride[0],
                             kh * dilation[1]: kh * dilation[1] + stride[1] * (osz[1] - 1) + 1: stride[1],
                             kw * dilation[2]: kw * dilation[2] + stride[2] * (osz[2] - 1) + 1: stride[2]]
                    wk = w[g * og:(g + 1) * og, :, kd, kh, kw]  # (og, cg)
                    out[:, g * og:(g + 1) * og] += torch.einsum("ncdhw,oc->nodhw", win, wk)
    return out + b.view(1, -1, 1, 1, 1) if b is not None else out


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-4), (torch.float16, 2e-2), (torch.bfloat16, 8e-2)])
def test_conv3d(device, dtype, tol):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 4, 5, 6, 5, generator=g, dtype=torch.float64)
    w = torch.randn(6, 2, 2, 3, 2, generator=g, dtype=torch.float64) * 0.3
    b = torch.randn(6, generator=g, dtype=torch.float64)
    args = ([1, 2, 1], [1, 0, 1], [1, 1, 2], 2)
    q = lambda t: t.to(dtype)
    out = torch_npu.npu_conv3d(q(x).to(device), q(w).to(device), q(b).to(device), *args)
    exp = ref_conv3d(q(x).double(), q(w).double(), q(b).double(), *args)
    assert out.dtype == dtype and out.device.type == device
    torch.testing.assert_close(out.cpu().double(), exp, rtol=tol, atol=tol * 4)
    o = torch.empty(0, dtype=dtype, device=device)
    assert torch_npu.npu_conv3d(q(x).to(device), q(w).to(device), None, *args, out=o) is o
    torch.testing.assert_close(o.cpu().double(), exp - q(b).double().view(1, -1, 1, 1, 1), rtol=tol, atol=tol * 4)


def test_conv3d_grad_and_meta():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(1, 2, 3, 3, 3, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(2, 2, 2, 2, 2, generator=g, dtype=torch.float64, requires_grad=True)
    torch.autograd.gradcheck(lambda a, b: torch_npu.npu_conv3d(a, b, None, [1, 1, 1], [0, 0, 0], [1, 1, 1], 1), (x, w))
    m = torch_npu.npu_conv3d(torch.empty(2, 4, 8, 8, 8, device="meta"), torch.empty(3, 4, 3, 3, 3, device="meta"),
                             None, [2, 2, 2], [1, 1, 1], [1, 1, 1], 1)
    assert m.shape == (2, 3, 4, 4, 4)
