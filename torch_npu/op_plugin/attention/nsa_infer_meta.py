"""Meta kernels (output shapes and dtypes only) for round-8 attention ops whose computation is
not emulated: FakeTensor / torch.compile can trace through them, while a real CPU / npu call
still raises NotImplementedError naming the op.

Shapes and dtypes come from each op's documentation and the real op-plugin sources (meta
registrations, op_api allocation code); the per-op docstrings say which.
"""
import torch

from torch_npu.op_plugin._common import check
from torch_npu.op_plugin._registry import meta

__all__ = []



# ---------------------------------------------------------------- quant fusion attention

@meta("npu_quant_fusion_attention")
def npu_quant_fusion_attention_meta(query, key, value, head_num, input_layout, *, d_scale_q, d_scale_k, d_scale_v,
                                    p_scale=None, scale=1., query_dtype=None):
    """(attention_score shaped like query, float16; softmax_max / softmax_sum float32 [B, N, S1, 8];
    softmax_out [0] float16; seed, offset, numels = 0) as the op-plugin meta registration (this schema
    has no out_dtype, so the output is float16)."""
    op = "npu_quant_fusion_attention"
    dims = {"BSH": (0, 1, 3), "SBH": (1, 0, 3), "BSND": (0, 1, 4), "BNSD": (0, 2, 4)}
    check(input_layout in dims, op, "input_layout must be BSH, SBH, BSND or BNSD, got %r" % (input_layout,))
    b, s, rank = dims[input_layout]
    check(query.dim() == rank, op, "query must be %d-D for %s, got %d-D" % (rank, input_layout, query.dim()))
    stat = query.new_empty((query.shape[b], head_num, query.shape[s], 8), dtype=torch.float32)
    return (query.new_empty(tuple(query.shape), dtype=torch.float16), stat, torch.empty_like(stat),
            query.new_empty([0], dtype=torch.float16), 0, 0, 0)


# ---------------------------------------------------------------- native sparse attention (inference, paged)

def _paged_value_dim(op, value, kv_heads):
    """Head dim of a paged value cache (block_num, block_size, H) or (block_num, block_size, N, D)."""
    check(value.dim() in (3, 4), op, "value must be (block_num, block_size, H) or (block_num, block_size, N, D)")
    if value.dim() == 4:
        return value.shape[3]
    check(kv_heads > 0 and value.shape[2] % kv_heads == 0, op, "value H (%d) must be a multiple of "
          "key_value_head_num (%d)" % (value.shape[2], kv_heads))
    return value.shape[2] // kv_heads


@meta("npu_nsa_compress_attention_infer")
def npu_nsa_compress_attention_infer_meta(query, key, value, scale_value, head_num, key_value_head_num,
                                          select_block_size, select_block_count, page_block_size, compress_block_size,
                                          compress_stride, *, layout="TND", atten_mask=None, block_table=None,
                                          topk_mask=None, actual_seq_qlen=None, actual_cmp_seq_kvlen=None,
                                          actual_sel_seq_kvlen=None):
    """(attention_out [T, N, Dv] in query's dtype, topk_indices [T, N_kv, select_block_count] int32)
    for a TND query (S = 1 per batch) over paged (block_num, block_size, H) caches."""
    op = "npu_nsa_compress_attention_infer"
    check(query.dim() == 3, op, "query must be TND (3-D), got %d-D" % query.dim())
    check(query.shape[1] == head_num, op, "query N (%d) must equal head_num (%d)" % (query.shape[1], head_num))
    check(key_value_head_num > 0 and head_num % key_value_head_num == 0, op,
          "head_num must be a multiple of key_value_head_num")
    dv = _paged_value_dim(op, value, key_value_head_num)
    return (query.new_empty((query.shape[0], head_num, dv)),
            query.new_empty((query.shape[0], key_value_head_num, select_block_count), dtype=torch.int32))


@meta("npu_nsa_select_attention_infer")
def npu_nsa_select_attention_infer_meta(query, key, value, topk_indices, scale_value, head_num, key_value_head_num,
                                        select_block_size, select_block_count, page_block_size, *, layout="BSND",
                                        atten_mask=None, block_table=None, actual_seq_qlen=None,
                                        actual_seq_kvlen=None):
    """attention_out like query with value's head dim: BSND [B, S, N, Dv], BSH [B, S, N * Dv]
    (documented layouts) and TND [T, N, Dv] (the op-plugin test's layout)."""
    op = "npu_nsa_select_attention_infer"
    ranks = {"BSND": 4, "BSH": 3, "TND": 3}
    check(layout in ranks, op, "layout must be BSND, BSH or TND, got %r" % (layout,))
    check(query.dim() == ranks[layout], op, "query must be %d-D for layout %s" % (ranks[layout], layout))
    dv = _paged_value_dim(op, value, key_value_head_num)
    if layout == "BSND":
        return query.new_empty(tuple(query.shape[:3]) + (dv,))
    if layout == "TND":
        return query.new_empty((query.shape[0], query.shape[1], dv))
    return query.new_empty((query.shape[0], query.shape[1], head_num * dv))
