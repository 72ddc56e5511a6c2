"""Quantised DeepSeek sparse attention: npu_quant_lightning_indexer and
npu_kv_quant_sparse_flash_attention, emulated as dequantize-then-sibling-math.

npu_quant_lightning_indexer (torch_npu docs): per query token and key position j,

    score[j] = sum_h  W[h] * ReLU(Scale_Q[h] * Scale_K[j] * (Q[h] . K[j]))

with Per-Token-Head scales (``query_quant_mode`` = ``key_quant_mode`` = 0): ``query_dequant_scale``
has the query's shape without D, ``key_dequant_scale`` the key's. Dequantizing ``Q[h] * Scale_Q[h]``
and ``K[j] * Scale_K[j]`` in float32 turns this into npu_lightning_indexer's score, whose top-k,
masks and layouts (``attention/lightning_indexer.py``) are reused unchanged.

npu_kv_quant_sparse_flash_attention (torch_npu docs and the op-plugin golden): MLA-absorb
(``attention_mode`` 2) with a combined per-tile cache (``quant_scale_repo_mode`` 1,
``key_quant_mode`` = ``value_quant_mode`` = 2). Each key row of D_k bytes is
``[int8 k_nope (dn) | k_rope (rope_head_dim values of the query's dtype) | float32 scales (dn / tile_size)]``
and the query is ``[q_nope (dn) | q_rope (rope_head_dim)]``. Dequant (as the golden):
``K_nope = (float32(k_nope) * scale[t // tile_size]).to(query dtype)``; values are the same
dequantized K_nope (K and V are one copy in MLA-absorb; the ``value`` tensor's contents are not
read). Then npu_sparse_flash_attention (``attention/sparse_flash.py``) with the rope parts gives
``softmax(scale_value * [q_nope, q_rope] . [K_nope, k_rope]) @ K_nope``, output D = dn.

Precision: the sibling kernels compute in float32; the hardware's intermediate roundings (the
indexer's float16 partial scores, the attention's softmax rounded to the query dtype) are not
reproduced, so near-ties of the top-k may order differently from the chip.

Not emulated (NotImplementedError naming the argument): other quant modes, ``attention_mode`` other
than 2, ``quant_scale_repo_mode`` other than 1, the reserved ``key_dequant_scale`` /
``value_dequant_scale`` and the ``query_dtype`` / ``key_dtype`` / ``value_dtype`` overrides (their
torch_npu ``_cd.DType`` codes, e.g. hifloat8, are not defined by this package; None uses the
tensor's own dtype).
"""
import torch

from torch_npu.op_plugin._common import check, unsupported
from torch_npu.op_plugin._registry import impl

__all__ = []

_MAX = 9223372036854775807

# Documented (query/key dtype) -> allowed (weights, query_dequant_scale, key_dequant_scale) dtypes.
_INDEXER_DTYPES = {
    torch.int8: ((torch.float16, torch.float16, torch.float16),),
    torch.float8_e4m3fn: ((torch.float16, torch.float16, torch.float16),
                          (torch.bfloat16, torch.float32, torch.float32)),
}


def _only(op, name, value, allowed, why):
    if value not in allowed:
        unsupported(op, "%s=%r (%s)" % (name, value, why))


def _dtype_override(op, name, value):
    if value is not None:
        unsupported(op, "%s=%r (torch_npu's _cd.DType codes such as hifloat8 are not defined here; "
                          "pass None to use the tensor's own dtype)" % (name, value))


def _dequant_rows(x, scale):
    """Per-token(-head) dequant: x [..., D] * scale [...] in float32."""
    return x.to(torch.float32) * scale.to(torch.float32).unsqueeze(-1)


