"""Chip-numerics mode: fp32 cube ops round their inputs as a 910B does.

By default (``exact``) the emulated npu computes bitwise what the CPU
computes. In ``chip`` mode the matmul and convolution families round their
fp32 inputs to the precision the cube unit uses (HF32 or fp16, chosen by
``torch.npu.conv.allow_hf32``, ``torch.npu.matmul.allow_hf32``,
``torch.npu.matmul.cube_math_type`` and ``ACL_PRECISION_MODE``) before the
product, which then accumulates in fp32. docs/numerics.md states every rule
with its public source, and what is not modelled.

Exact mode costs nothing: the chip kernels exist only while chip mode is on,
as a ``torch.library`` IMPL library on the PrivateUse1 key that is created
by ``set_numerics("chip")`` and destroyed by ``set_numerics("exact")`` (the
dispatcher then runs the previous kernels again).
"""
import enum
import threading
from typing import Dict, List, Optional, Tuple

import torch

import torch_npu
from torch_npu import _settings

__all__ = []

MODES = ("exact", "chip")


class _Rounding(enum.IntEnum):
    # values are the kind argument of torch_npu._C._emu_round_cube_input
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
_library: Optional[torch.library.Library] = None
# op name -> [calls, rounding name, elements rounded, elements changed]
_report: Dict[str, list] = {}


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
            return int(explicit.decode())
        allow_hf32 = _flag("ALLOW_MATMUL_HF32", False)
    else:
        allow_hf32 = _flag("ALLOW_CONV_HF32", True)
    return _CUBE_MATH_TYPE_OF_SWITCHES[(allow_hf32, _allow_fp32_to_fp16())]


def rounding(family: str) -> Optional[_Rounding]:
    """How fp32 inputs of ``family`` are rounded now (None: kept as fp32)."""
    return _ROUNDING_OF_CUBE_MATH_TYPE[cube_math_type(family)]


def _record(op: str, kind: _Rounding, elements: int, changed: int) -> None:
    with _lock:
        entry = _report.get(op)
        if entry is None:
            entry = _report[op] = [0, set(), 0, 0]
        entry[0] += 1
        entry[1].add(kind.name.lower())
        entry[2] += elements
        entry[3] += changed


def report() -> List[dict]:
    with _lock:
        return [{"op": op, "calls": e[0], "rounding": "/".join(sorted(e[1])), "elements": e[2], "changed": e[3]}
                for op, e in sorted(_report.items())]


def reset_report() -> None:
    with _lock:
        _report.clear()


# ------------------------------------------------------------------ kernels
# Each chip kernel runs the op's CPU kernel on CPU aliases of the npu
# arguments (zero-copy, as the default npu kernels do), with the cube inputs
# replaced by rounded copies: one elementwise pass over each of them.

def _cpu(x):
    return torch_npu._C._npu_cpu_alias(x) if isinstance(x, torch.Tensor) and x.device.type == "npu" else x


def _device_of(args) -> int:
    for a in args:
        if isinstance(a, torch.Tensor) and a.device.type == "npu":
            return a.device.index
    return torch_npu.npu.current_device()


