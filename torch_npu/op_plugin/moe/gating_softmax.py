"""MoE softmax gating: npu_moe_gating_top_k_softmax and npu_moe_gating_top_k_softmax_v2.

npu_moe_gating_top_k_softmax: softmax over the last (expert) dim, then the top ``k`` experts
per row (``finished`` rows get expert index E).

npu_moe_gating_top_k_softmax_v2 gives a choice of softmax/top-k order.

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
    check(x.dim() in (2, 3), op, "x must be 2D or 3D, got %dD", x.dim())
    e = x.shape[-1]
    check(0 <= k <= min(e, 1024), op, "k must be in [0, min(%d, 1024)], got %d", (e, k))
    check(renorm in (0, 1), op, "renorm must be 0 or 1, got %r", (renorm,))
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
        check(finished.dtype == torch.bool, op, "finished must be bool, got %s", finished.dtype)
        check(tuple(finished.shape) == tuple(x.shape[:-1]), op, "finished must have shape x.shape[:-1]")
        expert_idx = torch.where(finished.unsqueeze(-1), torch.full_like(expert_idx, e), expert_idx)
    softmax_out = probs.float() if want_softmax else x.new_empty((0,), dtype=torch.float32)
    return y.to(x.dtype), expert_idx, softmax_out


@impl("npu_moe_gating_top_k_softmax")
def npu_moe_gating_top_k_softmax(x, finished=None, k=1):
    """MoE gating: softmax over the last (expert) dim, then the top ``k`` experts per row.

    ``x`` is ``[..., E]`` (2D or 3D); with ``N`` = number of rows (product of the leading
    dims), returns ``(y, expert_idx, row_idx)``, each ``[..., k]``: ``y`` the top-k
    softmax probabilities in descending order (dtype of ``x``, softmax computed in
    float32), ``expert_idx`` their expert indices (int32; ties go to the lower expert
    index) and ``row_idx[i, j] = j * N + i`` (int32). ``finished`` (bool, ``x.shape[:-1]``):
    rows where it is True get ``expert_idx = E`` (the kernel's "not processed" marker);
    their ``y`` is still the softmax value.
    """
    op = "npu_moe_gating_top_k_softmax"
    check(x.dim() in (2, 3), op, "x must be 2D or 3D, got %dD", x.dim())
    e = x.shape[-1]
    check(1 <= k <= e, op, "k must be in [1, %d], got %d", (e, k))
    lead = tuple(x.shape[:-1])
    probs = torch.softmax(acc(x), dim=-1)
    values, indices = torch.sort(probs, dim=-1, descending=True, stable=True)
    y = values[..., :k].to(x.dtype)
    expert_idx = indices[..., :k].to(torch.int32)
    if finished is not None:
        check(finished.dtype == torch.bool, op, "finished must be bool, got %s", finished.dtype)
        check(tuple(finished.shape) == lead, op,
              "finished shape %s must equal x.shape[:-1] %s", (tuple(finished.shape), lead))
        expert_idx = torch.where(finished.unsqueeze(-1), torch.full_like(expert_idx, e), expert_idx)
    n = 1
    for s in lead:
        n *= s
    rows = torch.arange(n, dtype=torch.int32, device=x.device).unsqueeze(1)
    cols = torch.arange(k, dtype=torch.int32, device=x.device).unsqueeze(0)
    row_idx = (cols * n + rows).reshape(lead + (k,))
    return y, expert_idx, row_idx
