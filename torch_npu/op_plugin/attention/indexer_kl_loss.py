"""The lightning indexer's training step: KL loss between the main attention distribution and
the indexer distribution, fused with the indexer's gradients
(npu_dense_lightning_indexer_grad_kl_loss, npu_sparse_lightning_indexer_grad_kl_loss).

Per query token t (Ascend/op-plugin docs and the op-plugin / ops-transformer goldens):

    p_t   = (1/N1) * sum_h exp(scale * [q;q_rope]_h . [k;k_rope]_j - softmax_max[h]) / softmax_sum[h]
    I_t   = sum_h' w_h' * ReLU(q_index_h' . k_index_j)
    s_t   = Softmax(I_t)      dense: exp(I - softmax_max_index) / softmax_sum_index (given stats)
                              sparse: a softmax over the selected keys, computed here
    loss  = sum_t sum_j p * (log max(p, 1e-8) - log max(s, 1e-8))        (shape [1])
    dI    = s - p
    dW    = dI @ ReLU(S)^T,  dS = dI * w * 1[S > 0],  dq_index = dS @ K_index,  dK_index = dS^T @ q_index

Query head h reads key head h // (N1/N2); the stats are laid out (B, N2, S1, G) / (N2, T1, G)
with h = n2 * G + g. Keys j of the dense op are every key of the batch that sparse_mode 3
(right-down causal: j <= t + S2 - S1) keeps; the sparse op uses the slots of sparse_indices
[.., N2index=1, topK] whose index is >= 0, < S2 and causal (other slots, e.g. the -1
padding, take no part; a key chosen twice counts twice). Computed in float32 (float64 for
float64 inputs); dS is rounded to the input dtype before its two matmuls, as in the golden.

No data-dependent host reads (the lengths are host ints in the schema, the indices are masked
on the device), so FakeTensor / meta / torch.compile trace the real computation: there is no
shape-only shortcut that a compiled graph could bake in.
"""
import torch

from torch_npu.op_plugin._common import check, stat_dtype
from torch_npu.op_plugin._registry import impl

__all__ = []

_MAX = 9223372036854775807
_CLIP = 1e-8
_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
# Sparse path: rows of gathered keys handled at once (bounds the [rows, topK, D] gather).
_GATHER_BUDGET = 1 << 24


def _full_lengths_only(op, name, lengths, batch, seq):
    """BSND: the docs only define actual_seq_* for TND; full lengths (per batch or cumulative) are accepted."""
    if lengths is None:
        return
    lengths = [int(x) for x in lengths]
    if lengths not in ([seq] * batch, [seq * (i + 1) for i in range(batch)]):
        raise NotImplementedError("%s: %s=%s with layout BSND (other than the full lengths) is not emulated: "
                                  "the docs define it for TND only" % (op, name, lengths))


def _cumulative(op, name, lengths, total):
    check(lengths is not None, op, "%s is required for layout TND", name)
    lengths = [int(x) for x in lengths]
    check(len(lengths) >= 1 and lengths[0] >= 0 and all(a <= b for a, b in zip(lengths, lengths[1:])), op,
          "%s must hold non-decreasing cumulative lengths, got %s", (name, lengths))
    check(lengths[-1] == total, op, "%s must end at T=%d, got %d", (name, total, lengths[-1]))
    return [0] + lengths[:-1], [b - a for a, b in zip([0] + lengths[:-1], lengths)]


def _segments(op, layout, query, key, actual_seq_qlen, actual_seq_klen):
    """[(query row start, S1, key row start, S2)] per batch, over rows flattened to [T, N, D]."""
    if layout == "BSND":
        check(query.dim() == 4 and key.dim() == 4, op, "query and key must be 4-D for layout BSND, got %d-D and %d-D", (query.dim(), key.dim()))
        b, s1, s2 = query.shape[0], query.shape[1], key.shape[1]
        check(key.shape[0] == b, op, "key batch %d differs from the query's %d", (key.shape[0], b))
        _full_lengths_only(op, "actual_seq_qlen", actual_seq_qlen, b, s1)
        _full_lengths_only(op, "actual_seq_klen", actual_seq_klen, b, s2)
        return [(i * s1, s1, i * s2, s2) for i in range(b)]
    if layout == "TND":
        check(query.dim() == 3 and key.dim() == 3, op, "query and key must be 3-D for layout TND, got %d-D and %d-D", (query.dim(), key.dim()))
        qs, ql = _cumulative(op, "actual_seq_qlen", actual_seq_qlen, query.shape[0])
        ks, kl = _cumulative(op, "actual_seq_klen", actual_seq_klen, key.shape[0])
        check(len(ql) == len(kl), op, "actual_seq_qlen and actual_seq_klen give %d and %d batches", (len(ql), len(kl)))
        return list(zip(qs, ql, ks, kl))
    raise NotImplementedError("%s: layout %r is not emulated (supported: BSND, TND)" % (op, layout))


