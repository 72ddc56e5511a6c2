"""Meta kernels (output shapes and dtypes only) for the KV-cache, sampling and runtime ops of
``torch.ops.npu`` that are not emulated (the detection and RNN ops that were here are emulated
since round 9): FakeTensor / torch.compile can trace
through them, a real CPU/npu call still raises NotImplementedError naming the op.

Shapes and dtypes follow the ops' torch_npu documentation and op-plugin's own output-size code
(``_meta_registrations.py`` and the op_api/acl_op kernels; read, not copied). The per-op rules and
their sources are listed in docs/ops-cache-misc-r8.md. In-place ops (``Tensor(a!)`` returns) give
back the mutated argument itself; ops whose schema returns ``()`` return None.
"""
import torch
from torch.fx.node import has_side_effect

from torch_npu.op_plugin._registry import meta

__all__ = []


def _check(cond, op, message):
    torch._check(cond, lambda: "%s: %s" % (op, message))


# ----------------------------------------------------------------- rope + quant + KV cache

def _rope_quant_kvcache(op, x, cos, k_cache, v_cache, size_splits, kv_output):
    """q (and, with kv_output, k and v) after the rotary embedding, in cos's dtype: x is
    [B, S, H] (outputs [B, S, heads, D]) or [T, H] (outputs [T, heads, D]); D is the cache's last
    dim, q heads = size_splits[0] // D, k/v heads = the cache's third dim. Without kv_output the
    k/v outputs are empty [0] tensors. The caches are updated in place by the real kernel; the
    schema returns them as new tensors, so copies of their shape are returned here."""
    _check(x.dim() in (2, 3), op, "x must be 2-D or 3-D, got %d-D" % x.dim())
    _check(k_cache.dim() == 4, op, "k_cache must be 4-D, got %d-D" % k_cache.dim())
    _check(len(size_splits) == 3, op, "size_splits must have 3 entries, got %d" % len(size_splits))
    _check(size_splits[0] >= 0, op, "size_splits[0] must be >= 0, got %d" % size_splits[0])
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
    _check(x.dtype == torch.int32, op, "x must be int32 (the matmul accumulator), got %s" % x.dtype)
    return _rope_quant_kvcache(op, x, cos, k_cache, v_cache, size_splits, kv_output)


# ----------------------------------------------------------------- sampling

@meta("npu_top_k_top_p_sample")
def npu_top_k_top_p_sample(logits, top_k, top_p, q=None, eps=1e-8, is_need_logits=False, top_k_guess=32, min_ps=None,
                           ks_max=1024, input_is_logits=True, post_sample="qSample", generator=None):
    """logits_select_idx: int64 [batch]; logits_top_kp_select: float32 of logits' shape."""
    op = "npu_top_k_top_p_sample"
    _check(logits.dim() == 2, op, "logits must be 2-D [batch, voc_size], got %d-D" % logits.dim())
    _check(top_k.dim() == 1 and top_p.dim() == 1, op, "top_k and top_p must be 1-D")
    if q is not None:
        _check(tuple(q.shape) == tuple(logits.shape), op, "q must have logits' shape %s, got %s"
               % (tuple(logits.shape), tuple(q.shape)))
    return (logits.new_empty((logits.size(0),), dtype=torch.int64),
            logits.new_empty(tuple(logits.shape), dtype=torch.float32))


# ----------------------------------------------------------------- HANS lossless compression

@meta("npu_hans_encode.out")
def npu_hans_encode_out(input, statistic=False, reshuff=False, *, pdf, mantissa, fixed, var):
    return pdf, mantissa, fixed, var


@meta("npu_hans_decode.out")
def npu_hans_decode_out(mantissa, fixed, var, pdf, reshuff=False, *, out):
    return out


# ----------------------------------------------------------------- model obfuscation (PMCC)

@meta("obfuscation_calculate")
def obfuscation_calculate(fd, x, param, *, obf_coefficient=1.0):
    return torch.empty_like(x)


@meta("obfuscation_finalize")
def obfuscation_finalize(fd_to_close):
    return torch.empty_like(fd_to_close)


# ----------------------------------------------------------------- attention / FFN disaggregation

@meta("attention_worker_scheduler")
def attention_worker_scheduler(self):
    return torch.empty_like(self)


@meta("attention_worker_scheduler_")
def attention_worker_scheduler_(self):
    return self


@meta("ffn_worker_scheduler")
def ffn_worker_scheduler(self, *, sync_group_size=1, execute_mode=0):
    return torch.empty_like(self)


@meta("ffn_worker_scheduler_")
def ffn_worker_scheduler_(self, *, sync_group_size=1, execute_mode=0):
    return self


