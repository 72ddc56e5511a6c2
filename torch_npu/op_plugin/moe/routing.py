"""Mixture-of-experts ops: gating top-k softmax, init/finalize routing,
token permute/unpermute and grouped matmul."""
import torch

from torch_npu.op_plugin._common import acc, check, unsupported
from torch_npu.op_plugin._registry import impl

__all__ = []


@impl("npu_moe_gating_top_k_softmax")
def npu_moe_gating_top_k_softmax(x, finished=None, k=1):
    """MoE gating: softmax over the last (expert) dim, then the top ``k`` experts per row.

    ``x`` is ``[..., E]`` (2D or 3D); with ``N`` = number of rows (product of the leading
    dims), returns ``(y, expert_idx, row_idx)``, each ``[..., k]``: ``y`` the top-k
    softmax probabilities in descending order (dtype of ``x``, softmax computed in
    float32), ``expert_idx`` their expert indices (int32; ties go to the lower expert
    index) and ``row_idx[i, j] = j * N + i`` (int32). ``finished`` (bool, ``x.shape[:-1]``):
    rows where it is True get ``expert_idx = E`` (the kernel's "not processed" marker);
    their ``y`` is still the softmax value.
    """
    op = "npu_moe_gating_top_k_softmax"
    check(x.dim() in (2, 3), op, "x must be 2D or 3D, got %dD" % x.dim())
    e = x.shape[-1]
    check(1 <= k <= e, op, "k must be in [1, %d], got %d" % (e, k))
    lead = tuple(x.shape[:-1])
    probs = torch.softmax(acc(x), dim=-1)
    values, indices = torch.sort(probs, dim=-1, descending=True, stable=True)
    y = values[..., :k].to(x.dtype)
    expert_idx = indices[..., :k].to(torch.int32)
    if finished is not None:
        check(finished.dtype == torch.bool, op, "finished must be bool, got %s" % finished.dtype)
        check(tuple(finished.shape) == lead, op,
              "finished shape %s must equal x.shape[:-1] %s" % (tuple(finished.shape), lead))
        expert_idx = torch.where(finished.unsqueeze(-1), torch.full_like(expert_idx, e), expert_idx)
    n = 1
    for s in lead:
        n *= s
    rows = torch.arange(n, dtype=torch.int32, device=x.device).unsqueeze(1)
    cols = torch.arange(k, dtype=torch.int32, device=x.device).unsqueeze(0)
    row_idx = (cols * n + rows).reshape(lead + (k,))
    return y, expert_idx, row_idx


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


def _topk_of(indices):
    return 1 if indices.dim() == 1 else indices.shape[1]


@impl("npu_moe_token_permute")
def npu_moe_token_permute(tokens, indices, num_out_tokens=None, padded_mode=False):
    """MoE permute (non-padded mode): replicate each token to its ``topK`` experts and sort by expert.

    ``tokens`` [T, H]; ``indices`` [T, topK] or [T] (topK = 1) expert ids.
    ``first = stable_argsort(flatten(indices))``, ``sorted_indices = argsort(first)``
    (source slot -> destination row, int32), ``permuted[sorted_indices[i]] = tokens[i // topK]``.
    ``num_out_tokens`` (None or <= 0: all ``T * topK``; larger values are clamped) keeps
    the first rows. Returns ``(permuted_tokens, sorted_indices)``. ``padded_mode=True``
    is not supported.
    """
    op = "npu_moe_token_permute"
    if padded_mode:
        unsupported(op, "padded_mode=True")
    check(tokens.dim() == 2, op, "tokens must be 2D")
    check(indices.dim() in (1, 2) and indices.shape[0] == tokens.shape[0], op,
          "indices must be [T] or [T, topK] with T = tokens rows")
    topk = _topk_of(indices)
    total = indices.numel()
    out_n = total if num_out_tokens is None or num_out_tokens <= 0 else min(num_out_tokens, total)
    first = torch.sort(indices.reshape(-1), stable=True)[1]
    sorted_indices = torch.empty_like(first).index_put(
        (first,), torch.arange(total, dtype=first.dtype, device=first.device))
    permuted = tokens.index_select(0, torch.div(first[:out_n], topk, rounding_mode="floor"))
    return permuted, sorted_indices.to(torch.int32)


