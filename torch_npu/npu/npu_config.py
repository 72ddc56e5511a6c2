"""torch.npu option APIs: ``set_option``, compile mode, dump switches, core
limits and the ``config`` / ``matmul`` / ``conv`` switch objects.

The emulated device computes every op with PyTorch's CPU kernels, so options
that steer CANN (op compiler cache, dump, AOE, core limits) cannot change
results or speed here; the precision switches (HF32, ``cube_math_type``,
``ACL_PRECISION_MODE``) change results only in chip numerics mode
(torch_npu.emulator.set_numerics, docs/numerics.md). They are validated
exactly as on hardware, stored (``_option_store``) and read back by their
getters, so code that configures them runs unchanged and sees consistent state.
"""
import enum
import os
import warnings

import torch_npu
from torch_npu.utils._error_code import ErrCode, pta_error
from torch_npu.npu import _option_store

__all__ = ["set_option", "set_aoe", "set_compile_mode", "set_mm_bmm_format_nd", "get_mm_bmm_format_nd",
           "is_jit_compile_false", "finalize_dump", "init_dump", "set_dump", "set_device_limit",
           "get_device_limit", "set_stream_limit", "reset_stream_limit", "get_stream_limit"]

# Allowed values per validated option (None: any value); other keys pass through.
_OPTION_VALUES = {
    "ACL_PRECISION_MODE": ["allow_fp32_to_fp16", "must_keep_origin_dtype"],
    "ACL_OP_SELECT_IMPL_MODE": ["high_performance", "high_precision"],
    "ACL_AICORE_NUM": "an integer from 1 to 32",
    "ACL_OPTYPELIST_FOR_IMPLMODE": None,
    "ACL_OP_DEBUG_LEVEL": ["0", "1", "2", "3", "4"],
    "ACL_DEBUG_DIR": None,
    "ACL_OP_COMPILER_CACHE_MODE": ["disable", "enable", "force"],
    "ACL_OP_COMPILER_CACHE_DIR": None,
    "ACL_OP_DEBUG_OPTION": None,
}
_DEPRECATED_OPTIONS = {"ACL_OP_SELECT_IMPL_MODE", "ACL_OPTYPELIST_FOR_IMPLMODE"}


def _option_value_ok(name, value: str) -> bool:
    allowed = _OPTION_VALUES.get(name)
    if allowed is None:
        return True
    if name == "ACL_AICORE_NUM":
        return value.isdigit() and 1 <= int(value) <= 32
    return value in allowed


def set_option(option):
    r"""Set ACL options from a dict of ``name -> value`` (values become str)."""
    if not isinstance(option, dict):
        raise TypeError("npu option must be a dict." + pta_error(ErrCode.PARAM))
    if option.get("MM_BMM_ND_ENABLE") == "enable":
        set_mm_bmm_format_nd(True)
    elif option.get("MM_BMM_ND_ENABLE") == "disable":
        set_mm_bmm_format_nd(False)
    for name, value in option.items():
        if not _option_value_ok(name, str(value)):
            raise ValueError(f"value of {name} should be in {_OPTION_VALUES[name]} but got {value}"
                             + pta_error(ErrCode.PARAM))
        option[name] = str(value)
        if name in _DEPRECATED_OPTIONS:
            warnings.warn(f"{name} will be deprecated in future version. The accuracy or performance "
                          f"may not be the optimal when configuring this option. We do not recommend setting it.")
    _option_store.set_options(option)


def init_dump():
    _option_store.set_options({"mdldumpswitch": "enable"})


def set_dump(cfg_file):
    if not os.path.exists(cfg_file):
        raise AssertionError(f"cfg_file {cfg_file} path does not exists." + pta_error(ErrCode.NOT_FOUND))
    _option_store.set_options({"mdldumpconfigpath": os.path.realpath(cfg_file)})


def finalize_dump():
    _option_store.set_options({"mdldumpswitch": "disable"})


def set_compile_mode(jit_compile=False):
    r"""Choose online op compilation (True) or binary kernels (False, the 910B default)."""
    if torch_npu.npu.is_initialized():
        torch_npu.npu.synchronize()
    _option_store.set_options({"jitCompile": "enable" if jit_compile else "disable"})


def is_jit_compile_false() -> bool:
    torch_npu.npu._lazy_init()
    value = _option_store.get_option("jitCompile")
    return value is None or value.decode() != "enable"


def set_aoe(dump_path):
    if not os.path.exists(dump_path):
        try:
            os.makedirs(dump_path, mode=0o750)
        except TypeError:
            raise TypeError("Type of dump_path is invalid." + pta_error(ErrCode.TYPE)) from None
        except OSError:
            raise OSError("Value of dump_path is invalid." + pta_error(ErrCode.SYSCALL)) from None
    _option_store.set_options({"autotune": "enable", "autotunegraphdumppath": dump_path})


# mm/bmm in ND format (True by default); only remembered on the emulated device.
_MM_BMM_ND_ENABLE = True


def set_mm_bmm_format_nd(is_nd=True):
    global _MM_BMM_ND_ENABLE
    _MM_BMM_ND_ENABLE = bool(is_nd)


def get_mm_bmm_format_nd():
    return _MM_BMM_ND_ENABLE


# ---------------------------------------------------------------- core limits
# Cube/vector core limits per device and per stream. The emulated device runs
# ops on host threads, so a limit changes nothing but what the getters return.
_device_limits = {}
_stream_limits = {}


def _device_cores(device_id):
    props = torch_npu.npu.get_device_properties(device_id)
    return props.cube_core_num, props.vector_core_num


