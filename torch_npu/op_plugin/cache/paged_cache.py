"""KV-cache and sampling ops emulated from their documented formulas: npu_top_k_top_p (logits
filtering), npu_gather_pa_kv_cache (+ _functional, paged KV-cache gather), npu_scatter_pa_cache.value
(paged K-cache scatter), npu_scatter_list(_) (one row per tensor of a list) and
npu_kv_rmsnorm_rope_cache (+ _v2, _v2_functional, the MLA kv RMSNorm + RoPE + cache update); each
function's docstring and docs/ops-cache-misc-r8.md give the formula and its source.

* ``npu_top_k_top_p(logits, p, k)`` (aclnnApplyTopKTopP): per row b, sort ascending (stable);
  top-k keeps the values >= the k[b]-th largest (``k[b] <= 0`` or ``k[b] >= V`` skips top-k);
  top-p takes the softmax of the surviving sorted values, its cumulative sum from the smallest,
  and drops the positions whose cumulative probability is <= 1 - p[b], always keeping the
  largest; dropped positions become -inf, the rest keep their logit, in the original order.
  ``k=None`` or ``p=None`` skips that filter (both None is an error, as aclnn's null check).
  The softmax and cumulative sum run in float32 for float16/bfloat16 logits.
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
"""
import torch

from torch_npu.op_plugin._common import acc, check
from torch_npu.op_plugin._opaque_vjp import non_differentiable
from torch_npu.op_plugin._registry import impl, opaque
from torch_npu.op_plugin._common import symbolic

__all__ = []

_LOGIT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@impl("npu_top_k_top_p")
def npu_top_k_top_p(logits, p=None, k=None):
    """Top-k then top-p filtering of 2-D ``logits`` (see the module docstring)."""
    op = "npu_top_k_top_p"
    check(p is not None or k is not None, op, "p and k must not both be None")
    check(logits.dim() == 2, op, "logits must be 2-D [batch, vocab], got %d-D" % logits.dim())
    check(logits.dtype in _LOGIT_DTYPES, op, "logits must be float32, float16 or bfloat16, got %s" % logits.dtype)
    batch, vocab = logits.shape
    values, order = torch.sort(logits, dim=-1, stable=True)
    neg_inf = torch.tensor(float("-inf"), dtype=logits.dtype, device=logits.device)
    if k is not None:
        check(k.dim() == 1 and k.size(0) == batch, op, "k must be 1-D of logits.size(0)=%d, got %s"
              % (batch, tuple(k.shape)))
        check(k.dtype == torch.int32, op, "k must be int32, got %s" % k.dtype)
        kk = k.long()
        active = (kk > 0) & (kk < vocab)
        position = (vocab - kk).clamp(0, vocab - 1).unsqueeze(-1)   # the k-th largest, ascending order
        threshold = values.gather(-1, position)
        values = torch.where((values < threshold) & active.unsqueeze(-1), neg_inf, values)
    if p is not None:
        check(p.dim() == 1 and p.size(0) == batch, op, "p must be 1-D of logits.size(0)=%d, got %s"
              % (batch, tuple(p.shape)))
        check(p.dtype == logits.dtype, op, "p must have logits' dtype %s, got %s" % (logits.dtype, p.dtype))
        cumulative = torch.softmax(acc(values), dim=-1).cumsum(dim=-1)
        drop = cumulative <= (1 - acc(p)).unsqueeze(-1)
        keep_largest = torch.arange(vocab, device=logits.device) == vocab - 1
        values = torch.where(drop & ~keep_largest, neg_inf, values)
    return torch.empty_like(logits).scatter(-1, order, values)


def _lengths(op, seq_lens, batch, cumsum):
    lens = [int(v) for v in seq_lens.detach().cpu().reshape(-1).tolist()]
    if cumsum:
        check(len(lens) == batch + 1, op, "seq_lens must be [batch + 1] running sums when is_seq_lens_cumsum, "
              "got %d values for batch %d" % (len(lens), batch))
        lens = [b - a for a, b in zip(lens, lens[1:])]
    else:
        check(len(lens) == batch, op, "seq_lens must be [batch]=%d, got %d values" % (batch, len(lens)))
    check(all(n >= 0 for n in lens), op, "sequence lengths must be >= 0, got %s" % lens)
    return lens


