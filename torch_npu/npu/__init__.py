"""torch.npu: device management, streams, memory, random and amp for the NPU.

``torch.npu`` is this module (registered with ``torch._register_device_module``),
laid out like ``torch.cuda``. Runtime initialisation is lazy, as on hardware.
"""
import os
import threading
import traceback
from typing import List, Optional, Tuple, Union

import torch

import torch_npu
from torch_npu import _settings
from torch_npu.utils._error_code import ErrCode, pta_error

__all__ = [
    "is_initialized", "init", "synchronize", "device_count", "can_device_access_peer", "set_device",
    "current_device", "get_device_name", "get_device_properties", "get_device_capability", "mem_get_info",
    "is_available", "device", "device_of", "StreamContext", "stream", "set_stream", "current_stream",
    "default_stream", "set_sync_debug_mode", "get_sync_debug_mode", "utilization",
    "manual_seed", "manual_seed_all", "seed", "seed_all", "initial_seed",
    "caching_allocator_alloc", "caching_allocator_delete", "get_per_process_memory_fraction",
    "set_per_process_memory_fraction", "empty_cache", "memory_stats", "memory_stats_as_nested_dict",
    "reset_accumulated_memory_stats", "reset_peak_memory_stats", "reset_max_memory_allocated",
    "reset_max_memory_cached", "memory_allocated", "max_memory_allocated", "memory_reserved",
    "max_memory_reserved", "memory_cached", "max_memory_cached", "memory_snapshot", "memory_summary",
    "get_allocator_backend", "Stream", "Event", "ExternalStream", "get_rng_state", "set_rng_state",
    "get_rng_state_all", "set_rng_state_all", "get_amp_supported_dtype", "is_autocast_enabled",
    "is_bf16_supported", "set_autocast_enabled", "get_autocast_dtype", "set_autocast_dtype",
    "current_blas_handle", "SyncLaunchStream", "ExternalEvent", "ipc_collect",
    "get_npu_overflow_flag", "clear_npu_overflow_flag",
]

default_generators: Tuple[torch._C.Generator] = ()  # type: ignore[assignment]

_initialized = False
_is_internal_in_bad_fork = False
_tls = threading.local()
_initialization_lock = threading.Lock()
_queued_calls = []
_original_pid = False


class DeferredNpuCallError(Exception):
    pass


def _is_in_bad_fork():
    return _is_internal_in_bad_fork


def is_initialized():
    r"""Return whether PyTorch's NPU state has been initialized."""
    return _initialized and not _is_internal_in_bad_fork


def _lazy_call(cb):
    if _initialized:
        cb()
    else:
        _queued_calls.append((cb, traceback.format_stack()))


def init():
    r"""Initialize PyTorch's NPU state (done lazily on first use otherwise)."""
    _lazy_init()


def _lazy_init():
    global _initialized, _original_pid, _queued_calls, default_generators
    if _initialized or hasattr(_tls, "is_initializing"):
        return
    with _initialization_lock:
        if _initialized:
            return
        if _is_internal_in_bad_fork:
            raise RuntimeError(
                "Cannot re-initialize NPU in forked subprocess. To use NPU with "
                "multiprocessing, you must use the 'spawn' start method")
        try:  # the emulated machine's settings (torch_npu._settings) are checked at first device use
            _settings.validate("device")
        except _settings.SettingError as e:
            raise RuntimeError(str(e) + pta_error(ErrCode.VALUE)) from None
        if device_count() == 0:
            raise RuntimeError("No NPUs are available" + pta_error(ErrCode.UNAVAIL))
        torch_npu._C._npu_init()
        default_generators = tuple(torch_npu._C._npu_getDefaultGenerators())
        _original_pid = os.getpid()
        _tls.is_initializing = True
        try:
            for queued_call, orig_traceback in _queued_calls:
                try:
                    queued_call()
                except Exception as e:
                    msg = (f"NPU call failed lazily at initialization with error: {str(e)}\n\n"
                           f"NPU call was originally invoked at:\n\n{''.join(orig_traceback)}")
                    raise DeferredNpuCallError(msg + pta_error(ErrCode.INTERNAL)) from e
            _queued_calls = []
        finally:
            delattr(_tls, "is_initializing")
        _initialized = True
    from torch_npu.utils._logging import get_logger
    get_logger("device").info("NPU runtime initialised: %d device(s)", device_count())


def _after_fork(arg):
    global _initialized, _is_internal_in_bad_fork
    if _initialized and _original_pid != os.getpid():
        _initialized = False
        _is_internal_in_bad_fork = True
        torch_npu._C._npu_set_run_yet_variable_to_false()


# Every fork (os.fork and multiprocessing alike) marks the child.
os.register_at_fork(after_in_child=lambda: _after_fork(None))


def _parse_visible_devices() -> List[int]:
    r"""Parse ASCEND_RT_VISIBLE_DEVICES: digits and commas only, read up to the
    first other character; an empty element ends the list (torch_npu._settings
    owns the grammar)."""
    ids = _settings.get("ASCEND_RT_VISIBLE_DEVICES")
    return list(range(64)) if ids is None else list(ids)