def _check_core_num(name, value, maximum):
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int, but got {type(value).__name__}." + pta_error(ErrCode.TYPE))
    if value != -1 and not 0 < value <= maximum:
        raise ValueError(f"{name} should be -1 or in [1, {maximum}], but got {value}." + pta_error(ErrCode.VALUE))


def set_device_limit(*args, **kwargs):
    r"""``set_device_limit(device, cube_num=-1, vector_num=-1)``: limit the cube/vector
    cores ops on ``device`` may use (-1: keep the current limit)."""
    _set_device_limit(*args, **kwargs)


def _set_device_limit(device, cube_num=-1, vector_num=-1):
    from .utils import _get_device_index
    device_id = _get_device_index(device, optional=True)
    max_cube, max_vector = _device_cores(device_id)
    _check_core_num("cube_num", cube_num, max_cube)
    _check_core_num("vector_num", vector_num, max_vector)
    cur_cube, cur_vector = _device_limits.get(device_id, (max_cube, max_vector))
    _device_limits[device_id] = (cube_num if cube_num != -1 else cur_cube,
                                 vector_num if vector_num != -1 else cur_vector)


def get_device_limit(device):
    from .utils import _get_device_index
    device_id = _get_device_index(device, optional=True)
    cube, vector = _device_limits.get(device_id, _device_cores(device_id))
    return {"cube_core_num": cube, "vector_core_num": vector}


def _stream_key(stream):
    if not isinstance(stream, torch_npu.npu.Stream):
        raise TypeError("stream must be a torch_npu.npu.Stream." + pta_error(ErrCode.TYPE))
    return stream.device_index, stream.stream_id


def set_stream_limit(stream, cube_num=-1, vector_num=-1):
    key = _stream_key(stream)
    limit = get_device_limit(key[0])
    _check_core_num("cube_num", cube_num, limit["cube_core_num"])
    _check_core_num("vector_num", vector_num, limit["vector_core_num"])
    cur = _stream_limits.get(key, limit)
    _stream_limits[key] = {"cube_core_num": cube_num if cube_num != -1 else cur["cube_core_num"],
                           "vector_core_num": vector_num if vector_num != -1 else cur["vector_core_num"]}


def reset_stream_limit(stream):
    _stream_limits.pop(_stream_key(stream), None)


def get_stream_limit(stream):
    key = _stream_key(stream)
    return dict(_stream_limits.get(key) or get_device_limit(key[0]))


# ------------------------------------------------------- switch objects
class _CubeMathType(enum.IntEnum):
    KEEP_DTYPE = 0
    ALLOW_FP32_DOWN_PRECISION = 1
    USE_FP16 = 2
    USE_HF32 = 3
    USE_FP32_ADD = 4


def _enable_flag(name, value, default):
    stored = _option_store.get_option(name)
    if stored is None or stored.decode() == "":
        return default
    return stored.decode() == value


def _check_bool(name, value):
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, but got {type(value).__name__}." + pta_error(ErrCode.TYPE))


def _internal_format_default():
    """As documented: True on Atlas training/A2/inference products, False on A3 (Ascend910_93xx)."""
    from torch_npu import emulator
    return not emulator.device_name().startswith("Ascend910_93")


class _npuConfig:
    r"""``torch.npu.config``: ``allow_internal_format`` (private formats such as NZ)."""

    def __setattr__(self, name, value):
        if name == "allow_internal_format":
            _option_store.set_options({"ALLOW_INTERNAL_FORMAT": "enable" if value else "disable"})
        else:
            object.__setattr__(self, name, value)

    def __getattr__(self, name):
        if name == "allow_internal_format":
            return _enable_flag("ALLOW_INTERNAL_FORMAT", "enable", _internal_format_default())
        raise AttributeError(name)


class _allowHF32Matmul:
    r"""``torch.npu.matmul``: ``allow_hf32`` (default False) and ``cube_math_type``."""

    def __setattr__(self, name, value):
        if name == "allow_hf32":
            _check_bool("allow_hf32", value)
            _option_store.set_options({"ALLOW_MATMUL_HF32": "enable" if value else "disable"})
        elif name == "cube_math_type":
            try:
                value = _CubeMathType(value)
            except ValueError:
                raise ValueError(f"cube_math_type should be one of {[m.name for m in _CubeMathType]}, "
                                 f"but got {value}." + pta_error(ErrCode.VALUE)) from None
            _option_store.set_options({"MATMUL_CUBE_MATH_TYPE": str(int(value))})
        else:
            object.__setattr__(self, name, value)

    def __getattr__(self, name):
        if name == "allow_hf32":
            return _enable_flag("ALLOW_MATMUL_HF32", "enable", False)
        if name == "cube_math_type":
            stored = _option_store.get_option("MATMUL_CUBE_MATH_TYPE")
            return _CubeMathType(int(stored.decode())) if stored else _CubeMathType.KEEP_DTYPE
        raise AttributeError(name)


class _allowHF32Conv:
    r"""``torch.npu.conv``: ``allow_hf32`` (default True)."""

    def __setattr__(self, name, value):
        if name == "allow_hf32":
            _check_bool("allow_hf32", value)
            _option_store.set_options({"ALLOW_CONV_HF32": "enable" if value else "disable"})
        else:
            object.__setattr__(self, name, value)

    def __getattr__(self, name):
        if name == "allow_hf32":
            return _enable_flag("ALLOW_CONV_HF32", "enable", True)
        raise AttributeError(name)
