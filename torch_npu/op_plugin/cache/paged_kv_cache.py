"""Paged KV-cache bookkeeping (vLLM-style): npu_scatter_pa_kv_cache (+ _functional), npu_advance_step_flashattn,
npu_gather_pa_kv_cache (+ _functional) and npu_scatter_pa_cache.value.

The in-place ops write their outputs and return nothing, as the real ops.

* ``npu_scatter_pa_kv_cache``: token t goes to slot ``s = slot_mapping[t]``, i.e. block
  ``s // block_size``, row ``s % block_size``. ND caches (num_blocks, block_size, heads,
  head_size) take the (heads, head_size) row as is (the documented scenario 2); NZ-shaped
  caches (num_blocks, heads*head_size / last, block_size, last) take the flattened row
  cut into ``last``-wide pieces, piece c at ``[block, c, row, :]`` (scenario 1: the shapes
  of the FRACTAL_NZ layout; formats are metadata here). A cache shape that fits both
  readings is taken as ND. The compressed scenario 3
  (4-D key with ``compress_lens`` / ``seq_lens``) is not emulated: its formula is not
  documented.
* ``npu_advance_step_flashattn``: vLLM's ``advance_step_flashattn`` (the docs say the op
  implements it): for each of the first ``num_queries`` sequences i, the sampled token
  becomes the next input token, its position is the old ``seq_lens[i]``, ``seq_lens[i]``
  grows by one and the slot is ``block_tables[i, pos // block_size] * block_size +
  pos % block_size``. The speculative variant (``spec_token`` / ``accepted_num``) is not
  emulated ("last valid token" is not defined in the docs).
* ``npu_gather_pa_kv_cache(key_cache, value_cache, block_tables, seq_lens, key, value, *,
  seq_offset=None, is_seq_lens_cumsum=False)`` (aclnnGatherPaKvCache): the tokens of each
  batch b are copied, batch after batch, into consecutive rows of ``key`` / ``value`` (in place;
  the ``_functional`` variant returns updated copies). Token s of batch b comes from block
  ``block_tables[b, seq_offset[b] // block_size + s // block_size]``, row ``s % block_size``.
  ``seq_lens`` holds the lengths, or (``is_seq_lens_cumsum``) their running sum [0, l0, l0+l1,
  ...]. Layout as op-plugin picks ``cache_mode``: 3-D ``key`` [tokens, heads, head_size] with
  ND caches [num_blocks, block_size, heads, head_size] ("Norm"); 2-D ``key`` [tokens,
  heads*head_size] with NZ-shaped caches [num_blocks, heads*head_size / a, block_size, a]
  ("PA_NZ": the token's row is the concatenation of its ``a``-wide pieces). Rows of ``key``
  past the gathered tokens are left as they are. The lengths and block ids are read on the
  host, so both ops are registered opaque (a FakeTensor call only checks shapes).
* ``npu_scatter_pa_cache.value``: the paged K-cache scatter of one key per slot (``slot_mapping``),
  as npu_scatter_pa_kv_cache without the value cache.
"""
import torch

from torch_npu.op_plugin._common import check, symbolic, unsupported
from torch_npu.op_plugin._registry import impl, opaque

__all__ = []


