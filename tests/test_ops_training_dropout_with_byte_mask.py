"""dropout_with_byte_mask: the dropout distribution, scaling and gradient."""
import pytest
import torch

from _op_helpers import DEVICES


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_dropout_with_byte_mask(device, dtype):
    x = (torch.rand(4000) + 0.5).to(dtype).to(device).requires_grad_()
    y = torch.ops.npu.dropout_with_byte_mask(x, 0.25, True)
    kept = y != 0
    assert y.dtype == dtype and y.device.type == device
    tol = {torch.float32: 1e-6, torch.float16: 2e-3, torch.bfloat16: 1e-2}[dtype]   # scale rounding
    torch.testing.assert_close(y[kept].float(), x[kept].float() / 0.75, rtol=tol, atol=0)
    assert abs(kept.float().mean().item() - 0.75) < 0.04           # 4000 draws: sd ~ 0.007
    y.sum().backward()
    torch.testing.assert_close(x.grad.float(), kept.float() / 0.75, rtol=tol, atol=0)
    assert torch.equal(torch.ops.npu.dropout_with_byte_mask(x, 0.25, False), x)
    assert torch.equal(torch.ops.npu.dropout_with_byte_mask(x, 0.0, True), x)
