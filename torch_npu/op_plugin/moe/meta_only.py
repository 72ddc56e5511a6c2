"""Meta kernels (output shapes and dtypes only) for the matmul, communication-matmul and MoE ops
that are not emulated: FakeTensor / torch.compile can trace through them, a real CPU/npu call
still raises NotImplementedError naming the op.

Shapes and dtypes follow the ops' torch_npu documentation and op-plugin's own output-size code
(read, not copied): see docs/ops-matmul-moe-r8.md for the per-op rules. Integer dtype arguments
(``y_dtype``, ``output_dtype``, ...) take a ``torch.dtype``, its ScalarType code or a torch_npu
``_cd.DType`` code; one with no torch dtype (hifloat8, float4 ...) raises NotImplementedError
naming the argument. Outputs the real op leaves undefined are returned as None.
"""
import torch

from torch_npu.op_plugin._registry import meta
from torch_npu.op_plugin.quant.quantize import _decode_dtype, _dtype_name

__all__ = []


def _check(cond, op, message):
    torch._check(cond, lambda: "%s: %s" % (op, message))


def _dtype(op, argname, value, default):
    """torch.dtype of an int/torch.dtype dtype argument (``default`` when None)."""
    if value is None:
        return default
    dt = _decode_dtype(value)
    if dt is None:
        raise NotImplementedError("%s: %s=%s has no torch dtype on the CPU-emulated NPU"
                                  % (op, argname, _dtype_name(value)))
    return dt


def _empty(shape, dtype, like):
    return like.new_empty(tuple(shape), dtype=dtype)


# ----------------------------------------------------------------- in-place accumulate matmuls

@meta("npu_add_quant_gmm")
def npu_add_quant_gmm(self, x1, x2, x2_scale, group_list, *, x1_scale=None, group_list_type=0, group_sizes=None,
                      x1_dtype=None, x2_dtype=None, x1_scale_dtype=None, x2_scale_dtype=None):
    _check(group_sizes is None, "npu_add_quant_gmm", "group_sizes is not supported currently")
    return torch.empty_like(self)


@meta("npu_add_quant_gmm_")
def npu_add_quant_gmm_(self, x1, x2, x2_scale, group_list, *, x1_scale=None, group_list_type=0, group_sizes=None,
                       x1_dtype=None, x2_dtype=None, x1_scale_dtype=None, x2_scale_dtype=None):
    _check(group_sizes is None, "npu_add_quant_gmm_", "group_sizes is not supported currently")
    return self


@meta("npu_add_quant_matmul")
def npu_add_quant_matmul(self, x1, x2, x2_scale, *, x1_scale=None, group_sizes=None, x1_dtype=None, x2_dtype=None,
                         x1_scale_dtype=None, x2_scale_dtype=None):
    return torch.empty_like(self)


@meta("npu_add_quant_matmul_")
def npu_add_quant_matmul_(self, x1, x2, x2_scale, *, x1_scale=None, group_sizes=None, x1_dtype=None, x2_dtype=None,
                          x1_scale_dtype=None, x2_scale_dtype=None):
    return self


# ----------------------------------------------------------------- quantised matmuls

@meta("npu_dual_level_quant_matmul")
def npu_dual_level_quant_matmul(x1, x2, x1_level0_scale, x2_level0_scale, x1_level1_scale, x2_level1_scale, *,
                                bias=None, output_dtype=15):
    op = "npu_dual_level_quant_matmul"
    _check(x1.dim() == 2 and x2.dim() == 2, op, "x1 and x2 must be 2-D, got %dD and %dD" % (x1.dim(), x2.dim()))
    # both hold two float4 values per byte along K: x1 (m, k/2), x2 (n, k/2)
    _check(x1.shape[1] == x2.shape[1], op, "the k of x1 and x2 should be equal, got %d and %d"
           % (x1.shape[1] * 2, x2.shape[1] * 2))
    return _empty((x1.shape[0], x2.shape[0]), _dtype(op, "output_dtype", output_dtype, torch.bfloat16), x1)


@meta("npu_matmul_compress_dequant")
def npu_matmul_compress_dequant(x1, x2, compress_index, bias, scale, *, offsetW=None, offsetX=None):
    op = "npu_matmul_compress_dequant"
    _check(offsetW is None, op, "offsetW currently only supports None")
    _check(offsetX in (None, 0), op, "offsetX currently only supports 0, got %r" % (offsetX,))
    _check(x1.dim() == 2 and scale.dim() == 2 and bias.dim() == 2, op, "x1, scale and bias must be 2-D")
    return _empty((x1.shape[0], bias.shape[1]), torch.float16, x1)