def _scatter_one(op, name, x, cache, slots):
    t = x.size(0)
    check(cache.dim() == 4, op, "%s must be 4-D, got %d-D", (name, cache.dim()))
    row = x.reshape(t, -1)
    nb, d1, d2, d3 = cache.shape
    nd = d2 * d3 == row.size(1)  # ND: (num_blocks, block_size, heads, head_size)
    nz = d1 * d3 == row.size(1)  # NZ shapes: (num_blocks, heads*head_size / last, block_size, last)
    check(nd or nz, op, "%s shape %s does not hold rows of %d elements (ND or NZ layout)",
          (name, tuple(cache.shape), row.size(1)))
    block_size = d1 if nd else d2
    if t and not symbolic(slots):
        lo, hi = int(slots.min()), int(slots.max())
        check(0 <= lo and hi < nb * block_size, op,
              "slot_mapping values must be in [0, num_blocks * block_size - 1] = [0, %d], got [%d, %d]",
              (nb * block_size - 1, lo, hi))
    elif t:  # tracing (torch.compile): checked by the compiled graph at run time (indexing would wrap negatives)
        torch._assert_async(((slots >= 0) & (slots < nb * block_size)).all(),
                            "%s: slot_mapping values must be in [0, num_blocks * block_size - 1] = [0, %d]"
                            % (op, nb * block_size - 1))
    blk, off = slots // block_size, slots % block_size
    if nd:
        cache[blk, off] = row.reshape(t, d2, d3).to(cache.dtype)
    else:
        cache[blk, :, off, :] = row.reshape(t, d1, d3).to(cache.dtype)


@impl("npu_scatter_pa_kv_cache")
def npu_scatter_pa_kv_cache(key, value, key_cache, value_cache, slot_mapping, *, compress_lens=None,
                            compress_seq_offsets=None, seq_lens=None, cache_mode="PA_NZ"):
    """Writes ``key[t]`` / ``value[t]`` (3-D: tokens, heads, head_size) into ``key_cache`` /
    ``value_cache`` at slot ``slot_mapping[t]`` (block ``s // block_size``, row
    ``s % block_size``), in place. Caches are ND (num_blocks, block_size, heads, head_size)
    or NZ-shaped (num_blocks, heads*head_size / last, block_size, last); see the module doc.
    Slots must be distinct (as documented; duplicates have no defined winner)."""
    op = "npu_scatter_pa_kv_cache"
    if key.dim() == 4 or compress_lens is not None or compress_seq_offsets is not None or seq_lens is not None:
        unsupported(op, "the compressed scenario (4-D key, compress_lens / compress_seq_offsets / seq_lens)")
    check(key.dim() == 3 and value.dim() == 3 and key.shape[:2] == value.shape[:2], op,
          "key and value must be 3-D with equal first two dims, got %s and %s",
          (tuple(key.shape), tuple(value.shape)))
    check(key.dtype == value.dtype == key_cache.dtype == value_cache.dtype, op,
          "key, value, key_cache and value_cache must have one dtype")
    check(slot_mapping.dtype in (torch.int32, torch.int64), op,
          "slot_mapping must be int32 or int64, got %s", slot_mapping.dtype)
    check(slot_mapping.numel() == key.size(0), op, "slot_mapping must have one slot per token (%d), got %d",
          (key.size(0), slot_mapping.numel()))
    slots = slot_mapping.reshape(-1).long()
    _scatter_one(op, "key_cache", key, key_cache, slots)
    _scatter_one(op, "value_cache", value, value_cache, slots)


@impl("npu_scatter_pa_kv_cache_functional")
def npu_scatter_pa_kv_cache_functional(key, value, key_cache, value_cache, slot_mapping, *, compress_lens=None,
                                       compress_seq_offsets=None, seq_lens=None, cache_mode="PA_NZ"):
    """Out-of-place :func:`npu_scatter_pa_kv_cache`: returns updated copies of the caches."""
    kc, vc = key_cache.clone(), value_cache.clone()
    npu_scatter_pa_kv_cache(key, value, kc, vc, slot_mapping, compress_lens=compress_lens,
                            compress_seq_offsets=compress_seq_offsets, seq_lens=seq_lens, cache_mode=cache_mode)
    return kc, vc


