"""torch_npu.utils.storage: the unpickling hook of npu tensors saved by old torch_npu releases.

Old torch_npu pickled an npu tensor as a call of ``_rebuild_npu_tensor``; the
name stays importable so that such files load, and so that tools which list it
as a safe global for ``torch.load(weights_only=True)`` (msprobe does) find it.
"""
from torch._utils import _rebuild_tensor

__all__ = []


def _rebuild_npu_tensor(storage, storage_offset, size, stride, requires_grad, backward_hooks, npu_storage_info):
    """Rebuild a tensor pickled by an old torch_npu: a view of ``storage`` at
    ``storage_offset`` with ``size``/``stride``, its ``requires_grad`` and
    backward hooks restored. ``npu_storage_info`` (the device's private storage
    format of the saved tensor) is accepted and not applied: the emulated npu
    keeps every tensor in its logical layout, so the data needs no conversion."""
    tensor = _rebuild_tensor(storage, storage_offset, size, stride)
    tensor.requires_grad = requires_grad
    tensor._backward_hooks = backward_hooks
    return tensor
