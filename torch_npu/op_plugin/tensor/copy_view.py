"""Copies and views: ``copy_memory_``, ``npu_view_copy``, ``one_``, ``npu_reshape(.out)``,
``npu_stride_copy(.out)`` (a copy of ``as_strided(shape, stride, storage_offset)``) and
``get_storage_size`` (the element count of the tensor's storage). Each docstring states the
formula and where it comes from.

``npu_change_data_ptr`` (re-points one tensor's storage at another's memory) stays not
emulated: the emulated device cannot move a live tensor's data pointer.
"""
import torch

from torch_npu.op_plugin._common import check
from torch_npu.op_plugin._registry import impl

__all__ = []


@impl("copy_memory_")
def copy_memory_(self, src, non_blocking=False):
    """Copies ``src`` into ``self``; both must be npu tensors of the same dtype on the same
    device (the documented constraint), and the same shape."""
    op = "copy_memory_"
    check(self.device.type in ("npu", "meta") and src.device.type in ("npu", "meta"), op,
          "copy_memory_ only supports npu tensors, got %s and %s", (self.device, src.device))
    check(self.dtype == src.dtype, op, "self dtype %s and src dtype %s must match", (self.dtype, src.dtype))
    check(self.device == src.device, op, "self and src must be on the same device")
    check(tuple(self.shape) == tuple(src.shape), op,
          "self %s and src %s must have the same shape", (tuple(self.shape), tuple(src.shape)))
    return self.copy_(src)


@impl("npu_view_copy")
def npu_view_copy(self, other, non_blocking):
    """Copies ``other`` into ``self`` (which may be a view), as ``self.copy_(other)``."""
    return self.copy_(other)


@impl("one_")
def one_(self):
    """Fills ``self`` with ones."""
    return self.fill_(1)


@impl("npu_reshape")
def npu_reshape(self, shape, can_refresh=False):
    """``self`` with the new ``shape`` and the same data (a new tensor; ``can_refresh`` only
    lets the hardware reuse the input's memory)."""
    return self.reshape(list(shape)).clone()


@impl("npu_reshape.out")
def npu_reshape_out(self, shape, can_refresh=False, *, out):
    """:func:`npu_reshape` written into ``out``."""
    result = self.reshape(list(shape))
    out.resize_(result.shape)
    return out.copy_(result)


@impl("npu_stride_copy")
def npu_stride_copy(self, shape, stride, storage_offset):
    """A contiguous copy of the view of ``self``'s storage with ``shape``, ``stride`` and
    ``storage_offset`` (as ``torch.as_strided(self, shape, stride, storage_offset).clone()``)."""
    return torch.as_strided(self, list(shape), list(stride), int(storage_offset)).clone()


@impl("npu_stride_copy.out")
def npu_stride_copy_out(self, shape, stride, storage_offset, *, out):
    """:func:`npu_stride_copy` written into ``out``."""
    result = torch.as_strided(self, list(shape), list(stride), int(storage_offset))
    out.resize_(result.shape)
    return out.copy_(result)


@impl("get_storage_size")
def get_storage_size(self):
    """Number of elements of ``self``'s storage (its allocation, not the view's numel)."""
    return self.untyped_storage().nbytes() // self.element_size()