@impl("npu_advance_step_flashattn")
def npu_advance_step_flashattn(input_tokens, sampled_token_ids, input_positions, seq_lens, slot_mapping,
                               block_tables, num_seqs, num_queries, block_size, *, spec_token=None,
                               accepted_num=None):
    """One decode step of vLLM's ``advance_step_flashattn``, in place, for sequences
    ``i < num_queries``: ``input_tokens[i] = sampled_token_ids[i, 0]``,
    ``input_positions[i] = seq_lens[i]``, ``seq_lens[i] += 1``,
    ``slot_mapping[i] = block_tables[i, pos // block_size] * block_size + pos % block_size``
    with ``pos`` the new position. Entries past ``num_queries`` are left as they are."""
    op = "npu_advance_step_flashattn"
    if spec_token is not None or accepted_num is not None:
        unsupported(op, "the speculative scenario (spec_token / accepted_num)")
    check(num_seqs > 0 and num_queries > 0 and block_size > 0, op,
          "num_seqs, num_queries and block_size must be positive")
    check(num_queries <= num_seqs, op, "num_queries (%d) must not exceed num_seqs (%d)", (num_queries, num_seqs))
    for name, t in (("input_tokens", input_tokens), ("input_positions", input_positions), ("seq_lens", seq_lens),
                    ("slot_mapping", slot_mapping)):
        check(t.dtype == torch.int64, op, "%s must be int64, got %s", (name, t.dtype))
        check(t.numel() >= num_queries, op, "%s must hold at least num_queries=%d values", (name, num_queries))
    check(sampled_token_ids.numel() >= num_queries, op, "sampled_token_ids must be (num_queries, 1)")
    check(block_tables.dim() == 2 and block_tables.size(0) >= num_queries, op,
          "block_tables must be 2-D with a row per sequence, got %s", (tuple(block_tables.shape),))
    n = num_queries
    pos = seq_lens.reshape(-1)[:n].clone()
    col = pos // block_size
    check(symbolic(col) or int(col.max()) < block_tables.size(1), op,
          "block_tables has %d columns; position %d needs column %d",
          ((block_tables.size(1), int(pos.max()), int(col.max())) if not symbolic(col) else (0, 0, 0)))
    if symbolic(col):  # tracing (torch.compile): the same check, by the compiled graph at run time
        torch._assert_async((col < block_tables.size(1)).all(), "%s: block_tables has %d columns; a position needs "
                            "a column past them" % (op, block_tables.size(1)))
    rows = torch.arange(n, device=block_tables.device)
    slots = block_tables[rows, col].long() * block_size + pos % block_size
    input_tokens.view(-1)[:n].copy_(sampled_token_ids.reshape(-1)[:n])
    input_positions.view(-1)[:n].copy_(pos)
    seq_lens.view(-1)[:n].add_(1)
    slot_mapping.view(-1)[:n].copy_(slots)


def _lengths(op, seq_lens, batch, cumsum):
    lens = [int(v) for v in seq_lens.detach().cpu().reshape(-1).tolist()]
    if cumsum:
        check(len(lens) == batch + 1, op, "seq_lens must be [batch + 1] running sums when is_seq_lens_cumsum, "
              "got %d values for batch %d", (len(lens), batch))
        lens = [b - a for a, b in zip(lens, lens[1:])]
    else:
        check(len(lens) == batch, op, "seq_lens must be [batch]=%d, got %d values", (batch, len(lens)))
    check(all(n >= 0 for n in lens), op, "sequence lengths must be >= 0, got %s", lens)
    return lens


def _cache_layout(op, key, key_cache, name):
    """(block_size, nz) of ``key_cache`` for rows shaped like ``key``."""
    check(key_cache.dim() == 4, op, "%s must be 4-D, got %d-D", (name, key_cache.dim()))
    if key.dim() == 3:  # Norm: [num_blocks, block_size, heads, head_size]
        check(tuple(key_cache.shape[2:]) == tuple(key.shape[1:]), op,
              "%s [num_blocks, block_size, heads, head_size] must end with the rows' %s, got %s",
              (name, tuple(key.shape[1:]), tuple(key_cache.shape)))
        return key_cache.size(1), False
    check(key.dim() == 2, op, "key/value must be 3-D (Norm) or 2-D (PA_NZ), got %d-D", key.dim())
    check(key_cache.size(1) * key_cache.size(3) == key.size(1), op,
          "%s [num_blocks, heads*head_size / a, block_size, a] must hold rows of %d, got %s",
          (name, key.size(1), tuple(key_cache.shape)))
    return key_cache.size(2), True