def _check_common(op, query, key, query_index, key_index, weights, query_rope, key_rope, layout, sparse_mode,
                  pre_tokens, next_tokens):
    check(sparse_mode == 3, op, "only sparse_mode 3 is supported, got %s", sparse_mode)
    check(query.dim() in (3, 4), op, "query must be 3-D or 4-D, got %d-D", query.dim())
    for name, t in (("key", key), ("query_index", query_index), ("key_index", key_index)):
        check(t.dim() == query.dim(), op, "%s must have query's rank %d, got %d-D", (name, query.dim(), t.dim()))
    check(query.dtype in _FLOATS, op, "query dtype %s is not supported", query.dtype)
    for name, t in (("key", key), ("query_index", query_index), ("key_index", key_index)):
        check(t.dtype == query.dtype, op, "%s dtype %s must equal query's %s", (name, t.dtype, query.dtype))
    check(weights.dtype in (query.dtype, torch.float32), op,
          "weights dtype %s must be query's %s or float32", (weights.dtype, query.dtype))
    check((query_rope is None) == (key_rope is None), op, "query_rope and key_rope must be given together")
    n1, n2 = query.shape[-2], key.shape[-2]
    check(key.shape[-1] == query.shape[-1], op, "key head dim %d differs from the query's %d", (key.shape[-1], query.shape[-1]))
    check(n1 % n2 == 0, op, "query heads %d are not a multiple of key heads %d", (n1, n2))
    check(key_index.shape[-2] == 1, op, "key_index heads (N2index) must be 1, got %d", key_index.shape[-2])
    check(key_index.shape[-1] == query_index.shape[-1], op, "key_index head dim %d differs from query_index's %d", (key_index.shape[-1], query_index.shape[-1]))
    check(tuple(query_index.shape[:-2]) == tuple(query.shape[:-2]), op,
          "query_index leading dims %s differ from query's %s", (tuple(query_index.shape[:-2]),
                                                                   tuple(query.shape[:-2])))
    check(tuple(key_index.shape[:-2]) == tuple(key.shape[:-2]), op,
          "key_index leading dims %s differ from key's %s", (tuple(key_index.shape[:-2]), tuple(key.shape[:-2])))
    check(tuple(weights.shape) == tuple(query_index.shape[:-1]), op, "weights shape %s must be query_index's "
          "without D %s", (tuple(weights.shape), tuple(query_index.shape[:-1])))
    if query_rope is not None:
        check(query_rope.dtype == query.dtype and key_rope.dtype == query.dtype, op,
              "query_rope/key_rope dtype must equal query's %s", query.dtype)
        check(tuple(query_rope.shape[:-1]) == tuple(query.shape[:-1]), op, "query_rope shape %s must match query's "
              "%s except D", (tuple(query_rope.shape), tuple(query.shape)))
        check(tuple(key_rope.shape[:-1]) == tuple(key.shape[:-1]), op, "key_rope shape %s must match key's %s "
              "except D", (tuple(key_rope.shape), tuple(key.shape)))
        check(query_rope.shape[-1] == key_rope.shape[-1], op, "query_rope and key_rope head dims differ")
    # Under sparse_mode 3 a window at least as long as every sequence cannot cut anything; what a
    # shorter one does with the causal mask is not documented.
    longest = max(query.shape[-3], key.shape[-3])
    if pre_tokens < longest or next_tokens < longest:
        raise NotImplementedError("%s: pre_tokens=%d / next_tokens=%d shorter than the sequences are not emulated "
                                  "(their effect with sparse_mode 3 is not documented)" % (op, pre_tokens, next_tokens))
    check(layout in ("BSND", "TND"), op, "layout must be BSND or TND, got %r", (layout,))