@impl("npu_quant_lightning_indexer")
def npu_quant_lightning_indexer(query, key, weights, query_dequant_scale, key_dequant_scale, query_quant_mode,
                                key_quant_mode, *, actual_seq_lengths_query=None, actual_seq_lengths_key=None,
                                block_table=None, layout_query="BSND", layout_key="BSND", sparse_count=2048,
                                sparse_mode=3, pre_tokens=_MAX, next_tokens=_MAX, query_dtype=None, key_dtype=None):
    """int32 top-``sparse_count`` key positions per query token (see the module docstring):
    [B, S1, N2, k] for BSND queries, [T1, N2, k] for TND, -1 padded."""
    op = "npu_quant_lightning_indexer"
    _only(op, "query_quant_mode", query_quant_mode, (0,), "only 0, Per-Token-Head, is documented")
    _only(op, "key_quant_mode", key_quant_mode, (0,), "only 0, Per-Token-Head, is documented")
    _dtype_override(op, "query_dtype", query_dtype)
    _dtype_override(op, "key_dtype", key_dtype)
    check(query.dtype in _INDEXER_DTYPES, op, "query must be int8 or float8_e4m3fn, got %s", query.dtype)
    check(key.dtype == query.dtype, op, "key dtype %s differs from the query's %s", (key.dtype, query.dtype))
    combo = (weights.dtype, query_dequant_scale.dtype, key_dequant_scale.dtype)
    check(combo in _INDEXER_DTYPES[query.dtype], op,
          "with %s query/key, (weights, query_dequant_scale, key_dequant_scale) must be one of %s, got %s", (query.dtype, _INDEXER_DTYPES[query.dtype], combo))
    check(tuple(query_dequant_scale.shape) == tuple(query.shape[:-1]), op,
          "query_dequant_scale shape %s must be the query's without D %s", (tuple(query_dequant_scale.shape), tuple(query.shape[:-1])))
    check(tuple(key_dequant_scale.shape) == tuple(key.shape[:-1]), op,
          "key_dequant_scale shape %s must be the key's without D %s", (tuple(key_dequant_scale.shape), tuple(key.shape[:-1])))
    check(1 <= sparse_count <= 2048, op, "sparse_count must be in [1, 2048], got %d", sparse_count)
    check(layout_key == "PA_BSND" or layout_key == layout_query, op,
          "without PageAttention layout_key (%s) must equal layout_query (%s)", (layout_key, layout_query))
    # through the dispatcher: the indexer is an opaque op, one node under torch.compile
    indices, _ = torch.ops.npu.npu_lightning_indexer(
        _dequant_rows(query, query_dequant_scale), _dequant_rows(key, key_dequant_scale), weights,
        actual_seq_lengths_query=actual_seq_lengths_query, actual_seq_lengths_key=actual_seq_lengths_key,
        block_table=block_table, layout_query=layout_query, layout_key=layout_key, sparse_count=sparse_count,
        sparse_mode=sparse_mode, pre_tokens=pre_tokens, next_tokens=next_tokens, return_value=False)
    return indices


