"""npu_group_norm_swish and npu_group_norm_swish_grad against the documented formula written
here in float64 (GroupNorm with biased variance, then h / (1 + exp(-scale * h)))."""
import numpy as np
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import torch_npu
from torch_npu.testing.common_utils import create_common_tensor
from torch_npu.testing.testcase import TestCase

from _op_helpers import DEVICES


def ref_forward(x, groups, w, b, eps, s):
    n, c = x.shape[:2]
    xg = x.double().reshape(n, groups, -1)
    mean = xg.mean(-1)
    var = ((xg - mean[..., None]) ** 2).mean(-1)
    rstd = 1 / torch.sqrt(var + eps)
    shape = [1, c] + [1] * (x.dim() - 2)
    h = ((xg - mean[..., None]) * rstd[..., None]).reshape(x.shape) * w.double().view(shape) + b.double().view(shape)
    return h / (1 + torch.exp(-s * h)), mean, rstd


class TestGroupNormSwishForward(TestCase):
    """Inputs from torch_npu.testing's create_common_tensor: the same values on CPU and npu."""

    def test_forward(self):
        for shape, groups, scale in [((2, 6, 5), 3, 1.0), ((3, 4, 2, 3), 2, 0.7), ((4, 8), 8, 1.5)]:
            xs = create_common_tensor([np.float32, -1, shape], -1.5, 2.5)
            ws = create_common_tensor([np.float32, -1, (shape[1],)], -1.5, 1.5)
            bs = create_common_tensor([np.float32, -1, (shape[1],)], -1.5, 1.5)
            for dtype, tol in [(torch.float32, 1e-5), (torch.float16, 4e-3), (torch.bfloat16, 3e-2)]:
                x, w, b = xs[0].to(dtype), ws[0].to(dtype), bs[0].to(dtype)
                ry, rm, rr = ref_forward(x, groups, w, b, 1e-5, scale)
                for i, device in enumerate(DEVICES):
                    with self.subTest(shape=shape, dtype=dtype, device=device):
                        y, mean, rstd = torch_npu.npu_group_norm_swish(
                            xs[i].to(dtype), groups, ws[i].to(dtype), bs[i].to(dtype), eps=1e-5, swish_scale=scale)
                        self.assertEqual(y.dtype, dtype)
                        self.assertEqual(y.device.type, device)
                        self.assertEqual(mean.shape, (shape[0], groups))
                        self.assertEqual((mean.dtype, rstd.dtype), (torch.float32, torch.float32))
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
