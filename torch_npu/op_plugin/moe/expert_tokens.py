"""MoE token bookkeeping: npu_moe_compute_expert_tokens."""
import torch

from torch_npu.op_plugin._common import check
from torch_npu.op_plugin._registry import impl

__all__ = []


@impl("npu_moe_compute_expert_tokens")
def npu_moe_compute_expert_tokens(sorted_expert_for_source_row, num_expert):
    """For the ascending expert ids of the routed rows, the end position (exclusive) of each
    expert's rows, found by binary search: ``out[e] = #{rows with expert id <= e}`` for
    ``e = 0 .. num_expert - 1`` (so expert e owns rows ``out[e-1]:out[e]``). 1-D, dtype of the
    input."""
    op = "npu_moe_compute_expert_tokens"
    x = sorted_expert_for_source_row
    check(x.dim() == 1, op, "sorted_expert_for_source_row must be 1-D, got %s", (tuple(x.shape),))
    check(num_expert >= 0, op, "num_expert must be >= 0, got %d", num_expert)
    experts = torch.arange(num_expert, device=x.device, dtype=x.dtype)
    return torch.searchsorted(x.contiguous(), experts, right=True).to(x.dtype)