def _split_combined_key(op, key, query_dtype, dn, rope_dim, tile):
    """key [..., D_k] int8 = [k_nope | k_rope bytes | float32 scale bytes] ->
    (dequantized k_nope in the query dtype [..., dn], k_rope [..., rope_dim])."""
    rope_bytes = rope_dim * (torch.finfo(query_dtype).bits // 8)
    tiles = dn // tile
    expect = dn + rope_bytes + 4 * tiles
    check(key.shape[-1] == expect, op, "key D must be dn + rope bytes + scale bytes = %d + %d + %d = %d, got %d", (dn, rope_bytes, 4 * tiles, expect, key.shape[-1]))
    k_rope = key[..., dn:dn + rope_bytes].view(query_dtype)
    scale = key[..., dn + rope_bytes:].view(torch.float32)  # [..., tiles]
    k_nope = (key[..., :dn].to(torch.float32) * scale.repeat_interleave(tile, dim=-1)).to(query_dtype)
    return k_nope, k_rope


@impl("npu_kv_quant_sparse_flash_attention")
def npu_kv_quant_sparse_flash_attention(query, key, value, sparse_indices, scale_value, key_quant_mode,
                                        value_quant_mode, *, key_dequant_scale=None, value_dequant_scale=None,
                                        block_table=None, actual_seq_lengths_query=None, actual_seq_lengths_kv=None,
                                        sparse_block_size=1, layout_query="BSND", layout_kv="BSND", sparse_mode=3,
                                        pre_tokens=_MAX, next_tokens=_MAX, attention_mode=0, quant_scale_repo_mode=1,
                                        tile_size=128, rope_head_dim=64, key_dtype=None, value_dtype=None):
    """Sparse MLA attention over a per-tile int8 cache (see the module docstring). Returns the
    attention output in the query's layout and dtype with D = query D - rope_head_dim."""
    op = "npu_kv_quant_sparse_flash_attention"
    _only(op, "key_quant_mode", key_quant_mode, (2,), "only 2, per-tile, is documented")
    _only(op, "value_quant_mode", value_quant_mode, (2,), "only 2, per-tile, is documented")
    _only(op, "attention_mode", attention_mode, (2,), "only 2, MLA-absorb, is documented")
    _only(op, "quant_scale_repo_mode", quant_scale_repo_mode, (1,), "only 1, scales combined into key, is documented")
    if key_dequant_scale is not None:
        unsupported(op, "key_dequant_scale (reserved; only None is documented)")
    if value_dequant_scale is not None:
        unsupported(op, "value_dequant_scale (reserved; only None is documented)")
    _dtype_override(op, "key_dtype", key_dtype)
    _dtype_override(op, "value_dtype", value_dtype)
    check(tile_size == 128, op, "tile_size only supports 128, got %d", tile_size)
    check(rope_head_dim == 64, op, "rope_head_dim only supports 64, got %d", rope_head_dim)
    check(query.dtype in (torch.float16, torch.bfloat16), op, "query must be float16 or bfloat16, got %s", query.dtype)
    check(key.dtype == torch.int8 and value.dtype == torch.int8, op,
          "key and value must be int8, got %s and %s", (key.dtype, value.dtype))
    check(value.dim() == key.dim() and tuple(value.shape[:-1]) == tuple(key.shape[:-1]), op,
          "value must have the key's shape except D, got %s and %s", (tuple(value.shape), tuple(key.shape)))
    dn = query.shape[-1] - rope_head_dim
    check(dn > 0 and dn % tile_size == 0, op, "query D - rope_head_dim (%d) must be a positive multiple of tile_size %d", (dn, tile_size))
    check(1 <= sparse_block_size <= 16, op, "sparse_block_size must be in [1, 16], got %d", sparse_block_size)
    check(layout_kv == "PA_BSND" or layout_kv == layout_query, op,
          "without PageAttention layout_kv (%s) must equal layout_query (%s)", (layout_kv, layout_query))
    if layout_kv == "PA_BSND":
        check(key.dim() == 4 and key.shape[1] % sparse_block_size == 0, op,
              "sparse_block_size %d must divide the PageAttention block_size", sparse_block_size)
    n2 = key.shape[-2]
    check(sparse_indices.dtype == torch.int32, op, "sparse_indices must be int32, got %s", sparse_indices.dtype)
    check(sparse_indices.dim() == query.dim() and tuple(sparse_indices.shape[:-1]) == tuple(query.shape[:-2]) + (n2,),
          op, "sparse_indices shape %s must be %s + (sparse_size,)", (tuple(sparse_indices.shape), tuple(query.shape[:-2]) + (n2,)))
    k_nope, k_rope = _split_combined_key(op, key, query.dtype, dn, rope_head_dim, tile_size)
    out, _, _ = torch.ops.npu.npu_sparse_flash_attention(
        query[..., :dn], k_nope, k_nope, sparse_indices, scale_value, block_table=block_table,
        actual_seq_lengths_query=actual_seq_lengths_query, actual_seq_lengths_kv=actual_seq_lengths_kv,
        query_rope=query[..., dn:], key_rope=k_rope, sparse_block_size=sparse_block_size, layout_query=layout_query,
        layout_kv=layout_kv, sparse_mode=sparse_mode, pre_tokens=pre_tokens, next_tokens=next_tokens,
        attention_mode=2, return_softmax_lse=False)
    return out
