"""npu_group_norm_swish and npu_group_norm_swish_grad against the documented formula written
here in float64 (GroupNorm with biased variance, then h / (1 + exp(-scale * h)))."""
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import torch_npu

DEVICES = ["cpu", "npu"]


def ref_forward(x, groups, w, b, eps, s):
    n, c = x.shape[:2]
    xg = x.double().reshape(n, groups, -1)
    mean = xg.mean(-1)
    var = ((xg - mean[..., None]) ** 2).mean(-1)
    rstd = 1 / torch.sqrt(var + eps)
    shape = [1, c] + [1] * (x.dim() - 2)
    h = ((xg - mean[..., None]) * rstd[..., None]).reshape(x.shape) * w.double().view(shape) + b.double().view(shape)
    return h / (1 + torch.exp(-s * h)), mean, rstd


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.float16, 4e-3), (torch.bfloat16, 3e-2)])
@pytest.mark.parametrize("shape,groups,scale", [((2, 6, 5), 3, 1.0), ((3, 4, 2, 3), 2, 0.7), ((4, 8), 8, 1.5)])
def test_forward(device, dtype, tol, shape, groups, scale):
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(shape, generator=g) * 2 + 0.5).to(dtype)
    w = torch.randn(shape[1], generator=g).to(dtype)
    b = torch.randn(shape[1], generator=g).to(dtype)
    y, mean, rstd = torch_npu.npu_group_norm_swish(x.to(device), groups, w.to(device), b.to(device),
                                                   eps=1e-5, swish_scale=scale)
    ry, rm, rr = ref_forward(x, groups, w, b, 1e-5, scale)
    assert y.dtype == dtype and y.device.type == device and mean.shape == (shape[0], groups)
    assert mean.dtype == torch.float32 and rstd.dtype == torch.float32
    torch.testing.assert_close(y.cpu().double(), ry, rtol=tol, atol=tol)
    torch.testing.assert_close(mean.cpu().double(), rm, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(rstd.cpu().double(), rr, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_backward_gradcheck_and_grad_op(device):
    g = torch.Generator().manual_seed(1)
    shape, groups, s = (2, 4, 3), 2, 0.8
    x = torch.randn(shape, generator=g, dtype=torch.float64)
    w = torch.randn(4, generator=g, dtype=torch.float64)
    b = torch.randn(4, generator=g, dtype=torch.float64)
    xs = [t.to(device).requires_grad_() for t in (x, w, b)]
    torch.autograd.gradcheck(lambda p, q, r: torch_npu.npu_group_norm_swish(p, groups, q, r, swish_scale=s)[0], xs)
    # the grad op from the saved statistics equals autograd of the float64 reference
    refs = [t.clone().requires_grad_() for t in (x, w, b)]
    ry = ref_forward(refs[0], groups, refs[1], refs[2], 1e-5, s)[0]
    dy = torch.randn(shape, generator=g, dtype=torch.float64)
    expected = torch.autograd.grad(ry, refs, dy)
    _, mean, rstd = torch_npu.npu_group_norm_swish(x.to(device), groups, w.to(device), b.to(device), swish_scale=s)
    got = torch.ops.npu.npu_group_norm_swish_grad(dy.to(device), x.to(device), groups, w.to(device), b.to(device),
                                                  mean, rstd, [True, True, True], s)
    for a, e in zip(got, expected):
        assert a.device.type == device
        torch.testing.assert_close(a.cpu(), e, rtol=1e-7, atol=1e-9)


def test_errors_and_meta():
    with pytest.raises(RuntimeError, match="divisible"):
        torch_npu.npu_group_norm_swish(torch.zeros(2, 6, 3), 4, torch.ones(6), torch.zeros(6))
    with pytest.raises(RuntimeError, match="weight"):
        torch_npu.npu_group_norm_swish(torch.zeros(2, 6, 3), 3, torch.ones(5), torch.zeros(6))
    with FakeTensorMode():
        y, m, r = torch_npu.npu_group_norm_swish(torch.empty(3, 8, 5, dtype=torch.bfloat16), 4,
                                                 torch.empty(8, dtype=torch.bfloat16),
                                                 torch.empty(8, dtype=torch.bfloat16))
        assert y.shape == (3, 8, 5) and y.dtype == torch.bfloat16 and m.shape == (3, 4) and r.shape == (3, 4)
