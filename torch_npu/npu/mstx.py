"""``torch.npu.mstx``: MindStudio Tools Extension markers.

On hardware, marks and ranges go to the msprof timeline. Here each one is a
``torch.autograd.profiler`` record-function range, so it shows up in any
active profiler (``torch.profiler`` or ``torch_npu.profiler``) by name:

- ranges (``range_start``/``range_end``, ``range_push``/``range_pop``,
  ``mstx_range``, ``annotate``): ``mstx::<message>``;
- marks (``mark``): a zero-length range ``mstx::mark::<message>``.

The domain is passed as the record-function argument string
``domain=<domain>``. Range ids are positive ints; 0 means "not started"
(invalid message), as on hardware.
"""
import functools
import itertools
import threading
import warnings

import torch

__all__ = ["mstx", "annotate"]

_PREFIX = "mstx::"
_MARK_PREFIX = "mstx::mark::"

_ids = itertools.count(1)
_open_ranges = {}             # range id -> record-function handle
_tls = threading.local()      # per-thread stacks for range_push/range_pop, per domain
_lock = threading.Lock()


def _enter(name, domain):
    return torch.ops.profiler._record_function_enter_new(name, f"domain={domain}")


def _exit(handle):
    torch.ops.profiler._record_function_exit._RecordFunction(handle)


def _valid_message(message, func) -> bool:
    if not isinstance(message, str) or not message:
        warnings.warn(f"Invalid message for mstx.{func} func. Please input valid message string.")
        return False
    return True


class mstx:
    @staticmethod
    def mark(message: str, stream=None, domain: str = "default"):
        if not _valid_message(message, "mark"):
            return
        _exit(_enter(_MARK_PREFIX + message, domain))

    @staticmethod
    def range_start(message: str, stream=None, domain: str = "default") -> int:
        if not _valid_message(message, "range_start"):
            return 0
        handle = _enter(_PREFIX + message, domain)
        with _lock:
            range_id = next(_ids)
            _open_ranges[range_id] = handle
        return range_id

    @staticmethod
    def range_end(range_id: int, domain: str = "default"):
        if not isinstance(range_id, int):
            warnings.warn("Invalid message for mstx.range_end func. "
                          "Please input return value from mstx.range_start().")
            return
        with _lock:
            handle = _open_ranges.pop(range_id, None)
        if handle is not None:
            _exit(handle)

    @staticmethod
    def range_push(message: str, stream=None, domain: str = "default") -> int:
        range_id = mstx.range_start(message, stream, domain)
        if range_id:
            stacks = _tls.__dict__.setdefault("stacks", {})
            stacks.setdefault(domain, []).append(range_id)
        return range_id

    @staticmethod
    def range_pop(domain: str = "default") -> int:
        stack = _tls.__dict__.get("stacks", {}).get(domain)
        if not stack:
            return 0
        range_id = stack.pop()
        mstx.range_end(range_id, domain)
        return range_id

    @staticmethod
    def mstx_range(message: str, stream=None, domain: str = "default"):
        r"""Decorator: run the function inside a range named ``message``."""
        def wrapper(func):
            @functools.wraps(func)
            def inner(*args, **kwargs):
                range_id = mstx.range_start(message, stream, domain)
                try:
                    return func(*args, **kwargs)
                finally:
                    mstx.range_end(range_id, domain)
            return inner
        return wrapper

    @staticmethod
    def annotate(message: str = "", stream=None, domain: str = "default"):
        r"""Context manager and decorator: a range named ``message`` around a block."""
        return _Annotate(message, stream, domain)


class _Annotate:
    def __init__(self, message, stream, domain):
        self.message, self.stream, self.domain = message, stream, domain
        self.range_id = 0

    def __enter__(self):
        self.range_id = mstx.range_start(self.message, self.stream, self.domain)
        return self

    def __exit__(self, *exc):
        mstx.range_end(self.range_id, self.domain)
        return False

    def __call__(self, func):
        @functools.wraps(func)
        def inner(*args, **kwargs):
            with _Annotate(self.message, self.stream, self.domain):
                return func(*args, **kwargs)
        return inner


mark = mstx.mark
range_start = mstx.range_start
range_end = mstx.range_end
range_push = mstx.range_push
range_pop = mstx.range_pop
mstx_range = mstx.mstx_range
annotate = mstx.annotate