def _stat_rows(op, name, stat, layout, segments_q, shape_bsnd, shape_tnd):
    """Softmax statistics as [heads, total query rows] float (head order n2 * G + g)."""
    want = shape_bsnd if layout == "BSND" else shape_tnd
    check(tuple(stat.shape) == tuple(want), op, "%s must have shape %s, got %s", (name, tuple(want), tuple(stat.shape)))
    check(stat.dtype in (torch.float32, torch.float64), op, "%s must be float32, got %s", (name, stat.dtype))
    if layout == "BSND":
        stat = stat.movedim(0, -2) if stat.dim() == 3 else stat.permute(1, 3, 0, 2)   # -> [N2, (G,) B, S1]
    else:
        stat = stat.permute(0, 2, 1) if stat.dim() == 3 else stat                    # -> [N2, (G,) T1]
    return stat.reshape(-1, segments_q)


def _stats_softmax(x, masked, smax, ssum):
    """exp(x - max) / sum with the given statistics; masked entries are exactly 0."""
    m = torch.where(torch.isfinite(smax), smax, torch.zeros_like(smax)).unsqueeze(-1)
    s = torch.where(ssum > 0, ssum, torch.ones_like(ssum)).unsqueeze(-1)
    val = torch.exp(x.masked_fill(masked, 0) - m) / s
    return torch.where(masked, torch.zeros_like(val), val)


def _kl_terms(p, s):
    return p * (torch.log(p.clamp_min(_CLIP)) - torch.log(s.clamp_min(_CLIP)))


def _low(t, dtype):
    """dS rounded to the inputs' dtype (the golden casts it before the dq/dk matmuls)."""
    return t.to(dtype).to(t.dtype) if dtype in (torch.float16, torch.bfloat16) else t


def _with_rope(x, rope, cdt):
    x = x.to(cdt)
    return x if rope is None else torch.cat([x, rope.to(cdt)], dim=-1)


def _outputs(query, query_index, key_index, weights):
    loss = query.new_zeros([1], dtype=stat_dtype(query))
    return (torch.zeros_like(query_index, memory_format=torch.contiguous_format),
            torch.zeros_like(key_index, memory_format=torch.contiguous_format),
            torch.zeros_like(weights, memory_format=torch.contiguous_format), loss)


def _flat(x, layout):
    return x.flatten(0, 1) if layout == "BSND" else x


