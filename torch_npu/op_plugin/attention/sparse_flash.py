"""npu_sparse_flash_attention: attention over the keys a selector (npu_lightning_indexer)
picked, ``softmax(scale * Q K~^T) V~``.

Per batch b, key head n2 and valid query row i, ``sparse_indices[b, i, n2, :]`` lists
block ids up to the first -1; block id s covers key positions
``[s * sparse_block_size, min((s+1) * sparse_block_size, S2_act))``, concatenated in the
listed order. With ``query_rope``/``key_rope`` (MLA absorb, ``attention_mode`` 2) the
logits use ``[q, q_rope] . [k, k_rope]``; values are ``value`` (or ``key`` when value is
None: they share storage in that mode). ``sparse_mode`` 3 masks positions
``>= S2_act - S1_act + i + 1`` with -1e12 (as the op-plugin golden: a row whose selected
keys are all masked averages them); 0 masks nothing. ``sinks`` [N1] join each head's
softmax denominator (``exp(sink - max)``, max taken over logits and sink). Rows with no
selected key and rows past ``actual_seq_lengths_query`` output zeros.

``return_softmax_lse=True`` also returns float32 softmax_max / softmax_sum
[B, N2, S1, N1/N2] ([N2, T1, N1/N2] for TND) of the scaled, masked logits; else both are
empty tensors. Computed in float32 (float64 stays float64). pre/next_tokens take only their
documented default.

Registered opaque (lengths and block tables are read on the host): one node under
torch.compile; gradients come from recomputing the kernel in the backward (``_opaque_vjp``).

npu_sparse_flash_attention_grad, the op the real backward calls, rebuilds ``p`` from the given
``softmax_max`` / ``softmax_sum`` (as the kernel does; sinks of the forward are therefore
included) and, with ``delta = sum(d_out * out)``, returns

    ds      = p (d_out . v - delta), zero at the -1e12 / dropped positions (constants)
    d_query = scale ds . k,   d_key[pos] += scale ds^T q,   d_value[pos] += p^T d_out

split into (d_query, d_key, d_value, d_query_rope, d_key_rope) (rope gradients are empty [0]
without ropes), each in its input's dtype (computed in float32, float64 stays float64).
Layouts BSND and TND (cumulative lengths) for query and keys alike, lengths read on the host,
so it is registered opaque too (fake kernel for the shapes, no backward of its own).
"""
import torch

from torch_npu.op_plugin._common import check
from torch_npu.op_plugin._opaque_vjp import non_differentiable, recompute_autograd
from torch_npu.op_plugin._registry import opaque
from torch_npu.op_plugin.attention.sparse_layout import KeyRows, QueryRows

__all__ = []

_MAX = 9223372036854775807
_MASKED = -1e12


def _positions(indices, block, s2, device):
    """indices [S1, K] block ids (-1 ends a row) -> (pos [S1, K*block] long, valid bool)."""
    s1, kcount = indices.shape
    ended = (indices < 0).long().cumsum(-1) > 0
    base = indices.long().clamp(min=0) * block
    pos = (base.unsqueeze(-1) + torch.arange(block, device=device)).reshape(s1, kcount * block)
    valid = (~ended).unsqueeze(-1).expand(s1, kcount, block).reshape(s1, kcount * block) & (pos < s2)
    return pos.clamp(max=max(s2 - 1, 0)), valid


def sparse_attention_rows(q, k, v, indices, scale, block, sparse_mode, s1_act, s2_act, sinks, cdt):
    """q [S1, N1, Dq], k [S2, N2, Dq], v [S2, N2, Dv], indices [S1, N2, K].
    Returns (out [S1, N1, Dv], max [N2, S1, g], sum [N2, S1, g])."""
    s1, n1, _ = q.shape
    n2, dv = k.shape[1], v.shape[2]
    g = n1 // n2
    outs, maxes, sums = [], [], []
    for h in range(n2):
        pos, valid = _positions(indices[:, h], block, s2_act, q.device)  # [S1, L]
        kk = k[:, h].to(cdt)[pos]  # [S1, L, Dq]
        vv = v[:, h].to(cdt)[pos]
        qq = q[:, h * g:(h + 1) * g].to(cdt)  # [S1, g, Dq]
        logits = torch.einsum("sgd,sld->sgl", qq, kk) * scale
        if sparse_mode == 3:
            limit = s2_act - s1_act + torch.arange(s1, device=q.device).unsqueeze(1) + 1
            logits = logits.masked_fill((pos >= limit).unsqueeze(1), _MASKED)
        logits = logits.masked_fill(~valid.unsqueeze(1), float("-inf"))
        row_max = logits.amax(-1)  # [S1, g]
        if sinks is not None:
            sink = sinks[h * g:(h + 1) * g].to(cdt).unsqueeze(0)
            row_max = torch.maximum(row_max, sink)
        dead = torch.isneginf(row_max)
        safe = torch.where(dead, torch.zeros_like(row_max), row_max)
        e = torch.exp(logits - safe.unsqueeze(-1))
        total = e.sum(-1)
        if sinks is not None:
            total = total + torch.exp(sink - safe)
        p = e / torch.where(dead, torch.ones_like(total), total).unsqueeze(-1)
        outs.append(torch.einsum("sgl,sld->sgd", p, vv))
        maxes.append(row_max)
        sums.append(total)
    return torch.cat(outs, 1), torch.stack(maxes), torch.stack(sums)


