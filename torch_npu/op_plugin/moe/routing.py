"""MoE routing: npu_moe_init_routing (expand the tokens by their experts and group them by
expert), npu_moe_init_routing_v2 and npu_moe_finalize_routing (combine the expert outputs
back to token order); npu_moe_init_routing_quant is meta-only (its Meta kernel gives the shapes).

npu_moe_init_routing_v2: MoE routing (expand tokens by their K experts, group by expert).

Emulated: the dropless / active modes (``drop_pad_mode=0``) without quantisation
(``quant_mode=-1``) and with dynamic int8 quantisation (``quant_mode=1``), following the torch_npu
doc's formulas and its equivalent code; output shapes and dtypes follow op-plugin's op_api.
``N`` rows, ``K`` experts each, active expert range ``[start, end)`` (``active_expert_range``,
default ``[0, expert_num]``):

* the flattened ``expert_idx`` (experts below ``start`` moved to the end) is stably sorted: slot
  ``i`` holds the ``(row, k)`` pair ``order[i]``; the first ``available`` slots are the pairs whose
  expert is in ``[start, end)``;
* ``expanded_row_idx``: gather index (``row_idx_type=0``: ``expanded_row_idx[order[i]] = i`` for
  ``i < available``, -1 elsewhere) or scatter index (``=1``: ``order``), int32;
* ``expanded_x[i] = x[order[i] // K]`` for ``i < available`` (``active_num > 0`` keeps
  ``min(active_num, N*K)`` rows); rows past ``available`` are zero here (undefined on the NPU);
* ``expert_token_cumsum_or_count``: per expert of the range, the number of pairs (type 1), its
  cumulative sum (type 0), or ``(expert_id, count)`` of the experts with pairs, first, then zero
  rows, shape ``(expert_num, 2)`` (type 2); int64; always computed (the real op fills it when
  ``expert_tokens_num_flag`` is set);
* ``expanded_scale``: ``scale[order[i] // K]`` when a ``(N,)`` scale is given (no quantisation,
  zeros otherwise); with ``quant_mode=1``: ``xs = x_row * scale_e`` (scale ``(end-start, H)`` picked
  by the slot's expert, or ``(1, H)``, or none), ``expanded_scale = max|xs| / 127``,
  ``expanded_x = round_half_even(xs / expanded_scale)`` as int8 (float32 arithmetic).

Not emulated (NotImplementedError naming the argument): ``drop_pad_mode=1``, ``quant_mode`` other
than -1 and 1 (static int8, MXFP8, HiFloat8), int8 ``x`` with quantisation, ``x_dtype``.
No host reads: the data-dependent ``available`` count stays a tensor, so Meta/FakeTensor work.
"""
import torch

from torch_npu.op_plugin._common import acc, check, new_empty, unsupported
from torch_npu.op_plugin._registry import impl, meta

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
    check(x.dim() == 2, op, "x must be 2D, got %dD", x.dim())
    check(expert_idx.dim() == 2, op, "expert_idx must be 2D, got %dD", expert_idx.dim())
    check(tuple(row_idx.shape) == tuple(expert_idx.shape), op, "row_idx and expert_idx shapes differ")
    check(expert_idx.shape[0] == x.shape[0], op, "expert_idx rows must equal x rows")
    check(active_num >= 0, op, "active_num must be >= 0, got %d", active_num)
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
    check(kk >= 1 and total % kk == 0, op, "expanded_src_to_dst_row size %d is not a multiple of k=%d", (total, kk))
    n = total // kk
    check(bias is None or export_for_source_row is not None, op, "bias needs export_for_source_row")
    # dst index laid out [K, N] (j * N + i) -> [N, K]
    dst = expanded_src_to_dst_row.reshape(kk, n).t().long()
    rows = acc(expanded_permuted_rows).index_select(0, dst.reshape(-1)).reshape(n, kk, h)
    if bias is not None:
        check(export_for_source_row.shape == (n, kk), op, "export_for_source_row must be [%d, %d]", (n, kk))
        rows = rows + acc(bias).index_select(0, export_for_source_row.reshape(-1).long()).reshape(n, kk, h)
    if scales is not None:
        check(tuple(scales.shape) == (n, kk), op, "scales must be [%d, %d]", (n, kk))
        rows = rows * acc(scales).unsqueeze(-1)
    out = rows.sum(1)
    for skip in (skip1, skip2):
        if skip is not None:
            check(tuple(skip.shape) == (n, h), op, "skip must be [%d, %d]", (n, h))
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


_OP = "npu_moe_init_routing_v2"


_INT32_MAX = 2 ** 31 - 1


_INT8_MAX = 127.0


def _expert_range(active_expert_range, expert_num):
    if active_expert_range is None or len(active_expert_range) == 0:
        check(expert_num > 0, _OP, "expert_num must be given when active_expert_range is empty")
        return 0, expert_num
    check(len(active_expert_range) == 2, _OP, "active_expert_range must be [expert_start, expert_end]")
    start, end = active_expert_range
    check(0 <= start < end, _OP, "active_expert_range must satisfy 0 <= start < end, got %s", list(active_expert_range))
    check(expert_num <= 0 or end <= expert_num, _OP, "expert_end %d must not exceed expert_num %d", (end, expert_num))
    return start, end


