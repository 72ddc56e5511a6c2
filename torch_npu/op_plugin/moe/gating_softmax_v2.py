"""npu_moe_gating_top_k_softmax_v2: MoE gating with a choice of softmax/top-k order.

Documented (aclnnMoeGatingTopKSoftmaxV2): ``renorm=0``: ``p = softmax(x, -1)``,
``y, expert_idx = topk(p, k)``; ``renorm=1``: ``t, expert_idx = topk(x, k)``,
``y = softmax(t, -1)``. Rows whose ``finished`` flag is True get ``expert_idx = E`` (the
number of experts). The third output is the float32 softmax of ``x`` (shape of ``x``) when
``renorm=0`` and ``output_softmax=True``, otherwise an empty ``(0,)`` float32 tensor, as
torch_npu allocates it. ``y`` has ``x``'s dtype (softmax in float32), ``expert_idx`` is
int32; equal values keep the lower expert index first (stable order).
"""
import torch

from torch_npu.op_plugin._common import acc, check
from torch_npu.op_plugin._registry import impl

__all__ = []


@impl("npu_moe_gating_top_k_softmax_v2")
def npu_moe_gating_top_k_softmax_v2(x, *, k=1, finished=None, renorm=0, output_softmax=False):
    """See the module doc."""
    op = "npu_moe_gating_top_k_softmax_v2"
    renorm = 0 if renorm is None else renorm
    check(x.dim() in (2, 3), op, "x must be 2D or 3D, got %dD" % x.dim())
    e = x.shape[-1]
    check(0 <= k <= min(e, 1024), op, "k must be in [0, min(%d, 1024)], got %d" % (e, k))
    check(renorm in (0, 1), op, "renorm must be 0 or 1, got %r" % (renorm,))
    xf = acc(x)
    want_softmax = renorm == 0 and bool(output_softmax)
    if renorm == 0:
        probs = torch.softmax(xf, dim=-1)
        values, indices = torch.sort(probs, dim=-1, descending=True, stable=True)
        y = values[..., :k]
    else:
        probs = None
        values, indices = torch.sort(xf, dim=-1, descending=True, stable=True)
        y = torch.softmax(values[..., :k], dim=-1)
    expert_idx = indices[..., :k].to(torch.int32)
    if finished is not None:
        check(finished.dtype == torch.bool, op, "finished must be bool, got %s" % finished.dtype)
        check(tuple(finished.shape) == tuple(x.shape[:-1]), op, "finished must have shape x.shape[:-1]")
        expert_idx = torch.where(finished.unsqueeze(-1), torch.full_like(expert_idx, e), expert_idx)
    softmax_out = probs.float() if want_softmax else x.new_empty((0,), dtype=torch.float32)
    return y.to(x.dtype), expert_idx, softmax_out
