"""The caching allocator of torch.npu: statistics, snapshots and limits.

Statistics use CUDA's keys (``allocated_bytes.all.current`` …), so tools
written for ``torch.cuda.memory_stats`` read them unchanged.
"""
import collections
import contextlib
import warnings
from typing import Any, Dict, Optional, Tuple, Union

import torch

import torch_npu
from torch_npu.utils._error_code import ErrCode, pta_error

from .utils import _get_device_index

__all__ = [
    "caching_allocator_alloc", "caching_allocator_delete", "set_per_process_memory_fraction",
    "get_per_process_memory_fraction", "empty_cache", "memory_stats", "memory_stats_as_nested_dict",
    "reset_accumulated_memory_stats", "reset_peak_memory_stats", "reset_max_memory_allocated",
    "reset_max_memory_cached", "memory_allocated", "max_memory_allocated", "memory_reserved",
    "max_memory_reserved", "memory_cached", "max_memory_cached", "memory_snapshot", "memory_summary",
    "get_allocator_backend", "empty_virt_addr_cache", "NPUPluggableAllocator", "change_current_allocator",
    "MemPool", "use_mem_pool", "host_empty_cache", "host_memory_stats", "host_memory_stats_as_nested_dict",
    "reset_accumulated_host_memory_stats", "reset_peak_host_memory_stats",
]


def _device(device) -> int:
    torch_npu.npu._lazy_init()
    idx = _get_device_index(device, optional=True)
    if idx < 0 or idx >= torch_npu.npu.device_count():
        raise AssertionError("Invalid device id" + pta_error(ErrCode.VALUE))
    return idx


def caching_allocator_alloc(size, device: Union[torch.device, str, int, None] = None, stream=None):
    r"""Allocate ``size`` bytes of device memory from the caching allocator; returns the address."""
    if device is None:
        device = torch_npu.npu.current_device()
    if not isinstance(size, int):
        raise TypeError("Invalid type for size argument, expected `int`, got " + type(size).__name__
                        + pta_error(ErrCode.TYPE))
    return torch_npu._C._npu_cachingAllocator_raw_alloc(size, _device(device))


def caching_allocator_delete(mem_ptr):
    r"""Free memory obtained with :func:`caching_allocator_alloc`."""
    torch_npu._C._npu_cachingAllocator_raw_delete(mem_ptr)


def set_per_process_memory_fraction(fraction, device: Union[torch.device, int, None] = None) -> None:
    r"""Limit this process to ``fraction`` of the device's memory."""
    idx = _device(device)
    if not isinstance(fraction, float):
        raise TypeError("Invalid type for fraction argument, must be `float`" + pta_error(ErrCode.TYPE))
    if fraction < 0 or fraction > 1:
        raise ValueError(f"Invalid fraction value: {fraction}. Allowed range: 0~1" + pta_error(ErrCode.VALUE))
    torch_npu._C._npu_setMemoryFraction(fraction, idx)


def get_per_process_memory_fraction(device: Union[torch.device, int, None] = None) -> float:
    return torch_npu._C._npu_getMemoryFraction(_device(device))


def empty_cache() -> None:
    r"""Release all unoccupied cached memory back to the device."""
    if torch_npu.npu.is_initialized():
        torch_npu._C._npu_emptyCache()


def empty_virt_addr_cache() -> None:
    empty_cache()


def memory_stats_as_nested_dict(device=None) -> Dict[str, Any]:
    if not torch_npu.npu.is_initialized():
        return {}
    return torch_npu._C._npu_memoryStats(_device(device))


def memory_stats(device=None) -> Dict[str, Any]:
    r"""Return the allocator statistics of a device, flattened like torch.cuda.memory_stats."""
    result = []

    def _recurse(prefix, obj):
        if isinstance(obj, dict):
            if prefix:
                prefix += "."
            for k, v in obj.items():
                _recurse(prefix + k, v)
        else:
            result.append((prefix, obj))

    _recurse("", memory_stats_as_nested_dict(device))
    result.sort()
    return collections.OrderedDict(result)


def reset_accumulated_memory_stats(device=None) -> None:
    torch_npu._C._npu_resetAccumulatedMemoryStats(_device(device))


def reset_peak_memory_stats(device=None) -> None:
    torch_npu._C._npu_resetPeakMemoryStats(_device(device))