@impl("npu_dense_lightning_indexer_grad_kl_loss")
def npu_dense_lightning_indexer_grad_kl_loss(query, key, query_index, key_index, weights, softmax_max, softmax_sum,
                                             softmax_max_index, softmax_sum_index, scale_value, *, query_rope=None,
                                             key_rope=None, actual_seq_qlen=None, actual_seq_klen=None, layout="BSND",
                                             sparse_mode=3, pre_tokens=_MAX, next_tokens=_MAX):
    """(d_query_index, d_key_index, d_weights, loss[1]) of the KL loss between the main attention
    (given by softmax_max/softmax_sum, shape (B, N2, S1, G) / (N2, T1, G)) and the dense indexer
    distribution (softmax_max_index/softmax_sum_index from npu_dense_lightning_indexer_softmax_lse,
    shape (B, 1, S1) / (1, T1)); see the module docstring."""
    op = "npu_dense_lightning_indexer_grad_kl_loss"
    layout = "BSND" if layout is None else layout
    sparse_mode = 3 if sparse_mode is None else sparse_mode
    pre_tokens = _MAX if pre_tokens is None else pre_tokens
    next_tokens = _MAX if next_tokens is None else next_tokens
    _check_common(op, query, key, query_index, key_index, weights, query_rope, key_rope, layout, sparse_mode,
                  pre_tokens, next_tokens)
    segments = _segments(op, layout, query, key, actual_seq_qlen, actual_seq_klen)
    n1, n2 = query.shape[-2], key.shape[-2]
    rows = query.shape[0] * query.shape[1] if layout == "BSND" else query.shape[0]
    lead = tuple(query.shape[:-2])
    smax = _stat_rows(op, "softmax_max", softmax_max, layout, rows, lead[:1] + (n2,) + lead[1:] + (n1 // n2,),
                      (n2, rows, n1 // n2))
    ssum = _stat_rows(op, "softmax_sum", softmax_sum, layout, rows, tuple(softmax_max.shape), tuple(softmax_max.shape))
    imax = _stat_rows(op, "softmax_max_index", softmax_max_index, layout, rows, lead[:1] + (1,) + lead[1:], (1, rows))
    isum = _stat_rows(op, "softmax_sum_index", softmax_sum_index, layout, rows, tuple(softmax_max_index.shape),
                      tuple(softmax_max_index.shape))
    cdt = stat_dtype(query)
    qf, kf = _flat(query, layout), _flat(key, layout)
    qrf = None if query_rope is None else _flat(query_rope, layout)
    krf = None if key_rope is None else _flat(key_rope, layout)
    qif, kif, wf = _flat(query_index, layout).to(cdt), _flat(key_index, layout)[:, 0].to(cdt), _flat(weights, layout)
    d_qi, d_ki, d_w, loss = _outputs(query, query_index, key_index, weights)
    d_qi_f, d_ki_f, d_w_f = _flat(d_qi, layout), _flat(d_ki, layout), _flat(d_w, layout)
    total = loss.new_zeros([])
    g = n1 // n2
    for qs, s1, ks, s2 in segments:
        if s1 == 0:
            continue
        masked = torch.arange(s2, device=query.device).unsqueeze(0) > \
            (torch.arange(s1, device=query.device).unsqueeze(1) + (s2 - s1))                       # [s1, s2]
        q = _with_rope(qf[qs:qs + s1], None if qrf is None else qrf[qs:qs + s1], cdt)
        k = _with_rope(kf[ks:ks + s2], None if krf is None else krf[ks:ks + s2], cdt)
        scores = torch.einsum("sngd,tnd->ngst", q.reshape(s1, n2, g, -1), k).reshape(n1, s1, s2) * scale_value
        p = _stats_softmax(scores, masked, smax[:, qs:qs + s1], ssum[:, qs:qs + s1]).sum(0) / n1     # [s1, s2]
        qi, ki, w = qif[qs:qs + s1], kif[ks:ks + s2], wf[qs:qs + s1].to(cdt)
        relu = torch.relu(torch.einsum("snd,td->nst", qi, ki))                                      # [Ni, s1, s2]
        index_score = (relu * w.t().unsqueeze(-1)).sum(0)
        s = _stats_softmax(index_score, masked, imax[0, qs:qs + s1], isum[0, qs:qs + s1])
        total = total + _kl_terms(p, s).sum()
        d_index = s - p
        d_w_f[qs:qs + s1] = torch.einsum("st,nst->sn", d_index, relu).to(d_w.dtype)
        d_score = _low(d_index.unsqueeze(0) * w.t().unsqueeze(-1) * (relu > 0), query_index.dtype)
        d_qi_f[qs:qs + s1] = torch.einsum("nst,td->snd", d_score, ki).to(d_qi.dtype)
        d_ki_f[ks:ks + s2, 0] = torch.einsum("nst,snd->td", d_score, qi).to(d_ki.dtype)
    loss[0] = total
    return d_qi, d_ki, d_w, loss


@impl("npu_sparse_lightning_indexer_grad_kl_loss")
def npu_sparse_lightning_indexer_grad_kl_loss(query, key, query_index, key_index, weights, sparse_indices,
                                              softmax_max, softmax_sum, scale_value, *, query_rope=None, key_rope=None,
                                              actual_seq_qlen=None, actual_seq_klen=None, layout="BSND",
                                              sparse_mode=3, pre_tokens=_MAX, next_tokens=_MAX, sinks=None):
    """(d_query_index, d_key_index, d_weights, loss[1]) of the KL loss over the topK keys of
    sparse_indices (B, S1, 1, topK) / (T1, 1, topK); the indexer softmax is taken over the valid
    selected keys; see the module docstring. ``sinks`` raises NotImplementedError (the docs do
    not describe it)."""
    op = "npu_sparse_lightning_indexer_grad_kl_loss"
    if sinks is not None:
        raise NotImplementedError("%s: sinks is not emulated (its meaning is not documented)" % op)
    layout = "BSND" if layout is None else layout
    sparse_mode = 3 if sparse_mode is None else sparse_mode
    pre_tokens = _MAX if pre_tokens is None else pre_tokens
    next_tokens = _MAX if next_tokens is None else next_tokens
    _check_common(op, query, key, query_index, key_index, weights, query_rope, key_rope, layout, sparse_mode,
                  pre_tokens, next_tokens)
    check(sparse_indices.dtype in (torch.int32, torch.int64), op, "sparse_indices must be int32, got %s", sparse_indices.dtype)
    check(sparse_indices.dim() == query.dim() and tuple(sparse_indices.shape[:-2]) == tuple(query.shape[:-2])
          and sparse_indices.shape[-2] == 1, op, "sparse_indices must have shape %s, got %s", (tuple(query.shape[:-2]) + (1, "topK"), tuple(sparse_indices.shape)))
    segments = _segments(op, layout, query, key, actual_seq_qlen, actual_seq_klen)
    n1, n2 = query.shape[-2], key.shape[-2]
    g = n1 // n2
    rows = query.shape[0] * query.shape[1] if layout == "BSND" else query.shape[0]
    lead = tuple(query.shape[:-2])
    smax = _stat_rows(op, "softmax_max", softmax_max, layout, rows, lead[:1] + (n2,) + lead[1:] + (g,), (n2, rows, g))
    ssum = _stat_rows(op, "softmax_sum", softmax_sum, layout, rows, tuple(softmax_max.shape), tuple(softmax_max.shape))
    cdt = stat_dtype(query)
    top_k = sparse_indices.shape[-1]
    qf, kf = _flat(query, layout), _flat(key, layout)
    qrf = None if query_rope is None else _flat(query_rope, layout)
    krf = None if key_rope is None else _flat(key_rope, layout)
    qif, kif, wf = _flat(query_index, layout).to(cdt), _flat(key_index, layout)[:, 0].to(cdt), _flat(weights, layout)
    idx_f = _flat(sparse_indices, layout)[:, 0].long()                                              # [rows, topK]
    d_qi, d_ki, d_w, loss = _outputs(query, query_index, key_index, weights)
    d_qi_f, d_ki_f, d_w_f = _flat(d_qi, layout), _flat(d_ki, layout), _flat(d_w, layout)
    total = loss.new_zeros([])
    width = query.shape[-1] + (0 if query_rope is None else query_rope.shape[-1])
    chunk = max(1, _GATHER_BUDGET // max(1, top_k * n2 * width))
    for qs, s1, ks, s2 in segments:
        if s1 == 0:
            continue
        k_all = _with_rope(kf[ks:ks + s2], None if krf is None else krf[ks:ks + s2], cdt)            # [s2, N2, Dt]
        ki_all = kif[ks:ks + s2]
        d_key = torch.zeros_like(ki_all)
        for r0 in range(0, s1, chunk):
            r1 = min(s1, r0 + chunk)
            a, b = qs + r0, qs + r1
            idx = idx_f[a:b]
            limit = torch.arange(r0, r1, device=query.device).unsqueeze(1) + (s2 - s1)
            valid = (idx >= 0) & (idx < s2) & (idx <= limit)
            masked = ~valid
            safe = torch.where(valid, idx, torch.zeros_like(idx))                                    # [r, topK]
            q = _with_rope(qf[a:b], None if qrf is None else qrf[a:b], cdt)
            k_sel = k_all[safe]                                                                      # [r, topK, N2, Dt]
            scores = torch.einsum("sngd,sknd->ngsk", q.reshape(r1 - r0, n2, g, -1), k_sel)
            scores = scores.reshape(n1, r1 - r0, top_k) * scale_value
            p = _stats_softmax(scores, masked, smax[:, a:b], ssum[:, a:b]).sum(0) / n1               # [r, topK]
            qi, w = qif[a:b], wf[a:b].to(cdt)
            ki_sel = ki_all[safe]                                                                    # [r, topK, D]
            relu = torch.relu(torch.einsum("snd,skd->nsk", qi, ki_sel))
            index_score = (relu * w.t().unsqueeze(-1)).sum(0).masked_fill(masked, float("-inf"))
            row_max = index_score.amax(-1, keepdim=True)
            row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
            e = torch.exp(index_score - row_max)
            denom = e.sum(-1, keepdim=True)
            s = e / torch.where(denom > 0, denom, torch.ones_like(denom))
            total = total + _kl_terms(p, s).sum()
            d_index = s - p
            d_w_f[a:b] = torch.einsum("sk,nsk->sn", d_index, relu).to(d_w.dtype)
            d_score = _low(d_index.unsqueeze(0) * w.t().unsqueeze(-1) * (relu > 0), query_index.dtype)
            d_qi_f[a:b] = torch.einsum("nsk,skd->snd", d_score, ki_sel).to(d_qi.dtype)
            contrib = torch.einsum("nsk,snd->skd", d_score, qi)                                      # 0 on masked slots
            d_key = d_key.index_add(0, safe.reshape(-1), contrib.reshape(-1, contrib.shape[-1]))
        d_ki_f[ks:ks + s2, 0] = d_key.to(d_ki.dtype)
    loss[0] = total
    return d_qi, d_ki, d_w, loss