def _cache_layout(op, key, key_cache, name):
    """(block_size, nz) of ``key_cache`` for rows shaped like ``key``."""
    check(key_cache.dim() == 4, op, "%s must be 4-D, got %d-D" % (name, key_cache.dim()))
    if key.dim() == 3:  # Norm: [num_blocks, block_size, heads, head_size]
        check(tuple(key_cache.shape[2:]) == tuple(key.shape[1:]), op,
              "%s [num_blocks, block_size, heads, head_size] must end with the rows' %s, got %s"
              % (name, tuple(key.shape[1:]), tuple(key_cache.shape)))
        return key_cache.size(1), False
    check(key.dim() == 2, op, "key/value must be 3-D (Norm) or 2-D (PA_NZ), got %d-D" % key.dim())
    check(key_cache.size(1) * key_cache.size(3) == key.size(1), op,
          "%s [num_blocks, heads*head_size / a, block_size, a] must hold rows of %d, got %s"
          % (name, key.size(1), tuple(key_cache.shape)))
    return key_cache.size(2), True


def _gather_checks(op, key_cache, value_cache, block_tables, seq_lens, key, value, seq_offset):
    check(key.dim() == value.dim() and key.size(0) == value.size(0), op,
          "key and value must have the same rank and number of rows, got %s and %s"
          % (tuple(key.shape), tuple(value.shape)))
    check(key.dtype == key_cache.dtype and value.dtype == value_cache.dtype, op,
          "key/value must have their caches' dtypes")
    check(block_tables.dim() == 2, op, "block_tables must be 2-D [batch, blocks], got %d-D" % block_tables.dim())
    check(block_tables.dtype in (torch.int32, torch.int64), op, "block_tables must be int32 or int64")
    check(seq_lens.dim() == 1, op, "seq_lens must be 1-D, got %d-D" % seq_lens.dim())
    if seq_offset is not None:
        check(seq_offset.dim() == 1 and seq_offset.size(0) == block_tables.size(0), op,
              "seq_offset must be [batch]=%d, got %s" % (block_tables.size(0), tuple(seq_offset.shape)))
    k_block, k_nz = _cache_layout(op, key, key_cache, "key_cache")
    v_block, v_nz = _cache_layout(op, value, value_cache, "value_cache")
    check(k_block == v_block and key_cache.size(0) == value_cache.size(0), op,
          "key_cache and value_cache must have the same num_blocks and block_size")
    return k_block, k_nz