def reset_max_memory_allocated(device=None) -> None:
    warnings.warn("torch.npu.reset_max_memory_allocated now calls torch.npu.reset_peak_memory_stats, "
                  "which resets /all/ peak memory stats.", FutureWarning)
    return reset_peak_memory_stats(device)


def reset_max_memory_cached(device=None) -> None:
    warnings.warn("torch.npu.reset_max_memory_cached now calls torch.npu.reset_peak_memory_stats, "
                  "which resets /all/ peak memory stats.", FutureWarning)
    return reset_peak_memory_stats(device)


def memory_allocated(device=None) -> int:
    return memory_stats(device).get("allocated_bytes.all.current", 0)


def max_memory_allocated(device=None) -> int:
    return memory_stats(device).get("allocated_bytes.all.peak", 0)


def memory_reserved(device=None) -> int:
    return memory_stats(device).get("reserved_bytes.all.current", 0)


def max_memory_reserved(device=None) -> int:
    return memory_stats(device).get("reserved_bytes.all.peak", 0)


def memory_cached(device=None) -> int:
    warnings.warn("torch.npu.memory_cached has been renamed to torch.npu.memory_reserved", FutureWarning)
    return memory_reserved(device)


def max_memory_cached(device=None) -> int:
    warnings.warn("torch.npu.max_memory_cached has been renamed to torch.npu.max_memory_reserved", FutureWarning)
    return max_memory_reserved(device)


def memory_snapshot(mempool_id=None):
    r"""Segments and blocks of every device's caching allocator (torch.cuda.memory_snapshot format)."""
    if not torch_npu.npu.is_initialized():
        return []
    return torch_npu._C._npu_memorySnapshot()["segments"]


def _snapshot(device=None):
    return torch_npu._C._npu_memorySnapshot()


def _format_size(sz, pref_sz):
    prefixes = ["B  ", "KiB", "MiB", "GiB", "TiB", "PiB"]
    prefix = prefixes[0]
    for new_prefix in prefixes[1:]:
        if pref_sz < 768 * 1024:
            break
        prefix = new_prefix
        sz //= 1024
        pref_sz /= 1024
    return f"{sz:6d} {prefix}"


def _format_count(cnt, pref_cnt):
    prefixes = [" ", "K", "M"]
    prefix = prefixes[0]
    for new_prefix in prefixes[1:]:
        if pref_cnt < 750 * 1000:
            break
        prefix = new_prefix
        cnt //= 1000
        pref_cnt /= 1000
    return f"{cnt:7d} {prefix} "


def memory_summary(device=None, abbreviated: bool = False) -> str:
    r"""A human-readable table of the allocator statistics of a device."""
    idx = _device(device)
    stats = memory_stats(device=idx)
    rows = [
        ("allocated_bytes", "Allocated memory", _format_size),
        ("active_bytes", "Active memory", _format_size),
        ("requested_bytes", "Requested memory", _format_size),
        ("reserved_bytes", "NPU reserved memory", _format_size),
        ("inactive_split_bytes", "Non-releasable memory", _format_size),
        ("allocation", "Allocations", _format_count),
        ("active", "Active allocs", _format_count),
        ("segment", "NPU reserved segments", _format_count),
        ("inactive_split", "Non-releasable allocs", _format_count),
    ]
    width = 75
    line = "|" + "=" * width + "|"
    thin = "|" + "-" * width + "|"
    out = [line, "| {:^73} |".format(f"PyTorch NPU memory summary, device ID {idx}"), thin,
           "| {:^73} |".format(f"NPU OOMs: {stats.get('num_ooms', 0)}  |  "
                               f"npuMalloc retries: {stats.get('num_alloc_retries', 0)}"),
           line, "|        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  |", thin]
    pools = [("all", "")] if abbreviated else [("all", ""), ("large_pool", "      from large pool"),
                                               ("small_pool", "      from small pool")]
    for key, name, fmt in rows:
        out.append(thin)
        for pool, label in pools:
            prefix = f"{key}.{pool}."
            cur = stats.get(prefix + "current", 0)
            peak = stats.get(prefix + "peak", 0)
            alloc = stats.get(prefix + "allocated", 0)
            freed = stats.get(prefix + "freed", 0)
            title = name if pool == "all" else label
            out.append("| {:<21} | {} | {} | {} | {} |".format(
                title, fmt(cur, cur), fmt(peak, peak), fmt(alloc, alloc), fmt(freed, freed)))
    out.append(line)
    out.append("| {:<21} | {:>45} |".format("Oversize allocations", stats.get("oversize_allocations.current", 0)))
    out.append("| {:<21} | {:>45} |".format("Oversize NPU segments", stats.get("oversize_segments.current", 0)))
    out.append(line)
    return "\n".join(out) + "\n"


