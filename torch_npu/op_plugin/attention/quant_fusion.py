"""npu_quant_fusion_attention (the quantised npu_fusion_attention): meta-only.

Its computation is not emulated: FakeTensor / torch.compile can trace through it with the Meta
kernel below (shapes and dtypes from the op-plugin meta registration), while a real CPU / npu
call raises NotImplementedError naming the op.
"""
import torch

from torch_npu.op_plugin._common import check
from torch_npu.op_plugin._registry import meta

__all__ = []


@meta("npu_quant_fusion_attention")
def npu_quant_fusion_attention_meta(query, key, value, head_num, input_layout, *, d_scale_q, d_scale_k, d_scale_v,
                                    p_scale=None, scale=1., query_dtype=None):
    """(attention_score shaped like query, float16; softmax_max / softmax_sum float32 [B, N, S1, 8];
    softmax_out [0] float16; seed, offset, numels = 0) as the op-plugin meta registration (this schema
    has no out_dtype, so the output is float16)."""
    op = "npu_quant_fusion_attention"
    dims = {"BSH": (0, 1, 3), "SBH": (1, 0, 3), "BSND": (0, 1, 4), "BNSD": (0, 2, 4)}
    check(input_layout in dims, op, "input_layout must be BSH, SBH, BSND or BNSD, got %r", (input_layout,))
    b, s, rank = dims[input_layout]
    check(query.dim() == rank, op, "query must be %d-D for %s, got %d-D", (rank, input_layout, query.dim()))
    stat = query.new_empty((query.shape[b], head_num, query.shape[s], 8), dtype=torch.float32)
    return (query.new_empty(tuple(query.shape), dtype=torch.float16), stat, torch.empty_like(stat),
            query.new_empty([0], dtype=torch.float16), 0, 0, 0)