def _gather_checks(op, key_cache, value_cache, block_tables, seq_lens, key, value, seq_offset):
    check(key.dim() == value.dim() and key.size(0) == value.size(0), op,
          "key and value must have the same rank and number of rows, got %s and %s",
          (tuple(key.shape), tuple(value.shape)))
    check(key.dtype == key_cache.dtype and value.dtype == value_cache.dtype, op,
          "key/value must have their caches' dtypes")
    check(block_tables.dim() == 2, op, "block_tables must be 2-D [batch, blocks], got %d-D", block_tables.dim())
    check(block_tables.dtype in (torch.int32, torch.int64), op, "block_tables must be int32 or int64")
    check(seq_lens.dim() == 1, op, "seq_lens must be 1-D, got %d-D", seq_lens.dim())
    if seq_offset is not None:
        check(seq_offset.dim() == 1 and seq_offset.size(0) == block_tables.size(0), op,
              "seq_offset must be [batch]=%d, got %s", (block_tables.size(0), tuple(seq_offset.shape)))
    k_block, k_nz = _cache_layout(op, key, key_cache, "key_cache")
    v_block, v_nz = _cache_layout(op, value, value_cache, "value_cache")
    check(k_block == v_block and key_cache.size(0) == value_cache.size(0), op,
          "key_cache and value_cache must have the same num_blocks and block_size")
    return k_block, k_nz


