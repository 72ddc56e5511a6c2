"""Streams and events of torch.npu.

The emulated device runs every op to completion before returning, so a
stream is always idle: ``query()`` is True, ``synchronize()`` returns at once,
and an event's timestamp is the host time at which it was recorded. Code that
orders work with streams and events stays correct; elapsed times measure the
host-side execution, which *is* the device time here.

Streams are still distinct all the way down: each ``Stream()`` has its own id
(``npu_stream``), which the caching allocator orders its reuse by and the trace
hooks (``torch_npu.utils._npu_trace``) report; records, waits and
synchronisations reach the runtime.
"""
import ctypes
import time

import torch

import torch_npu
from torch_npu.utils._error_code import ErrCode, pta_error

__all__ = ["Stream", "Event", "ExternalStream", "SyncLaunchStream", "ExternalEvent"]


class Stream(torch.Stream):
    r"""Wrapper around an NPU stream.

    Args:
        device (torch.device or int, optional): device on which to allocate the stream.
        priority (int, optional): priority of the stream (lower is higher priority).
    """

    def __new__(cls, device=None, priority=0, **kwargs):
        if kwargs.get("stream_id") is not None:
            return super().__new__(cls, stream_id=kwargs["stream_id"], device_index=kwargs["device_index"],
                                   device_type=kwargs["device_type"])
        torch_npu.npu._lazy_init()
        from .utils import _get_device_index
        idx = _get_device_index(device, optional=True)
        with torch_npu.npu.device(idx):
            return super().__new__(cls, device=torch.device("npu", idx), priority=priority)

    def wait_event(self, event):
        event.wait(self)

    def wait_stream(self, stream):
        self.wait_event(stream.record_event())

    def record_event(self, event=None):
        if event is None:
            event = Event()
        event.record(self)
        return event

    def query(self):
        return super().query()

    def synchronize(self):
        r"""Wait for the stream's work (done already, here); reported to the runtime
        and the trace hooks."""
        super().synchronize()

    @property
    def npu_stream(self):
        r"""The stream's native handle: its id, as the trace hooks report it."""
        return self.stream_id

    def set_data_preprocess_stream(self, is_data_preprocess_stream=False):
        r"""Mark this stream as the data-preprocessing stream (a profiler tag on
        hardware; remembered here)."""
        self._is_data_preprocess_stream = bool(is_data_preprocess_stream)

    @property
    def _as_parameter_(self):
        return ctypes.c_void_p(self.stream_id)

    def __eq__(self, o):
        if isinstance(o, torch.Stream):
            return super().__eq__(o)
        return False

    def __hash__(self):
        return hash((self.stream_id, self.device))

    def __repr__(self):
        return f"<torch_npu.npu.Stream device={self.device} npu_stream={self.stream_id:#x}>"


class SyncLaunchStream(Stream):
    r"""A stream whose launches are synchronous (every stream is, here)."""


class ExternalStream(Stream):
    r"""Wrap an externally created stream id (kept for API compatibility)."""

    def __new__(cls, stream_ptr, device=None, **kwargs):
        from .utils import _get_device_index
        idx = _get_device_index(device, optional=True)
        return super().__new__(cls, stream_id=int(stream_ptr), device_index=idx,
                               device_type=torch._C._autograd.DeviceType.PrivateUse1.value
                               if hasattr(torch._C._autograd, "DeviceType") else 20)


class Event(torch.Event):
    r"""Wrapper around an NPU event.

    Args:
        enable_timing (bool): whether the event should measure time.
        blocking (bool), interprocess (bool): accepted for compatibility.
    """

    def __new__(cls, enable_timing=False, blocking=False, interprocess=False, **kwargs):
        ev = super().__new__(cls, device="npu", enable_timing=enable_timing, blocking=blocking,
                             interprocess=interprocess)
        ev._enable_timing = enable_timing
        ev._recorded_at = None
        return ev

    def record(self, stream=None):
        if stream is None:
            stream = torch_npu.npu.current_stream()
        super().record(stream)
        # Work before the record has already run (synchronous device), so the
        # host clock at record time is the event's device timestamp.
        self._recorded_at = time.perf_counter()

    def wait(self, stream=None):
        if stream is None:
            stream = torch_npu.npu.current_stream()
        super().wait(stream)

    def query(self):
        return super().query()

    @property
    def npu_event(self):
        r"""The event's native handle as the trace hooks report it (0 until first recorded)."""
        return self.event_id

    def elapsed_time(self, end_event):
        r"""Milliseconds between this event and ``end_event`` being recorded."""
        if not (self._enable_timing and getattr(end_event, "_enable_timing", False)):
            raise RuntimeError("Both events must be created with argument 'enable_timing=True'."
                               + pta_error(ErrCode.PARAM))
        if self._recorded_at is None or getattr(end_event, "_recorded_at", None) is None:
            raise RuntimeError("Both events must be recorded before calculating elapsed time."
                               + pta_error(ErrCode.PARAM))
        if self.device != end_event.device:
            # Device clocks are not comparable; CUDA fails here too (invalid resource handle).
            raise RuntimeError(f"Both events must be recorded on the same device to calculate elapsed time, "
                               f"but the start event was recorded on {self.device} and the end event on "
                               f"{end_event.device}." + pta_error(ErrCode.PARAM))
        return (end_event._recorded_at - self._recorded_at) * 1000.0

    def synchronize(self):
        super().synchronize()

    def recorded_time(self):
        r"""Device timestamp of the record, in microseconds (host monotonic clock here)."""
        if self._recorded_at is None:
            raise RuntimeError("Event must be recorded before getting its recorded time." + pta_error(ErrCode.PARAM))
        return int(self._recorded_at * 1e6)

    def __repr__(self):
        return "<torch_npu.npu.Event>"


class ExternalEvent(Event):
    r"""Event usable across graph capture boundaries (plain event here)."""

    def reset(self, stream=None):
        r"""Return the event to the not-recorded state."""
        self._recorded_at = None
