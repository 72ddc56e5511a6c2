"""Float-status ops (torch_npu/op_plugin/float_status.py): 8-element float32 status, the
emulated register shared with torch.npu's overflow-flag APIs."""
import pytest
import torch

import torch_npu
from torch_npu.npu import _overflow


@pytest.mark.parametrize("device", ["cpu", "npu"])
def test_alloc_get_clear(device):
    x = torch.randn(1, 2, 3, device=device)
    status = torch_npu.npu_alloc_float_status(x)
    assert status.dtype == torch.float32 and status.device.type == device
    assert status.cpu().tolist() == [0.0] * 8
    assert torch_npu.npu_get_float_status(status).cpu().tolist() == [0.0] * 8
    assert torch_npu.npu_clear_float_status(status).cpu().tolist() == [0.0] * 8


def test_register_is_read_and_cleared():
    status = torch_npu.npu_alloc_float_status(torch.rand(2).npu())
    _overflow._float_status[0] = True  # what a saturating kernel would do
    try:
        assert torch_npu.npu_get_float_status(status).cpu().tolist() == [1.0] + [0.0] * 7
        torch_npu.npu_clear_float_status(status)
        assert _overflow._float_status[0] is False
        assert torch_npu.npu_get_float_status(status).cpu().tolist() == [0.0] * 8
    finally:
        _overflow._float_status[0] = False


def test_meta():
    out = torch_npu.npu_get_float_status(torch.empty(8, device="meta"))
    assert out.shape == (8,) and out.device.type == "meta"
