"""npu_fused_causal_conv1d and npu_fused_causal_conv1d_v2: the vLLM / Mamba-style causal
conv1d (kernel width K = 3, depthwise) with a per-sequence state cache ``conv_states``
[N, C, dim] that is read as the left context and written back in place.

Per sequence b (tokens ``x[query_start_loc[b]:query_start_loc[b+1]]`` for 2-D x, row
``x[b]`` for 3-D x; length L), with the documented formula (torch_npu doc and the
op-plugin golden):

    read line  r = cache_indices[b, initial_state_idx[b]] (APC) | cache_indices[b] | b
    write line w = cache_indices[b, block_idx_last[b]]    (APC) | cache_indices[b] | b
    skip the sequence when r == pad_slot_id
    num_computed_tokens[b] == 0:  cached = K-1 zero rows, offset = 0
    num_accepted_tokens given:    offset = num_accepted_tokens[b] - 1, cached = conv_states[r, :offset+K-1]
    otherwise:                    offset = C - (K-1),                 cached = conv_states[r, :]
    padded = cached ++ x_b;  M = min(C, len(padded));  conv_states[w, C-M:] = padded[-M:]
    x' = padded[offset:];    y[i] = sum_k weight[k] * x'[i + k]            (i < L)
    APC: for chunk c < last - first, the K-1 rows x'[bnd : bnd+K-1] at the c-th full-block
         boundary bnd go to conv_states[cache_indices[b, first + c], C-(K-1):]
    conv_mode "pangu": y[i] = 0 for i < min(max(K-1-num_computed_tokens[b], 0), L)
    residual_connection 1: y += x_b

y is accumulated in float32 and returned in x's dtype; conv_states keeps its dtype (it only
receives copies of input rows). ``_v2`` writes y into x in place and returns nothing.
``initial_state_mode``, ``bias``, ``activation`` and ``run_mode`` are documented as having no
effect in this interface; they are validated and ignored. The computation is gathers and
scatters with indices computed on the device (static shapes, no host reads), so FakeTensor,
meta and torch.compile trace the real computation and its cache writes; only the validation
of documented value ranges reads the index tensors on the host, and it is skipped for
meta / fake tensors.
"""
import torch

from torch_npu.op_plugin._common import check, symbolic
from torch_npu.op_plugin._registry import impl

__all__ = []

WIDTH = 3  # the kernel width K is fixed by the op
_DTYPES = (torch.float16, torch.bfloat16, torch.float32)  # float32: an emulator extension
_CONV_MODES = ("default", "pangu")
_ACTIVATIONS = (None, "None", "silu", "swish")  # accepted; documented as no effect


def _host_ints(t):
    return [int(v) for v in t.reshape(-1).tolist()]


def _check_index_tensor(op, name, t, shape):
    if t is None:
        return
    check(t.dtype == torch.int32, op, "%s must be int32, got %s", (name, t.dtype))
    check(tuple(t.shape) == tuple(shape), op, "%s must have shape %s, got %s",
          (name, list(shape), list(t.shape)))


