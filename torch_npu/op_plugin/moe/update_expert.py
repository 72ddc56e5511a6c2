"""npu_moe_update_expert: map logical top-K experts to physical replicas (EPLB) and prune experts.

Documented (torch_npu docs and the real op's test golden), for token row ``i`` and slot ``j``,
``e = expert_ids[i, j]``, ``count = eplb_table[e, 0]``:

* ``count == 1``: ``eplb_table[e, 1]``;
* ``balance_mode=0``: ``eplb_table[e, local_rank_id // ceil(world_size / count) + 1]``;
* ``balance_mode=1``: ``eplb_table[e, i % count + 1]``.

Pruning (with ``expert_scales`` and ``pruning_threshold``): slot ``(i, j)`` stays active when
``active_mask[i]`` and not ``expert_scales[i, j] < pruning_threshold[j] * sum_j expert_scales[i]``.
Without ``expert_scales`` the documented mask is "not valid"; it is returned all True here (every
token and expert participates, which is what a missing mask means to dispatch).
``balanced_expert_ids`` keeps ``expert_ids``' dtype; the mask is bool ``(BS, K)``.
"""
import torch

from torch_npu.op_plugin._common import check
from torch_npu.op_plugin._registry import impl

__all__ = []

_OP = "npu_moe_update_expert"


def _place_column(op, counts, rows, local_rank_id, world_size, balance_mode):
    """Column of eplb_table read for each slot (1-based, after the count column)."""
    if balance_mode == 0:
        check(world_size >= 1 and 0 <= local_rank_id < world_size, op,
              "balance_mode=0 needs 0 <= local_rank_id < world_size, got %d and %d", (local_rank_id, world_size))
        per_replica = torch.div(world_size + counts - 1, counts, rounding_mode="floor")  # ceil(world_size / count)
        place = torch.div(torch.full_like(counts, local_rank_id), per_replica, rounding_mode="floor")
    else:
        place = torch.remainder(rows, counts)
    return torch.where(counts == 1, torch.zeros_like(place), place) + 1


@impl("npu_moe_update_expert")
def npu_moe_update_expert(expert_ids, eplb_table, *, expert_scales=None, pruning_threshold=None,
                          active_mask=None, local_rank_id=-1, world_size=-1, balance_mode=0):
    """See the module doc."""
    check(expert_ids.dim() == 2, _OP, "expert_ids must be 2D (BS, K), got %dD", expert_ids.dim())
    check(expert_ids.dtype in (torch.int32, torch.int64), _OP, "expert_ids must be int32 or int64")
    check(eplb_table.dim() == 2 and eplb_table.size(1) >= 2, _OP,
          "eplb_table must be 2D (log_expert_num, F) with F >= 2, got %s", (tuple(eplb_table.shape),))
    check(balance_mode in (0, 1), _OP, "balance_mode must be 0 or 1, got %r", (balance_mode,))
    check((expert_scales is None) == (pruning_threshold is None), _OP,
          "expert_scales and pruning_threshold must be given together")
    check(active_mask is None or expert_scales is not None, _OP,
          "active_mask needs expert_scales and pruning_threshold")
    bs, k = expert_ids.shape
    ids = expert_ids.long()
    table = eplb_table.long()
    counts = table[:, 0][ids]
    rows = torch.arange(bs, device=ids.device).unsqueeze(1).expand(bs, k)
    column = _place_column(_OP, counts, rows, local_rank_id, world_size, balance_mode)
    balanced = table[ids, column].to(expert_ids.dtype)
    if expert_scales is None:
        return balanced, torch.ones((bs, k), dtype=torch.bool, device=ids.device)
    check(tuple(expert_scales.shape) == (bs, k), _OP, "expert_scales must be (BS, K)")
    check(pruning_threshold.numel() == k, _OP, "pruning_threshold must be (K,) or (1, K)")
    scales = expert_scales.float() if expert_scales.dtype != torch.float64 else expert_scales
    limit = scales.sum(1, keepdim=True) * pruning_threshold.reshape(1, k).to(scales.dtype)
    keep = ~(scales < limit)
    if active_mask is not None:
        check(tuple(active_mask.shape) == (bs,) and active_mask.dtype == torch.bool, _OP,
              "active_mask must be bool (BS,)")
        keep = keep & active_mask.unsqueeze(1)
    return balanced, keep
