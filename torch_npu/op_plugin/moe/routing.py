"""MoE routing: npu_moe_init_routing (expand the tokens by their experts and group them by
expert) and npu_moe_finalize_routing (combine the expert outputs back to token order)."""
import torch

from torch_npu.op_plugin._common import acc, check, new_empty, unsupported
from torch_npu.op_plugin._registry import impl
from torch_npu.op_plugin._registry import meta

__all__ = []


@impl("npu_moe_init_routing")
def npu_moe_init_routing(x, row_idx, expert_idx, active_num):
    """MoE routing: expand ``x`` [N, H] by the ``k`` experts of each row and group by expert.

    ``expert_idx`` / ``row_idx`` are ``[N, k]`` int32 (``row_idx`` usually from
    :func:`npu_moe_gating_top_k_softmax`). The flattened ``expert_idx`` is stably sorted
    (ties keep flattened order) carrying the flattened ``row_idx``:
    ``expanded_expert_idx`` = sorted experts, ``sorted_row_idx`` = carried rows,
    ``expanded_row_idx[sorted_row_idx[d]] = d`` and
    ``expanded_x[d] = x[sorted_row_idx[d] % N]`` for the first ``min(N, active_num) * k``
    destinations. Returns ``(expanded_x [min(N, active_num)*k, H],
    expanded_row_idx [N*k] int32, expanded_expert_idx [N*k] int32)``.
    """
    op = "npu_moe_init_routing"
    check(x.dim() == 2, op, "x must be 2D, got %dD" % x.dim())
    check(expert_idx.dim() == 2, op, "expert_idx must be 2D, got %dD" % expert_idx.dim())
    check(tuple(row_idx.shape) == tuple(expert_idx.shape), op, "row_idx and expert_idx shapes differ")
    check(expert_idx.shape[0] == x.shape[0], op, "expert_idx rows must equal x rows")
    check(active_num >= 0, op, "active_num must be >= 0, got %d" % active_num)
    n, k = expert_idx.shape
    flat_expert = expert_idx.reshape(-1)
    sorted_expert, order = torch.sort(flat_expert, stable=True)
    sorted_row = row_idx.reshape(-1).long().index_select(0, order)
    expanded_row_idx = torch.empty(n * k, dtype=torch.int32, device=x.device)
    expanded_row_idx = expanded_row_idx.index_put(
        (sorted_row,), torch.arange(n * k, dtype=torch.int32, device=x.device))
    active = min(n, active_num) * k
    expanded_x = x.index_select(0, torch.remainder(sorted_row[:active], n))
    return expanded_x, expanded_row_idx, sorted_expert.to(torch.int32)


@impl("npu_moe_finalize_routing")
def npu_moe_finalize_routing(expanded_permuted_rows, skip1, skip2, bias, scales, expanded_src_to_dst_row,
                             export_for_source_row, drop_pad_mode=0, k=1):
    """Combine the expert outputs back to token order (drop_pad_mode 0 only).

    With ``N`` rows, ``K`` experts per row (``scales.shape[1]``, else
    ``export_for_source_row.shape[1]``, else ``k``) and ``dst(i, j) =
    expanded_src_to_dst_row[j * N + i]``:
    ``out[i] = skip1[i] + skip2[i] + sum_j scales[i, j] * (expanded_permuted_rows[dst(i, j)]
    + bias[export_for_source_row[i, j]])``. Missing ``skip1``/``skip2``/``bias`` count as
    zero, missing ``scales`` as one (``bias`` needs ``export_for_source_row``). Computed
    in float32 for float16/bfloat16; the output has the dtype of ``expanded_permuted_rows``.
    """
    op = "npu_moe_finalize_routing"
    if drop_pad_mode not in (None, 0):
        unsupported(op, "drop_pad_mode=%s (only 0)" % drop_pad_mode)
    check(expanded_permuted_rows.dim() == 2, op, "expanded_permuted_rows must be 2D")
    h = expanded_permuted_rows.shape[1]
    total = expanded_src_to_dst_row.numel()
    if scales is not None:
        kk = scales.shape[1]
    elif export_for_source_row is not None:
        kk = export_for_source_row.shape[1]
    else:
        kk = 1 if k is None else k
    check(kk >= 1 and total % kk == 0, op, "expanded_src_to_dst_row size %d is not a multiple of k=%d" % (total, kk))
    n = total // kk
    check(bias is None or export_for_source_row is not None, op, "bias needs export_for_source_row")
    # dst index laid out [K, N] (j * N + i) -> [N, K]
    dst = expanded_src_to_dst_row.reshape(kk, n).t().long()
    rows = acc(expanded_permuted_rows).index_select(0, dst.reshape(-1)).reshape(n, kk, h)
    if bias is not None:
        check(export_for_source_row.shape == (n, kk), op, "export_for_source_row must be [%d, %d]" % (n, kk))
        rows = rows + acc(bias).index_select(0, export_for_source_row.reshape(-1).long()).reshape(n, kk, h)
    if scales is not None:
        check(tuple(scales.shape) == (n, kk), op, "scales must be [%d, %d]" % (n, kk))
        rows = rows * acc(scales).unsqueeze(-1)
    out = rows.sum(1)
    for skip in (skip1, skip2):
        if skip is not None:
            check(tuple(skip.shape) == (n, h), op, "skip must be [%d, %d]" % (n, h))
            out = out + acc(skip)
    return out.to(expanded_permuted_rows.dtype)


# ----------------------------------------------------------------- grouped matmul


@meta("npu_moe_init_routing_quant")
def npu_moe_init_routing_quant(x, expert_idx, *, scale=None, offset=None, active_num=1024, expert_capacity=0,
                               expert_num=256, drop_pad_mode=0, expert_tokens_num_mode=0,
                               expert_tokens_before_capacity_flag=False, quant_mode=1):
    op = "npu_moe_init_routing_quant"
    check(x.dim() == 2, op, "input tensor 'x' must be 2-dimensional")
    check(expert_idx.dim() == 2, op, "input tensor 'expert_idx' must be 2-dimensional")
    check(x.shape[0] == expert_idx.shape[0], op, "the rows of x and expert_idx must match")
    check(drop_pad_mode in (0, 1), op, "drop_pad_mode must be 0 or 1")
    check(quant_mode in (0, 1), op, "quant_mode must be 0 or 1")
    check(expert_tokens_num_mode in (0, 1, 2), op, "expert_tokens_num_mode must be 0, 1, or 2")
    bs, h = x.shape
    k = expert_idx.shape[1]
    if drop_pad_mode == 1:
        expanded_shape = (expert_num, expert_capacity, h)
        scale_len = expert_num * expert_capacity
    else:
        scale_len = min(bs * k, active_num) if active_num > 0 else bs * k
        expanded_shape = (scale_len, h)
    expanded_x = new_empty(expanded_shape, torch.int8, x)
    expanded_row_idx = new_empty((bs * k,), expert_idx.dtype, x)
    counts = new_empty((expert_num,), torch.int32, x) if drop_pad_mode == 0 and expert_tokens_num_mode > 0 else None
    before_capacity = (new_empty((expert_num,), torch.int32, x)
                       if drop_pad_mode == 1 and expert_tokens_before_capacity_flag else None)
    expanded_scale = new_empty((scale_len,), torch.float32, x) if quant_mode == 1 else None
    return expanded_x, expanded_row_idx, counts, before_capacity, expanded_scale
