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

__all__ = ["config", "device_count", "device_name", "memory_per_device", "cann_version", "driver_used_bytes",
           "fallback_report", "reset_fallback_report", "kernel_registration"]


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


def fallback_report() -> list:
    """Ops that went through the emulated CPU fallback in this process.

    On real hardware these ops (ATen ops without an NPU kernel in torch_npu
    2.13.0) run on the CPU: arguments are copied to the host and results back.
    Each entry: ``{"op", "calls", "bytes_to_cpu", "bytes_to_npu", "ns"}`` (``ns``:
    wall time spent in the fallback, copies included), sorted by op name.
    """
    return [dict(e) for e in torch_npu._C._emu_fallback_report()]


def reset_fallback_report() -> None:
    """Clear the fallback counters (the once-per-op warnings stay printed)."""
    torch_npu._C._emu_reset_fallback_report()


def kernel_registration() -> dict:
    """How many ATen ops got an explicit zero-copy kernel and how many the
    emulated CPU fallback, when torch_npu was imported."""
    return dict(torch_npu._kernel_registration)
