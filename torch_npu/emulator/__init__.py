"""Facts that exist only because the NPU is emulated.

Configured by environment variables read once, at the first device use:

- ``TORCH_NPU_EMU_DEVICE_COUNT`` — number of emulated NPUs (default 8).
- ``TORCH_NPU_EMU_DEVICE_NAME`` — device name (default ``Ascend910B4``).
- ``TORCH_NPU_EMU_MEMORY`` — capacity per device, e.g. ``64GiB``, ``512MiB``
  or a number of bytes (default 64 GiB). Host memory is used only as tensors
  are allocated.

- ``TORCH_NPU_EMU_AUTOGRAD_THREADS`` — ``1`` keeps PyTorch's per-device
  autograd threads for npu backward (default: the calling thread runs it).

``ASCEND_RT_VISIBLE_DEVICES`` then selects among the emulated devices as on
hardware.
"""
import torch_npu
from torch_npu import version as _version

__all__ = ["config", "device_count", "device_name", "memory_per_device", "cann_version", "driver_used_bytes"]


def config() -> dict:
    """The emulated machine: physical and visible device counts, name, capacity."""
    return dict(torch_npu._C._emu_config())


def device_count() -> int:
    """Emulated devices before ASCEND_RT_VISIBLE_DEVICES is applied."""
    return config()["physical_device_count"]


def device_name() -> str:
    return config()["device_name"]


def memory_per_device() -> int:
    return config()["memory_per_device"]


def cann_version() -> str:
    """The CANN version this emulator reports as installed."""
    return _version.cann


def driver_used_bytes(device: int) -> int:
    """Bytes the emulated driver has handed to the caching allocator on ``device``."""
    return torch_npu._C._emu_driver_used_bytes(device)
