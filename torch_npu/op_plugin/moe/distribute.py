"""MoE expert-parallel dispatch / combine (npu_moe_distribute_dispatch(_v2),
npu_moe_distribute_combine(_v2), npu_moe_distribute_combine_add_rms_norm): meta-only.

The computation runs an all-to-all between expert-parallel ranks and is not emulated: a real
CPU / npu call raises NotImplementedError naming the op. The Meta kernels give the output shapes
and dtypes from the ops' torch_npu documentation and op-plugin's own output-size code (read, not
copied), so FakeTensor / torch.compile can trace through them; see docs/ops-moe.md for the
per-op rules.
"""
import torch

from torch_npu.op_plugin._common import check, new_empty
from torch_npu.op_plugin._registry import meta

__all__ = []


def _dispatch_sizes(x, expert_ids, ep_world_size, ep_rank_id, moe_expert_num, expert_shard_type,
                    shared_expert_num, shared_expert_rank_num, global_bs, v2, elastic):
    """(rows received by this rank, local expert count, global batch), as op-plugin's meta sizes them."""
    bs, k = x.shape[0], expert_ids.shape[1]
    global_bs_real = bs * ep_world_size if global_bs == 0 else global_bs
    moe_local = moe_expert_num // (ep_world_size - shared_expert_rank_num)
    moe_rows = global_bs_real * min(moe_local, k)
    shared_front = expert_shard_type == 0
    if not v2:
        # a shared-expert rank (first ranks when shared_front, else last ranks) takes its share of the batch
        shared_rank = (ep_rank_id < shared_expert_rank_num if shared_front
                       else ep_rank_id >= ep_world_size - shared_expert_rank_num)
        if shared_rank:
            return global_bs_real // shared_expert_rank_num, 1, global_bs_real
        return moe_rows, moe_local, global_bs_real
    if not shared_front:
        return 0, 0, global_bs_real     # the v2 sizing covers the shared-front layout only

    def shared_rows():
        ranks_per_shared = shared_expert_rank_num // shared_expert_num
        groups = (ep_world_size + ranks_per_shared - 1) // ranks_per_shared
        return global_bs_real // ep_world_size * groups

    if ep_rank_id < shared_expert_rank_num:
        rows, local = shared_rows(), 1
    else:
        rows, local = moe_rows, moe_local
    if elastic:
        rows, local = max(shared_rows(), moe_rows), max(local, moe_local)
    return rows, local, global_bs_real


