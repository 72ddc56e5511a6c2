"""npu_moe_gating_top_k_backward: gradient of npu_moe_gating_top_k (sigmoid mode) w.r.t. its logits.

Documented (aclnnMoeGatingTopKBackward, sigmoid mode ``norm_type=1``), per token row ``i`` and
selected slot ``p``::

    g_ip  = routed_scaling_factor * grad_y_ip
    w'_ip = x_norm[i, expert_idx_ip]          D_i = sum_p w'_ip + eps
    beta_i = sum_p (w'_ip / D_i) * g_ip
    grad_norm[i, expert_idx_ip] += (g_ip - beta_i) / D_i
    grad_x = x_norm * (1 - x_norm) * grad_norm

``x_norm`` is the forward's sigmoid output (float32 on hardware), computed here in float32
(float64 stays float64); the result has ``grad_y``'s dtype. The softmax mode (``norm_type=0``)
and ``renorm != 0`` are not documented for this backward and raise NotImplementedError.
"""
import torch

from torch_npu.op_plugin._common import check
from torch_npu.op_plugin._registry import impl

__all__ = []

_OP = "npu_moe_gating_top_k_backward"


@impl("npu_moe_gating_top_k_backward")
def npu_moe_gating_top_k_backward(x_norm, grad_y, expertIdx, *, renorm=0, norm_type=0,
                                  routed_scaling_factor=1.0, eps=1e-20):
    """See the module doc."""
    if norm_type != 1:
        raise NotImplementedError("%s: norm_type=%r is not emulated (only the documented sigmoid "
                                  "mode norm_type=1)" % (_OP, norm_type))
    if renorm != 0:
        raise NotImplementedError("%s: renorm=%r is not emulated (only renorm=0 is documented)" % (_OP, renorm))
    check(x_norm.dim() == 2, _OP, "x_norm must be 2D (M, N), got %dD" % x_norm.dim())
    check(grad_y.dim() == 2 and tuple(grad_y.shape) == tuple(expertIdx.shape), _OP,
          "grad_y and expert_idx must both be (M, K), got %s and %s"
          % (tuple(grad_y.shape), tuple(expertIdx.shape)))
    check(grad_y.size(0) == x_norm.size(0), _OP, "grad_y has %d rows, x_norm %d" % (grad_y.size(0), x_norm.size(0)))
    check(grad_y.size(1) <= x_norm.size(1), _OP, "K=%d exceeds N=%d" % (grad_y.size(1), x_norm.size(1)))
    check(not expertIdx.is_floating_point(), _OP, "expert_idx must be an integer tensor")
    compute = torch.float64 if torch.float64 in (x_norm.dtype, grad_y.dtype) else torch.float32
    x = x_norm.to(compute)
    idx = expertIdx.long()
    g = grad_y.to(compute) * routed_scaling_factor
    selected = torch.gather(x, 1, idx)
    denom = selected.sum(1, keepdim=True) + eps
    beta = (selected / denom * g).sum(1, keepdim=True)
    grad_norm = torch.zeros_like(x).scatter_add(1, idx, (g - beta) / denom)
    return (x * (1 - x) * grad_norm).to(grad_y.dtype)