def _check_static(op, x, weight, conv_states, query_start_loc, cache_indices, initial_state_mode, bias,
                  num_accepted_tokens, activation, residual_connection, max_query_len, num_computed_tokens,
                  block_first, block_last, initial_state_idx, block_size, conv_mode):
    """Shape / dtype / attribute checks that need no tensor values. Returns (batch, apc)."""
    if conv_mode not in _CONV_MODES:
        raise NotImplementedError("%s: conv_mode=%r is not emulated (documented: 'default', 'pangu')"
                                  % (op, conv_mode))
    check(activation in _ACTIVATIONS, op, "activation must be 'None', 'silu' or 'swish', got %r", (activation,))
    check(residual_connection in (0, 1), op, "residual_connection must be 0 or 1, got %r", (residual_connection,))
    check(x.dim() in (2, 3), op, "x must be 2-D [cu_seq_len, dim] or 3-D [batch, seq_len, dim], got %d-D",
          x.dim())
    check(x.dtype in _DTYPES, op, "x must be float16 or bfloat16 (float32 also emulated), got %s", x.dtype)
    dim = x.shape[-1]
    check(64 <= dim <= 16384 and dim % 16 == 0, op,
          "dim (last dim of x) must be a multiple of 16 in [64, 16384], got %d", dim)
    check(weight.dim() == 2 and weight.shape[0] == WIDTH and weight.shape[1] == dim, op,
          "weight must be [K=3, dim=%d], got %s", (dim, list(weight.shape)))
    check(conv_states.dim() == 3 and conv_states.shape[1] >= WIDTH - 1 and conv_states.shape[2] == dim, op,
          "conv_states must be [num_slots, state_len >= K-1 = 2, dim=%d], got %s", (dim, list(conv_states.shape)))
    check(weight.dtype == x.dtype and conv_states.dtype == x.dtype, op,
          "weight and conv_states must have x's dtype %s, got %s and %s", (x.dtype, weight.dtype, conv_states.dtype))
    if x.dim() == 3:
        batch = x.shape[0]
        check(conv_states.shape[1] >= WIDTH - 2 + x.shape[1], op,
              "conv_states.shape[1] must be >= K-1 + seq_len-1 = %d for 3-D x, got %d",
              (WIDTH - 2 + x.shape[1], conv_states.shape[1]))
        check(x.shape[1] >= 1, op, "x must have at least one token per sequence")
    else:
        check(query_start_loc is not None, op, "query_start_loc is required when x is 2-D")
        check(query_start_loc.dim() == 1 and query_start_loc.shape[0] >= 2, op,
              "query_start_loc must be 1-D [batch+1], got %s", list(query_start_loc.shape))
        batch = query_start_loc.shape[0] - 1
    if query_start_loc is not None:
        check(query_start_loc.dtype == torch.int32, op, "query_start_loc must be int32, got %s",
              query_start_loc.dtype)
    check(1 <= batch <= 256, op, "batch must be in [1, 256], got %d", batch)
    apc = any(t is not None for t in (block_first, block_last, initial_state_idx)) or (
        cache_indices is not None and cache_indices.dim() == 2)
    if apc:
        for name, t in (("block_idx_first_scheduled_token", block_first),
                        ("block_idx_last_scheduled_token", block_last),
                        ("initial_state_idx", initial_state_idx), ("num_computed_tokens", num_computed_tokens),
                        ("cache_indices", cache_indices)):
            check(t is not None, op, "%s is required when prefix caching (APC) is enabled", name)
        check(cache_indices.dim() == 2 and cache_indices.shape[0] == batch, op,
              "cache_indices must be [batch=%d, max_num_blocks] with APC, got %s", (batch, list(cache_indices.shape)))
        check(block_size >= 2, op, "block_size must be >= 2 with APC, got %r", (block_size,))
        _check_index_tensor(op, "cache_indices", cache_indices, cache_indices.shape)
    else:
        _check_index_tensor(op, "cache_indices", cache_indices, (batch,))
    if conv_mode == "pangu":
        check(num_computed_tokens is not None, op, "num_computed_tokens is required when conv_mode is 'pangu'")
    for name, t in (("num_accepted_tokens", num_accepted_tokens), ("num_computed_tokens", num_computed_tokens),
                    ("block_idx_first_scheduled_token", block_first), ("block_idx_last_scheduled_token", block_last),
                    ("initial_state_idx", initial_state_idx), ("initial_state_mode", initial_state_mode)):
        _check_index_tensor(op, name, t, (batch,))
    if bias is not None:
        check(tuple(bias.shape) == (dim,) and bias.dtype == x.dtype, op,
              "bias must be [dim=%d] of x's dtype, got %s %s", (dim, list(bias.shape), bias.dtype))
    check(max_query_len == -1 or max_query_len >= 1, op, "max_query_len must be -1 or >= 1, got %r", (max_query_len,))
    return batch, apc


