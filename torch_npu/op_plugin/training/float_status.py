"""Float-status register ops: npu_alloc_float_status, npu_get_float_status, npu_clear_float_status.

On saturation-mode SoCs the AI cores set a float-status register on overflow; these ops
allocate a buffer for it, read it and clear it. The emulated register is the one behind
``torch.npu.get_npu_overflow_flag`` (``torch_npu.npu._overflow``): a process-wide flag that no
emulated kernel sets (CPU kernels produce inf/NaN instead of saturating), so reads give zeros
unless a test sets it. The status is 8 float32 values; element 0 carries the flag.

Reading and clearing the register are opaque ops (``_registry.opaque``): under
``torch.compile`` they stay graph nodes that touch the register when the graph runs, instead
of the flag value seen while tracing being baked in; clearing is marked side-effecting so that
an unused result does not let the compiler drop it.

``_amp_foreach_non_finite_check``: True when any of the scaled gradients holds an inf or NaN
(the check AMP's GradScaler runs).
"""
import torch

from torch_npu.op_plugin._common import check
from torch_npu.op_plugin._registry import impl, opaque

__all__ = []

_STATUS_LEN = 8


def _register():
    from torch_npu.npu import _overflow
    return _overflow._float_status


def _status(like):
    status = torch.zeros(_STATUS_LEN, dtype=torch.float32, device=like.device)
    if like.device.type != "meta" and _register()[0]:
        status[0] = 1.0
    return status


@impl("npu_alloc_float_status")
def npu_alloc_float_status(self):
    """A float32 tensor of 8 zeros on ``self``'s device (the status buffer); ``self`` only
    selects the device."""
    return torch.zeros(_STATUS_LEN, dtype=torch.float32, device=self.device)


def _status_fake(self, mode=0):
    return self.new_empty((_STATUS_LEN,), dtype=torch.float32)


@opaque("npu_get_float_status", fake=_status_fake)
def npu_get_float_status(self, mode=0):
    """Reads the float-status register into a new 8-element float32 tensor: all zeros when no
    overflow was recorded, element 0 = 1 when one was."""
    check(self.dim() == 1, "npu_get_float_status", "self must be the 1-D status buffer, got %s", (tuple(self.shape),))
    return _status(self)


@opaque("npu_clear_float_status", fake=_status_fake)
def npu_clear_float_status(self, mode=0):
    """Clears the float-status register and returns the (now zero) 8-element float32 status."""
    _register()[0] = False
    return torch.zeros(_STATUS_LEN, dtype=torch.float32, device=self.device)


torch.fx.node.has_side_effect(torch.ops.npu.npu_clear_float_status.default)


@impl("_amp_foreach_non_finite_check")
def _amp_foreach_non_finite_check(scaled_grads):
    """True when any of ``scaled_grads`` holds an inf or NaN (reads the flag on the host)."""
    return any(bool((~torch.isfinite(g)).any()) for g in scaled_grads)
