"""Bind the calling thread to CPU cores (``set_thread_affinity``).

On hardware torch_npu binds the main and dispatch threads near the NPU's
NUMA node. The emulated device computes on this host, so binding is real:
it uses ``os.sched_setaffinity`` on the calling thread (Linux)."""
import os

from torch_npu.utils._error_code import ErrCode, pta_error

__all__ = ["set_thread_affinity", "reset_thread_affinity"]


def _cores(core_range):
    if core_range is None:
        return set(range(os.cpu_count() or 1))
    if not isinstance(core_range, list):
        raise TypeError("core_range must be a list of two ints or a list of such lists." + pta_error(ErrCode.TYPE))
    ranges = core_range if core_range and isinstance(core_range[0], list) else [core_range]
    cores = set()
    for r in ranges:
        if len(r) != 2 or not all(isinstance(c, int) for c in r) or r[0] > r[1] or r[0] < 0:
            raise ValueError(f"core range {r} must be [start, end] with 0 <= start <= end." + pta_error(ErrCode.VALUE))
        cores.update(range(r[0], r[1] + 1))
    return cores


def set_thread_affinity(core_range=None):
    r"""Bind the calling thread to the cores ``[start, end]`` (inclusive), or to
    the union of several such ranges; None binds to every core."""
    if not hasattr(os, "sched_setaffinity"):
        return
    cores = _cores(core_range) & set(range(os.cpu_count() or 1))
    if cores:
        os.sched_setaffinity(0, cores)


def reset_thread_affinity():
    r"""Let the calling thread run on every core again."""
    set_thread_affinity(None)