def _gather_into(op, key_cache, value_cache, block_tables, seq_lens, key, value, seq_offset, is_seq_lens_cumsum):
    block_size, nz = _gather_checks(op, key_cache, value_cache, block_tables, seq_lens, key, value, seq_offset)
    batch, width = block_tables.shape
    lens = _lengths(op, seq_lens, batch, is_seq_lens_cumsum)
    check(sum(lens) <= key.size(0), op, "key/value have %d rows, the sequences hold %d tokens"
          % (key.size(0), sum(lens)))
    offsets = [0] * batch if seq_offset is None else [int(v) for v in seq_offset.detach().cpu().tolist()]
    table = block_tables.detach().cpu().long()
    blocks, rows = [], []
    for b, n in enumerate(lens):
        if n == 0:
            continue
        first = offsets[b] // block_size
        last = first + (n - 1) // block_size
        check(0 <= first and last < width, op, "batch %d needs block_tables columns [%d, %d], it has %d"
              % (b, first, last, width))
        steps = torch.arange(n)
        blocks.append(table[b, first + steps // block_size])
        rows.append(steps % block_size)
    if not blocks:
        return
    blocks, rows = torch.cat(blocks), torch.cat(rows)
    check(int(blocks.min()) >= 0 and int(blocks.max()) < key_cache.size(0), op,
          "block ids must be in [0, num_blocks=%d)" % key_cache.size(0))
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


# ----------------------------------------------------------------- paged K cache scatter, list scatter

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
    check(key.dim() == 3, op, "key must be [tokens, heads, head_size], got %s" % (tuple(key.shape),))
    check(key_cache.dim() == 4 and tuple(key_cache.shape[2:]) == tuple(key.shape[1:]), op,
          "key_cache must be [num_blocks, block_size, %d, %d], got %s"
          % (key.size(1), key.size(2), tuple(key_cache.shape)))
    check(key.dtype == key_cache.dtype, op, "key and key_cache must have one dtype, got %s and %s"
          % (key.dtype, key_cache.dtype))
    check(slot_mapping.dtype in (torch.int32, torch.int64), op, "slot_mapping must be int32 or int64")
    check(slot_mapping.numel() == key.size(0), op, "slot_mapping must hold one slot per token (%d), got %d"
          % (key.size(0), slot_mapping.numel()))
    num_blocks, block_size = key_cache.shape[:2]
    slots = slot_mapping.reshape(-1).long()
    if slots.numel() and not symbolic(slots):
        lo, hi = int(slots.min()), int(slots.max())
        check(0 <= lo and hi < num_blocks * block_size, op, "slot_mapping values must be in [0, %d], got [%d, %d]"
              % (num_blocks * block_size - 1, lo, hi))
    elif slots.numel():  # tracing (torch.compile): checked by the compiled graph at run time
        torch._assert_async(((slots >= 0) & (slots < num_blocks * block_size)).all(),
                            "%s: slot_mapping values must be in [0, %d]" % (op, num_blocks * block_size - 1))
    key_cache[slots // block_size, slots % block_size] = key
    return key_cache


def _scatter_list_into(op, outputs, indices, updates, mask, reduce, axis):
    """outputs[i].select(axis, indices[i]) = updates[i].select(axis, 0) for every list entry."""
    check(reduce == "update", op, "reduce must be 'update', got %r" % (reduce,))
    check(len(outputs) > 0, op, "the tensor list must not be empty")
    rank = outputs[0].dim()
    check(axis in (-2, -1, rank - 2, rank - 1), op, "axis must be -2 or -1, got %d" % axis)
    dim = axis % rank
    check(indices.dim() == 1 and indices.size(0) == len(outputs), op,
          "indices must be 1-D with one index per tensor (%d), got %s" % (len(outputs), tuple(indices.shape)))
    check(indices.dtype in (torch.int32, torch.int64), op, "indices must be int32 or int64")
    expected = [len(outputs)] + [1 if d == dim else s for d, s in enumerate(outputs[0].shape)]
    if updates.dim() == rank + 1 and updates.size(dim + 1) != 1:
        raise NotImplementedError("%s: updates of %d rows along axis are not emulated (only the documented one row "
                                  "per tensor)" % (op, updates.size(dim + 1)))
    check(list(updates.shape) == expected, op, "updates must be %s, got %s" % (expected, list(updates.shape)))
    if mask is not None:
        check(mask.dim() == 1 and mask.size(0) == len(outputs), op, "mask must be 1-D with one entry per tensor")
        if not symbolic(mask) and not bool((mask != 0).all()):
            raise NotImplementedError("%s: a mask with zero entries is not emulated (its effect is not documented)"
                                      % op)
    for i, out in enumerate(outputs):
        check(tuple(out.shape) == tuple(outputs[0].shape) and out.dtype == updates.dtype, op,
              "every tensor must have shape %s and updates' dtype" % (tuple(outputs[0].shape),))
        out.index_copy_(dim, indices[i:i + 1].long(), updates[i])


# The mask is checked on its values (zeros are not emulated), which a FakeTensor does not have:
# as CompositeImplicitAutograd kernels, compiled graphs skipped the check and accepted masks
# that eager rejects. As opaque ops the kernel runs on the real tensors inside the compiled
# graph, so compiled and eager raise the same error; the fake kernels do the shape checks.
def _scatter_list_fake(self, indices, updates, mask=None, reduce="update", axis=-2):
    outputs = [torch.empty_like(t) for t in self]
    _scatter_list_into("npu_scatter_list", outputs, indices, updates, mask, reduce, axis)
    return outputs


@opaque("npu_scatter_list", _scatter_list_fake)
def npu_scatter_list(self, indices, updates, mask=None, reduce="update", axis=-2):
    """Returns copies of the tensors of ``self`` with row ``indices[i]`` along ``axis`` of
    tensor i replaced by ``updates[i]`` (updates [list, *tensor shape with 1 at axis]). The
    tested scenario of op-plugin: ``reduce='update'``, ``axis`` -2 or -1, mask None or all ones."""
    outputs = [t.clone() for t in self]
    _scatter_list_into("npu_scatter_list", outputs, indices, updates, mask, reduce, axis)
    return outputs


non_differentiable("npu_scatter_list")  # no backward in op-plugin's derivatives either


def _scatter_list_inplace_fake(self, indices, updates, mask=None, reduce="update", axis=-2):
    _scatter_list_into("npu_scatter_list_", [torch.empty_like(t) for t in self], indices, updates, mask, reduce, axis)


@opaque("npu_scatter_list_", _scatter_list_inplace_fake)
def npu_scatter_list_(self, indices, updates, mask=None, reduce="update", axis=-2):
    """In-place :func:`npu_scatter_list`; returns nothing."""
    _scatter_list_into("npu_scatter_list_", list(self), indices, updates, mask, reduce, axis)


# ----------------------------------------------------------------- MLA kv: RMSNorm + RoPE + cache update

_KV_CACHE_MODES = ("Norm", "PA", "PA_BNSD", "PA_NZ", "PA_BLK_BNSD", "PA_BLK_NZ")
# elements per FRACTAL_NZ piece of the NZ cache modes (op-plugin golden: 16, 32 for int8 caches)
_NZ_PIECE = {False: 16, True: 32}


def _kv_rmsnorm_rope(op, kv, gamma, cos, sin, epsilon):
    """(k_embed, y) in float32 (float64 kept): RMSNorm of the first gamma.size(0) features of
    ``kv`` [B, 1, S, H] and the de-interleaving RoPE (evens then odds, ``k*cos +
    rotate_half(k)*sin``) of the remaining cos.size(3) features."""
    rms_dim, rope_dim = gamma.size(0), cos.size(3)
    check(kv.size(1) == 1, op, "kv must be [batch, 1, seq_len, hidden], got %s" % (tuple(kv.shape),))
    check(kv.size(3) == rms_dim + rope_dim, op, "kv's last dim %d must be gamma.size(0) + cos.size(3) = %d"
          % (kv.size(3), rms_dim + rope_dim))
    for name, t in (("cos", cos), ("sin", sin)):
        check(tuple(t.shape) == tuple(kv.shape[:3]) + (rope_dim,), op, "%s must be %s, got %s"
              % (name, tuple(kv.shape[:3]) + (rope_dim,), tuple(t.shape)))
    compute = torch.float64 if kv.dtype == torch.float64 else torch.float32
    rms_in, rope_in = kv.to(compute).split([rms_dim, rope_dim], dim=-1)
    y = rms_in * torch.rsqrt(rms_in.pow(2).mean(-1, keepdim=True) + epsilon) * gamma.to(compute)
    k = torch.cat((rope_in[..., 0::2], rope_in[..., 1::2]), -1)
    half = rope_dim // 2
    k_embed = k * cos.to(compute) + torch.cat((-k[..., half:], k[..., :half]), -1) * sin.to(compute)
    return k_embed, y


def _kv_cache_rows(rows, cache, scale):
    """Rows as stored: ``round(rows * scale)`` clipped to int8 with a scale, else the cache dtype."""
    if scale is None:
        return rows.to(cache.dtype)
    return torch.round(rows * scale.to(rows.dtype)).clamp(-128, 127).to(torch.int8)


def _kv_cache_targets(op, index, cache_mode, batch, seq_len, block_size):
    """(token ids into the flattened [B*S] rows, page ids, rows in page) of the tokens to write;
    tokens whose offset is negative are skipped (as the op-plugin golden)."""
    tokens = torch.arange(batch * seq_len)
    if cache_mode in ("PA_BLK_BNSD", "PA_BLK_NZ"):
        check(index.dim() == 1 and index.numel() % batch == 0, op,
              "%s: index must be [batch * ceil(seq_len / block_size)], got %s" % (cache_mode, tuple(index.shape)))
        pages_per_batch = index.numel() // batch
        in_batch = tokens % seq_len
        check((seq_len + block_size - 1) // block_size <= pages_per_batch, op,
              "%s: index holds %d pages per batch, seq_len %d needs %d"
              % (cache_mode, pages_per_batch, seq_len, (seq_len + block_size - 1) // block_size))
        offsets = index.detach().cpu().long()[(tokens // seq_len) * pages_per_batch + in_batch // block_size]
        keep = offsets >= 0
        return tokens[keep], offsets[keep] // block_size, in_batch[keep] % block_size
    check(index.numel() == batch * seq_len, op, "%s: index must hold one offset per token (%d), got %s"
          % (cache_mode, batch * seq_len, tuple(index.shape)))
    offsets = index.detach().cpu().long().reshape(-1)
    keep = offsets >= 0
    return tokens[keep], offsets[keep] // block_size, offsets[keep] % block_size


def _kv_write(op, cache, rows, index, cache_mode, batch, seq_len, quant, name):
    """Writes ``rows`` [B, 1, S, D] (already in the stored dtype) into ``cache`` in place."""
    dim = rows.size(-1)
    flat_rows = rows.reshape(batch * seq_len, dim)
    if cache_mode == "Norm":
        check(cache.dim() == 4 and cache.size(0) == batch and cache.size(1) == 1 and cache.size(3) == dim, op,
              "Norm: %s must be [batch, 1, cache_length, %d], got %s" % (name, dim, tuple(cache.shape)))
        check(tuple(index.shape) == (batch, seq_len), op, "Norm: index must be [batch, seq_len] = %s, got %s"
              % ((batch, seq_len), tuple(index.shape)))
        offsets = index.detach().cpu().long().reshape(-1)
        keep = offsets >= 0
        tokens = torch.arange(batch * seq_len)[keep]
        check(bool((offsets[keep] < cache.size(2)).all()), op, "Norm: index values must be < cache_length %d"
              % cache.size(2))
        b = (tokens // seq_len).to(cache.device)
        cache[b, 0, offsets[keep].to(cache.device)] = flat_rows[tokens.to(rows.device)]
        return
    check(cache.dim() == 4 and cache.size(2) == 1 and cache.size(3) == dim, op,
          "%s: %s must be [block_num, block_size, 1, %d], got %s" % (cache_mode, name, dim, tuple(cache.shape)))
    block_num, block_size = cache.size(0), cache.size(1)
    tokens, pages, in_page = _kv_cache_targets(op, index, cache_mode, batch, seq_len, block_size)
    check(bool((pages < block_num).all()), op, "%s: index points past block_num %d" % (cache_mode, block_num))
    tokens, pages, in_page = tokens.to(cache.device), pages.to(cache.device), in_page.to(cache.device)
    if cache_mode.endswith("NZ"):
        piece = _NZ_PIECE[quant]
        check(dim % piece == 0 and cache.is_contiguous(), op, "%s: %s's last dim must be a multiple of %d"
              % (cache_mode, name, piece))
        nz = cache.view(block_num, dim // piece, block_size, piece)   # each block stored as FRACTAL_NZ
        nz[pages, :, in_page, :] = flat_rows[tokens].reshape(-1, dim // piece, piece)
    else:
        cache[pages, in_page, 0] = flat_rows[tokens]


def _kv_rmsnorm_rope_cache(op, kv, gamma, cos, sin, index, k_cache, ckv_cache, k_rope_scale, c_kv_scale,
                           k_rope_offset, c_kv_offset, v, epsilon, cache_mode, cache_dtypes=(None, None)):
    """Updates the caches in place; returns (k_rope, c_kv) in kv's dtype."""
    if v is not None:
        raise NotImplementedError("%s: the v input (separate value tensor) is not emulated on the CPU-emulated NPU"
                                  % op)
    if k_rope_offset is not None or c_kv_offset is not None:
        raise NotImplementedError("%s: k_rope_offset / c_kv_offset (asymmetric cache quantisation) are not emulated "
                                  "on the CPU-emulated NPU" % op)
    if any(d is not None for d in cache_dtypes):
        raise NotImplementedError("%s: k_cache_dtype / ckv_cache_dtype are not emulated on the CPU-emulated NPU" % op)
    check(cache_mode in _KV_CACHE_MODES, op, "cache_mode must be one of %s, got %r" % (_KV_CACHE_MODES, cache_mode))
    check(kv.dim() == 4 and gamma.dim() == 1 and cos.dim() == 4, op, "kv and cos must be 4-D, gamma 1-D")
    check((k_rope_scale is None) == (c_kv_scale is None), op, "k_rope_scale and c_kv_scale must be given together")
    quant = k_rope_scale is not None
    if quant:
        check(k_cache.dtype == torch.int8 and ckv_cache.dtype == torch.int8, op,
              "quantised caches (k_rope_scale given) must be int8")
    k_embed, y = _kv_rmsnorm_rope(op, kv, gamma, cos, sin, epsilon)
    batch, _, seq_len, _ = kv.shape
    _kv_write(op, k_cache, _kv_cache_rows(k_embed, k_cache, k_rope_scale), index, cache_mode, batch, seq_len, quant,
              "k_cache")
    _kv_write(op, ckv_cache, _kv_cache_rows(y, ckv_cache, c_kv_scale), index, cache_mode, batch, seq_len, quant,
              "ckv_cache")
    return k_embed.to(kv.dtype), y.to(kv.dtype)


def _kv_fake_outputs(kv, gamma, cos):
    lead = list(kv.shape[:3])
    return kv.new_empty(lead + [cos.size(3)]), kv.new_empty(lead + [gamma.size(0)])


@impl("npu_kv_rmsnorm_rope_cache")
def npu_kv_rmsnorm_rope_cache(kv, gamma, cos, sin, index, k_cache, ckv_cache, *, k_rope_scale=None, c_kv_scale=None,
                              k_rope_offset=None, c_kv_offset=None, v=None, epsilon=1e-5, cache_mode="Norm",
                              is_output_kv=False):
    """MLA kv branch (KvRmsNormRopeCache): ``kv`` [B, 1, S, 512+64] splits into the RMSNorm part
    (``y = x / sqrt(mean(x^2) + epsilon) * gamma``) and the RoPE part (de-interleaved, then
    ``k*cos + rotate_half(k)*sin``); ``y`` goes to ``ckv_cache``, the rotated k to ``k_cache``
    (int8 ``round(v * scale)`` with ``k_rope_scale`` / ``c_kv_scale``), at the positions of
    ``index`` per ``cache_mode`` (see docs/ops-cache-misc-r8.md); negative offsets are skipped.
    The caches are updated in place and returned (as the real op); then k_rope, c_kv in kv's
    dtype. With ``is_output_kv=False`` the real kernel leaves k_rope / c_kv unwritten; the
    computed values are returned here.

    This schema (as the real one) does not declare that it writes the caches, so it is not an
    opaque op itself: under torch.compile an unannotated write is invisible (the call was
    dead-code eliminated when its outputs were unused, reads of the caches could be reordered
    across it). It delegates to ``npu_kv_rmsnorm_rope_cache_v2``, whose schema marks the caches
    ``(a!)``: eager writes in place, compiled graphs functionalize the write and copy it back."""
    k_rope, c_kv = torch.ops.npu.npu_kv_rmsnorm_rope_cache_v2(
        kv, gamma, cos, sin, index, k_cache, ckv_cache, k_rope_scale=k_rope_scale, c_kv_scale=c_kv_scale,
        k_rope_offset=k_rope_offset, c_kv_offset=c_kv_offset, v=v, epsilon=epsilon, cache_mode=cache_mode,
        is_output_kv=is_output_kv)
    return k_cache, ckv_cache, k_rope, c_kv


def _kv_rmsnorm_rope_cache_v2_fake(kv, gamma, cos, sin, index, k_cache, ckv_cache, *, k_rope_scale=None,
                                   c_kv_scale=None, k_rope_offset=None, c_kv_offset=None, v=None, epsilon=1e-5,
                                   cache_mode="Norm", is_output_kv=False, k_cache_dtype=None, ckv_cache_dtype=None):
    return _kv_fake_outputs(kv, gamma, cos)


@opaque("npu_kv_rmsnorm_rope_cache_v2", _kv_rmsnorm_rope_cache_v2_fake)
def npu_kv_rmsnorm_rope_cache_v2(kv, gamma, cos, sin, index, k_cache, ckv_cache, *, k_rope_scale=None,
                                 c_kv_scale=None, k_rope_offset=None, c_kv_offset=None, v=None, epsilon=1e-5,
                                 cache_mode="Norm", is_output_kv=False, k_cache_dtype=None, ckv_cache_dtype=None):
    """:func:`npu_kv_rmsnorm_rope_cache` with the caches as in-place arguments: returns (k_rope, c_kv)."""
    return _kv_rmsnorm_rope_cache("npu_kv_rmsnorm_rope_cache_v2", kv, gamma, cos, sin, index, k_cache, ckv_cache,
                                  k_rope_scale, c_kv_scale, k_rope_offset, c_kv_offset, v, epsilon, cache_mode,
                                  (k_cache_dtype, ckv_cache_dtype))


def _kv_rmsnorm_rope_cache_v2_functional_fake(kv, gamma, cos, sin, index, k_cache, ckv_cache, *, k_rope_scale=None,
                                              c_kv_scale=None, k_rope_offset=None, c_kv_offset=None, v=None,
                                              epsilon=1e-5, cache_mode="Norm", is_output_kv=False,
                                              k_cache_dtype=None, ckv_cache_dtype=None):
    return _kv_fake_outputs(kv, gamma, cos) + (torch.empty_like(k_cache), torch.empty_like(ckv_cache))


@opaque("npu_kv_rmsnorm_rope_cache_v2_functional", _kv_rmsnorm_rope_cache_v2_functional_fake)
def npu_kv_rmsnorm_rope_cache_v2_functional(kv, gamma, cos, sin, index, k_cache, ckv_cache, *, k_rope_scale=None,
                                            c_kv_scale=None, k_rope_offset=None, c_kv_offset=None, v=None,
                                            epsilon=1e-5, cache_mode="Norm", is_output_kv=False, k_cache_dtype=None,
                                            ckv_cache_dtype=None):
    """Out-of-place v2: (k_rope, c_kv, updated copy of k_cache, updated copy of ckv_cache)."""
    k_out, ckv_out = k_cache.clone(), ckv_cache.clone()
    k_rope, c_kv = _kv_rmsnorm_rope_cache("npu_kv_rmsnorm_rope_cache_v2_functional", kv, gamma, cos, sin, index,
                                          k_out, ckv_out, k_rope_scale, c_kv_scale, k_rope_offset, c_kv_offset, v,
                                          epsilon, cache_mode, (k_cache_dtype, ckv_cache_dtype))
    return k_rope, c_kv, k_out, ckv_out
