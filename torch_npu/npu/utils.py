"""Device selection, properties and stream contexts of torch.npu."""
import warnings
from typing import Any, Optional, Union

import torch

import torch_npu
from torch_npu.utils._error_code import ErrCode, pta_error

__all__ = [
    "set_device", "current_device", "device", "device_of", "synchronize", "get_device_name",
    "get_device_properties", "get_device_capability", "mem_get_info", "can_device_access_peer",
    "utilization", "set_sync_debug_mode", "get_sync_debug_mode", "current_blas_handle", "is_bf16_supported",
    "ipc_collect", "StreamContext", "stream", "set_stream", "current_stream", "default_stream",
    "obfuscation_initialize", "obfuscation_finalize", "obfuscation_calculate", "init_dump", "set_dump",
    "finalize_dump", "is_support_inf_nan", "is_force_overflow_check", "get_npu_overflow_flag",
    "npu_check_overflow", "clear_npu_overflow_flag", "check_uce_in_memory", "stress_detect", "get_cann_version",
    "set_op_timeout_ms", "set_task_queue_enable", "get_task_queue_enable",
]


def _get_device_index(device: Any, optional: bool = False, allow_cpu: bool = False) -> int:
    r"""Get the device index from :attr:`device`, as the real torch_npu does.

    An ``int`` is returned as is (negative included); a ``str`` is parsed by
    ``torch.device`` (an unparsable one raises its ``RuntimeError``); a
    ``torch.device`` must be npu (or cpu with ``allow_cpu``, giving -1), else
    ``ValueError``; a ``torch.npu.device`` gives its index. Anything without an
    index (``None``, ``torch.device("npu")``, and, as in PyTorch's helper that
    the real one defers to, any other object such as a float) means the current
    device when ``optional``, else ``ValueError``.
    """
    if isinstance(device, int):
        return device
    if isinstance(device, str):
        device = torch.device(device)
    if isinstance(device, torch.device):
        if allow_cpu:
            if device.type not in ("npu", "cpu"):
                raise ValueError(f"Expected a npu or cpu device, but got: {device}" + pta_error(ErrCode.VALUE))
        elif device.type != "npu":
            raise ValueError(f"Expected a npu device, but got: {device}" + pta_error(ErrCode.VALUE))
        if device.type == "cpu":
            return -1
        if device.index is not None:
            return device.index
    elif isinstance(device, torch_npu.npu.device):
        return device.idx
    if optional:
        return current_device()
    raise ValueError(f"Expected a torch.device with a specified index or an integer, but got:{device}")


def set_device(device):
    r"""Set the current device (negative indices are a no-op, as in torch.cuda)."""
    device_id = _get_device_index(device, optional=True)
    if device_id >= 0:
        torch_npu.npu._lazy_init()
        torch_npu._C._npu_setDevice(device_id)


def current_device() -> int:
    r"""Return the index of the currently selected device."""
    torch_npu.npu._lazy_init()
    return torch_npu._C._npu_getDevice()


class device:
    r"""Context manager that changes the selected device."""

    def __init__(self, device):
        self.idx = _get_device_index(device, optional=True)
        self.prev_idx = -1

    def __enter__(self):
        if self.idx == -1:
            return
        self.prev_idx = current_device()
        if self.prev_idx != self.idx:
            set_device(self.idx)

    def __exit__(self, *args):
        if self.prev_idx != self.idx and self.prev_idx >= 0:
            set_device(self.prev_idx)
        return False


class device_of(device):
    r"""Context manager that changes the current device to that of given object."""

    def __init__(self, obj):
        idx = obj.get_device() if obj.device.type == "npu" else -1
        super().__init__(idx)


def synchronize(device=None):
    r"""Wait for all kernels in all streams on an NPU device to complete.

    The emulated device executes each op before returning, so there is never
    outstanding work; this validates the device and returns."""
    torch_npu.npu._lazy_init()
    with torch_npu.npu.device(device):
        return torch_npu._C._npu_synchronize()


def _checked_index(device) -> int:
    device_id = _get_device_index(device, optional=True)
    if device_id < 0 or device_id >= torch_npu.npu.device_count():
        raise AssertionError("Invalid device id" + pta_error(ErrCode.VALUE))
    return device_id