_cached_device_count: Optional[int] = None


def device_count() -> int:
    r"""Return the number of NPUs available."""
    global _cached_device_count
    if _cached_device_count is not None:
        return _cached_device_count
    r = torch_npu._C._npu_getDeviceCount()
    # Not cached before initialisation: ASCEND_RT_VISIBLE_DEVICES may still change.
    if _initialized:
        _cached_device_count = r
    return r


def is_available() -> bool:
    r"""Return a bool indicating if an NPU is currently available."""
    return device_count() > 0


from .utils import (  # noqa: E402
    _get_device_index, set_device, current_device, device, device_of, synchronize, get_device_name,
    get_device_properties, get_device_capability, mem_get_info, can_device_access_peer, utilization,
    set_sync_debug_mode, get_sync_debug_mode, current_blas_handle, is_bf16_supported, ipc_collect,
    StreamContext, stream, set_stream, current_stream, default_stream,
)
from .streams import Stream, Event, ExternalStream, SyncLaunchStream, ExternalEvent  # noqa: E402
from .memory import *  # noqa: E402,F403
from .random import *  # noqa: E402,F403
from .autocast_utils import *  # noqa: E402,F403
from . import _utils  # noqa: E402
from ._overflow import get_npu_overflow_flag, clear_npu_overflow_flag  # noqa: E402,F401
from . import amp  # noqa: E402,F401
from .utils import (  # noqa: E402,F401
    set_dump, init_dump, finalize_dump, set_task_queue_enable, get_task_queue_enable, stress_detect,
    check_uce_in_memory, obfuscation_initialize, obfuscation_finalize, obfuscation_calculate, set_op_timeout_ms,
    _sleep,
)
from . import npu_config  # noqa: E402
from .npu_config import (  # noqa: E402,F401
    set_option, set_aoe, set_compile_mode, set_mm_bmm_format_nd, get_mm_bmm_format_nd, is_jit_compile_false,
    set_device_limit, get_device_limit, set_stream_limit, reset_stream_limit, get_stream_limit,
)
from ._legacy_types import *  # noqa: E402,F403
from ._recovery import stop_device, restart_device  # noqa: E402,F401
from .deterministic import enable_deterministic_with_backward, disable_deterministic_with_backward  # noqa: E402,F401
from ._switches import (  # noqa: E402,F401
    set_deterministic_level, use_compatible_impl, are_compatible_impl_enabled, npurt,
)
from . import aclnn  # noqa: E402,F401
from .mstx import mstx  # noqa: E402,F401

config = npu_config._npuConfig()
matmul = npu_config._allowHF32Matmul()
conv = npu_config._allowHF32Conv()
CubeMathType = npu_config._CubeMathType

__all__ += [
    "set_dump", "init_dump", "finalize_dump", "set_task_queue_enable", "get_task_queue_enable",
    "empty_virt_addr_cache", "MemPool", "use_mem_pool", "NPUPluggableAllocator", "change_current_allocator",
    "set_option", "CubeMathType", "set_aoe", "set_compile_mode", "set_mm_bmm_format_nd", "get_mm_bmm_format_nd",
    "stress_detect", "is_jit_compile_false", "BoolStorage", "ByteStorage", "ShortStorage", "LongStorage",
    "IntStorage", "HalfStorage", "CharStorage", "DoubleStorage", "FloatStorage", "BoolTensor", "ByteTensor",
    "CharTensor", "DoubleTensor", "FloatTensor", "HalfTensor", "IntTensor", "LongTensor", "ShortTensor",
    "BFloat16Tensor", "BFloat16Storage", "stop_device", "restart_device", "check_uce_in_memory", "config",
    "matmul", "conv", "enable_deterministic_with_backward", "disable_deterministic_with_backward", "mstx",
    "set_device_limit", "get_device_limit", "set_stream_limit", "reset_stream_limit", "get_stream_limit",
    "obfuscation_initialize", "obfuscation_finalize", "obfuscation_calculate", "set_op_timeout_ms",
    "host_empty_cache", "host_memory_stats", "host_memory_stats_as_nested_dict",
    "reset_accumulated_host_memory_stats", "reset_peak_host_memory_stats", "set_deterministic_level",
    "use_compatible_impl", "are_compatible_impl_enabled", "npurt",
]

from .graphs import (  # noqa: E402
    NPUGraph, graph, graph_pool_handle, is_current_stream_capturing, make_graphed_callables,
    graph_task_group_begin, graph_task_group_end, graph_task_update_begin, graph_task_update_end,
    super_kernel_scope_begin, super_kernel_scope_end,
)
from ._npugraph_handlers import NpuGraphOpHandler, register_npu_graph_handler  # noqa: E402

__all__ += ["NPUGraph", "graph", "graph_pool_handle", "is_current_stream_capturing", "make_graphed_callables",
            "graph_task_group_begin", "graph_task_group_end", "graph_task_update_begin", "graph_task_update_end",
            "NpuGraphOpHandler", "register_npu_graph_handler", "super_kernel_scope_begin", "super_kernel_scope_end"]
