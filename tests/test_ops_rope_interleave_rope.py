"""npu_interleave_rope against a float64 reference (rotate_half RoPE on de-interleaved channels)."""
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import torch_npu  # noqa: F401

from _op_helpers import DEVICES, close_tol as _close

ops = torch.ops.npu


LOW = [(torch.float16, 2e-3, 2e-3), (torch.bfloat16, 2e-2, 2e-2)]


def _rope_ref(x, cos, sin):
    x, cos, sin = x.double(), cos.double(), sin.double()
    b, n, s, d = x.shape
    out = torch.empty(b, n, s, d, dtype=torch.float64)
    half = d // 2
    for bi in range(b):
        for ni in range(n):
            for si in range(s):
                c = cos[bi, 0, si if cos.shape[2] > 1 else 0]
                sn = sin[bi, 0, si if sin.shape[2] > 1 else 0]
                q = [x[bi, ni, si, 2 * j] for j in range(half)] + [x[bi, ni, si, 2 * j + 1] for j in range(half)]
                for j in range(d):
                    rot = -q[j + half] if j < half else q[j - half]
                    out[bi, ni, si, j] = q[j] * c[j] + rot * sn[j]
    return out


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("s_cos", [1, 3])
def test_interleave_rope_float32(device, s_cos):
    torch.manual_seed(0)
    x = torch.randn(2, 2, 3, 8)
    cos, sin = torch.randn(2, 1, s_cos, 8), torch.randn(2, 1, s_cos, 8)
    out = torch_npu.npu_interleave_rope(x.to(device), cos.to(device), sin.to(device))
    assert out.device.type == device and out.shape == x.shape and out.dtype == x.dtype
    _close(out, _rope_ref(x, cos, sin), 1e-5, 1e-5)


@pytest.mark.parametrize("dtype,atol,rtol", LOW)
def test_interleave_rope_low_precision(dtype, atol, rtol):
    torch.manual_seed(1)
    x, cos, sin = (torch.randn(2, 2, 1, 64).to(dtype), torch.randn(2, 1, 1, 64).to(dtype),
                   torch.randn(2, 1, 1, 64).to(dtype))
    out = torch_npu.npu_interleave_rope(x.npu(), cos.npu(), sin.npu())
    assert out.dtype == dtype
    _close(out, _rope_ref(x, cos, sin), atol * 8, rtol)


def test_interleave_rope_errors_and_fake():
    with pytest.raises(RuntimeError, match="cos/sin must be"):
        torch_npu.npu_interleave_rope(torch.randn(1, 2, 3, 8), torch.randn(1, 2, 3, 8), torch.randn(1, 2, 3, 8))
    with FakeTensorMode():
        out = ops.npu_interleave_rope(torch.randn(3, 4, 5, 64, dtype=torch.bfloat16),
                                      torch.randn(3, 1, 5, 64, dtype=torch.bfloat16),
                                      torch.randn(3, 1, 5, 64, dtype=torch.bfloat16))
    assert out.shape == (3, 4, 5, 64) and out.dtype == torch.bfloat16
