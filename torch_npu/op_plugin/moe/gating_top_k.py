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
    check(x.dim() == 2, _OP, "x must be 2-D, got %dD" % x.dim())
    # float64 is accepted too (computed in float64) so that gradcheck can run
    check(x.dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64), _OP,
          "x must be float16, bfloat16 or float32, got %s" % x.dtype)
    n, e = x.shape
    check(e <= _MAX_EXPERTS, _OP, "the expert count %d must not exceed %d" % (e, _MAX_EXPERTS))
    check(norm_type in (0, 1), _OP, "norm_type must be 0 (softmax) or 1 (sigmoid), got %r" % (norm_type,))
    check(group_select_mode in (0, 1), _OP, "group_select_mode must be 0 or 1, got %r" % (group_select_mode,))
    check(group_count > 0 and e % group_count == 0 and e // group_count > 2, _OP,
          "x.shape[-1]=%d must be divisible by group_count=%d into groups of more than 2" % (e, group_count))
    check(1 <= k_group <= group_count, _OP, "k_group must be in [1, group_count=%d], got %d" % (group_count, k_group))
    per_group = e // group_count
    check(1 <= k <= per_group * k_group, _OP, "k must be in [1, %d], got %d" % (per_group * k_group, k))
    if bias is not None:
        check(bias.dim() == 1 and bias.shape[0] == e, _OP, "bias must be 1-D with %d entries" % e)
        check(bias.dtype == x.dtype, _OP, "bias dtype %s must equal x dtype %s" % (bias.dtype, x.dtype))
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