@meta("_npu_matmul_abft_verify")
def _npu_matmul_abft_verify(a, b, c, checksum_weight, *, e_max=0.001):
    op = "_npu_matmul_abft_verify"
    _check(a.dim() == 2 and b.dim() == 2 and c.dim() == 2, op, "a, b and c must be 2-D")
    _check(checksum_weight.dim() == 1, op, "checksum_weight must be a 1D tensor")
    _check(a.shape[1] == b.shape[0], op, "the K dim of a (%d) must be equal to the K dim of b (%d)"
           % (a.shape[1], b.shape[0]))
    _check(tuple(c.shape) == (a.shape[0], b.shape[1]), op, "c must have shape [M, N] = [%d, %d]"
           % (a.shape[0], b.shape[1]))
    _check(e_max >= 0, op, "e_max must be non-negative, got %r" % e_max)
    # one verdict bit per row and 256-column segment, 8 rows per byte
    row_bytes = (a.shape[0] + 7) // 8
    segments = (b.shape[1] + 255) // 256
    return _empty((row_bytes * segments,), torch.uint8, a)


# ----------------------------------------------------------------- communication + matmul

def _check_world(op, world_size, allowed):
    _check(world_size in allowed, op, "world_size should be in %s, but the actual value is %d"
           % (list(allowed), world_size))


