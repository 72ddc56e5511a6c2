"""Chip-numerics mode: fp32 cube ops round their inputs as a 910B does.

By default (``exact``) the emulated npu computes bitwise what the CPU
computes. In ``chip`` mode the matmul and convolution families round their
fp32 inputs to the precision the cube unit uses (HF32 or fp16, chosen by
``torch.npu.conv.allow_hf32``, ``torch.npu.matmul.allow_hf32``,
``torch.npu.matmul.cube_math_type`` and ``ACL_PRECISION_MODE``) before the
product, which then accumulates in fp32. docs/numerics.md states every rule
with its public source, and what is not modelled.

The rules live here (``cube_math_type``, ``rounding``); the kernels are C++
(csrc/aten/ChipNumericsKernels.cpp). Python pushes each family's rounding to
them whenever it can change: on ``set_mode`` and on every option change
(``_option_store.set_options``, where every switch lands). Exact mode costs
nothing: the chip kernels exist only while chip mode is on, as an IMPL
library on the PrivateUse1 key that ``set_numerics("chip")`` creates and
``set_numerics("exact")`` destroys (the dispatcher then runs the previous
kernels again). The report is counted in C++.
"""
import enum
import threading
from typing import List, Optional

import torch_npu
from torch_npu import _settings

__all__ = []

MODES = ("exact", "chip")


class _Rounding(enum.IntEnum):
    # values are the kind argument of torch_npu._C._emu_round_cube_input and
    # _emu_set_cube_rounding, and the bit of the kinds mask of _emu_numerics_report
    HF32 = 0
    FP16 = 1


# torch_npu's CubeMathType values (torch.npu.CubeMathType; aclnn cubeMathType).
_KEEP_DTYPE, _ALLOW_FP32_DOWN_PRECISION, _USE_FP16, _USE_HF32, _USE_FP32_ADD = 0, 1, 2, 3, 4

# What each cubeMathType does to fp32 inputs on Atlas A2/A3 (910B, 910_93):
# aclnnMatmul / aclnnConvolution parameter docs. USE_FP32_ADD is documented
# only as "high-precision mode": fp32 inputs are kept.
_ROUNDING_OF_CUBE_MATH_TYPE = {
    _KEEP_DTYPE: None,
    _ALLOW_FP32_DOWN_PRECISION: _Rounding.HF32,
    _USE_FP16: _Rounding.FP16,
    _USE_HF32: _Rounding.HF32,
    _USE_FP32_ADD: None,
}

# torch_npu's CalcuOpUtil::GetCubeMathType: (allow_hf32, allow_fp32_to_fp16) -> cubeMathType.
_CUBE_MATH_TYPE_OF_SWITCHES = {
    (False, False): _KEEP_DTYPE,
    (False, True): _USE_FP16,
    (True, False): _USE_HF32,
    (True, True): _ALLOW_FP32_DOWN_PRECISION,
}

_lock = threading.Lock()
_mode = "exact"


def _chip_modelled(device_name: str) -> bool:
    """Chip mode models the Atlas A2 (Ascend910B*) and A3 (Ascend910_93*) SoCs only."""
    return device_name.startswith("Ascend910B") or device_name.startswith("Ascend910_93")


def _allow_fp32_to_fp16() -> bool:
    """torch_npu's IsAllowFP32ToFP16: ACL_PRECISION_MODE as set by set_option; unset (or
    another value), the SoC default, which is must_keep_origin_dtype from Ascend910B1 on."""
    from torch_npu.npu import _option_store
    value = _option_store.get_option("ACL_PRECISION_MODE")
    if value is not None:
        if value == b"must_keep_origin_dtype":
            return False
        if value == b"allow_fp32_to_fp16":
            return True
    return False  # chip mode runs only on SoCs from Ascend910B1 on (_chip_modelled)


def _flag(option: str, default: bool) -> bool:
    from torch_npu.npu import _option_store
    value = _option_store.get_option(option)
    if value is None or value == b"":
        return default
    return value == b"enable"


def cube_math_type(family: str) -> int:
    """The cubeMathType the real torch_npu passes to the aclnn cube op of ``family``
    ("conv" or "matmul") under the current switches."""
    if family == "matmul":
        from torch_npu.npu import _option_store
        explicit = _option_store.get_option("MATMUL_CUBE_MATH_TYPE")
        if explicit:
            value = explicit.decode()
            if not value.isdigit() or int(value) not in _ROUNDING_OF_CUBE_MATH_TYPE:
                raise ValueError(f"MATMUL_CUBE_MATH_TYPE is {value!r}; chip numerics needs one of "
                                 f"{sorted(_ROUNDING_OF_CUBE_MATH_TYPE)} (torch.npu.CubeMathType)")
            return int(value)
        allow_hf32 = _flag("ALLOW_MATMUL_HF32", False)
    else:
        allow_hf32 = _flag("ALLOW_CONV_HF32", True)
    return _CUBE_MATH_TYPE_OF_SWITCHES[(allow_hf32, _allow_fp32_to_fp16())]


def rounding(family: str) -> Optional[_Rounding]:
    """How fp32 inputs of ``family`` are rounded now (None: kept as fp32)."""
    return _ROUNDING_OF_CUBE_MATH_TYPE[cube_math_type(family)]


def _kind_code(kind: Optional[_Rounding]) -> int:
    return -1 if kind is None else int(kind)


def _push_rounding() -> None:
    """Hand the C++ kernels each family's rounding under the current switches."""
    torch_npu._C._emu_set_cube_rounding(_kind_code(rounding("matmul")), _kind_code(rounding("conv")))


def options_changed() -> None:
    """Called by the option store after every change: in chip mode the kernels
    take the new rounding from the next call on. Raises what ``rounding`` raises
    for a value it cannot interpret."""
    with _lock:
        if _mode == "chip":
            _push_rounding()


def _register_option_listener() -> None:
    from torch_npu.npu import _option_store
    _option_store.add_listener(options_changed)


_register_option_listener()


def report() -> List[dict]:
    kinds = [(r, r.name.lower()) for r in _Rounding]
    return sorted(({"op": op, "calls": calls, "rounding": "/".join(sorted(n for r, n in kinds if mask >> r & 1)),
                    "elements": elements, "changed": changed}
                   for op, calls, mask, elements, changed in torch_npu._C._emu_numerics_report()),
                  key=lambda e: e["op"])


def reset_report() -> None:
    torch_npu._C._emu_reset_numerics_report()


def set_mode(mode: str) -> None:
    global _mode
    if not isinstance(mode, str) or mode not in MODES:
        raise ValueError(f"numerics mode must be 'exact' or 'chip', got {mode!r}")
    with _lock:
        if mode == "chip":
            name = _settings.get("TORCH_NPU_EMU_DEVICE_NAME")
            if not _chip_modelled(name):
                raise ValueError(f"numerics mode 'chip' (TORCH_NPU_EMU_NUMERICS, torch_npu.emulator.set_numerics) "
                                 f"models the Atlas A2/A3 SoCs (Ascend910B*, Ascend910_93*); the emulated device is "
                                 f"{name} (TORCH_NPU_EMU_DEVICE_NAME)")
            _push_rounding()
            torch_npu._C._emu_chip_kernels(True)
        else:
            torch_npu._C._emu_chip_kernels(False)
        _mode = mode


def get_mode() -> str:
    return _mode


def apply_setting() -> None:
    """Start-up: TORCH_NPU_EMU_NUMERICS=chip switches chip mode on."""
    mode = _settings.get("TORCH_NPU_EMU_NUMERICS")
    if mode != "exact":
        set_mode(mode)