def _validate_values(op, x, batch, conv_states, apc, query_start_loc, cache_indices, pad_slot_id,
                     num_accepted_tokens, num_computed_tokens, block_first, block_last, initial_state_idx,
                     block_size, max_query_len):
    """The documented value ranges, read on the host (real tensors only; the computation
    itself never reads values on the host)."""
    if x.dim() == 3:  # fixed batch: query_start_loc is not read
        lengths = [x.shape[1]] * batch
    else:
        starts = _host_ints(query_start_loc)
        check(starts[0] >= 0 and starts[-1] <= x.shape[0], op,
              "query_start_loc values must be in [0, cu_seq_len=%d], got %s", (x.shape[0], starts))
        check(all(a < b for a, b in zip(starts, starts[1:])), op,
              "query_start_loc must be strictly increasing (every sequence has a token), got %s", starts)
        lengths = [b - a for a, b in zip(starts, starts[1:])]
        if max_query_len >= 1:
            check(max(lengths) <= max_query_len, op, "a sequence has %d tokens, more than max_query_len=%d",
                  (max(lengths), max_query_len))
    num_slots, state_len = conv_states.shape[0], conv_states.shape[1]
    lines = _host_ints(cache_indices) if cache_indices is not None else None
    nat = _host_ints(num_accepted_tokens) if num_accepted_tokens is not None else None
    ncomp = _host_ints(num_computed_tokens) if num_computed_tokens is not None else None
    if apc:
        first, last, init = (_host_ints(t) for t in (block_first, block_last, initial_state_idx))
        width = cache_indices.shape[1]
    readers, writers = {}, {}
    for b, length in enumerate(lengths):
        fills = []
        if apc:
            check(0 <= first[b] <= last[b] < width and 0 <= init[b] <= min(first[b] + 1, last[b]), op,
                  "sequence %d: need 0 <= initial_state_idx <= min(block_idx_first + 1, block_idx_last) and "
                  "block_idx_first <= block_idx_last < max_num_blocks=%d; got %d, %d, %d",
                  (b, width, init[b], first[b], last[b]))
            row = lines[b * width:(b + 1) * width]
            read, write = row[init[b]], row[last[b]]
            fills = row[first[b]:last[b]]
        elif lines is not None:
            read = write = lines[b]
        else:
            read = write = b
        if read == pad_slot_id:
            continue
        for line in [read, write] + fills:
            check(line != pad_slot_id, op, "sequence %d: a cache line it writes is pad_slot_id=%d", (b, pad_slot_id))
            check(0 <= line < num_slots, op, "sequence %d: cache line %d outside conv_states[0:%d]",
                  (b, line, num_slots))
        for line in [write] + fills:  # one writer per line, and no other sequence reads it
            check(line not in writers and readers.get(line, {b}) == {b}, op, "cache line %d is used by two "
                  "sequences or written twice (cache_indices must be distinct)", line)
            writers[line] = b
        check(writers.get(read, b) == b, op,
              "cache line %d is read by sequence %d and written by another (cache_indices must be distinct)",
              (read, b))
        readers.setdefault(read, set()).add(b)  # shared reads (a common prefix block) are allowed
        if ncomp is not None:
            check(ncomp[b] >= 0, op, "num_computed_tokens must be >= 0, got %d", ncomp[b])
        if nat is not None and not (ncomp is not None and ncomp[b] == 0):
            check(1 <= nat[b] <= length and nat[b] - 1 + WIDTH - 1 <= state_len, op,
                  "sequence %d: num_accepted_tokens=%d must be in [1, %d] (its tokens) and leave K-1 rows of "
                  "conv_states (state_len %d)", (b, nat[b], length, state_len))
        if fills:
            end_part = (length - (block_size - ncomp[b] % block_size)) % block_size
            last_full = length - end_part - (block_size if end_part == 0 else 0)
            boundaries = [last_full - (len(fills) - 1 - c) * block_size for c in range(len(fills))]
            check(all(0 < bnd <= length for bnd in boundaries), op,
                  "sequence %d: block indices do not fit its %d tokens with num_computed_tokens=%d, block_size=%d",
                  (b, length, ncomp[b], block_size))