@impl("npu_moe_token_unpermute")
def npu_moe_token_unpermute(permuted_tokens, sorted_indices, probs=None, padded_mode=False, restore_shape=None):
    """MoE unpermute (non-padded mode), the inverse of :func:`npu_moe_token_permute`.

    With topK = ``probs.shape[1]`` (1 without ``probs``) and ``T = sorted_indices.numel() / topK``:
    ``out[t] = sum_k probs[t, k] * permuted_tokens[sorted_indices[t * topK + k]]``;
    destinations ``>= permuted_tokens.shape[0]`` (dropped by ``num_out_tokens``) count
    as zero. Computed in float32 for float16/bfloat16; output [T, H] in the dtype of
    ``permuted_tokens``. ``padded_mode=True`` is not supported; ``restore_shape`` is
    only used in padded mode and ignored otherwise.
    """
    op = "npu_moe_token_unpermute"
    if padded_mode:
        unsupported(op, "padded_mode=True")
    check(permuted_tokens.dim() == 2, op, "permuted_tokens must be 2D")
    topk = 1 if probs is None else probs.shape[-1]
    total = sorted_indices.numel()
    check(total % topk == 0, op, "sorted_indices size %d is not a multiple of topK %d" % (total, topk))
    t = total // topk
    p, h = permuted_tokens.shape
    idx = sorted_indices.reshape(-1).long()
    valid = idx < p
    rows = acc(permuted_tokens).index_select(0, torch.where(valid, idx, torch.zeros_like(idx)))
    rows = (rows * valid.unsqueeze(-1).to(rows.dtype)).reshape(t, topk, h)
    if probs is not None:
        check(probs.numel() == total, op, "probs must have %d elements" % total)
        rows = rows * acc(probs).reshape(t, topk, 1).to(rows.dtype)
    return rows.sum(1).to(permuted_tokens.dtype)


# ----------------------------------------------------------------- grouped matmul

_GMM_QUANT_ARGS = ("scale", "offset", "antiquant_scale", "antiquant_offset", "per_token_scale",
                   "activation_input", "activation_quant_scale", "activation_quant_offset",
                   "x_dtype", "weight_dtype", "scale_dtype", "per_token_scale_dtype")


def _group_sizes(op, group_list, group_list_type, m):
    if group_list_type not in (None, 0, 1):
        unsupported(op, "group_list_type=%s (only 0 cumulative, 1 counts)" % group_list_type)
    if isinstance(group_list, torch.Tensor):
        vals = [int(v) for v in group_list.reshape(-1).tolist()]
    else:
        vals = [int(v) for v in group_list]
    if group_list_type in (None, 0):
        sizes = [b - a for a, b in zip([0] + vals[:-1], vals)]
    else:
        sizes = vals
    check(all(s >= 0 for s in sizes), op, "group_list gives negative group sizes %s" % sizes)
    if sum(sizes) != m:
        unsupported(op, "group_list covering %d of the %d rows of x (must cover all)" % (sum(sizes), m))
    return sizes