def _conv_forward(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    # convolution_overrideable has no CPU kernel: the npu kernel runs aten::convolution
    return torch.ops.aten.convolution.default(input, weight, bias, stride, padding, dilation, transposed,
                                              output_padding, groups)


def _conv_backward(grad_output, input, weight, stride, padding, dilation, transposed, output_padding, groups,
                   output_mask):
    # as DirectKernels.cpp's convolution_backward_overrideable does
    bias_sizes = [weight.size(1) * groups if transposed else weight.size(0)]
    return torch.ops.aten.convolution_backward.default(grad_output, input, weight, bias_sizes, stride, padding,
                                                       dilation, transposed, output_padding, groups, output_mask)


class _CubeOp:
    """The chip kernel of one ATen overload: ``cube_args`` are the positions of
    the product's inputs, rounded when all of them are fp32; ``cpu_fn`` runs
    the op on CPU tensors (default: the ATen overload itself)."""

    def __init__(self, name: str, family: str, cube_args: Tuple[int, ...], cpu_fn=None):
        self.name, self.family, self.cube_args = name, family, cube_args
        self.cpu_fn = cpu_fn if cpu_fn is not None else getattr(torch.ops.aten, name).default
        self.inplace = name.endswith("_")
        self.aten_name = f"aten::{name}"

    def __call__(self, *args, **kwargs):
        device = _device_of(args)
        cpu_args = [_cpu(a) for a in args]
        kind = rounding(self.family)
        # inside the kernel scope: the rounded copies, like the outputs, come from
        # the device pool (no page faults), and the timeline times the rounding too
        with torch_npu._C._NpuKernelScope(self.aten_name, "", device):
            if kind is not None and all(cpu_args[i].dtype == torch.float32 for i in self.cube_args):
                elements = changed = 0
                for i in self.cube_args:
                    rounded, n_changed = torch_npu._C._emu_round_cube_input(cpu_args[i], int(kind))
                    cpu_args[i] = rounded
                    elements += rounded.numel()
                    changed += n_changed
                _record(self.name, kind, elements, changed)
            result = self.cpu_fn(*cpu_args, **kwargs)  # kwargs: scalars (beta, alpha)
            if self.inplace:
                return args[0]  # the CPU kernel wrote through the alias of args[0]
            if isinstance(result, tuple):
                return tuple(torch_npu._C._npu_adopt(r, device) if isinstance(r, torch.Tensor) else r
                             for r in result)
            return torch_npu._C._npu_adopt(result, device)


# (name, family, positions of the product's inputs, CPU implementation);
# the default overloads. Out= overloads keep their exact kernels (docs/numerics.md).
_CUBE_OPS = (
    ("mm", "matmul", (0, 1), None),
    ("bmm", "matmul", (0, 1), None),
    ("addmm", "matmul", (1, 2), None),
    ("addmm_", "matmul", (1, 2), None),
    ("baddbmm", "matmul", (1, 2), None),
    ("baddbmm_", "matmul", (1, 2), None),
    ("addbmm", "matmul", (1, 2), None),
    ("addbmm_", "matmul", (1, 2), None),
    ("convolution_overrideable", "conv", (0, 1), _conv_forward),
    ("convolution_backward_overrideable", "conv", (0, 1, 2), _conv_backward),
)


def _install() -> torch.library.Library:
    import warnings
    lib = torch.library.Library("aten", "IMPL", "PrivateUse1")
    with warnings.catch_warnings():
        # replacing the default npu kernel is the point; the warning says so
        warnings.filterwarnings("ignore", message=r"(?s).*(Overriding a previously registered kernel"
                                                  r"|other operators may also be overridden)")
        for name, family, cube_args, cpu_fn in _CUBE_OPS:
            lib.impl(name, _CubeOp(name, family, cube_args, cpu_fn))
    return lib


def set_mode(mode: str) -> None:
    global _mode, _library
    if not isinstance(mode, str) or mode not in MODES:
        raise ValueError(f"numerics mode must be 'exact' or 'chip', got {mode!r}")
    with _lock:
        if mode == "chip":
            name = _settings.get("TORCH_NPU_EMU_DEVICE_NAME")
            if not _chip_modelled(name):
                raise ValueError(f"numerics mode 'chip' (TORCH_NPU_EMU_NUMERICS, torch_npu.emulator.set_numerics) "
                                 f"models the Atlas A2/A3 SoCs (Ascend910B*, Ascend910_93*); the emulated device is "
                                 f"{name} (TORCH_NPU_EMU_DEVICE_NAME)")
            if _library is None:
                _library = _install()
        elif _library is not None:
            _library._destroy()
            _library = None
        _mode = mode


def get_mode() -> str:
    return _mode


def apply_setting() -> None:
    """Start-up: TORCH_NPU_EMU_NUMERICS=chip switches chip mode on."""
    mode = _settings.get("TORCH_NPU_EMU_NUMERICS")
    if mode != "exact":
        set_mode(mode)