def _compute(x, weight, conv_states, batch, apc, query_start_loc, cache_indices, pad_slot_id, num_accepted_tokens,
             num_computed_tokens, block_first, block_last, initial_state_idx, block_size, residual, pangu):
    """Device-side formula, static shapes only: returns (y rows [T, dim] in x's dtype, valid [T]) and
    writes conv_states. Every row is fetched by index from one table
    ``src = [read lines' rows | a zero row | x rows]``."""
    num_slots, state_len, dim = conv_states.shape
    dev = x.device
    rows = x.reshape(-1, dim)
    total = rows.shape[0]
    seq_ids = torch.arange(batch, device=dev)
    tokens = torch.arange(total, device=dev)
    if x.dim() == 3:
        starts = seq_ids * x.shape[1]
        lengths = torch.full((batch,), x.shape[1], dtype=torch.long, device=dev)
        seq = tokens // x.shape[1]
        covered = torch.ones(total, dtype=torch.bool, device=dev)
    else:
        bounds = query_start_loc.to(dev).long()
        starts, lengths = bounds[:-1], bounds[1:] - bounds[:-1]
        seq = torch.searchsorted(bounds[1:], tokens, right=True)
        covered = (seq < batch) & (tokens >= bounds[0])
        seq = seq.clamp(max=batch - 1)
    pos = tokens - starts[seq]  # position inside its sequence
    if apc:
        table = cache_indices.to(dev).long()
        read = table.gather(1, initial_state_idx.to(dev).long()[:, None])[:, 0]
        write = table.gather(1, block_last.to(dev).long()[:, None])[:, 0]
    elif cache_indices is not None:
        read = write = cache_indices.to(dev).long()
    else:
        read = write = seq_ids
    skip = read == pad_slot_id
    fresh = (num_computed_tokens.to(dev).long() == 0) if num_computed_tokens is not None else torch.zeros_like(skip)
    if num_accepted_tokens is not None:
        offset = num_accepted_tokens.to(dev).long() - 1
    else:
        offset = torch.full((batch,), state_len - (WIDTH - 1), dtype=torch.long, device=dev)
    offset = torch.where(fresh, 0, offset)
    hist_len = offset + WIDTH - 1  # rows of cached context before the tokens

    history = conv_states[read.clamp(0, num_slots - 1)].reshape(batch * state_len, dim)
    zero_row = batch * state_len
    x_base = zero_row + 1
    src = torch.cat([history, rows.new_zeros(1, dim).to(conv_states.dtype), rows.to(conv_states.dtype)])

    def padded(b, i):
        """src row of paddedInput[i] of sequence b (i may be out of range where masked later)."""
        from_cache = torch.where(fresh[b], zero_row, b * state_len + i.clamp(0, state_len - 1))
        from_x = (x_base + starts[b] + i - hist_len[b]).clamp(x_base, x_base + total - 1)
        return torch.where(i < hist_len[b], from_cache, from_x)

    # the causal conv: y[t] = sum_k w[k] * x'[pos + k], x'[j] = paddedInput[j + offset]
    w = weight.float()
    y = None
    for k in range(WIDTH):
        term = src[padded(seq, pos + k + offset[seq])].float() * w[k]
        y = term if y is None else y + term
    if pangu:
        y = torch.where((pos < WIDTH - 1 - num_computed_tokens.to(dev).long()[seq])[:, None], 0.0, y)
    if residual:
        y = y + rows.float()
    valid = covered & ~skip[seq]

    # cache writes as (line, row, src row, valid) candidates; every candidate gets the final
    # value of its target row, so duplicate or masked targets write identical values
    cols = torch.arange(state_len, device=dev)
    length_all = hist_len + lengths
    i_write = (length_all - state_len)[:, None] + cols[None, :]  # paddedInput index per cache row
    b_write = seq_ids[:, None].expand(batch, state_len)
    lines = [write[:, None].expand(batch, state_len).reshape(-1)]
    slots = [cols[None, :].expand(batch, state_len).reshape(-1)]
    sources = [padded(b_write, i_write).reshape(-1)]
    oks = [((i_write >= 0) & ~skip[:, None]).reshape(-1)]
    if apc:
        bsize = block_size
        ncomp = num_computed_tokens.to(dev).long()
        first = block_first.to(dev).long()
        n_fill = block_last.to(dev).long() - first
        end_part = torch.remainder(lengths - (bsize - torch.remainder(ncomp, bsize)), bsize)
        last_full = lengths - end_part - torch.where(end_part == 0, bsize, 0)
        gap = last_full[seq] - (pos + 1)  # a fill boundary after this token when gap = (n-1-c) * B
        chunk = n_fill[seq] - 1 - torch.div(gap, bsize, rounding_mode="floor")
        is_fill = valid & (gap >= 0) & (torch.remainder(gap, bsize) == 0) & (chunk >= 0)
        column = (first[seq] + chunk).clamp(0, table.shape[1] - 1)
        fill_line = table[seq, column]
        for j in range(WIDTH - 1):
            lines.append(fill_line)
            slots.append(torch.full_like(fill_line, state_len - (WIDTH - 1) + j))
            sources.append(padded(seq, pos + 1 + j + offset[seq]))
            oks.append(is_fill)
    line, slot, source, ok = (torch.cat(v) for v in (lines, slots, sources, oks))
    line = line.clamp(0, num_slots - 1)
    flat = line * state_len + slot
    ids = torch.arange(flat.shape[0], device=dev)
    owner = torch.full((num_slots * state_len,), -1, dtype=torch.long, device=dev)
    owner = owner.scatter_reduce(0, torch.where(ok, flat, 0), torch.where(ok, ids, -1), reduce="amax")
    final_owner = owner[flat]
    value = torch.where((final_owner >= 0)[:, None], src[source[final_owner.clamp(min=0)]], conv_states[line, slot])
    conv_states.index_put_((line, slot), value)
    return y.to(x.dtype), valid


