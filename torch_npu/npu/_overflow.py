"""Float-overflow APIs (``torch_npu.npu.utils`` in the real plugin).

Real semantics mirrored here:

* ``is_support_inf_nan()``: True on Ascend910B/910_93-class SoCs (INF_NAN mode, the default),
  unless ``INF_NAN_MODE_FORCE_DISABLE=1``; older SoCs only with ``INF_NAN_MODE_ENABLE=1``.
* In INF_NAN mode ``get_npu_overflow_flag()`` raises RuntimeError and
  ``clear_npu_overflow_flag()`` only warns (no-op); ``npu_check_overflow(grad)`` checks the
  sum of ``grad`` for inf/NaN.
* In saturation mode (forced off) the flag APIs read/clear the device float-status
  register.  The emulator has no saturation hardware: its register is a process-wide flag
  that no kernel ever sets, so ``get_npu_overflow_flag()`` returns False there.
"""
import warnings


import torch_npu
from torch_npu import _settings

__all__ = []

_float_status = [False]


def _soc_supports_inf_nan(name):
    name = str(name)
    if name.startswith("Ascend310B"):
        return False
    return name.startswith("Ascend910B") or name.startswith("Ascend910_93")


def is_support_inf_nan():
    torch_npu.npu._lazy_init()
    if _settings.get("INF_NAN_MODE_FORCE_DISABLE"):
        return False
    if _soc_supports_inf_nan(torch_npu.npu.get_device_name()):
        return True
    return _env_on("INF_NAN_MODE_ENABLE")


def get_npu_overflow_flag():
    if is_support_inf_nan():
        raise RuntimeError("Unsupported api when soc_version >= Ascend910B1, please use npu_check_overflow")
    return bool(_float_status[0])


def clear_npu_overflow_flag():
    if is_support_inf_nan():
        warnings.warn("When soc_version >= Ascend910B1, clear_npu_overflow_flag is useless, please remove it.")
        return
    _float_status[0] = False


def npu_check_overflow(grad):
    if is_support_inf_nan():
        cpu_sum = float(grad.float().sum())
        return cpu_sum in (float("inf"), -float("inf")) or cpu_sum != cpu_sum
    ret = get_npu_overflow_flag()
    if ret:
        clear_npu_overflow_flag()
    return ret
