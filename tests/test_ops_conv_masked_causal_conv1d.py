"""npu_masked_causal_conv1d (+ backward) against float64 references."""
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import torch_npu

from _op_helpers import DEVICES, close_scaled as close, close_tol as _close, randn_scaled as rand


def ref_causal_conv(x, w, mask):
    s_len, b_len, h_len = x.shape
    width = w.shape[0]
    out = torch.zeros(x.shape, dtype=torch.float64)
    for s in range(s_len):
        for b in range(b_len):
            if mask is not None and not bool(mask[b, s]):
                continue
            for h in range(h_len):
                acc = 0.0
                for k in range(width):
                    src = s - (width - 1 - k)
                    if src >= 0:
                        acc += float(w[k, h]) * float(x[src, b, h])
                out[s, b, h] = acc
    return out


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("masked", [False, True])
def test_masked_causal_conv1d(device, dtype, masked):
    s, b, h = 7, 2, 5
    x, w = rand((s, b, h), dtype, 11), rand((3, h), dtype, 12)
    mask = (torch.rand(b, s, generator=torch.Generator().manual_seed(13)) > 0.4) if masked else None
    out = torch_npu.npu_masked_causal_conv1d(x.to(device), w.to(device),
                                             mask=None if mask is None else mask.to(device))
    assert out.dtype == dtype and out.shape == x.shape and out.device.type == device
    close(out, ref_causal_conv(x, w, mask), dtype, 3)


def test_masked_causal_conv1d_grad_and_fake():
    s, b, h = 5, 2, 3
    x = rand((s, b, h), torch.float64, 14).requires_grad_()
    w = rand((3, h), torch.float64, 15).requires_grad_()
    mask = torch.tensor([[True, False, True, True, False], [True, True, True, False, True]])
    assert torch.autograd.gradcheck(lambda a, c: torch_npu.npu_masked_causal_conv1d(a, c, mask=mask), (x, w))
    # npu bf16 backward equals the float64 gradient of the reference formula
    xb, wb = x.detach().to(torch.bfloat16).npu().requires_grad_(), w.detach().to(torch.bfloat16).npu().requires_grad_()
    torch_npu.npu_masked_causal_conv1d(xb, wb, mask=mask.npu()).float().sum().backward()
    gx = torch.zeros(s, b, h, dtype=torch.float64)
    gw = torch.zeros(3, h, dtype=torch.float64)
    xd, wd = xb.detach().cpu().double(), wb.detach().cpu().double()
    for t in range(s):
        for bb in range(b):
            if mask[bb, t]:
                for k in range(3):
                    src = t - (2 - k)
                    if src >= 0:
                        gx[src, bb] += wd[k]
                        gw[k] += xd[src, bb]
    close(xb.grad, gx, torch.bfloat16, 4)
    close(wb.grad, gw, torch.bfloat16, 4)
    with FakeTensorMode():
        out = torch_npu.npu_masked_causal_conv1d(torch.empty(9, 2, 4, dtype=torch.float16),
                                                 torch.empty(3, 4, dtype=torch.float16),
                                                 mask=torch.empty(2, 9, dtype=torch.bool))
    assert out.shape == (9, 2, 4) and out.dtype == torch.float16
    with pytest.raises(RuntimeError, match="weight must be"):
        torch_npu.npu_masked_causal_conv1d(torch.randn(4, 1, 2), torch.randn(4, 2))


ops = torch.ops.npu


LOW = [(torch.float16, 2e-3, 2e-3), (torch.bfloat16, 2e-2, 2e-2)]


def _conv_grads_ref(g, x, w, mask):
    s, b, h = x.shape
    width = w.shape[0]
    g = g.double().clone()
    if mask is not None:
        for bi in range(b):
            for si in range(s):
                if not mask[bi, si]:
                    g[si, bi] = 0
    gx = torch.zeros(s, b, h, dtype=torch.float64)
    gw = torch.zeros(width, h, dtype=torch.float64)
    for si in range(s):
        for k in range(width):
            src = si - (width - 1 - k)
            if src >= 0:
                gx[src] += w[k].double() * g[si]
                gw[k] += (g[si] * x[src].double()).sum(0)
    return gx, gw


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("with_mask", [False, True])
def test_masked_causal_conv1d_backward(device, with_mask):
    torch.manual_seed(6)
    x, w, g = torch.randn(7, 2, 4), torch.randn(3, 4), torch.randn(7, 2, 4)
    mask = (torch.rand(2, 7) > 0.3) if with_mask else None
    gx, gw = torch_npu.npu_masked_causal_conv1d_backward(g.to(device), x.to(device), w.to(device),
                                                        mask=None if mask is None else mask.to(device))
    rx, rw = _conv_grads_ref(g, x, w, mask)
    _close(gx, rx, 1e-5, 1e-5)
    _close(gw, rw, 1e-5, 1e-5)


@pytest.mark.parametrize("dtype,atol,rtol", LOW)
def test_masked_causal_conv1d_backward_low_precision_matches_forward_autograd(dtype, atol, rtol):
    torch.manual_seed(7)
    x, w, g = torch.randn(9, 2, 8).to(dtype), torch.randn(3, 8).to(dtype), torch.randn(9, 2, 8).to(dtype)
    gx, gw = torch_npu.npu_masked_causal_conv1d_backward(g, x, w)
    assert gx.dtype == dtype and gw.dtype == dtype
    rx, rw = _conv_grads_ref(g, x, w, None)
    _close(gx, rx, atol * 4, rtol)
    _close(gw, rw, atol * 20, rtol * 2)


def test_masked_causal_conv1d_backward_fake_and_errors():
    with FakeTensorMode():
        gx, gw = ops.npu_masked_causal_conv1d_backward(torch.randn(5, 2, 4).half(), torch.randn(5, 2, 4).half(),
                                                       torch.randn(3, 4).half())
    assert gx.shape == (5, 2, 4) and gw.shape == (3, 4) and gx.dtype == torch.float16
    with pytest.raises(RuntimeError, match="grad_output shape"):
        torch_npu.npu_masked_causal_conv1d_backward(torch.randn(4, 2, 4), torch.randn(5, 2, 4), torch.randn(3, 4))
