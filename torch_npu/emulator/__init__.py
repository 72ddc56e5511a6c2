"""Facts that exist only because the NPU is emulated.

Configured by environment variables (torch_npu._settings; docs/settings.md
lists every variable the package reads):

{settings}
"""
import torch_npu
from torch_npu import _settings
from torch_npu import version as _version
from torch_npu.emulator import _numerics

if __doc__:  # None under python -OO
    __doc__ = __doc__.format(settings=_settings.listing(_settings.EMULATOR_SETTINGS))

__all__ = ["settings", "config", "device_count", "device_name", "memory_per_device", "cann_version",
           "driver_used_bytes",
           "fallback_report", "reset_fallback_report", "kernel_registration",
           "set_numerics", "get_numerics", "numerics_report", "reset_numerics_report"]


def settings() -> dict:
    """The emulator's own settings (names in this module's docstring): name -> parsed value."""
    return {name: _settings.get(name) for name in _settings.EMULATOR_SETTINGS}


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
    """How many ATen ops got an explicit zero-copy kernel (``zero_copy_explicit``: the
    boxed one; ``unboxed``: the unboxed ones of the hottest ops) and how many the
    emulated CPU fallback (``emulated_fallback``), when torch_npu was imported."""
    return dict(torch_npu._kernel_registration)


def set_numerics(mode: str) -> None:
    """Choose how npu ops round: ``"exact"`` (the default) computes bitwise what
    the CPU computes; ``"chip"`` rounds the fp32 inputs of the matmul and
    convolution families as a 910B cube unit does (HF32 or fp16, as
    ``torch.npu.conv.allow_hf32``, ``torch.npu.matmul.allow_hf32``,
    ``torch.npu.matmul.cube_math_type`` and ``ACL_PRECISION_MODE`` select;
    docs/numerics.md). Per process, like those switches. Starts from
    ``TORCH_NPU_EMU_NUMERICS``. Raises ValueError for another mode, or for
    ``"chip"`` when the emulated device is not an Atlas A2/A3 SoC."""
    _numerics.set_mode(mode)


def get_numerics() -> str:
    """The current numerics mode: ``"exact"`` or ``"chip"``."""
    return _numerics.get_mode()


def numerics_report() -> list:
    """Ops that ran with reduced precision in chip mode since the last reset.

    One entry per ATen op, sorted by name: ``{"op", "calls", "rounding",
    "elements", "changed"}``. ``calls`` counts the calls whose fp32 inputs were
    rounded; ``rounding`` is ``"hf32"``, ``"fp16"`` or both joined by ``/``;
    ``elements`` is how many input elements were rounded (the product's inputs:
    e.g. both matrices of ``mm``, not the bias of ``addmm``); ``changed`` is how
    many of them the rounding changed (bit pattern differs). Calls that kept
    fp32 (switch off, non-fp32 inputs) are not counted.
    """
    return _numerics.report()


def reset_numerics_report() -> None:
    """Clear the counts of ``numerics_report``."""
    _numerics.reset_report()
