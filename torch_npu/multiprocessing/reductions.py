"""Pickling npu tensors and events for ``torch.multiprocessing`` (queues, pipes, spawn arguments).

On hardware a tensor crosses processes as an IPC handle of its device memory,
so both processes then see the same memory. The emulated device memory is
private to each process (host memory owned by its allocator), so here the
bytes of the tensor's storage travel through a shared-memory CPU storage
(torch's own CPU sharing: file descriptors or files) and the receiver puts
them into its own device memory: values, dtype, shape, strides, storage
offset, device index and ``requires_grad`` arrive intact, but a write in one
process is **not** seen by the other (a copy, not an alias). Views sent in one
message do not share storage on the receiving side either.

Events need no handle: the emulated device finishes every op before the call
returns, so a received event is always complete.
"""
import torch
import torch.multiprocessing.reductions as _torch_reductions
from multiprocessing.reduction import ForkingPickler

import torch_npu

__all__ = ["rebuild_npu_tensor", "rebuild_npu_event"]


def rebuild_npu_tensor(tensor_cls, tensor_size, tensor_stride, tensor_offset, storage_cls, dtype, storage_device,
                       storage_handle, storage_size_bytes, storage_offset_bytes, requires_grad, ref_counter_handle,
                       ref_counter_offset, event_handle, event_sync_required):
    """Rebuild an npu tensor from its storage bytes (``storage_handle``: a shared CPU storage here)."""
    device = torch.device("npu", storage_device)
    host = torch.empty(0, dtype=torch.uint8).set_(storage_handle)
    host = host[storage_offset_bytes:storage_offset_bytes + storage_size_bytes]
    device_bytes = host.to(device)
    t = torch.empty(0, dtype=dtype, device=device)
    t.set_(device_bytes.untyped_storage(), tensor_offset, tensor_size, tensor_stride)
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
    nbytes = storage.nbytes()
    raw = torch.empty(0, dtype=torch.uint8, device=tensor.device).set_(storage, 0, (nbytes,), (1,))
    shared = raw.cpu().untyped_storage()
    shared.share_memory_()
    return (rebuild_npu_tensor,
            (type(tensor), tuple(tensor.size()), tuple(tensor.stride()), tensor.storage_offset(), type(storage),
             tensor.dtype, tensor.device.index, shared, nbytes, 0, tensor.requires_grad, None, 0, None, False))


def _reduce_tensor(tensor):
    if tensor.device.type == "npu" and type(tensor) in (torch.Tensor, torch.nn.parameter.Parameter):
        return _reduce_npu_tensor(tensor)
    return _torch_reductions.reduce_tensor(tensor)


def _reduce_event(event):
    return rebuild_npu_event, (torch_npu.npu.current_device(), None)


def _install():
    for cls in torch._tensor_classes:
        ForkingPickler.register(cls, _reduce_tensor)
    ForkingPickler.register(torch.Tensor, _reduce_tensor)
    ForkingPickler.register(torch.nn.parameter.Parameter, _reduce_tensor)
    ForkingPickler.register(torch_npu.npu.Event, _reduce_event)
