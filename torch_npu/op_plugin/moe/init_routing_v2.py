"""npu_moe_init_routing_v2: MoE routing (expand tokens by their K experts, group by expert).

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

from torch_npu.op_plugin._common import check, unsupported
from torch_npu.op_plugin._registry import impl

__all__ = []

_OP = "npu_moe_init_routing_v2"
_INT32_MAX = 2 ** 31 - 1
_INT8_MAX = 127.0


def _expert_range(active_expert_range, expert_num):
    if active_expert_range is None or len(active_expert_range) == 0:
        check(expert_num > 0, _OP, "expert_num must be given when active_expert_range is empty")
        return 0, expert_num
    check(len(active_expert_range) == 2, _OP, "active_expert_range must be [expert_start, expert_end]")
    start, end = active_expert_range
    check(0 <= start < end, _OP, "active_expert_range must satisfy 0 <= start < end, got %s" % list(active_expert_range))
    check(expert_num <= 0 or end <= expert_num, _OP, "expert_end %d must not exceed expert_num %d" % (end, expert_num))
    return start, end


def _token_counts(flat, in_range, start, end, kind, expert_num):
    span = end - start
    hist = torch.zeros(span, dtype=torch.int64, device=flat.device).scatter_add(
        0, torch.where(in_range, flat - start, torch.zeros_like(flat)), in_range.long())
    if kind == 1:
        return hist
    if kind == 0:
        return torch.cumsum(hist, 0)
    check(expert_num >= span, _OP, "expert_num %d is smaller than the expert range %d" % (expert_num, span))
    used_first = torch.sort((hist == 0).to(torch.int8), stable=True)[1]
    ids = torch.arange(start, end, device=flat.device).index_select(0, used_first)
    counts = hist.index_select(0, used_first)
    pairs = torch.stack([ids, counts], dim=1) * (counts > 0).long().unsqueeze(1)
    return torch.cat([pairs, pairs.new_zeros((expert_num - span, 2))])


@impl("npu_moe_init_routing_v2")
def npu_moe_init_routing_v2(x, expert_idx, *, scale=None, offset=None, active_num=-1, expert_capacity=-1,
                            expert_num=-1, drop_pad_mode=0, expert_tokens_num_type=0, expert_tokens_num_flag=False,
                            quant_mode=-1, active_expert_range=[], row_idx_type=0, x_dtype=None):
    check(x.dim() == 2, _OP, "x must be 2-D (NUM_ROWS, H), got %dD" % x.dim())
    check(expert_idx.dim() == 2 and expert_idx.shape[0] == x.shape[0], _OP,
          "expert_idx must be 2-D (NUM_ROWS=%d, K)" % x.shape[0])
    check(expert_idx.dtype == torch.int32, _OP, "expert_idx must be int32, got %s" % expert_idx.dtype)
    if drop_pad_mode != 0:
        unsupported(_OP, "drop_pad_mode=%r (only 0, dropless/active)" % (drop_pad_mode,))
    if quant_mode not in (-1, 1):
        unsupported(_OP, "quant_mode=%r (only -1 none and 1 dynamic int8)" % (quant_mode,))
    if x_dtype is not None:
        unsupported(_OP, "x_dtype=%r" % (x_dtype,))
    check(row_idx_type in (0, 1), _OP, "row_idx_type must be 0 or 1, got %r" % (row_idx_type,))
    check(expert_tokens_num_type in (0, 1, 2), _OP, "expert_tokens_num_type must be 0, 1 or 2")
    check(active_num >= -1, _OP, "active_num must be >= 0 (or -1), got %d" % active_num)
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
            check(scale.dim() == 1 and scale.shape[0] == n, _OP, "scale must be (NUM_ROWS=%d,) without quantisation" % n)
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
              "scale must be (%d, %d) or (1, %d) in dynamic quantisation" % (end - start, h, h))
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