def _dispatch_outputs(x, expert_ids, scales, expert_scales, quant_mode, tp_world_size, ep_world_size, a, local,
                      global_bs_real, idx_rows):
    k = expert_ids.shape[1]
    out_dtype = torch.int8 if (scales is not None or quant_mode != 0) else x.dtype
    tp = max(tp_world_size, 1)
    expand_x = new_empty((a * tp, x.shape[1]), out_dtype, x)
    dynamic_scales = new_empty((a * tp,), torch.float32, x)
    recv = ep_world_size * local * (tp_world_size if tp_world_size == 2 else 1)
    expand_scales = new_empty((0,), torch.float32, x)
    if expert_scales is not None:
        recv = ep_world_size * local + global_bs_real * 2 * k * (ep_world_size // 8)
        expand_scales = new_empty((a,), torch.float32, x)
    return (expand_x, dynamic_scales, new_empty((idx_rows,), torch.int32, x), new_empty((local,), torch.int64, x),
            new_empty((recv,), torch.int32, x), new_empty((tp_world_size,), torch.int32, x), expand_scales)


@meta("npu_moe_distribute_dispatch")
def npu_moe_distribute_dispatch(x, expert_ids, group_ep, ep_world_size, ep_rank_id, moe_expert_num, *, scales=None,
                                x_active_mask=None, expert_scales=None, group_tp="", tp_world_size=0, tp_rank_id=0,
                                expert_shard_type=0, shared_expert_num=1, shared_expert_rank_num=0, quant_mode=0,
                                global_bs=0, expert_token_nums_type=1):
    op = "npu_moe_distribute_dispatch"
    check(x.dim() == 2 and expert_ids.dim() == 2, op, "x and expert_ids must be 2-D")
    check(0 <= shared_expert_rank_num < ep_world_size, op, "shared_expert_rank_num should be in [0, ep_world_size)")
    a, local, gbs = _dispatch_sizes(x, expert_ids, ep_world_size, ep_rank_id, moe_expert_num, expert_shard_type,
                                    shared_expert_num, shared_expert_rank_num, global_bs, False, False)
    return _dispatch_outputs(x, expert_ids, scales, expert_scales, quant_mode, tp_world_size, ep_world_size, a, local,
                             gbs, x.shape[0] * expert_ids.shape[1])


@meta("npu_moe_distribute_dispatch_v2")
def npu_moe_distribute_dispatch_v2(x, expert_ids, group_ep, ep_world_size, ep_rank_id, moe_expert_num, *,
                                   scales=None, x_active_mask=None, expert_scales=None, elastic_info=None,
                                   performance_info=None, group_tp="", tp_world_size=0, tp_rank_id=0,
                                   expert_shard_type=0, shared_expert_num=1, shared_expert_rank_num=0, quant_mode=0,
                                   global_bs=0, expert_token_nums_type=1, comm_alg="", zero_expert_num=0,
                                   copy_expert_num=0, const_expert_num=0, y_dtype=None, x_dtype=None,
                                   scales_dtype=None):
    op = "npu_moe_distribute_dispatch_v2"
    check(x.dim() == 2 and expert_ids.dim() == 2, op, "x and expert_ids must be 2-D")
    check(0 <= ep_rank_id < ep_world_size, op, "ep_rank_id should be in [0, ep_world_size)")
    check(0 <= shared_expert_rank_num < ep_world_size, op, "shared_expert_rank_num should be in [0, ep_world_size)")
    shared_ok = ((shared_expert_num == 1 and shared_expert_rank_num == 0)
                 or (shared_expert_num == 0 and shared_expert_rank_num == 0)
                 or (shared_expert_num > 0 and shared_expert_rank_num // shared_expert_num > 0
                     and shared_expert_rank_num % shared_expert_num == 0))
    check(shared_ok, op, "shared expert setting invalid (shared_expert_num=%d, shared_expert_rank_num=%d)",
           (shared_expert_num, shared_expert_rank_num))
    if y_dtype is not None:
        raise NotImplementedError("%s: y_dtype is not emulated (its output dtypes are not documented)" % op)
    a, local, gbs = _dispatch_sizes(x, expert_ids, ep_world_size, ep_rank_id, moe_expert_num, expert_shard_type,
                                    shared_expert_num, shared_expert_rank_num, global_bs, True,
                                    elastic_info is not None)
    return _dispatch_outputs(x, expert_ids, scales, expert_scales, quant_mode, tp_world_size, ep_world_size, a, local,
                             gbs, max(x.shape[0] * expert_ids.shape[1], a * 128))


@meta("npu_moe_distribute_combine")
def npu_moe_distribute_combine(expand_x, expert_ids, expand_idx, ep_send_counts, expert_scales, group_ep,
                               ep_world_size, ep_rank_id, moe_expert_num, *, tp_send_counts=None, x_active_mask=None,
                               activation_scale=None, weight_scale=None, group_list=None, expand_scales=None,
                               shared_expert_x=None, group_tp="", tp_world_size=0, tp_rank_id=0, expert_shard_type=0,
                               shared_expert_num=1, shared_expert_rank_num=0, global_bs=0, out_dtype=0,
                               comm_quant_mode=0, group_list_type=0):
    return new_empty((expert_ids.shape[0], expand_x.shape[1]), expand_x.dtype, expand_x)


@meta("npu_moe_distribute_combine_v2")
def npu_moe_distribute_combine_v2(expand_x, expert_ids, assist_info_for_combine, ep_send_counts, expert_scales,
                                  group_ep, ep_world_size, ep_rank_id, moe_expert_num, *, tp_send_counts=None,
                                  x_active_mask=None, expand_scales=None, shared_expert_x=None, elastic_info=None,
                                  ori_x=None, const_expert_alpha_1=None, const_expert_alpha_2=None,
                                  const_expert_v=None, performance_info=None, group_tp="", tp_world_size=0,
                                  tp_rank_id=0, expert_shard_type=0, shared_expert_num=1, shared_expert_rank_num=0,
                                  global_bs=0, comm_quant_mode=0, comm_alg="", zero_expert_num=0, copy_expert_num=0,
                                  const_expert_num=0):
    return new_empty((expert_ids.shape[0], expand_x.shape[1]), expand_x.dtype, expand_x)


@meta("npu_moe_distribute_combine_add_rms_norm")
def npu_moe_distribute_combine_add_rms_norm(expand_x, expert_ids, expand_idx, ep_send_counts, expert_scales,
                                            residual_x, gamma, group_ep, ep_world_size, ep_rank_id, moe_expert_num, *,
                                            tp_send_counts=None, x_active_mask=None, activation_scale=None,
                                            weight_scale=None, group_list=None, expand_scales=None,
                                            shared_expert_x=None, elastic_info=None, ori_x=None,
                                            const_expert_alpha_1=None, const_expert_alpha_2=None,
                                            const_expert_v=None, group_tp="", tp_world_size=0, tp_rank_id=0,
                                            expert_shard_type=0, shared_expert_num=1, shared_expert_rank_num=0,
                                            global_bs=0, out_dtype=0, comm_quant_mode=0, group_list_type=0,
                                            comm_alg="", norm_eps=1e-06, zero_expert_num=0, copy_expert_num=0,
                                            const_expert_num=0):
    bs, h = expert_ids.shape[0], expand_x.shape[1]
    return (new_empty((bs, 1, h), expand_x.dtype, expand_x), new_empty((bs, 1, 1), torch.float32, expand_x),
            new_empty((bs, 1, h), expand_x.dtype, expand_x))
