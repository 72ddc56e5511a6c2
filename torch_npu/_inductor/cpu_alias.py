"""Zero-copy bridges between npu tensors and the CPU code Inductor generates.

The emulated device memory is host memory, so compiled CPU code can read npu
inputs through CPU aliases of the same memory and write its outputs straight
into the device pool. The C++ core provides the three primitives
(``_npu_cpu_alias``, ``_DeviceMemoryScope``, ``_npu_adopt``); until a build
has them, Python stand-ins keep the same contracts (aliases via ctypes, which
are still zero-copy; outputs copied into device memory, which is not).
"""
import contextlib
import ctypes

import torch

import torch_npu


def _c(name):
    return getattr(torch_npu._C, name, None)


def cpu_alias(t: torch.Tensor) -> torch.Tensor:
    """A CPU tensor over the npu tensor's memory (same sizes, strides, offset)."""
    native = _c("_npu_cpu_alias")
    if native is not None:
        return native(t)
    storage = t.untyped_storage()
    nbytes = storage.nbytes()
    if nbytes == 0:
        return torch.empty_strided(t.size(), t.stride(), dtype=t.dtype)
    # The ctypes array borrows the memory; frombuffer keeps it alive.
    raw = (ctypes.c_char * nbytes).from_address(storage.data_ptr())
    base = torch.frombuffer(raw, dtype=torch.uint8).view(t.dtype)
    return base.as_strided(t.size(), t.stride(), t.storage_offset())


def device_memory_scope(device_index: int):
    """While entered, CPU allocations on this thread come from the npu pool."""
    native = _c("_DeviceMemoryScope")
    if native is not None:
        return native(device_index)
    return contextlib.nullcontext()


def adopt(t: torch.Tensor, device_index: int) -> torch.Tensor:
    """An npu tensor for a CPU tensor produced inside ``device_memory_scope``."""
    native = _c("_npu_adopt")
    if native is not None:
        return native(t, device_index)
    return t.to(torch.device("npu", device_index))


def is_zero_copy() -> bool:
    """True when outputs are handed back without a copy (C++ primitives present)."""
    return all(_c(n) is not None for n in ("_npu_cpu_alias", "_DeviceMemoryScope", "_npu_adopt"))