def _run(op, x, weight, conv_states, *, query_start_loc, cache_indices, initial_state_mode, bias,
         num_accepted_tokens, activation, pad_slot_id, residual_connection, max_query_len, num_computed_tokens,
         block_idx_first_scheduled_token, block_idx_last_scheduled_token, initial_state_idx, block_size,
         conv_mode):
    """Returns (y rows [T, dim], valid [T]) and updates ``conv_states`` in place."""
    pad_slot_id = -1 if pad_slot_id is None else pad_slot_id
    residual_connection = 0 if residual_connection is None else residual_connection
    max_query_len = -1 if max_query_len is None else max_query_len
    block_size = 128 if block_size is None else block_size
    conv_mode = "default" if conv_mode is None else conv_mode
    batch, apc = _check_static(op, x, weight, conv_states, query_start_loc, cache_indices, initial_state_mode,
                               bias, num_accepted_tokens, activation, residual_connection, max_query_len,
                               num_computed_tokens, block_idx_first_scheduled_token,
                               block_idx_last_scheduled_token, initial_state_idx, block_size, conv_mode)
    if not any(symbolic(t) for t in (x, weight, conv_states)):
        _validate_values(op, x, batch, conv_states, apc, query_start_loc, cache_indices, pad_slot_id,
                         num_accepted_tokens, num_computed_tokens, block_idx_first_scheduled_token,
                         block_idx_last_scheduled_token, initial_state_idx, block_size, max_query_len)
    return _compute(x, weight, conv_states, batch, apc, query_start_loc, cache_indices, pad_slot_id,
                    num_accepted_tokens, num_computed_tokens, block_idx_first_scheduled_token,
                    block_idx_last_scheduled_token, initial_state_idx, block_size, residual_connection == 1,
                    conv_mode == "pangu")


@impl("npu_fused_causal_conv1d")
def npu_fused_causal_conv1d(x, weight, conv_states, *, query_start_loc=None, cache_indices=None,
                            initial_state_mode=None, bias=None, num_accepted_tokens=None, activation="None",
                            pad_slot_id=-1, run_mode=0, residual_connection=0, max_query_len=-1,
                            num_computed_tokens=None, block_idx_first_scheduled_token=None,
                            block_idx_last_scheduled_token=None, initial_state_idx=None, block_size=128,
                            conv_mode="default"):
    """Causal conv1d (K = 3) of each sequence of ``x`` with its cached left context; updates
    ``conv_states`` in place and returns y (x's shape and dtype). Rows of skipped sequences
    (read line == pad_slot_id) are not written by the real op; here they are zero."""
    y, valid = _run("npu_fused_causal_conv1d", x, weight, conv_states, query_start_loc=query_start_loc,
                    cache_indices=cache_indices, initial_state_mode=initial_state_mode, bias=bias,
                    num_accepted_tokens=num_accepted_tokens, activation=activation, pad_slot_id=pad_slot_id,
                    residual_connection=residual_connection, max_query_len=max_query_len,
                    num_computed_tokens=num_computed_tokens,
                    block_idx_first_scheduled_token=block_idx_first_scheduled_token,
                    block_idx_last_scheduled_token=block_idx_last_scheduled_token,
                    initial_state_idx=initial_state_idx,
                    block_size=block_size, conv_mode=conv_mode)
    return torch.where(valid[:, None], y, 0).reshape(x.shape)


@impl("npu_fused_causal_conv1d_v2")
def npu_fused_causal_conv1d_v2(x, weight, conv_states, *, query_start_loc=None, cache_indices=None,
                               initial_state_mode=None, bias=None, num_accepted_tokens=None, activation="None",
                               pad_slot_id=-1, run_mode=0, residual_connection=0, max_query_len=-1,
                               num_computed_tokens=None, block_idx_first_scheduled_token=None,
                               block_idx_last_scheduled_token=None, initial_state_idx=None, block_size=128,
                               conv_mode="default"):
    """As npu_fused_causal_conv1d, but y is written into ``x`` in place (rows of skipped
    sequences keep their values) and nothing is returned."""
    y, valid = _run("npu_fused_causal_conv1d_v2", x, weight, conv_states, query_start_loc=query_start_loc,
                    cache_indices=cache_indices, initial_state_mode=initial_state_mode, bias=bias,
                    num_accepted_tokens=num_accepted_tokens, activation=activation, pad_slot_id=pad_slot_id,
                    residual_connection=residual_connection, max_query_len=max_query_len,
                    num_computed_tokens=num_computed_tokens,
                    block_idx_first_scheduled_token=block_idx_first_scheduled_token,
                    block_idx_last_scheduled_token=block_idx_last_scheduled_token,
                    initial_state_idx=initial_state_idx,
                    block_size=block_size, conv_mode=conv_mode)
    x.copy_(torch.where(valid[:, None], y, x.reshape(y.shape)).reshape(x.shape))