def _output_shapes(query, key, value, sparse_block_size, layout_query, sparse_mode, pre_tokens, next_tokens,
                   query_rope, key_rope):
    """The checks that need no tensor values; returns (attention_out shape, softmax stats shape)."""
    op = "npu_sparse_flash_attention"
    check(sparse_mode in (0, 3), op, "sparse_mode must be 0 or 3, got %d", sparse_mode)
    check(pre_tokens == _MAX and next_tokens == _MAX, op, "pre_tokens/next_tokens only support 2^63-1")
    check(sparse_block_size >= 1, op, "sparse_block_size must be >= 1, got %d", sparse_block_size)
    check((query_rope is None) == (key_rope is None), op, "query_rope and key_rope go together")
    val = key if value is None else value
    n1, n2 = query.shape[-2], key.shape[-2]
    check(n1 % n2 == 0, op, "query heads %d are not a multiple of key heads %d", (n1, n2))
    check(query.shape[-1] == key.shape[-1], op, "query and key head dims differ")
    out_shape = tuple(query.shape[:-1]) + (val.shape[-1],)
    stat_shape = ((query.shape[0], n2, query.shape[1], n1 // n2) if layout_query == "BSND"
                  else (n2, query.shape[0], n1 // n2))
    return out_shape, stat_shape


def _sparse_flash_attention_fake(query, key, value, sparse_indices, scale_value, *, block_table=None,
                                 actual_seq_lengths_query=None, actual_seq_lengths_kv=None, query_rope=None,
                                 key_rope=None, sparse_block_size=1, layout_query="BSND", layout_kv="BSND",
                                 sparse_mode=3, pre_tokens=_MAX, next_tokens=_MAX, attention_mode=0,
                                 return_softmax_lse=False, sinks=None):
    out_shape, stat_shape = _output_shapes(query, key, value, sparse_block_size, layout_query, sparse_mode,
                                           pre_tokens, next_tokens, query_rope, key_rope)
    stat = stat_shape if return_softmax_lse else (0,)
    return (query.new_empty(out_shape), query.new_empty(stat, dtype=torch.float32),
            query.new_empty(stat, dtype=torch.float32))


# opaque: the lengths and paged block tables are read on the host; autograd recomputes this
# kernel (its ATen math) in the backward
@opaque("npu_sparse_flash_attention", fake=_sparse_flash_attention_fake)
def npu_sparse_flash_attention(query, key, value, sparse_indices, scale_value, *, block_table=None,
                               actual_seq_lengths_query=None, actual_seq_lengths_kv=None, query_rope=None,
                               key_rope=None, sparse_block_size=1, layout_query="BSND", layout_kv="BSND",
                               sparse_mode=3, pre_tokens=_MAX, next_tokens=_MAX, attention_mode=0,
                               return_softmax_lse=False, sinks=None):
    """Sparse attention over the key blocks in ``sparse_indices`` (see the module docstring).
    Returns (attention_out in the query's layout and dtype with value's head dim,
    softmax_max, softmax_sum)."""
    op = "npu_sparse_flash_attention"
    out_shape, _ = _output_shapes(query, key, value, sparse_block_size, layout_query, sparse_mode, pre_tokens,
                                  next_tokens, query_rope, key_rope)
    val = key if value is None else value
    n1, n2 = query.shape[-2], key.shape[-2]
    cdt = torch.float64 if query.dtype == torch.float64 else torch.float32
    rows = QueryRows(op, query, layout_query, actual_seq_lengths_query)
    keys = KeyRows(op, key, layout_kv, actual_seq_lengths_kv, block_table, rows.batch)
    q_all = rows.flat(query if query_rope is None else torch.cat([query, query_rope], -1))
    k_all = key if key_rope is None else torch.cat([key, key_rope], -1)
    idx_all = rows.flat(sparse_indices)
    out = query.new_zeros((q_all.shape[0], n1, val.shape[-1]), dtype=cdt)
    smax = torch.zeros((n2, q_all.shape[0], n1 // n2), dtype=torch.float32, device=query.device)
    ssum = torch.zeros_like(smax)
    for b in range(rows.batch):
        s1, start = rows.lengths[b], rows.starts[b]
        if s1 == 0:
            continue
        k, v = keys.keys(k_all, b), keys.keys(val, b)
        o, m, s = sparse_attention_rows(q_all[start:start + s1], k, v, idx_all[start:start + s1], scale_value,
                                        sparse_block_size, sparse_mode, s1, k.shape[0], sinks, cdt)
        out = out.index_copy(0, torch.arange(start, start + s1, device=query.device), o)
        smax[:, start:start + s1] = m.float()
        ssum[:, start:start + s1] = s.float()
    out = out.to(query.dtype).reshape(out_shape)
    if not return_softmax_lse:
        empty = query.new_empty((0,), dtype=torch.float32)
        return out, empty, empty.clone()
    if layout_query == "BSND":
        b_, s_ = query.shape[0], query.shape[1]
        smax = smax.reshape(n2, b_, s_, n1 // n2).transpose(0, 1).contiguous()
        ssum = ssum.reshape(n2, b_, s_, n1 // n2).transpose(0, 1).contiguous()
    return out, smax, ssum


recompute_autograd("npu_sparse_flash_attention", npu_sparse_flash_attention)


def _check(op, query, key, value, query_rope, key_rope, sparse_block_size, layout, sparse_mode, pre_tokens,
           next_tokens, attention_mode):
    for name, t in (("query", query), ("key", key), ("value", value), ("query_rope", query_rope),
                    ("key_rope", key_rope)):
        if t is not None:
            check(t.dim() in (3, 4), op, "The shapes of the input %s should be 3 or 4 dimensional, but got %d-"
                  "dimensional", (name, t.dim()))
    check(value is not None, op, "value is required")
    check(layout in ("BSND", "TND"), op, "layout must be BSND or TND, got %r", (layout,))
    check(sparse_mode in (0, 3), op, "sparse_mode must be 0 or 3, got %s", sparse_mode)
    check(attention_mode in (0, 2), op, "attention_mode must be 0 or 2, got %s", attention_mode)
    check(sparse_block_size >= 1, op, "sparse_block_size must be >= 1, got %d", sparse_block_size)
    check((query_rope is None) == (key_rope is None), op, "query_rope and key_rope go together")
    if pre_tokens != _MAX or next_tokens != _MAX:
        raise NotImplementedError("%s: only the default pre_tokens/next_tokens are emulated" % op)
    check(query.shape[-2] % key.shape[-2] == 0, op, "query heads must be a multiple of key heads")
    check(query.shape[-1] == key.shape[-1], op, "query and key head dims differ")


def _sparse_flash_attention_grad_fake(query, key, value, sparse_indices, d_out, out, softmax_max, softmax_sum,
                                      scale_value, sparse_block_size, query_rope=None, key_rope=None,
                                      actual_seq_qlen=None, actual_seq_kvlen=None, layout="BSND", sparse_mode=3,
                                      pre_tokens=_MAX, next_tokens=_MAX, attention_mode=0):
    _check("npu_sparse_flash_attention_grad", query, key, value, query_rope, key_rope, sparse_block_size, layout,
           sparse_mode, pre_tokens, next_tokens, attention_mode)
    d_query_rope = query.new_empty([0]) if query_rope is None else torch.empty_like(query_rope)
    d_key_rope = key.new_empty([0]) if key_rope is None else torch.empty_like(key_rope)
    return torch.empty_like(query), torch.empty_like(key), torch.empty_like(value), d_query_rope, d_key_rope


@opaque("npu_sparse_flash_attention_grad", fake=_sparse_flash_attention_grad_fake)
def npu_sparse_flash_attention_grad(query, key, value, sparse_indices, d_out, out, softmax_max, softmax_sum,
                                    scale_value, sparse_block_size, query_rope=None, key_rope=None,
                                    actual_seq_qlen=None, actual_seq_kvlen=None, layout="BSND", sparse_mode=3,
                                    pre_tokens=_MAX, next_tokens=_MAX, attention_mode=0):
    op = "npu_sparse_flash_attention_grad"
    _check(op, query, key, value, query_rope, key_rope, sparse_block_size, layout, sparse_mode, pre_tokens,
           next_tokens, attention_mode)
    n1, n2 = query.shape[-2], key.shape[-2]
    grp = n1 // n2
    cdt = torch.float64 if query.dtype == torch.float64 else torch.float32
    rows = QueryRows(op, query, layout, actual_seq_qlen)
    keys = KeyRows(op, key, layout, actual_seq_kvlen, None, rows.batch)
    stat_shape = (query.shape[0], n2, query.shape[1], grp) if layout == "BSND" else (n2, query.shape[0], grp)
    check(tuple(softmax_max.shape) == stat_shape and tuple(softmax_sum.shape) == stat_shape, op,
          "softmax_max / softmax_sum must be %s", (stat_shape,))
    out_shape = tuple(query.shape[:-1]) + (value.shape[-1],)
    check(tuple(d_out.shape) == out_shape and tuple(out.shape) == out_shape, op,
          "d_out / out must be %s", (out_shape,))
    q_cat = query if query_rope is None else torch.cat([query, query_rope], -1)
    k_cat = key if key_rope is None else torch.cat([key, key_rope], -1)
    q_all = rows.flat(q_cat).to(cdt)                                  # [R, N1, Dq]
    idx_all = rows.flat(sparse_indices)
    do_all, o_all = rows.flat(d_out).to(cdt), rows.flat(out).to(cdt)
    if layout == "BSND":                                              # -> [N2, R, G]
        smax = softmax_max.transpose(0, 1).reshape(n2, -1, grp).to(cdt)
        ssum = softmax_sum.transpose(0, 1).reshape(n2, -1, grp).to(cdt)
        key_base = [b * key.shape[1] for b in range(rows.batch)]
    else:
        smax, ssum = softmax_max.to(cdt), softmax_sum.to(cdt)
        key_base = keys.starts
    k_flat = (k_cat.flatten(0, 1) if layout == "BSND" else k_cat).to(cdt)   # [rows_k, N2, Dq]
    v_flat = (value.flatten(0, 1) if layout == "BSND" else value).to(cdt)
    masked_value = float(torch.tensor(_MASKED, dtype=softmax_max.dtype))
    dq_all = torch.zeros_like(q_all)
    dk_flat, dv_flat = torch.zeros_like(k_flat), torch.zeros_like(v_flat)
    for b in range(rows.batch):
        s1, start, s2 = rows.lengths[b], rows.starts[b], keys.lengths[b]
        if s1 == 0:
            continue
        for h in range(n2):
            pos, kept = _positions(idx_all[start:start + s1, h], sparse_block_size, s2, query.device)
            krow = key_base[b] + pos                                  # rows of k_flat / v_flat
            kk, vv = k_flat[krow, h], v_flat[krow, h]                 # [S1, L, D]
            heads = slice(h * grp, (h + 1) * grp)
            qq = q_all[start:start + s1, heads]                       # [S1, G, Dq]
            logits = torch.einsum("sgd,sld->sgl", qq, kk) * scale_value
            constant = ~kept
            if sparse_mode == 3:
                limit = s2 - s1 + torch.arange(s1, device=query.device).unsqueeze(1) + 1
                late = pos >= limit
                # the forward's -1e12 as the stored statistics hold it (float32), so exp(x - max) matches
                logits = logits.masked_fill(late.unsqueeze(1), masked_value)
                constant = constant | late
            logits = logits.masked_fill((~kept).unsqueeze(1), float("-inf"))
            m, total = smax[h, start:start + s1], ssum[h, start:start + s1]     # [S1, G]
            dead = torch.isneginf(m) | (total == 0)
            p = torch.exp(logits - torch.where(dead, torch.zeros_like(m), m).unsqueeze(-1))
            p = p / torch.where(dead, torch.ones_like(total), total).unsqueeze(-1)
            p = p.masked_fill(dead.unsqueeze(-1), 0.0)
            do, o = do_all[start:start + s1, heads], o_all[start:start + s1, heads]
            dp = torch.einsum("sgd,sld->sgl", do, vv)
            ds = (p * (dp - (do * o).sum(-1, keepdim=True))).masked_fill(constant.unsqueeze(1), 0.0)
            dq_all[start:start + s1, heads] = torch.einsum("sgl,sld->sgd", ds, kk) * scale_value
            dk_part = torch.einsum("sgl,sgd->sld", ds, qq) * scale_value
            dv_part = torch.einsum("sgl,sgd->sld", p, do)
            flat_rows = krow.reshape(-1)
            dk_flat[:, h] = dk_flat[:, h].index_add(0, flat_rows, dk_part.reshape(-1, dk_part.shape[-1]))
            dv_flat[:, h] = dv_flat[:, h].index_add(0, flat_rows, dv_part.reshape(-1, dv_part.shape[-1]))
    d = query.shape[-1]
    dq = dq_all.reshape(q_cat.shape)
    dk = dk_flat.reshape(k_cat.shape)
    dv = dv_flat.reshape(value.shape)
    d_query_rope = query.new_empty([0]) if query_rope is None else dq[..., d:].to(query_rope.dtype)
    d_key_rope = key.new_empty([0]) if key_rope is None else dk[..., d:].to(key_rope.dtype)
    return (dq[..., :d].to(query.dtype).contiguous(), dk[..., :d].to(key.dtype).contiguous(), dv.to(value.dtype),
            d_query_rope.contiguous(), d_key_rope.contiguous())


non_differentiable("npu_sparse_flash_attention_grad")
