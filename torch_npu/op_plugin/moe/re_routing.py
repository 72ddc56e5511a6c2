"""npu_moe_re_routing: after the AlltoAll, reorder the received tokens from (source rank, expert)
blocks to (expert, source rank) blocks.

From the torch_npu doc: ``expert_token_num_per_rank (N, E)`` gives the token count of each (rank i,
expert j) block; ``tokens (A, H)`` hold the blocks rank-major (block (i, j) starts at
``SrcOffset = Σ`` of the counts before it in (i, j) order), the output holds them expert-major
(``DstOffset = Σ`` of the counts before (j, i) in (j, i) order), each block keeping its row order.

* ``permute_tokens[d] = tokens[permute_token_idx[d]]`` (``permute_token_idx``: gather index, int32);
* ``permute_per_token_scales`` moves ``per_token_scales`` the same way (zeros without them: the doc
  calls that output invalid then);
* ``expert_token_num[j] = Σ_i expert_token_num_per_rank[i, j]`` (count mode), in its dtype.

The block of every row is found with searchsorted on the cumulative counts (no host read), so
Meta/FakeTensor work. ``expert_token_num_type`` other than 1, ``idx_type`` other than 0 ("currently
only") and ``tokens_dtype`` raise NotImplementedError.
"""
import torch

from torch_npu.op_plugin._common import check, unsupported
from torch_npu.op_plugin._registry import impl

__all__ = []

_OP = "npu_moe_re_routing"


@impl("npu_moe_re_routing")
def npu_moe_re_routing(tokens, expert_token_num_per_rank, *, per_token_scales=None, expert_token_num_type=1,
                       idx_type=0, tokens_dtype=None):
    if expert_token_num_type != 1:
        unsupported(_OP, "expert_token_num_type=%r (only 1, count mode)" % (expert_token_num_type,))
    if idx_type != 0:
        unsupported(_OP, "idx_type=%r (only 0, gather index)" % (idx_type,))
    if tokens_dtype is not None:
        unsupported(_OP, "tokens_dtype=%r" % (tokens_dtype,))
    counts = expert_token_num_per_rank
    check(tokens.dim() == 2, _OP, "tokens must be 2-D (A, H), got %dD", tokens.dim())
    check(counts.dim() == 2, _OP, "expert_token_num_per_rank must be 2-D (N, E), got %dD", counts.dim())
    check(counts.dtype in (torch.int32, torch.int64), _OP, "expert_token_num_per_rank must be int32 or int64")
    ranks, experts = counts.shape
    a = tokens.shape[0]
    if per_token_scales is not None:
        check(per_token_scales.dim() == 1 and per_token_scales.shape[0] == a, _OP,
              "per_token_scales must be 1-D with A=%d entries", a)
    flat = counts.long().reshape(-1)                                   # (i, j) order
    src_end = torch.cumsum(flat, 0)
    src_start = src_end - flat
    by_expert = counts.long().t().reshape(-1)                          # (j, i) order
    dst_start_em = torch.cumsum(by_expert, 0) - by_expert
    dst_start = dst_start_em.reshape(experts, ranks).t().reshape(-1)   # back to (i, j) order
    rows = torch.arange(a, device=tokens.device)
    block = torch.searchsorted(src_end.contiguous(), rows, right=True).clamp(max=ranks * experts - 1)
    dest = dst_start.index_select(0, block) + rows - src_start.index_select(0, block)
    gather_idx = torch.empty_like(rows).scatter(0, dest, rows)
    permute_tokens = tokens.index_select(0, gather_idx)
    if per_token_scales is not None:
        permute_scales = per_token_scales.index_select(0, gather_idx)
    else:
        permute_scales = tokens.new_zeros((a,), dtype=torch.float32)
    expert_token_num = counts.sum(0).to(counts.dtype)
    return permute_tokens, permute_scales, gather_idx.to(torch.int32), expert_token_num
