"""Device fault recovery (``stop_device`` / ``restart_device``).

On hardware these stop a device after an uncorrectable memory error (UCE) or
a link failure and bring it back. The emulated device never faults, so the
calls validate their arguments, synchronize, and only record whether the
device is stopped (ops on a stopped device are not refused: that needs the
C++ runtime).
"""
import torch_npu
from torch_npu.utils._error_code import ErrCode, pta_error

__all__ = ["stop_device", "restart_device"]

_stopped = set()


def _check_device(device_id):
    if not isinstance(device_id, int) or not 0 <= device_id < torch_npu.npu.device_count():
        raise AssertionError("Invalid device id" + pta_error(ErrCode.VALUE))


def stop_device(device_id):
    r"""Stop ``device_id``: returns 0 on success, as the runtime call does."""
    _check_device(device_id)
    torch_npu.npu._lazy_init()
    torch_npu.npu.synchronize(device_id)
    _stopped.add(device_id)
    return 0


def restart_device(device_id: int, rebuild_all_resources: bool = False, disable_tensor_unsafe_check: bool = False):
    r"""Restart a stopped device (allowed on a running one too; nothing to rebuild here)."""
    _check_device(device_id)
    torch_npu.npu._lazy_init()
    _stopped.discard(device_id)


def _is_stopped(device_id) -> bool:
    return device_id in _stopped