@meta("npu_quant_matmul_all_to_all")
def npu_quant_matmul_all_to_all(x1, x2, hcom, world_size, bias=None, x1_scale=None, x2_scale=None,
                                common_scale=None, x1_offset=None, x2_offset=None, x1_quant_mode=None,
                                x2_quant_mode=None, common_quant_mode=None, group_sizes=None, all2all_axes=None,
                                comm_quant_dtype=None, x1_dtype=None, x2_dtype=None, x1_scale_dtype=None,
                                x2_scale_dtype=None, output_scale_dtype=None, comm_scale_dtype=None, y_dtype=None,
                                comm_mode=None):
    op = "npu_quant_matmul_all_to_all"
    _check_world(op, world_size, (2, 4, 8, 16))
    _check(x1.dim() == 2 and x2.dim() == 2, op, "x1 and x2 must be 2-D")
    return _empty((x1.shape[0] * world_size, x2.shape[1] // world_size),
                  _dtype(op, "y_dtype", y_dtype, torch.float32), x1)


@meta("npu_all_to_all_quant_matmul")
def npu_all_to_all_quant_matmul(x1, x2, hcom, world_size, *, all2all_out_flag=True, bias=None, x1_scale=None,
                                x2_scale=None, common_scale=None, x1_offset=None, x2_offset=None, x1_quant_mode=None,
                                x2_quant_mode=None, common_quant_mode=None, group_sizes=None, all2all_axes=None,
                                comm_quant_dtype=None, x1_quant_dtype=None, x1_dtype=None, x2_dtype=None,
                                x1_scale_dtype=None, x2_scale_dtype=None, output_scale_dtype=None,
                                comm_scale_dtype=None, y_dtype=None, comm_mode=None):
    op = "npu_all_to_all_quant_matmul"
    _check_world(op, world_size, (2, 4, 8, 16))
    _check(x1.dim() == 2 and x2.dim() == 2, op, "x1 and x2 must be 2-D")
    _check(x1.shape[0] % world_size == 0, op, "the x1 first axis should be divisible by world_size")
    rows = x1.shape[0] // world_size
    out = _empty((rows, x2.shape[1]), _dtype(op, "y_dtype", y_dtype, torch.float32), x1)
    comm = _empty((rows, x1.shape[1] * world_size), x1.dtype, x1) if all2all_out_flag else None
    return out, comm


# ----------------------------------------------------------------- MoE routing

@meta("npu_moe_init_routing_quant")
def npu_moe_init_routing_quant(x, expert_idx, *, scale=None, offset=None, active_num=1024, expert_capacity=0,
                               expert_num=256, drop_pad_mode=0, expert_tokens_num_mode=0,
                               expert_tokens_before_capacity_flag=False, quant_mode=1):
    op = "npu_moe_init_routing_quant"
    _check(x.dim() == 2, op, "input tensor 'x' must be 2-dimensional")
    _check(expert_idx.dim() == 2, op, "input tensor 'expert_idx' must be 2-dimensional")
    _check(x.shape[0] == expert_idx.shape[0], op, "the rows of x and expert_idx must match")
    _check(drop_pad_mode in (0, 1), op, "drop_pad_mode must be 0 or 1")
    _check(quant_mode in (0, 1), op, "quant_mode must be 0 or 1")
    _check(expert_tokens_num_mode in (0, 1, 2), op, "expert_tokens_num_mode must be 0, 1, or 2")
    bs, h = x.shape
    k = expert_idx.shape[1]
    if drop_pad_mode == 1:
        expanded_shape = (expert_num, expert_capacity, h)
        scale_len = expert_num * expert_capacity
    else:
        scale_len = min(bs * k, active_num) if active_num > 0 else bs * k
        expanded_shape = (scale_len, h)
    expanded_x = _empty(expanded_shape, torch.int8, x)
    expanded_row_idx = _empty((bs * k,), expert_idx.dtype, x)
    counts = _empty((expert_num,), torch.int32, x) if drop_pad_mode == 0 and expert_tokens_num_mode > 0 else None
    before_capacity = (_empty((expert_num,), torch.int32, x)
                       if drop_pad_mode == 1 and expert_tokens_before_capacity_flag else None)
    expanded_scale = _empty((scale_len,), torch.float32, x) if quant_mode == 1 else None
    return expanded_x, expanded_row_idx, counts, before_capacity, expanded_scale


# ----------------------------------------------------------------- MoE distribute (expert parallel)

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
    expand_x = _empty((a * tp, x.shape[1]), out_dtype, x)
    dynamic_scales = _empty((a * tp,), torch.float32, x)
    recv = ep_world_size * local * (tp_world_size if tp_world_size == 2 else 1)
    expand_scales = _empty((0,), torch.float32, x)
    if expert_scales is not None:
        recv = ep_world_size * local + global_bs_real * 2 * k * (ep_world_size // 8)
        expand_scales = _empty((a,), torch.float32, x)
    return (expand_x, dynamic_scales, _empty((idx_rows,), torch.int32, x), _empty((local,), torch.int64, x),
            _empty((recv,), torch.int32, x), _empty((tp_world_size,), torch.int32, x), expand_scales)


@meta("npu_moe_distribute_dispatch")
def npu_moe_distribute_dispatch(x, expert_ids, group_ep, ep_world_size, ep_rank_id, moe_expert_num, *, scales=None,
                                x_active_mask=None, expert_scales=None, group_tp="", tp_world_size=0, tp_rank_id=0,
                                expert_shard_type=0, shared_expert_num=1, shared_expert_rank_num=0, quant_mode=0,
                                global_bs=0, expert_token_nums_type=1):
    op = "npu_moe_distribute_dispatch"
    _check(x.dim() == 2 and expert_ids.dim() == 2, op, "x and expert_ids must be 2-D")
    _check(0 <= shared_expert_rank_num < ep_world_size, op, "shared_expert_rank_num should be in [0, ep_world_size)")
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
    _check(x.dim() == 2 and expert_ids.dim() == 2, op, "x and expert_ids must be 2-D")
    _check(0 <= ep_rank_id < ep_world_size, op, "ep_rank_id should be in [0, ep_world_size)")
    _check(0 <= shared_expert_rank_num < ep_world_size, op, "shared_expert_rank_num should be in [0, ep_world_size)")
    shared_ok = ((shared_expert_num == 1 and shared_expert_rank_num == 0)
                 or (shared_expert_num == 0 and shared_expert_rank_num == 0)
                 or (shared_expert_num > 0 and shared_expert_rank_num // shared_expert_num > 0
                     and shared_expert_rank_num % shared_expert_num == 0))
    _check(shared_ok, op, "shared expert setting invalid (shared_expert_num=%d, shared_expert_rank_num=%d)"
           % (shared_expert_num, shared_expert_rank_num))
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
    return _empty((expert_ids.shape[0], expand_x.shape[1]), expand_x.dtype, expand_x)


@meta("npu_moe_distribute_combine_v2")
def npu_moe_distribute_combine_v2(expand_x, expert_ids, assist_info_for_combine, ep_send_counts, expert_scales,
                                  group_ep, ep_world_size, ep_rank_id, moe_expert_num, *, tp_send_counts=None,
                                  x_active_mask=None, expand_scales=None, shared_expert_x=None, elastic_info=None,
                                  ori_x=None, const_expert_alpha_1=None, const_expert_alpha_2=None,
                                  const_expert_v=None, performance_info=None, group_tp="", tp_world_size=0,
                                  tp_rank_id=0, expert_shard_type=0, shared_expert_num=1, shared_expert_rank_num=0,
                                  global_bs=0, comm_quant_mode=0, comm_alg="", zero_expert_num=0, copy_expert_num=0,
                                  const_expert_num=0):
    return _empty((expert_ids.shape[0], expand_x.shape[1]), expand_x.dtype, expand_x)


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
    return (_empty((bs, 1, h), expand_x.dtype, expand_x), _empty((bs, 1, 1), torch.float32, expand_x),
            _empty((bs, 1, h), expand_x.dtype, expand_x))
