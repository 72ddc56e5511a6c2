"""npu_clipped_swiglu against the documented ClippedSwiglu computation written here with
plain loops over rows (float64)."""
import math

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import torch_npu

from _op_helpers import DEVICES


def ref(x, dim, alpha, limit, bias, interleaved, valid_rows=None):
    d = dim % x.dim()
    pre = math.prod(x.shape[:d])
    rows = x.double().reshape(pre, -1).tolist()
    out = []
    for r, row in enumerate(rows):
        if interleaved:
            a, b = row[0::2], row[1::2]
        else:
            a, b = row[:len(row) // 2], row[len(row) // 2:]
        vals = []
        for ai, bi in zip(a, b):
            ai = min(ai, limit)
            bi = max(min(bi, limit), -limit)
            vals.append(ai / (1 + math.exp(-alpha * ai)) * (bi + bias))
        out.append(vals if valid_rows is None or r < valid_rows else [0.0] * len(vals))
    shape = list(x.shape)
    shape[d] //= 2
    return torch.tensor(out, dtype=torch.float64).reshape(shape)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.float16, 2e-3), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("shape,dim,interleaved", [((4, 10), -1, True), ((4, 10), -1, False),
                                                   ((3, 4, 5), 1, True), ((2, 6, 3), -2, False)])
def test_forward(device, dtype, tol, shape, dim, interleaved):
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(shape, generator=g) * 5).to(dtype)        # many values beyond limit=3
    y = torch_npu.npu_clipped_swiglu(x.to(device), dim=dim, alpha=1.5, limit=3.0, bias=0.5, interleaved=interleaved)
    expected = ref(x, dim, 1.5, 3.0, 0.5, interleaved)
    assert y.dtype == dtype and y.device.type == device and y.shape == expected.shape
    torch.testing.assert_close(y.cpu().double(), expected, rtol=tol, atol=tol * 4)


@pytest.mark.parametrize("device", DEVICES)
def test_group_index_defaults_and_grad(device):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(6, 8, generator=g, dtype=torch.float64) * 4
    gi = torch.tensor([1, 3], dtype=torch.int64)
    y = torch_npu.npu_clipped_swiglu(x.to(device), group_index=gi.to(device))
    torch.testing.assert_close(y.cpu(), ref(x, -1, 1.702, 7.0, 1.0, True, valid_rows=4))
    xg = x.to(device).requires_grad_()
    torch.autograd.gradcheck(lambda t: torch_npu.npu_clipped_swiglu(t, alpha=1.2, limit=2.5, interleaved=False), (xg,))


def test_errors_and_meta():
    with pytest.raises(RuntimeError, match="even"):
        torch_npu.npu_clipped_swiglu(torch.zeros(3, 5))
    with FakeTensorMode():
        y = torch_npu.npu_clipped_swiglu(torch.empty(2, 6, 4, dtype=torch.bfloat16), dim=1)
        assert y.shape == (2, 3, 4) and y.dtype == torch.bfloat16