def _gather_into(op, key_cache, value_cache, block_tables, seq_lens, key, value, seq_offset, is_seq_lens_cumsum):
    block_size, nz = _gather_checks(op, key_cache, value_cache, block_tables, seq_lens, key, value, seq_offset)
    batch, width = block_tables.shape
    lens = _lengths(op, seq_lens, batch, is_seq_lens_cumsum)
    check(sum(lens) <= key.size(0), op, "key/value have %d rows, the sequences hold %d tokens",
          (key.size(0), sum(lens)))
    offsets = [0] * batch if seq_offset is None else [int(v) for v in seq_offset.detach().cpu().tolist()]
    table = block_tables.detach().cpu().long()
    blocks, rows = [], []
    for b, n in enumerate(lens):
        if n == 0:
            continue
        first = offsets[b] // block_size
        last = first + (n - 1) // block_size
        check(0 <= first and last < width, op, "batch %d needs block_tables columns [%d, %d], it has %d",
              (b, first, last, width))
        steps = torch.arange(n)
        blocks.append(table[b, first + steps // block_size])
        rows.append(steps % block_size)
    if not blocks:
        return
    blocks, rows = torch.cat(blocks), torch.cat(rows)
    check(int(blocks.min()) >= 0 and int(blocks.max()) < key_cache.size(0), op,
          "block ids must be in [0, num_blocks=%d)", key_cache.size(0))
    total = blocks.numel()
    blocks, rows = blocks.to(key.device), rows.to(key.device)
    for out, cache in ((key, key_cache), (value, value_cache)):
        if nz:
            out[:total] = cache[blocks, :, rows, :].reshape(total, -1)
        else:
            out[:total] = cache[blocks, rows]


def _gather_fake(key_cache, value_cache, block_tables, seq_lens, key, value, *, seq_offset=None,
                 is_seq_lens_cumsum=False):
    _gather_checks("npu_gather_pa_kv_cache", key_cache, value_cache, block_tables, seq_lens, key, value, seq_offset)
    return None


@opaque("npu_gather_pa_kv_cache", _gather_fake)
def npu_gather_pa_kv_cache(key_cache, value_cache, block_tables, seq_lens, key, value, *, seq_offset=None,
                           is_seq_lens_cumsum=False):
    """Gathers each batch's tokens from the paged caches into ``key`` / ``value`` in place."""
    _gather_into("npu_gather_pa_kv_cache", key_cache, value_cache, block_tables, seq_lens, key, value, seq_offset,
                 is_seq_lens_cumsum)


def _gather_functional_fake(key_cache, value_cache, block_tables, seq_lens, key, value, *, seq_offset=None,
                            is_seq_lens_cumsum=False):
    _gather_checks("npu_gather_pa_kv_cache_functional", key_cache, value_cache, block_tables, seq_lens, key, value,
                   seq_offset)
    return torch.empty_like(key), torch.empty_like(value)


@opaque("npu_gather_pa_kv_cache_functional", _gather_functional_fake)
def npu_gather_pa_kv_cache_functional(key_cache, value_cache, block_tables, seq_lens, key, value, *,
                                      seq_offset=None, is_seq_lens_cumsum=False):
    """Out-of-place :func:`npu_gather_pa_kv_cache`: updated copies of ``key`` and ``value``."""
    key_out, value_out = key.clone(), value.clone()
    _gather_into("npu_gather_pa_kv_cache_functional", key_cache, value_cache, block_tables, seq_lens, key_out,
                 value_out, seq_offset, is_seq_lens_cumsum)
    return key_out, value_out


@impl("npu_scatter_pa_cache.value")
def npu_scatter_pa_cache_value(key, slot_mapping, *, compress_lens=None, compress_seq_offsets=None, seq_lens=None,
                               key_cache):
    """aclnnScatterPaCache scenario one ("Norm"): ``key`` [tokens, heads, head_size] row t goes
    to ``key_cache`` [num_blocks, block_size, heads, head_size] at block ``slot // block_size``,
    row ``slot % block_size`` with ``slot = slot_mapping[t]``; in place, returns ``key_cache``.
    The compressed scenarios (``compress_lens`` / ``compress_seq_offsets`` / ``seq_lens``, 4-D
    key) are not emulated: their per-head ReduceMean layout is not documented precisely."""
    op = "npu_scatter_pa_cache"
    if key.dim() == 4 or compress_lens is not None or compress_seq_offsets is not None or seq_lens is not None:
        raise NotImplementedError("%s: the compressed scenarios (compress_lens / compress_seq_offsets / seq_lens, "
                                  "4-D key) are not emulated on the CPU-emulated NPU" % op)
    check(key.dim() == 3, op, "key must be [tokens, heads, head_size], got %s", (tuple(key.shape),))
    check(key_cache.dim() == 4 and tuple(key_cache.shape[2:]) == tuple(key.shape[1:]), op,
          "key_cache must be [num_blocks, block_size, %d, %d], got %s",
          (key.size(1), key.size(2), tuple(key_cache.shape)))
    check(key.dtype == key_cache.dtype, op, "key and key_cache must have one dtype, got %s and %s",
          (key.dtype, key_cache.dtype))
    check(slot_mapping.dtype in (torch.int32, torch.int64), op, "slot_mapping must be int32 or int64")
    check(slot_mapping.numel() == key.size(0), op, "slot_mapping must hold one slot per token (%d), got %d",
          (key.size(0), slot_mapping.numel()))
    num_blocks, block_size = key_cache.shape[:2]
    slots = slot_mapping.reshape(-1).long()
    if slots.numel() and not symbolic(slots):
        lo, hi = int(slots.min()), int(slots.max())
        check(0 <= lo and hi < num_blocks * block_size, op, "slot_mapping values must be in [0, %d], got [%d, %d]",
              (num_blocks * block_size - 1, lo, hi))
    elif slots.numel():  # tracing (torch.compile): checked by the compiled graph at run time
        torch._assert_async(((slots >= 0) & (slots < num_blocks * block_size)).all(),
                            "%s: slot_mapping values must be in [0, %d]" % (op, num_blocks * block_size - 1))
    key_cache[slots // block_size, slots % block_size] = key
    return key_cache
