"""Max / min along a dimension: ``npu_max.dim`` / ``npu_min.dim`` (values and int32 indices, as
``torch.max`` / ``torch.min`` along ``dim``) and their backward ops ``npu_max_backward`` /
``npu_min_backward`` (the gradient scattered to the selected positions).
"""
import torch

from torch_npu.op_plugin._registry import impl

__all__ = []


@impl("npu_max.dim")
def npu_max_dim(self, dim, keepdim=False):
    """``(values, indices)`` of the maximum along ``dim`` (as ``torch.max``), indices int32."""
    values, indices = torch.max(self, dim, keepdim)
    return values, indices.to(torch.int32)


def _select_backward(grad, dim, indices, sizes, keepdim):
    if not keepdim and len(sizes) > 0:
        grad, indices = grad.unsqueeze(dim), indices.unsqueeze(dim)
    return grad.new_zeros(list(sizes)).scatter(dim, indices.long(), grad)


@impl("npu_max_backward")
def npu_max_backward(grad, dim, indices, sizes, keepdim):
    """Gradient of ``npu_max(self, dim, keepdim)``: ``grad`` placed at ``indices`` along ``dim`` in
    a zero tensor of ``sizes``."""
    return _select_backward(grad, dim, indices, sizes, keepdim)


@impl("npu_min_backward")
def npu_min_backward(grad, dim, indices, sizes, keepdim):
    """Gradient of ``npu_min(self, dim, keepdim)``: ``grad`` placed at ``indices`` along ``dim`` in
    a zero tensor of ``sizes``."""
    return _select_backward(grad, dim, indices, sizes, keepdim)


@impl("npu_min.dim")
def npu_min_dim(self, dim, keepdim=False):
    """``(values, indices)`` of the minimum along ``dim`` (as ``torch.min``), indices int32 (as
    ``npu_max``)."""
    values, indices = torch.min(self, dim, keepdim)
    return values, indices.to(torch.int32)