def get_allocator_backend() -> str:
    return "native"


# ------------------------------------------------------------------ pools and pluggable allocators
class _NPUAllocator:
    r"""An allocator that ``change_current_allocator`` can install."""

    def __init__(self, allocator=None):
        self._allocator = allocator

    def allocator(self):
        return self._allocator


class NPUPluggableAllocator(_NPUAllocator):
    r"""An allocator loaded from a shared library exporting
    ``void* alloc_fn(size_t size, int device, aclrtStream stream)`` and
    ``void free_fn(void* ptr, size_t size, int device, aclrtStream stream)``.

    The library and both symbols are checked as on hardware. The emulated
    caching allocator owns device memory, so installing it
    (``change_current_allocator``) is refused."""

    def __init__(self, path_to_so_file: str, alloc_fn_name: str, free_fn_name: str):
        import ctypes
        lib = ctypes.CDLL(path_to_so_file)
        for fn in (alloc_fn_name, free_fn_name):
            if not hasattr(lib, fn):
                raise RuntimeError(f"Cannot find symbol {fn} in {path_to_so_file}" + pta_error(ErrCode.NOT_FOUND))
        super().__init__((path_to_so_file, alloc_fn_name, free_fn_name))


def change_current_allocator(allocator: _NPUAllocator) -> None:
    r"""Install another device allocator: not supported by the emulated device,
    whose memory exists only through its own caching allocator."""
    raise RuntimeError("change_current_allocator is not supported on the emulated NPU: device memory is "
                       "provided by the emulated caching allocator." + pta_error(ErrCode.NOT_SUPPORT))


_pool_ids = iter(range(1, 1 << 62))


class MemPool:
    r"""A private memory pool handle (``torch.npu.MemPool``).

    Emulated: ``use_mem_pool`` accepts the pool, but allocations made under it
    still come from the device's default pool (private pools need the C++
    allocator; see docs/api.md)."""

    def __init__(self, allocator=None):
        self._allocator = allocator
        self._id = (0, next(_pool_ids))

    @property
    def id(self):
        return self._id

    @property
    def allocator(self):
        return self._allocator

    def use_count(self):
        return 1

    def snapshot(self):
        return memory_snapshot(self._id)


@contextlib.contextmanager
def use_mem_pool(pool: MemPool, device=None):
    r"""Route allocations in the block to ``pool`` (emulated: default pool, see MemPool)."""
    if not isinstance(pool, MemPool):
        raise TypeError("pool must be a torch.npu.MemPool." + pta_error(ErrCode.TYPE))
    _device(device)
    yield


# ------------------------------------------------------------------ host (pinned) memory
def _host_stats_native():
    return getattr(torch_npu._C, "_npu_hostMemoryStats", None)


def host_memory_stats() -> Dict[str, Any]:
    r"""Statistics of the pinned host allocator. Empty until the C++ core exposes
    ``_npu_hostMemoryStats`` (pinned memory is not counted yet)."""
    native = _host_stats_native()
    if native is None:
        return collections.OrderedDict()
    stats = native()
    return collections.OrderedDict(sorted(stats.items()))


def host_memory_stats_as_nested_dict() -> Dict[str, Any]:
    native = _host_stats_native()
    return dict(native()) if native is not None else {}


def host_empty_cache() -> None:
    r"""Release cached pinned host memory (the emulated pinned memory is not cached)."""
    native = getattr(torch_npu._C, "_npu_hostEmptyCache", None)
    if native is not None:
        native()


def reset_accumulated_host_memory_stats() -> None:
    native = getattr(torch_npu._C, "_npu_resetAccumulatedHostMemoryStats", None)
    if native is not None:
        native()


def reset_peak_host_memory_stats() -> None:
    native = getattr(torch_npu._C, "_npu_resetPeakHostMemoryStats", None)
    if native is not None:
        native()
