"""Behaviour switches of torch.npu: deterministic level and compatible
implementations (``use_compatible_impl``), plus ``npurt``."""
import types
import warnings

import torch

from torch_npu.npu import _option_store

__all__ = ["set_deterministic_level", "use_compatible_impl", "are_compatible_impl_enabled", "npurt"]

_deterministic_level = 0


def set_deterministic_level(level):
    r"""0: default; >= 1: deterministic algorithms (kept in step with
    ``torch.use_deterministic_algorithms``, which CPU kernels honour here)."""
    global _deterministic_level
    warnings.warn("After using 'torch_npu.npu.set_deterministic_level', please do not use "
                  "'torch.use_deterministic_algorithms' anymore, as it may cause unknown errors.")
    enabled = torch.are_deterministic_algorithms_enabled()
    if level == 0 and enabled:
        warnings.warn("The current configuration value of 'torch_npu.npu.set_deterministic_level' conflicts with "
                      "'torch.use_deterministic_algorithms'. 'torch.use_deterministic_algorithms' has been "
                      "configured to 'False'")
        torch.use_deterministic_algorithms(False)
    elif level >= 1 and not enabled:
        warnings.warn("The current configuration value of 'torch_npu.npu.set_deterministic_level' conflicts with "
                      "'torch.use_deterministic_algorithms'. 'torch.use_deterministic_algorithms' has been "
                      "configured to 'True'")
        torch.use_deterministic_algorithms(True)
    _deterministic_level = level


def _get_deterministic_level():
    r"""The level, re-synchronised with torch's switch if someone changed it."""
    enabled = torch.are_deterministic_algorithms_enabled()
    if _deterministic_level == 0 and enabled:
        set_deterministic_level(1)
    elif _deterministic_level >= 1 and not enabled:
        set_deterministic_level(0)
    return _deterministic_level


def use_compatible_impl(is_enable):
    r"""Prefer implementations that match PyTorch's CPU/CUDA results over the
    fastest NPU ones. Emulated ops already are PyTorch's CPU kernels, so the
    switch only changes what ``are_compatible_impl_enabled`` returns."""
    _option_store.set_options({"COMPATIBLE_IMPL": "enable" if is_enable else "disable"})


def are_compatible_impl_enabled():
    value = _option_store.get_option("COMPATIBLE_IMPL")
    return value is not None and value.decode() == "enable"


_npurt_module = types.ModuleType("torch_npu._C._npurt", "NPU runtime bindings (none on the emulated device).")


def npurt():
    r"""The NPU runtime bindings module; empty on the emulated device."""
    return _npurt_module
