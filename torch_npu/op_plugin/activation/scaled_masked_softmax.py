"""Softmax ops."""
import torch

from torch_npu.op_plugin._common import acc, check
from torch_npu.op_plugin._registry import impl

__all__ = []

# Value written at masked positions before the softmax (the kernel's constant:
# fully masked rows come out uniform instead of NaN).
MASK_FILL = -10000.0


def _mask(op, x, mask, fixed_triu_mask):
    check(x.dim() >= 2, op, "x must have at least 2 dims, got %d", x.dim())
    if fixed_triu_mask:
        # Generated causal mask over the last two dims: True strictly above the diagonal.
        rows, cols = x.shape[-2], x.shape[-1]
        return torch.ones(rows, cols, dtype=torch.bool, device=x.device).triu(1)
    check(mask.dtype == torch.bool, op, "mask must be a bool tensor, got %s", mask.dtype)
    torch.broadcast_shapes(mask.shape, x.shape)
    return mask


@impl("npu_scaled_masked_softmax")
def npu_scaled_masked_softmax(x, mask, scale=1, fixed_triu_mask=False):
    """Scaled, masked softmax over the last dim:
    ``y = softmax(masked_fill(x * scale, mask, -10000), dim=-1)``; ``mask`` (bool,
    broadcastable to ``x``) is True where masked. With ``fixed_triu_mask=True`` the
    mask is instead generated as the strict upper triangle of the last two dims
    (``triu(ones(S, S), 1)``, causal). Computed in float32; ``y`` has ``x``'s dtype."""
    m = _mask("npu_scaled_masked_softmax", x, mask, fixed_triu_mask)
    z = (acc(x) * scale).masked_fill(m, MASK_FILL)
    return torch.softmax(z, dim=-1).to(x.dtype)


@impl("npu_scaled_masked_softmax_backward")
def npu_scaled_masked_softmax_backward(y_grad, y, mask, scale, fixed_triu_mask):
    """Gradient of :func:`npu_scaled_masked_softmax` from its output ``y``:
    ``dx = scale * y * (dy - sum(dy * y, -1))``, and 0 where masked."""
    m = _mask("npu_scaled_masked_softmax_backward", y, mask, fixed_triu_mask)
    yf, g = acc(y), acc(y_grad)
    dx = (yf * (g - (g * yf).sum(-1, keepdim=True)) * scale).masked_fill(m, 0)
    return dx.to(y.dtype)
