"""Backward ops torch_npu's autograd formulas call (its ``derivatives.yaml``):
``repeat_interleave_backward_int`` / ``_tensor`` (the gradient summed over each repeated
group) and ``npu_renorm_backward`` (the gradient of ``torch.renorm``).
"""
import torch

from torch_npu.op_plugin._common import check
from torch_npu.op_plugin._registry import impl

__all__ = []


@impl("repeat_interleave_backward_int")
def repeat_interleave_backward_int(grad, self, repeats, dim=None):
    """Gradient of ``repeat_interleave(self, repeats, dim)`` with an int ``repeats``: each group
    of ``repeats`` consecutive gradient entries along ``dim`` (of flattened ``self`` when ``dim``
    is None) summed."""
    if dim is None:
        return grad.reshape(self.numel(), repeats).sum(1).reshape(self.shape)
    d = dim % max(self.dim(), 1)
    shape = list(self.shape)
    grouped = grad.reshape(shape[:d] + [shape[d], repeats] + shape[d + 1:])
    return grouped.sum(d + 1)


@impl("repeat_interleave_backward_tensor")
def repeat_interleave_backward_tensor(grad, self, repeats, dim=None):
    """Gradient of ``repeat_interleave(self, repeats, dim)`` with a tensor ``repeats``: the
    gradient entries of each repeated element summed back onto it (``index_add``)."""
    flat = dim is None
    src = self.reshape(-1) if flat else self
    d = 0 if flat else dim % max(self.dim(), 1)
    n = src.shape[d]
    reps = repeats.expand(n) if repeats.numel() == 1 else repeats
    owner = torch.repeat_interleave(torch.arange(n, device=grad.device), reps.to(grad.device),
                                    output_size=grad.shape[d])
    out = grad.new_zeros(src.shape).index_add(d, owner, grad)
    return out.reshape(self.shape)


@impl("npu_renorm_backward")
def npu_renorm_backward(grad, self, p, dim, maxnorm):
    """Gradient of ``torch.renorm(self, p, dim, maxnorm)``. With ``norm`` the p-norm of each
    slice along ``dim`` and ``f = maxnorm / (norm + 1e-7)``: slices with ``norm <= maxnorm``
    pass ``grad`` through; the others get ``f * grad - maxnorm / (norm + 1e-7)^2 *
    sum(grad * self) * d norm / d self``."""
    p = float(p)
    maxnorm = float(maxnorm)
    check(p > 0, "npu_renorm_backward", "p must be positive, got %s", p)
    d = dim % self.dim()
    reduce_dims = [i for i in range(self.dim()) if i != d]
    x = self
    norm = torch.linalg.vector_norm(x, p, reduce_dims, keepdim=True)
    if p == float("inf"):
        at_max = (x.abs() == norm).to(x.dtype)
        dnorm = torch.sign(x) * at_max / at_max.sum(reduce_dims, keepdim=True)
    elif p == 1.0:
        dnorm = torch.sign(x)
    else:
        dnorm = x * x.abs().pow(p - 2) / norm.pow(p - 1)
        dnorm = torch.where(norm > 0, dnorm, torch.zeros_like(dnorm))
    inv = 1.0 / (norm + 1e-7)
    inner = (grad * x).sum(reduce_dims, keepdim=True)
    scaled = maxnorm * inv * grad - maxnorm * inv * inv * inner * dnorm
    return torch.where(norm > maxnorm, scaled, grad)
