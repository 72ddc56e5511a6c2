"""npu tensors, storages and events across processes (``torch.multiprocessing``
queues, pipes, ``Process``/``spawn`` arguments).

On hardware an npu tensor crosses processes as an IPC handle of its device
memory, so both processes then use the same memory. The emulator does the
same with shared device memory: ``UntypedStorage.share_memory_()`` (and
sending a tensor, which shares it first, as CUDA tensors are always
shareable) moves the storage's bytes into a memory file mapped by the device
allocator (``csrc/core/NPUCachingAllocator.cpp``, ``allocate_shared``); the
handle travels as a file descriptor (``multiprocessing.reduction.DupFd``, as
CPU tensors do with the ``file_descriptor`` strategy) and the receiver maps
it as an npu storage on the same device index. Writes in one process are
seen by the other. A storage sent several times arrives as one storage
(views keep sharing it). ``is_shared()`` is ``False`` for a fresh npu tensor
and ``True`` once its storage is in shared memory (after ``share_memory_``,
after it was sent, and in the receiver). Storages themselves are not
picklable, as CUDA storages are not: send a tensor.

Events need no handle: the emulated device finishes every op before the call
returns, so a received event is always complete.
"""
import multiprocessing.reduction
import os

import torch
import torch.multiprocessing.reductions as _torch_reductions
from multiprocessing.reduction import ForkingPickler
from torch.multiprocessing.reductions import StorageWeakRef, shared_cache, storage_from_cache

import torch_npu

__all__ = ["rebuild_npu_tensor", "rebuild_npu_event"]

_NPU = "npu"


def _byte_view(storage):
    """A 1-D uint8 npu tensor over the whole of ``storage`` (for the C++ calls)."""
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage, 0, (storage.nbytes(),), (1,))


def _cache_key(handle, device):
    st = os.fstat(handle)
    return (_NPU, device, st.st_dev, st.st_ino)


def _share_npu_(self):
    """Move this npu storage into shared device memory (if it is not there)
    and return ``(device, handle, size_bytes, offset_bytes, ref_counter_handle,
    ref_counter_offset, event_handle, event_sync_required)``, the layout of
    CUDA's ``_share_cuda_``; ``handle`` is a file descriptor that stays owned
    by the storage."""
    handle = torch_npu._C._npu_share_storage(_byte_view(self))
    return self.device.index, handle, self.nbytes(), 0, None, 0, None, False


def _new_shared_npu(device, handle, size_bytes):
    """An npu storage on ``device`` over the shared memory behind ``handle``
    (a file descriptor this process owns; the storage takes it over). One
    storage per shared memory: a handle seen before returns that storage."""
    torch_npu.npu._lazy_init()
    key = _cache_key(handle, device)
    storage = storage_from_cache(torch.UntypedStorage, key)
    if storage is not None:
        os.close(handle)
        return storage
    storage = torch_npu._C._npu_import_shared_storage(handle, size_bytes, device).untyped_storage()
    shared_cache[key] = StorageWeakRef(storage)
    return storage


def rebuild_npu_tensor(tensor_cls, tensor_size, tensor_stride, tensor_offset, storage_cls, dtype, storage_device,
                       storage_handle, storage_size_bytes, storage_offset_bytes, requires_grad, ref_counter_handle,
                       ref_counter_offset, event_handle, event_sync_required):
    """Rebuild an npu tensor sent by another process: ``storage_handle`` is the
    shared memory's handle (a ``multiprocessing.reduction.DupFd`` while in
    transit, or a file descriptor); the tensor is a view of that memory."""
    handle = storage_handle.detach() if hasattr(storage_handle, "detach") else storage_handle
    storage = _new_shared_npu(storage_device, handle, storage_size_bytes)
    t = torch.empty(0, dtype=dtype, device=torch.device(_NPU, storage_device))
    t.set_(storage, storage_offset_bytes // t.element_size() + tensor_offset, tensor_size, tensor_stride)
    if tensor_cls is torch.nn.parameter.Parameter:
        return torch.nn.parameter.Parameter(t, requires_grad=requires_grad)
    t.requires_grad_(requires_grad)
    return t


def rebuild_npu_event(device, handle):
    """An event on ``device``; complete, as every event of the synchronous emulated device."""
    with torch_npu.npu.device(device):
        return torch_npu.npu.Event()


def _reduce_npu_tensor(tensor):
    if tensor.requires_grad and not tensor.is_leaf:
        raise RuntimeError("Cowardly refusing to serialize non-leaf tensor which requires_grad, since autograd does "
                           "not support crossing process boundaries.  If you just want to transfer the data, call "
                           "detach() on the tensor before serializing (e.g., putting it on the queue).")
    storage = tensor.untyped_storage()
    device, handle, size_bytes, offset_bytes, *_ = storage._share_npu_()
    # A tensor that comes back to this process is rebuilt on this storage.
    shared_cache[_cache_key(handle, device)] = StorageWeakRef(storage)
    return (rebuild_npu_tensor,
            (type(tensor), tuple(tensor.size()), tuple(tensor.stride()), tensor.storage_offset(), type(storage),
             tensor.dtype, device, multiprocessing.reduction.DupFd(handle), size_bytes, offset_bytes,
             tensor.requires_grad, None, 0, None, False))


def _reduce_tensor(tensor):
    if tensor.device.type == _NPU and type(tensor) in (torch.Tensor, torch.nn.parameter.Parameter):
        return _reduce_npu_tensor(tensor)
    return _torch_reductions.reduce_tensor(tensor)


def _reduce_storage(storage):
    if storage.device.type == _NPU:
        raise RuntimeError("Cannot pickle NPU storage; try pickling a NPU tensor instead")
    return _torch_reductions.reduce_storage(storage)


def _reduce_event(event):
    return rebuild_npu_event, (torch_npu.npu.current_device(), None)


def _patch_storage_methods():
    cls = torch.UntypedStorage
    original_share = cls.share_memory_
    original_is_shared = cls.is_shared

    def share_memory_(self, *args, **kwargs):
        if self.device.type == _NPU:
            torch_npu._C._npu_share_storage(_byte_view(self))
            return self
        return original_share(self, *args, **kwargs)

    def is_shared(self):
        if self.device.type == _NPU:
            return torch_npu._C._npu_storage_shared_handle(_byte_view(self)) >= 0
        return original_is_shared(self)

    share_memory_.__doc__ = original_share.__doc__
    is_shared.__doc__ = original_is_shared.__doc__
    cls.share_memory_ = share_memory_
    cls.is_shared = is_shared
    cls._share_npu_ = _share_npu_
    cls._new_shared_npu = staticmethod(_new_shared_npu)


def _install():
    """Patch the storage methods (once) and register the npu reducers with
    ForkingPickler (idempotent: registering again replaces the same entry)."""
    if getattr(torch.UntypedStorage, "_share_npu_", None) is not _share_npu_:
        _patch_storage_methods()
    for cls in torch._tensor_classes:
        ForkingPickler.register(cls, _reduce_tensor)
    ForkingPickler.register(torch.Tensor, _reduce_tensor)
    ForkingPickler.register(torch.nn.parameter.Parameter, _reduce_tensor)
    ForkingPickler.register(torch.UntypedStorage, _reduce_storage)
    ForkingPickler.register(torch_npu.npu.Event, _reduce_event)
