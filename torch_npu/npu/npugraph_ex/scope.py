"""Scopes of the npugraph_ex backend that steer how the ops inside them are compiled.

On hardware they set, for the ops traced inside, the number of AI/vector cores
(``limit_core_num``) and the deterministic-computation level
(``deterministic``). The emulated device runs CPU kernels that are already
deterministic and has no cores to share out: the values are checked, and
``current()`` tells which scopes are open; results are unchanged.
"""
import contextlib
import threading

__all__ = ["limit_core_num", "deterministic"]

_open = threading.local()


def current():
    """The open scopes on this thread, innermost last: [(kind, values), ...] (emulator introspection)."""
    return list(getattr(_open, "stack", []))


@contextlib.contextmanager
def _scope(kind, values):
    stack = _open.__dict__.setdefault("stack", [])
    stack.append((kind, values))
    try:
        yield
    finally:
        stack.pop()


def _check_count(name, value):
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be a non-negative int, got {value!r}")


def limit_core_num(op_aicore_num: int, op_vectorcore_num: int, stream=None):
    """Ops inside use at most this many AI cores / vector cores (0: no limit)."""
    _check_count("op_aicore_num", op_aicore_num)
    _check_count("op_vectorcore_num", op_vectorcore_num)
    return _scope("limit_core_num", (op_aicore_num, op_vectorcore_num, stream))


def deterministic(level: int):
    """Ops inside compute deterministically at ``level`` (0: off, 1: deterministic, 2: strong)."""
    if isinstance(level, bool) or level not in (0, 1, 2):
        raise ValueError(f"level must be 0, 1 or 2, got {level!r}")
    return _scope("deterministic", (level,))
