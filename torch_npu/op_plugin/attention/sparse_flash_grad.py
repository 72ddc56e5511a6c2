"""npu_sparse_flash_attention_grad: the gradients of npu_sparse_flash_attention.

The forward (attention_r4_sparse.py, from the op-plugin docs and golden) attends, per batch b,
key head n2 and valid query row i, to the key positions of the blocks listed in
``sparse_indices[.., i, n2, :]`` (up to the first -1; positions past the batch's key length
are dropped) with ``p = softmax(scale * [q, q_rope] . [k, k_rope])`` (sparse_mode 3 fills
positions after the row's right-down causal limit with -1e12) and ``out = p v``.

This op rebuilds ``p`` from the given ``softmax_max`` / ``softmax_sum`` (as the kernel does;
sinks of the forward are therefore included) and, with ``delta = sum(d_out * out)``, returns

    ds      = p (d_out . v - delta), zero at the -1e12 / dropped positions (constants)
    d_query = scale ds . k,   d_key[pos] += scale ds^T q,   d_value[pos] += p^T d_out

split into (d_query, d_key, d_value, d_query_rope, d_key_rope) (rope gradients are empty [0]
without ropes), each in its input's dtype (computed in float32, float64 stays float64).
Layouts BSND and TND (cumulative lengths) for query and keys alike, lengths read on the host,
so the op is registered opaque (fake kernel for the shapes, no backward of its own).
"""
import torch

from torch_npu.op_plugin._common import check
from torch_npu.op_plugin._opaque_vjp import non_differentiable
from torch_npu.op_plugin._registry import opaque
from torch_npu.op_plugin.attention.sparse_layout import KeyRows, QueryRows

__all__ = []

_MAX = 9223372036854775807
_MASKED = -1e12


def _check(op, query, key, value, query_rope, key_rope, sparse_block_size, layout, sparse_mode, pre_tokens,
           next_tokens, attention_mode):
    for name, t in (("query", query), ("key", key), ("value", value), ("query_rope", query_rope),
                    ("key_rope", key_rope)):
        if t is not None:
            check(t.dim() in (3, 4), op, "The shapes of the input %s should be 3 or 4 dimensional, but got %d-"
                  "dimensional" % (name, t.dim()))
    check(value is not None, op, "value is required")
    check(layout in ("BSND", "TND"), op, "layout must be BSND or TND, got %r" % (layout,))
    check(sparse_mode in (0, 3), op, "sparse_mode must be 0 or 3, got %s" % sparse_mode)
    check(attention_mode in (0, 2), op, "attention_mode must be 0 or 2, got %s" % attention_mode)
    check(sparse_block_size >= 1, op, "sparse_block_size must be >= 1, got %d" % sparse_block_size)
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


def _positions(indices, block, s2, device):
    """indices [S1, K] block ids (-1 ends a row) -> (pos [S1, K*block], kept bool)."""
    s1, kcount = indices.shape
    ended = (indices < 0).long().cumsum(-1) > 0
    pos = (indices.long().clamp(min=0) * block).unsqueeze(-1) + torch.arange(block, device=device)
    pos = pos.reshape(s1, kcount * block)
    kept = (~ended).unsqueeze(-1).expand(s1, kcount, block).reshape(s1, kcount * block) & (pos < s2)
    return pos.clamp(max=max(s2 - 1, 0)), kept


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
          "softmax_max / softmax_sum must be %s" % (stat_shape,))
    out_shape = tuple(query.shape[:-1]) + (value.shape[-1],)
    check(tuple(d_out.shape) == out_shape and tuple(out.shape) == out_shape, op,
          "d_out / out must be %s" % (out_shape,))
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
