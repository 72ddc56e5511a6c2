"""npu_rope_quant_kvcache and npu_dequant_rope_quant_kvcache: meta-only.

Rotary embedding of q / k followed by the quantised KV-cache update. Not emulated (a real CPU / npu
call raises NotImplementedError naming the op); the Meta kernels give the output shapes and
dtypes from the ops' torch_npu documentation and op-plugin's output-size code (read, not copied).
"""
import torch

from torch_npu.op_plugin._common import check
from torch_npu.op_plugin._registry import meta

__all__ = []


def _rope_quant_kvcache(op, x, cos, k_cache, v_cache, size_splits, kv_output):
    """q (and, with kv_output, k and v) after the rotary embedding, in cos's dtype: x is
    [B, S, H] (outputs [B, S, heads, D]) or [T, H] (outputs [T, heads, D]); D is the cache's last
    dim, q heads = size_splits[0] // D, k/v heads = the cache's third dim. Without kv_output the
    k/v outputs are empty [0] tensors. The caches are updated in place by the real kernel; the
    schema returns them as new tensors, so copies of their shape are returned here."""
    check(x.dim() in (2, 3), op, "x must be 2-D or 3-D, got %d-D", x.dim())
    check(k_cache.dim() == 4, op, "k_cache must be 4-D, got %d-D", k_cache.dim())
    check(len(size_splits) == 3, op, "size_splits must have 3 entries, got %d", len(size_splits))
    check(size_splits[0] >= 0, op, "size_splits[0] must be >= 0, got %d", size_splits[0])
    lead = [x.size(0), x.size(1)] if x.dim() == 3 else [x.size(0)]
    k_heads, head_dim = k_cache.size(2), k_cache.size(3)
    q_heads = size_splits[0] // head_dim if head_dim != 0 else 0
    kv_shape = lead + [k_heads, head_dim] if kv_output else [0]
    return (x.new_empty(lead + [q_heads, head_dim], dtype=cos.dtype),
            x.new_empty(kv_shape, dtype=cos.dtype),
            x.new_empty(kv_shape, dtype=cos.dtype),
            torch.empty_like(k_cache), torch.empty_like(v_cache))


@meta("npu_rope_quant_kvcache")
def npu_rope_quant_kvcache(x, cos, sin, k_cache, v_cache, indices, scale_k, scale_v, size_splits, *, offset_k=None,
                           offset_v=None, quant_mode=0, input_layout="BSND", kv_output=False, cache_mode="contiguous"):
    return _rope_quant_kvcache("npu_rope_quant_kvcache", x, cos, k_cache, v_cache, size_splits, kv_output)


@meta("npu_dequant_rope_quant_kvcache")
def npu_dequant_rope_quant_kvcache(x, cos, sin, k_cache, v_cache, indices, scale_k, scale_v, size_splits, *,
                                   offset_k=None, offset_v=None, weight_scale=None, activation_scale=None, bias=None,
                                   quant_mode=0, input_layout="BSND", kv_output=False, cache_mode="contiguous"):
    op = "npu_dequant_rope_quant_kvcache"
    check(x.dtype == torch.int32, op, "x must be int32 (the matmul accumulator), got %s", x.dtype)
    return _rope_quant_kvcache(op, x, cos, k_cache, v_cache, size_splits, kv_output)
