"""Meta kernels (output shapes and dtypes only) for the serving-runtime ops of ``torch.ops.npu``,
which are not emulated: the attention-FFN disaggregation workers (attention_worker_scheduler(_),
ffn_worker_scheduler(_), npu_attention_to_ffn, npu_ffn_to_attention, npu_attention_worker_combine,
npu_ffn_worker_batching) and model obfuscation (obfuscation_calculate, obfuscation_finalize).
FakeTensor / torch.compile can trace through them, a real CPU/npu call still raises NotImplementedError naming the op.

Shapes and dtypes follow the ops' torch_npu documentation and op-plugin's own output-size code
(``_meta_registrations.py`` and the op_api/acl_op kernels; read, not copied). The per-op rules and
their sources are listed in docs/ops-serving.md. In-place ops (``Tensor(a!)`` returns) give
back the mutated argument itself; ops whose schema returns ``()`` return None.
"""
import torch
from torch.fx.node import has_side_effect

from torch_npu.op_plugin._common import check
from torch_npu.op_plugin._registry import meta

__all__ = []


# ----------------------------------------------------------------- rope + quant + KV cache


# ----------------------------------------------------------------- sampling


# ----------------------------------------------------------------- HANS lossless compression


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
    check(expert_num > 0, op, "expert_num should be a positive number")
    check(len(max_out_shape) == 4, op, "max_out_shape must have 4 elements")
    check(all(v > 0 for v in max_out_shape), op, "every element of max_out_shape should be a positive number")
    rows = max_out_shape[0] * max_out_shape[1] * max_out_shape[2]
    ids = [schedule_context.new_empty((rows,), dtype=torch.int32) for _ in range(4)]
    return (schedule_context.new_empty((rows, max_out_shape[3]), dtype=_TOKEN_DTYPES.get(token_dtype, torch.float16)),
            schedule_context.new_empty((expert_num, 2), dtype=torch.int64),
            *ids,
            schedule_context.new_empty((rows,), dtype=torch.float32),
            schedule_context.new_empty((1,), dtype=torch.int64))


# ----------------------------------------------------------------- silent data corruption checks