def _token_counts(flat, in_range, start, end, kind, expert_num):
    span = end - start
    hist = torch.zeros(span, dtype=torch.int64, device=flat.device).scatter_add(
        0, torch.where(in_range, flat - start, torch.zeros_like(flat)), in_range.long())
    if kind == 1:
        return hist
    if kind == 0:
        return torch.cumsum(hist, 0)
    check(expert_num >= span, _OP, "expert_num %d is smaller than the expert range %d", (expert_num, span))
    used_first = torch.sort((hist == 0).to(torch.int8), stable=True)[1]
    ids = torch.arange(start, end, device=flat.device).index_select(0, used_first)
    counts = hist.index_select(0, used_first)
    pairs = torch.stack([ids, counts], dim=1) * (counts > 0).long().unsqueeze(1)
    return torch.cat([pairs, pairs.new_zeros((expert_num - span, 2))])


@impl("npu_moe_init_routing_v2")
def npu_moe_init_routing_v2(x, expert_idx, *, scale=None, offset=None, active_num=-1, expert_capacity=-1,
                            expert_num=-1, drop_pad_mode=0, expert_tokens_num_type=0, expert_tokens_num_flag=False,
                            quant_mode=-1, active_expert_range=[], row_idx_type=0, x_dtype=None):
    check(x.dim() == 2, _OP, "x must be 2-D (NUM_ROWS, H), got %dD", x.dim())
    check(expert_idx.dim() == 2 and expert_idx.shape[0] == x.shape[0], _OP,
          "expert_idx must be 2-D (NUM_ROWS=%d, K)", x.shape[0])
    check(expert_idx.dtype == torch.int32, _OP, "expert_idx must be int32, got %s", expert_idx.dtype)
    if drop_pad_mode != 0:
        unsupported(_OP, "drop_pad_mode=%r (only 0, dropless/active)" % (drop_pad_mode,))
    if quant_mode not in (-1, 1):
        unsupported(_OP, "quant_mode=%r (only -1 none and 1 dynamic int8)" % (quant_mode,))
    if x_dtype is not None:
        unsupported(_OP, "x_dtype=%r" % (x_dtype,))
    check(row_idx_type in (0, 1), _OP, "row_idx_type must be 0 or 1, got %r", (row_idx_type,))
    check(expert_tokens_num_type in (0, 1, 2), _OP, "expert_tokens_num_type must be 0, 1 or 2")
    check(active_num >= -1, _OP, "active_num must be >= 0 (or -1), got %d", active_num)
    start, end = _expert_range(active_expert_range, expert_num)
    n, k = expert_idx.shape
    h = x.shape[1]
    total = n * k
    out_rows = total if active_num <= 0 else min(active_num, total)

    flat = expert_idx.reshape(-1).long()
    key = torch.where(flat < start, torch.full_like(flat, _INT32_MAX), flat)
    order = torch.sort(key, stable=True)[1]
    in_range = (flat >= start) & (flat < end)
    available = in_range.sum()
    slots = torch.arange(total, device=x.device)
    valid_slot = slots < available
    if row_idx_type == 0:
        row_idx = torch.full_like(flat, -1).scatter(0, order, torch.where(valid_slot, slots, torch.full_like(slots, -1)))
    else:
        row_idx = order
    counts = _token_counts(flat, in_range, start, end, expert_tokens_num_type, expert_num)

    taken = order[:out_rows]
    valid = valid_slot[:out_rows]
    gathered = x.index_select(0, torch.div(taken, k, rounding_mode="floor"))
    if quant_mode == -1:
        check(offset is None, _OP, "offset must be None without quantisation")
        expanded_x = torch.where(valid.unsqueeze(1), gathered, torch.zeros_like(gathered))
        if scale is not None:
            check(scale.dim() == 1 and scale.shape[0] == n, _OP, "scale must be (NUM_ROWS=%d,) without quantisation", n)
            picked = scale.float().index_select(0, torch.div(taken, k, rounding_mode="floor"))
            expanded_scale = torch.where(valid, picked, torch.zeros_like(picked))
        else:
            expanded_scale = x.new_zeros((out_rows,), dtype=torch.float32)
        return expanded_x, row_idx.to(torch.int32), counts, expanded_scale

    if x.dtype == torch.int8:
        unsupported(_OP, "int8 x with quant_mode=1 (its output is documented as meaningless)")
    check(offset is None, _OP, "offset must be None in dynamic quantisation")
    xs = gathered.float()
    if scale is not None:
        check(scale.dim() == 2 and scale.shape[1] == h and scale.shape[0] in (1, end - start), _OP,
              "scale must be (%d, %d) or (1, %d) in dynamic quantisation", (end - start, h, h))
        if scale.shape[0] == 1:
            xs = xs * scale.float()
        else:
            expert_of_slot = (key.index_select(0, taken) - start).clamp(0, end - start - 1)
            xs = xs * scale.float().index_select(0, expert_of_slot)
    row_scale = xs.abs().amax(-1) / _INT8_MAX
    q = torch.round(xs / row_scale.unsqueeze(1))
    q = torch.where(valid.unsqueeze(1) & (row_scale.unsqueeze(1) > 0), q, torch.zeros_like(q))
    expanded_scale = torch.where(valid, row_scale, torch.zeros_like(row_scale))
    return q.to(torch.int8), row_idx.to(torch.int32), counts, expanded_scale
