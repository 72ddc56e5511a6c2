"""npu_scatter_list(_): for each tensor ``i`` of the list ``self``, row ``indices[i]`` along ``axis``
is replaced by ``updates[i]`` (copies; the ``_`` form updates in place). The tested scenario of
op-plugin is emulated: ``reduce='update'``, ``axis`` -2 or -1, ``mask`` None or all ones.
Registered opaque (indices are read on the host) and non-differentiable (op-plugin's derivatives
have no entry either).
"""
import torch

from torch_npu.op_plugin._common import check, symbolic
from torch_npu.op_plugin._opaque_vjp import non_differentiable
from torch_npu.op_plugin._registry import opaque

__all__ = []


def _scatter_list_into(op, outputs, indices, updates, mask, reduce, axis):
    """outputs[i].select(axis, indices[i]) = updates[i].select(axis, 0) for every list entry."""
    check(reduce == "update", op, "reduce must be 'update', got %r", (reduce,))
    check(len(outputs) > 0, op, "the tensor list must not be empty")
    rank = outputs[0].dim()
    check(axis in (-2, -1, rank - 2, rank - 1), op, "axis must be -2 or -1, got %d", axis)
    dim = axis % rank
    check(indices.dim() == 1 and indices.size(0) == len(outputs), op,
          "indices must be 1-D with one index per tensor (%d), got %s", (len(outputs), tuple(indices.shape)))
    check(indices.dtype in (torch.int32, torch.int64), op, "indices must be int32 or int64")
    expected = [len(outputs)] + [1 if d == dim else s for d, s in enumerate(outputs[0].shape)]
    if updates.dim() == rank + 1 and updates.size(dim + 1) != 1:
        raise NotImplementedError("%s: updates of %d rows along axis are not emulated (only the documented one row "
                                  "per tensor)" % (op, updates.size(dim + 1)))
    check(list(updates.shape) == expected, op, "updates must be %s, got %s", (expected, list(updates.shape)))
    if mask is not None:
        check(mask.dim() == 1 and mask.size(0) == len(outputs), op, "mask must be 1-D with one entry per tensor")
        if not symbolic(mask) and not bool((mask != 0).all()):
            raise NotImplementedError("%s: a mask with zero entries is not emulated (its effect is not documented)"
                                      % op)
    for i, out in enumerate(outputs):
        check(tuple(out.shape) == tuple(outputs[0].shape) and out.dtype == updates.dtype, op,
              "every tensor must have shape %s and updates' dtype", (tuple(outputs[0].shape),))
        out.index_copy_(dim, indices[i:i + 1].long(), updates[i])


# The mask is checked on its values (zeros are not emulated), which a FakeTensor does not have:
# as CompositeImplicitAutograd kernels, compiled graphs skipped the check and accepted masks
# that eager rejects. As opaque ops the kernel runs on the real tensors inside the compiled
# graph, so compiled and eager raise the same error; the fake kernels do the shape checks.
def _scatter_list_fake(self, indices, updates, mask=None, reduce="update", axis=-2):
    outputs = [torch.empty_like(t) for t in self]
    _scatter_list_into("npu_scatter_list", outputs, indices, updates, mask, reduce, axis)
    return outputs


@opaque("npu_scatter_list", _scatter_list_fake)
def npu_scatter_list(self, indices, updates, mask=None, reduce="update", axis=-2):
    """Returns copies of the tensors of ``self`` with row ``indices[i]`` along ``axis`` of
    tensor i replaced by ``updates[i]`` (updates [list, *tensor shape with 1 at axis]). The
    tested scenario of op-plugin: ``reduce='update'``, ``axis`` -2 or -1, mask None or all ones."""
    outputs = [t.clone() for t in self]
    _scatter_list_into("npu_scatter_list", outputs, indices, updates, mask, reduce, axis)
    return outputs


non_differentiable("npu_scatter_list")  # no backward in op-plugin's derivatives either


def _scatter_list_inplace_fake(self, indices, updates, mask=None, reduce="update", axis=-2):
    _scatter_list_into("npu_scatter_list_", [torch.empty_like(t) for t in self], indices, updates, mask, reduce, axis)


@opaque("npu_scatter_list_", _scatter_list_inplace_fake)
def npu_scatter_list_(self, indices, updates, mask=None, reduce="update", axis=-2):
    """In-place :func:`npu_scatter_list`; returns nothing."""
    _scatter_list_into("npu_scatter_list_", list(self), indices, updates, mask, reduce, axis)
