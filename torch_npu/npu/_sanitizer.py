"""The NPU sanitizer: finds stream synchronisation bugs from the order of launches.

Turned on by ``TORCH_NPU_SANITIZER`` at ``import torch_npu`` (any value: the stream
check; the value ``1`` also reports missing ``record_stream`` calls when memory is
freed) or by :func:`enable_npu_sanitizer`. See ``docs/stream-sanitizer.md``.

Two modes, as in the real torch_npu: ``SanitizerMode.STREAM`` (the stream check of
``torch_npu.npu._stream_check``, built on ``torch.cuda._sanitizer``) and
``SanitizerMode.KERNEL``, chosen when ``ASCEND_OPP_DEBUG_PATH`` is set, which checks
CANN debug kernels; the emulated device runs no CANN kernels, so kernel mode only
says that it has nothing to check.
"""
import sys
import threading
import warnings

import torch_npu
from torch_npu import _settings

__all__ = []

# The real torch_npu's warning when kernel mode is asked for without debug kernels.
_NO_DEBUG_PATH = "ASCEND_OPP_DEBUG_PATH is not set! TORCH_NPU_SANITIZER takes no effect!"

# npu_trace registry -> EventHandler method it feeds.
_STREAM_CALLBACKS = (
    ("npu_event_creation", "_handle_event_creation"),
    ("npu_event_deletion", "_handle_event_deletion"),
    ("npu_event_record", "_handle_event_record"),
    ("npu_event_wait", "_handle_event_wait"),
    ("npu_memory_allocation", "_handle_memory_allocation"),
    ("npu_memory_deallocation", "_handle_memory_deallocation"),
    ("npu_stream_creation", "_handle_stream_creation"),
    ("npu_device_synchronization", "_handle_device_synchronization"),
    ("npu_stream_synchronization", "_handle_stream_synchronization"),
    ("npu_event_synchronization", "_handle_event_synchronization"),
    ("npu_record_stream", "_handle_record_stream"),
    ("npu_erase_stream", "_handle_erase_stream"),
)


class SanitizerMode:
    """What the sanitizer checks (the value handed to ``torch_npu._C._activate_npu_trace``)."""
    STREAM = 0
    KERNEL = 1


class NPUSanitizer:
    """The sanitizer's state: its mode, the event handler and the dispatch mode.

    ``enable()`` picks the mode (KERNEL when ``ASCEND_OPP_DEBUG_PATH`` is set, STREAM
    otherwise), turns it on and activates the runtime's trace; calling it again does
    nothing. ``disable()`` stops the stream check (the trace callbacks stay registered
    and forward to no one).
    """

    def __init__(self):
        self.event_handler = None
        self.dispatch = None
        self.kernel_path_manager = None
        self.mode = SanitizerMode.STREAM
        self.enabled = False
        self.check_record_stream = False
        self._registered = False
        self._trace_was_off = False
        # Runtime callbacks may come from another thread (a free in a worker thread).
        self._lock = threading.RLock()

    @property
    def opp_debug_kernel_path(self):
        """``ASCEND_OPP_DEBUG_PATH``: where CANN's debug kernels are (None when unset)."""
        return _settings.raw("ASCEND_OPP_DEBUG_PATH") or None

    def enable(self):
        """Turn the sanitizer on (idempotent)."""
        if self.enabled:
            return
        if self.opp_debug_kernel_path:
            success = self.enable_kernel_check()
            self.mode = SanitizerMode.KERNEL
        else:
            success = self.enable_stream_check()
            self.mode = SanitizerMode.STREAM
        if success:
            # Whether the runtime's hooks were off before: disable() then turns them off again.
            mask = getattr(torch_npu._C, "_npu_trace_active_mask", None)
            self._trace_was_off = mask is not None and mask() == 0
            torch_npu._C._activate_npu_trace(self.mode)
            self.enabled = True

    def enable_kernel_check(self) -> bool:
        """Kernel mode: needs CANN debug kernels (``ASCEND_OPP_DEBUG_PATH``). Without the
        variable it warns and does nothing; with it, the emulated device still has no
        CANN kernels to check, so it warns so and does nothing. Returns False."""
        if not self.opp_debug_kernel_path:
            warnings.warn(_NO_DEBUG_PATH, stacklevel=2)
            return False
        warnings.warn(f"ASCEND_OPP_DEBUG_PATH is set ({self.opp_debug_kernel_path}), which selects the "
                      "sanitizer's kernel check; the emulated NPU runs no CANN debug kernels, so it has "
                      "nothing to check. Unset ASCEND_OPP_DEBUG_PATH for the stream check. "
                      "TORCH_NPU_SANITIZER takes no effect!", stacklevel=2)
        return False

    def enable_stream_check(self) -> bool:
        """Stream mode: every op on npu tensors is checked against the streams'
        synchronisations; races raise ``torch.cuda._sanitizer.CUDASanitizerErrors``.
        Missing ``record_stream`` calls are reported at the free when
        ``TORCH_NPU_SANITIZER=1``. Returns True."""
        from torch_npu.npu import _stream_check
        self.check_record_stream = _settings.raw("TORCH_NPU_SANITIZER") == "1"
        with self._lock:
            self.event_handler = _stream_check.NPURecordStreamHandler(self.check_record_stream)
            self._register_callbacks()
        self.dispatch = _stream_check.NPUSanitizerDispatchMode(self.event_handler)
        self.dispatch.lock = self._lock
        self.dispatch.__enter__()
        from torch_npu.utils._logging import get_logger
        get_logger("env").info("NPU sanitizer enabled: stream check, record_stream check at frees %s",
                               "on" if self.check_record_stream else "off (TORCH_NPU_SANITIZER=1 turns it on)")
        return True

    def disable(self):
        """Stop checking: leave the dispatch mode, drop the handler's state and turn the
        runtime's trace hooks off again if enable() turned them on."""
        with self._lock:
            if self.dispatch is not None:
                try:
                    self.dispatch.__exit__(None, None, None)
                finally:
                    self.dispatch = None
            self.event_handler = None
            if self.enabled and self._trace_was_off and hasattr(torch_npu._C, "_deactivate_npu_trace"):
                torch_npu._C._deactivate_npu_trace()
            self.enabled = False

    def _register_callbacks(self):
        # Registered once: each forwards to the current handler, so a disable() and a new
        # enable() need no way to unregister.
        if self._registered:
            return
        import torch_npu.utils._npu_trace as npu_trace
        for event, method in _STREAM_CALLBACKS:
            getattr(npu_trace, f"register_callback_for_{event}")(self._forwarder(method), f"handle_{event[4:]}")
        self._registered = True

    def _forwarder(self, method):
        def forward(*args):
            with self._lock:
                handler = self.event_handler
                if handler is not None:
                    getattr(handler, method)(*args)
        forward.__name__ = method
        return forward

    def __del__(self):
        try:
            if sys is not None and not sys.is_finalizing() and self.dispatch is not None:
                self.dispatch.__exit__(None, None, None)
        except Exception:  # never fail the interpreter's teardown
            pass


def enable_npu_sanitizer():
    """Enable the NPU sanitizer (see :class:`NPUSanitizer`). For best results call it at
    the start of the program: allocations and streams made before are backfilled."""
    npu_sanitizer.enable()


npu_sanitizer = NPUSanitizer()