@meta("npu_attention_to_ffn")
def npu_attention_to_ffn(x, session_id, micro_batch_id, layer_id, expert_ids, expert_rank_table, group, world_size,
                         ffn_token_info_table_shape, ffn_token_data_shape, attn_token_info_table_shape, moe_expert_num,
                         *, scales=None, active_mask=None, quant_mode=0, sync_flag=0, ffn_start_rank_id=0):
    """Sends tokens to the FFN ranks; returns nothing (marked side-effecting for FX below)."""
    return None


@meta("npu_ffn_to_attention")
def npu_ffn_to_attention(x, session_ids, micro_batch_ids, token_ids, expert_offsets, actual_token_num, group,
                         world_size, token_info_table_shape, token_data_shape, *, attn_rank_table=None):
    """Sends FFN results back to the attention ranks; returns nothing."""
    return None


# A traced graph must keep these communication calls although nothing reads an output.
has_side_effect(torch.ops.npu.npu_attention_to_ffn.default)
has_side_effect(torch.ops.npu.npu_ffn_to_attention.default)

# token_dtype codes of the worker ops' token buffers
_TOKEN_DTYPES = {0: torch.float16, 1: torch.bfloat16, 2: torch.int8}


@meta("npu_attention_worker_combine")
def npu_attention_worker_combine(schedule_context, expert_scales, layer_id, hidden_size, *, token_dtype=0,
                                 need_schedule=0):
    """y [BS, hidden_size] (float16, or bfloat16 for token_dtype=1) and next_layer_id, int32 [1]."""
    y_dtype = torch.bfloat16 if token_dtype == 1 else torch.float16
    return (schedule_context.new_empty((expert_scales.size(0), hidden_size), dtype=y_dtype),
            schedule_context.new_empty((1,), dtype=torch.int32))


@meta("npu_ffn_worker_batching")
def npu_ffn_worker_batching(schedule_context, expert_num, max_out_shape, *, token_dtype=0, need_schedule=0,
                            layer_num=0):
    """max_out_shape = [A, BS, K+1, H]; Y = A * BS * (K+1) rows: hidden states [Y, H] (float16 /
    bfloat16 / int8 for token_dtype 0 / 1 / 2), group_list int64 [expert_num, 2], session / micro
    batch / token ids and expert offsets int32 [Y], dynamic scales float32 [Y], actual token
    count int64 [1]."""
    op = "npu_ffn_worker_batching"
    _check(expert_num > 0, op, "expert_num should be a positive number")
    _check(len(max_out_shape) == 4, op, "max_out_shape must have 4 elements")
    _check(all(v > 0 for v in max_out_shape), op, "every element of max_out_shape should be a positive number")
    rows = max_out_shape[0] * max_out_shape[1] * max_out_shape[2]
    ids = [schedule_context.new_empty((rows,), dtype=torch.int32) for _ in range(4)]
    return (schedule_context.new_empty((rows, max_out_shape[3]), dtype=_TOKEN_DTYPES.get(token_dtype, torch.float16)),
            schedule_context.new_empty((expert_num, 2), dtype=torch.int64),
            *ids,
            schedule_context.new_empty((rows,), dtype=torch.float32),
            schedule_context.new_empty((1,), dtype=torch.int64))


@meta("_npu_distribute_barrier")
def _npu_distribute_barrier(x_ref, group, world_size, *, time_out=None, elastic_info=None):
    return torch.empty_like(x_ref)


# ----------------------------------------------------------------- silent data corruption checks

@meta("_npu_silent_check")
def _npu_silent_check(input_grad, val, pre_val, min_val, max_val, val_counter, c_min_steps, c_thresh_l1, c_coeff_l1,
                      c_thresh_l2, c_coeff_l2):
    """The detection result, shaped and typed like ``val_counter``."""
    return torch.empty_like(val_counter)


@meta("_npu_silent_check_v2")
def _npu_silent_check_v2(val, input_grad, sfda, step, c_min_steps, c_thresh_l1, c_coeff_l1, c_thresh_l2, c_coeff_l2,
                         npu_asd_detect):
    """The detection result: int32 of ``step``'s shape."""
    return step.new_empty(tuple(step.shape), dtype=torch.int32)


@meta("_npu_silent_check_v3")
def _npu_silent_check_v3(val, input_grad, step, max, avg, c_thresh_l1, c_thresh_l2, betal, npu_asd_detect):
    """The detection result: int32 of ``step``'s shape."""
    return step.new_empty(tuple(step.shape), dtype=torch.int32)
