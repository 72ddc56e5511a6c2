"""Gather ops: ``npu_gather_backward`` (the gradient of gather: ``grad`` scattered-added at
``index``), ``npu_gather_sparse_index`` (rows of ``input`` picked by an index tensor of any
shape) and its backward ``npu_gather_sparse_index_backward``.
"""
import torch

from torch_npu.op_plugin._common import check
from torch_npu.op_plugin._registry import impl

__all__ = []


@impl("npu_gather_backward")
def npu_gather_backward(grad, self_size, dim, index, sparse_grad):
    """Gradient of ``gather(self, dim, index)``: ``zeros(self_size).scatter_add(dim, index, grad)``.
    ``sparse_grad=True`` raises NotImplementedError (the npu gradient is dense)."""
    if sparse_grad:
        raise NotImplementedError("npu_gather_backward: sparse_grad=True is not supported")
    return grad.new_zeros(list(self_size)).scatter_add(dim, index.long(), grad)


@impl("npu_gather_sparse_index")
def npu_gather_sparse_index(input, index):
    """Row gather along dim 0: ``y[i..., j...] = input[index[i...], j...]``; output shape
    ``index.shape + input.shape[1:]``. ``index`` int32/int64 in ``[0, input.shape[0])`` (no
    negative indices). Differentiable in ``input`` (gradient: :func:`npu_gather_sparse_index_backward`)."""
    op = "npu_gather_sparse_index"
    check(input.dim() >= 1, op, "input must have at least 1 dim")
    check(index.dtype in (torch.int32, torch.int64), op, "index must be int32 or int64, got %s", index.dtype)
    rows = input.index_select(0, index.reshape(-1))
    return rows.reshape(tuple(index.shape) + tuple(input.shape[1:]))


@impl("npu_gather_sparse_index_backward")
def npu_gather_sparse_index_backward(grad, self_sizes, index):
    """Gradient of :func:`npu_gather_sparse_index`: zeros of ``self_sizes`` with each row of
    ``grad`` added into row ``index[...]`` (repeated indices accumulate)."""
    sizes = list(self_sizes)
    flat = grad.reshape([-1] + sizes[1:])
    return grad.new_zeros(sizes).index_add(0, index.reshape(-1), flat)