def get_device_properties(device_name=None):
    device_id = _checked_index(device_name)
    torch_npu.npu._lazy_init()
    return torch_npu._C._npu_getDeviceProperties(device_id)


def get_device_name(device_name=None):
    return get_device_properties(device_name).name


def get_device_capability(device=None):
    r"""torch_npu returns None (with a warning) unless TORCH_NPU_DEVICE_CAPABILITY="M.m"."""
    from torch_npu import _settings
    cap = _settings.get("TORCH_NPU_DEVICE_CAPABILITY")
    if cap is not None:
        return cap
    warnings.warn("torch.npu.get_device_capability isn't implemented!")
    return None


def mem_get_info(device=None):
    r"""Return (free, total) device memory in bytes as the driver sees it."""
    device_id = _checked_index(device)
    torch_npu.npu._lazy_init()
    return torch_npu._C._npu_getMemInfo(device_id)


def can_device_access_peer(device_id, peer_device_id):
    device_id = _get_device_index(device_id, optional=True)
    peer_device_id = _get_device_index(peer_device_id, optional=True)
    count = torch_npu.npu.device_count()
    if device_id < 0 or device_id >= count:
        raise AssertionError("Invalid device id" + pta_error(ErrCode.VALUE))
    if peer_device_id < 0 or peer_device_id >= count:
        raise AssertionError("Invalid peer device id" + pta_error(ErrCode.VALUE))
    return torch_npu._C._npu_canDeviceAccessPeer(device_id, peer_device_id)


def utilization(device=None):
    r"""Percent of time the device was busy; the emulated device reports 0."""
    _checked_index(device)
    return 0


_sync_debug_mode = 0


def set_sync_debug_mode(debug_mode: Union[int, str]) -> None:
    global _sync_debug_mode
    if isinstance(debug_mode, str):
        modes = {"default": 0, "warn": 1, "error": 2}
        if debug_mode not in modes:
            raise RuntimeError("invalid value of debug_mode, expected one of `default`, `warn`, `error`"
                               + pta_error(ErrCode.VALUE))
        debug_mode = modes[debug_mode]
    _sync_debug_mode = int(debug_mode)


def get_sync_debug_mode() -> int:
    return _sync_debug_mode


def current_blas_handle():
    warnings.warn("NPU does not use blas handle.")
    return None


def is_bf16_supported(including_emulation: bool = False) -> bool:
    return True


def ipc_collect():
    r"""Nothing to collect: the emulator never shares device memory across processes."""
    torch_npu.npu._lazy_init()


class StreamContext:
    r"""Context manager that selects a given stream (no-op for None)."""

    def __init__(self, stream_ctx):
        self.stream = stream_ctx
        self.idx = _get_device_index(None, True) if stream_ctx is not None else -1
        self.src_prev_stream = None
        self.dst_prev_stream = None

    def __enter__(self):
        cur = self.stream
        if cur is None or self.idx == -1:
            return
        self.src_prev_stream = current_stream(None)
        if self.src_prev_stream.device != cur.device:
            with device(cur.device):
                self.dst_prev_stream = current_stream(cur.device)
        set_stream(cur)

    def __exit__(self, *args):
        cur = self.stream
        if cur is None or self.idx == -1:
            return
        if self.src_prev_stream.device != cur.device:
            set_stream(self.dst_prev_stream)
        set_stream(self.src_prev_stream)


def stream(stream):
    return StreamContext(stream)


def set_stream(stream):
    if stream is None:
        return
    torch_npu._C._npu_setStream(stream.stream_id, stream.device_index, stream.device_type)


def _stream_from_tuple(t):
    from .streams import Stream
    stream_id, device_index, device_type = t
    return Stream(stream_id=stream_id, device_index=device_index, device_type=device_type)


def current_stream(device=None):
    torch_npu.npu._lazy_init()
    return _stream_from_tuple(torch_npu._C._npu_getCurrentStream(_get_device_index(device, optional=True)))


def default_stream(device=None):
    torch_npu.npu._lazy_init()
    return _stream_from_tuple(torch_npu._C._npu_getDefaultStream(_get_device_index(device, optional=True)))


