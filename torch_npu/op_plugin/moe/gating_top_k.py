"""npu_moe_gating_top_k: grouped top-k expert selection (DeepSeek-style gating).

From the torch_npu doc (its "equivalent computation logic"), per token row, in float32:

* ``norm = softmax(x)`` (``norm_type=0``) or ``sigmoid(x)`` (``norm_type=1``);
  ``scores = norm + bias`` (bias only steers the selection);
* with ``group_count > 1`` the experts are split into ``group_count`` equal groups scored by their
  maximum (``group_select_mode=0``) or the sum of their two largest scores (``=1``); the top
  ``k_group`` groups are kept (stable order: ties keep the lower group), the others are -inf;
* ``expert_idx`` = the ``k`` largest scores (stable: ties keep the lower expert), int32;
  ``y = norm[expert_idx]``, divided by ``sum(y) + eps`` in sigmoid mode, times
  ``routed_scaling_factor``, in ``x``'s dtype;
* the third output is ``norm`` (float32, shape of ``x``; float64 for float64 input). The real op fills it only with
  ``out_flag=True``; it is always returned here.

``renorm`` other than 0 ("currently only 0"), ``input_ids`` and ``tid2eid`` (not described by the
doc) raise NotImplementedError. Autograd flows through the composition (float32 norm, gather).

npu_moe_gating_top_k_backward, the gradient w.r.t. the logits in sigmoid mode (documented,
aclnnMoeGatingTopKBackward, ``norm_type=1``), per token row ``i`` and selected slot ``p``::

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

from torch_npu.op_plugin._common import check, stat_dtype, unsupported
from torch_npu.op_plugin._registry import impl

__all__ = []

_OP = "npu_moe_gating_top_k"
_MAX_EXPERTS = 2048


@impl("npu_moe_gating_top_k")
def npu_moe_gating_top_k(x, k, *, bias=None, input_ids=None, tid2eid=None, k_group=1, group_count=1,
                         group_select_mode=0, renorm=0, norm_type=0, out_flag=False, routed_scaling_factor=1.0,
                         eps=1e-20):
    if renorm != 0:
        unsupported(_OP, "renorm=%r (only 0)" % (renorm,))
    for name, value in (("input_ids", input_ids), ("tid2eid", tid2eid)):
        if value is not None:
            unsupported(_OP, "%s (not described by the documentation)" % name)
    check(x.dim() == 2, _OP, "x must be 2-D, got %dD", x.dim())
    # float64 is accepted too (computed in float64) so that gradcheck can run
    check(x.dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64), _OP,
          "x must be float16, bfloat16 or float32, got %s", x.dtype)
    n, e = x.shape
    check(e <= _MAX_EXPERTS, _OP, "the expert count %d must not exceed %d", (e, _MAX_EXPERTS))
    check(norm_type in (0, 1), _OP, "norm_type must be 0 (softmax) or 1 (sigmoid), got %r", (norm_type,))
    check(group_select_mode in (0, 1), _OP, "group_select_mode must be 0 or 1, got %r", (group_select_mode,))
    check(group_count > 0 and e % group_count == 0 and e // group_count > 2, _OP,
          "x.shape[-1]=%d must be divisible by group_count=%d into groups of more than 2", (e, group_count))
    check(1 <= k_group <= group_count, _OP, "k_group must be in [1, group_count=%d], got %d", (group_count, k_group))
    per_group = e // group_count
    check(1 <= k <= per_group * k_group, _OP, "k must be in [1, %d], got %d", (per_group * k_group, k))
    if bias is not None:
        check(bias.dim() == 1 and bias.shape[0] == e, _OP, "bias must be 1-D with %d entries", e)
        check(bias.dtype == x.dtype, _OP, "bias dtype %s must equal x dtype %s", (bias.dtype, x.dtype))
    xf = x.to(stat_dtype(x))
    norm = torch.softmax(xf, dim=-1) if norm_type == 0 else torch.sigmoid(xf)
    scores = norm if bias is None else norm + bias.to(xf.dtype)
    if group_count > 1:
        grouped = scores.reshape(n, group_count, per_group)
        if group_select_mode == 0:
            group_score = grouped.amax(-1)
        else:
            group_score = torch.topk(grouped, 2, dim=-1).values.sum(-1)
        kept = torch.sort(group_score, dim=-1, descending=True, stable=True)[1][:, :k_group]
        keep = torch.zeros(n, group_count, dtype=torch.bool, device=x.device).scatter(1, kept, True)
        scores = torch.where(keep.unsqueeze(-1), grouped, torch.full_like(grouped, float("-inf"))).reshape(n, e)
    expert_idx = torch.sort(scores, dim=-1, descending=True, stable=True)[1][:, :k]
    y = norm.gather(1, expert_idx)
    if norm_type == 1:
        y = y / (y.sum(-1, keepdim=True) + eps)
    y = y * routed_scaling_factor
    return y.to(x.dtype), expert_idx.to(torch.int32), norm


_BACKWARD_OP = "npu_moe_gating_top_k_backward"


@impl("npu_moe_gating_top_k_backward")
def npu_moe_gating_top_k_backward(x_norm, grad_y, expertIdx, *, renorm=0, norm_type=0,
                                  routed_scaling_factor=1.0, eps=1e-20):
    """See the module doc."""
    if norm_type != 1:
        raise NotImplementedError("%s: norm_type=%r is not emulated (only the documented sigmoid "
                                  "mode norm_type=1)" % (_BACKWARD_OP, norm_type))
    if renorm != 0:
        raise NotImplementedError("%s: renorm=%r is not emulated (only renorm=0 is documented)" % (_BACKWARD_OP, renorm))
    check(x_norm.dim() == 2, _BACKWARD_OP, "x_norm must be 2D (M, N), got %dD", x_norm.dim())
    check(grad_y.dim() == 2 and tuple(grad_y.shape) == tuple(expertIdx.shape), _BACKWARD_OP,
          "grad_y and expert_idx must both be (M, K), got %s and %s",
          (tuple(grad_y.shape), tuple(expertIdx.shape)))
    check(grad_y.size(0) == x_norm.size(0), _BACKWARD_OP, "grad_y has %d rows, x_norm %d", (grad_y.size(0), x_norm.size(0)))
    check(grad_y.size(1) <= x_norm.size(1), _BACKWARD_OP, "K=%d exceeds N=%d", (grad_y.size(1), x_norm.size(1)))
    check(not expertIdx.is_floating_point(), _BACKWARD_OP, "expert_idx must be an integer tensor")
    compute = torch.float64 if torch.float64 in (x_norm.dtype, grad_y.dtype) else torch.float32
    x = x_norm.to(compute)
    idx = expertIdx.long()
    g = grad_y.to(compute) * routed_scaling_factor
    selected = torch.gather(x, 1, idx)
    denom = selected.sum(1, keepdim=True) + eps
    beta = (selected / denom * g).sum(1, keepdim=True)
    grad_norm = torch.zeros_like(x).scatter_add(1, idx, (g - beta) / denom)
    return (x * (1 - x) * grad_norm).to(grad_y.dtype)