def _grouped_matmul(op, x, weight, bias, group_list, split_item, group_type, group_list_type, act_type,
                    output_dtype, extras):
    for name, value in extras.items():
        if value is not None:
            unsupported(op, "%s (quantization/activation inputs must be None)" % name)
    if act_type not in (None, 0):
        unsupported(op, "act_type=%s (only 0)" % act_type)
    if output_dtype is not None:
        unsupported(op, "output_dtype=%s (only None: the dtype of x)" % output_dtype)
    if split_item not in (None, 0, 1, 2, 3):
        unsupported(op, "split_item=%s" % split_item)
    if group_type not in (None, -1, 0):
        unsupported(op, "group_type=%s (only -1/None no split, 0 split M)" % group_type)
    x = list(x)
    weight = list(weight)
    check(len(x) >= 1 and len(weight) >= 1, op, "x and weight must be non-empty lists")
    if len(weight) == 1 and weight[0].dim() == 3:
        weight = list(weight[0].unbind(0))
    if bias is not None:
        bias = list(bias)
        if len(bias) == 1 and bias[0].dim() == 2 and len(weight) > 1:
            bias = list(bias[0].unbind(0))
        check(len(bias) == len(weight), op, "bias list length %d != weight groups %d" % (len(bias), len(weight)))
    g = len(weight)
    if group_list is not None and group_type != -1:
        check(len(x) == 1, op, "group_list needs a single x tensor")
        xs = x[0]
        check(xs.dim() == 2, op, "x split by group_list must be 2D")
        sizes = _group_sizes(op, group_list, group_list_type, xs.shape[0])
        check(len(sizes) == g, op, "group_list has %d groups, weight has %d" % (len(sizes), g))
        x = list(torch.split(xs, sizes, dim=0))
    else:
        if group_list is not None:
            unsupported(op, "group_list with group_type=-1")
        if len(x) == 1 and g > 1:
            unsupported(op, "a single x with %d weights and no group_list" % g)
        check(len(x) == g, op, "x has %d tensors, weight has %d" % (len(x), g))
    outs = []
    for i in range(g):
        xi, wi = x[i], weight[i]
        check(wi.dim() == 2, op, "weight[%d] must be 2D [K, N]" % i)
        check(xi.shape[-1] == wi.shape[0], op, "x[%d] K=%d != weight[%d] K=%d" % (i, xi.shape[-1], i, wi.shape[0]))
        y = torch.matmul(acc(xi), acc(wi).to(acc(xi).dtype))
        if bias is not None:
            y = y + acc(bias[i]).to(y.dtype)
        outs.append(y.to(xi.dtype))
    if split_item in (2, 3):
        check(all(o.dim() == 2 for o in outs), op, "split_item 2/3 needs 2D outputs")
        return [torch.cat(outs, 0)]
    return outs


@impl("npu_grouped_matmul")
def npu_grouped_matmul(x, weight, *, bias=None, scale=None, offset=None, antiquant_scale=None,
                       antiquant_offset=None, per_token_scale=None, group_list=None, activation_input=None,
                       activation_quant_scale=None, activation_quant_offset=None, split_item=0, group_type=None,
                       group_list_type=0, act_type=0, tuning_config=None, output_dtype=None, x_dtype=None,
                       weight_dtype=None, scale_dtype=None, per_token_scale_dtype=None):
    """Grouped matmul (float path): ``y_i = x_i @ weight_i + bias_i`` per group.

    ``weight`` is a list of [K, N] tensors (or one [G, K, N]); ``bias`` a matching list of
    [N] (or one [G, N]). With a single 2D ``x`` and ``group_list`` (``group_type`` 0 or
    None), ``x`` is split along dim 0: ``group_list_type`` 0 = cumulative ends,
    1 = per-group counts; the groups must cover all rows. ``split_item`` 0/1 returns one
    output per group, 2/3 one tensor concatenated along dim 0. Computed in float32 for
    float16/bfloat16, outputs in the dtype of x. Quantization / activation inputs,
    ``act_type != 0``, ``output_dtype``, ``group_type`` 2 are not supported.
    """
    extras = dict(scale=scale, offset=offset, antiquant_scale=antiquant_scale, antiquant_offset=antiquant_offset,
                  per_token_scale=per_token_scale, activation_input=activation_input,
                  activation_quant_scale=activation_quant_scale, activation_quant_offset=activation_quant_offset,
                  x_dtype=x_dtype, weight_dtype=weight_dtype, scale_dtype=scale_dtype,
                  per_token_scale_dtype=per_token_scale_dtype)
    return _grouped_matmul("npu_grouped_matmul", x, weight, bias, group_list, split_item, group_type,
                           group_list_type, act_type, output_dtype, extras)


@impl("npu_grouped_matmul.List")
def npu_grouped_matmul_list(x, weight, *, bias=None, scale=None, offset=None, antiquant_scale=None,
                            antiquant_offset=None, per_token_scale=None, group_list=None, activation_input=None,
                            activation_quant_scale=None, activation_quant_offset=None, split_item=0,
                            group_type=None, group_list_type=0, act_type=0, output_dtype=None):
    """:func:`npu_grouped_matmul` with ``group_list`` given as an int list."""
    extras = dict(scale=scale, offset=offset, antiquant_scale=antiquant_scale, antiquant_offset=antiquant_offset,
                  per_token_scale=per_token_scale, activation_input=activation_input,
                  activation_quant_scale=activation_quant_scale, activation_quant_offset=activation_quant_offset)
    return _grouped_matmul("npu_grouped_matmul", x, weight, bias, group_list, split_item, group_type,
                           group_list_type, act_type, output_dtype, extras)