# The overflow helpers live in _overflow.py; torch_npu keeps them reachable here.
from ._overflow import (  # noqa: E402,F401
    is_support_inf_nan, npu_check_overflow, get_npu_overflow_flag, clear_npu_overflow_flag,
)


# ------------------------------------------------------------ config, health
from .npu_config import set_dump, init_dump, finalize_dump  # noqa: E402,F401


def get_cann_version(module="CANN"):
    r"""Version of a CANN package; the emulated machine's (see torch_npu.utils._cann)."""
    from torch_npu.utils import _cann
    return _cann.get_cann_version(module)


def _is_gte_cann_version(version, module="CANN"):
    from torch_npu.utils import _cann
    return _cann.is_gte_cann_version(version, module)


def _initial_task_queue_level():
    from torch_npu import _settings
    return _settings.get("TASK_QUEUE_ENABLE")


_task_queue_level = None


def set_task_queue_enable(mode):
    r"""Op-launch pipeline level 0, 1 or 2. The emulated device launches
    synchronously at every level; the level is only remembered."""
    global _task_queue_level
    if not isinstance(mode, int) or isinstance(mode, bool) or mode not in (0, 1, 2):
        raise ValueError(f"task queue mode should be 0, 1 or 2, but got {mode}." + pta_error(ErrCode.VALUE))
    _task_queue_level = mode


def get_task_queue_enable():
    global _task_queue_level
    if _task_queue_level is None:
        _task_queue_level = _initial_task_queue_level()
    return _task_queue_level


_op_timeout_ms = None


def set_op_timeout_ms(timeout):
    r"""Op execution timeout in ms (emulated ops finish synchronously and never time out)."""
    global _op_timeout_ms
    if not isinstance(timeout, int) or isinstance(timeout, bool) or timeout < 0:
        raise ValueError(f"timeout should be a non-negative int, but got {timeout}." + pta_error(ErrCode.VALUE))
    _op_timeout_ms = timeout


def stress_detect(detect_type="aic"):
    r"""Hardware stress test (``"aic"`` cores or ``"hccs"`` links). Returns 0: the
    emulated device has no hardware that could fail it."""
    if detect_type not in ("aic", "hccs"):
        raise ValueError(f"detect_type should be 'aic' or 'hccs', but got {detect_type}." + pta_error(ErrCode.VALUE))
    torch_npu.npu._lazy_init()
    torch_npu.npu.synchronize()
    return 0


def check_uce_in_memory(device_id):
    r"""Whether device memory holds an uncorrectable error (UCE): 0, none, as the
    emulated memory is host memory."""
    _checked_index(device_id)
    return 0


def _obfuscation_unsupported(name):
    raise RuntimeError(f"{name} is not supported on the emulated NPU: model obfuscation runs in "
                       f"the device's secure firmware." + pta_error(ErrCode.NOT_SUPPORT))


def obfuscation_initialize(hidden_size, tp_rank, cmd, *, data_type=None, model_obf_seed_id=0, data_obf_seed_id=0,
                           thread_num=4, obf_coefficient=1.0):
    _obfuscation_unsupported("obfuscation_initialize")


def obfuscation_finalize(fd_to_close):
    _obfuscation_unsupported("obfuscation_finalize")


def obfuscation_calculate(fd, x, param, *, obf_coefficient=1.0):
    _obfuscation_unsupported("obfuscation_calculate")


def is_force_overflow_check():
    r"""True when ``INF_NAN_MODE_FORCE_DISABLE=1`` forces saturation mode, where
    overflow is detected through the device float-status flag."""
    from torch_npu import _settings
    return _settings.get("INF_NAN_MODE_FORCE_DISABLE")


# Clock of the emulated AI core for torch.npu._sleep (1.8 GHz, cycles per ms).
_EMULATED_CYCLES_PER_MS = 1_800_000


def _sleep(cycles):
    r"""Keep the current stream busy for ``cycles`` device cycles (tests use it to
    create work of known length). Emulated: the host spins for that time."""
    import time
    end = time.perf_counter() + cycles / _EMULATED_CYCLES_PER_MS / 1000.0
    while time.perf_counter() < end:
        pass
