"""npu_lightning_indexer (DeepSeek sparse attention's top-k key selection) and the softmax
statistics of its dense score (npu_dense_lightning_indexer_softmax_lse).

Documented formula, per query token and key head n2 (query heads ``n2*g .. n2*g+g-1``):

    score[j] = sum_h  w[h] * ReLU(q[h] . k[j])        (no scale)
    sparse_indices = Top-sparse_count positions j of score

over the valid keys of the batch (``actual_seq_lengths_key``); ``sparse_mode`` 3 (default)
also masks j > i + S2_act - S1_act (right-down causal, as the op-plugin golden), 0 masks
nothing more. Indices are sorted by descending score (ties: lower position first, the
kernel's tie order is not documented); slots past the valid keys hold -1, as do rows past
``actual_seq_lengths_query``. Computed in float32 (float64 stays float64).

``return_value=True`` raises NotImplementedError: the docs give sparse_values an int32
dtype for a float score, so what it holds is not established; with False the second output
is an empty tensor. ``pre_tokens``/``next_tokens`` only take their default (as documented).

Both ops are registered opaque (``_registry.opaque``): the selection depends on the scores'
values and lengths / block tables are read on the host, so under torch.compile each stays one
graph node running its kernel; the fake kernels give the shapes after the value-free checks.

npu_lightning_indexer_grad: for ``dy``, the gradient of the loss w.r.t. the scores of the
selected keys (same shape as sparse_indices), the gradients of
``sum_t dy[t] * score[sparse_indices[t]]`` (the op-plugin golden):

    r[h, t]    = q[h] . k[j_t]
    d_query[h] = sum_t [r > 0] w[h] dy[t] k[j_t]
    d_key[j_t] += sum_h [r > 0] w[h] dy[t] q[h]             (keys selected twice accumulate)
    d_weights[h] = sum_t ReLU(r[h, t]) dy[t]

Slots whose index is negative (the forward's -1 padding) contribute nothing. Layouts: BSND
(query [B,S1,N1,D], key [B,S2,N2,D], weights [B,S1,N1], indices/dy [B,S1,N2,K], or [B,S1,K]
when N2 = 1) and TND (query [T1,N1,D], key [T2,N2,D], weights [T1,N1], indices/dy [T1,N2,K] or
[T1,K], indices relative to the token's batch, cumulative ``actual_seq_lengths_query`` /
``_key`` tensors read on the host). Computed in float32 (float64 stays float64); the
gradients come back in query's / key's / weights' dtypes. sparse_mode 0 or 3 (the selection
is already in the indices), pre/next_tokens only their defaults. Registered opaque too, with no
backward of its own.
"""
import torch

from torch_npu.op_plugin._common import check
from torch_npu.op_plugin._opaque_vjp import non_differentiable
from torch_npu.op_plugin._registry import opaque
from torch_npu.op_plugin.attention.sparse_layout import KeyRows, QueryRows

__all__ = []

_MAX = 9223372036854775807


def _compute_dtype(t):
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def indexer_scores(q, w, k, cdt):
    """q [S1, N1, D], w [S1, N1], k [S2, N2, D] -> scores [N2, S1, S2]."""
    s1, n1, d = q.shape
    n2 = k.shape[1]
    g = n1 // n2
    qg = q.to(cdt).reshape(s1, n2, g, d)
    dots = torch.einsum("sngd,tnd->nsgt", qg, k.to(cdt))  # [N2, S1, g, S2]
    return (torch.relu(dots) * w.to(cdt).reshape(s1, n2, g).permute(1, 0, 2).unsqueeze(-1)).sum(2)


def causal_mask(s1, s2, device):
    """sparse_mode 3: True where key j lies after query i's right-down diagonal."""
    i = torch.arange(s1, device=device).unsqueeze(1)
    j = torch.arange(s2, device=device).unsqueeze(0)
    return j > i + (s2 - s1)


def _indexer_shape(query, key, weights, sparse_count, sparse_mode, pre_tokens, next_tokens, return_value):
    """The checks that need no tensor values; returns the sparse_indices shape."""
    op = "npu_lightning_indexer"
    if return_value:
        raise NotImplementedError("%s: return_value=True is not emulated (sparse_values' content/dtype "
                                  "are not established in the docs)" % op)
    check(sparse_mode in (0, 3), op, "sparse_mode must be 0 or 3, got %d", sparse_mode)
    check(pre_tokens == _MAX and next_tokens == _MAX, op, "pre_tokens/next_tokens only support 2^63-1")
    check(1 <= sparse_count, op, "sparse_count must be positive, got %d", sparse_count)
    n1, d = query.shape[-2], query.shape[-1]
    n2 = key.shape[-2]
    check(key.shape[-1] == d, op, "key head dim %d differs from the query's %d", (key.shape[-1], d))
    check(n1 % n2 == 0, op, "query heads %d are not a multiple of key heads %d", (n1, n2))
    check(tuple(weights.shape) == tuple(query.shape[:-1]), op, "weights shape %s must be query shape without D %s",
          (tuple(weights.shape), tuple(query.shape[:-1])))
    return tuple(query.shape[:-2]) + (n2, sparse_count)


def _lightning_indexer_fake(query, key, weights, *, actual_seq_lengths_query=None, actual_seq_lengths_key=None,
                            block_table=None, layout_query="BSND", layout_key="BSND", sparse_count=2048,
                            sparse_mode=3, pre_tokens=_MAX, next_tokens=_MAX, return_value=False):
    out_shape = _indexer_shape(query, key, weights, sparse_count, sparse_mode, pre_tokens, next_tokens, return_value)
    return query.new_empty(out_shape, dtype=torch.int32), query.new_empty([0])


# opaque: the top-k selection depends on the scores' values and the lengths are read on the
# host, so under torch.compile the op stays one graph node running this kernel
@opaque("npu_lightning_indexer", fake=_lightning_indexer_fake)
def npu_lightning_indexer(query, key, weights, *, actual_seq_lengths_query=None, actual_seq_lengths_key=None,
                          block_table=None, layout_query="BSND", layout_key="BSND", sparse_count=2048,
                          sparse_mode=3, pre_tokens=_MAX, next_tokens=_MAX, return_value=False):
    """Top-``sparse_count`` key positions per query token of
    ``sum_h w_h ReLU(q_h . k_j)`` (see the module docstring). query BSND [B,S1,N1,D] / TND
    [T1,N1,D], key BSND / TND / PA_BSND (with ``block_table``), weights [B,S1,N1] / [T1,N1].
    Returns (int32 sparse_indices [B,S1,N2,sparse_count] / [T1,N2,sparse_count], -1 padded;
    an empty tensor)."""
    op = "npu_lightning_indexer"
    out_shape = _indexer_shape(query, key, weights, sparse_count, sparse_mode, pre_tokens, next_tokens, return_value)
    n2 = key.shape[-2]
    empty = query.new_empty([0])
    rows = QueryRows(op, query, layout_query, actual_seq_lengths_query)
    keys = KeyRows(op, key, layout_key, actual_seq_lengths_key, block_table, rows.batch)
    cdt = _compute_dtype(query)
    qf, wf = rows.flat(query), rows.flat(weights)
    out = torch.full((qf.shape[0], n2, sparse_count), -1, dtype=torch.int32, device=query.device)
    for b in range(rows.batch):
        s1, start = rows.lengths[b], rows.starts[b]
        k = keys.keys(key, b)
        s2 = k.shape[0]
        if s1 == 0 or s2 == 0:
            continue
        scores = indexer_scores(qf[start:start + s1], wf[start:start + s1], k, cdt)  # [N2, S1, S2]
        if sparse_mode == 3:
            scores = scores.masked_fill(causal_mask(s1, s2, query.device), float("-inf"))
        vals, idx = torch.sort(scores, dim=-1, descending=True, stable=True)
        take = min(sparse_count, s2)
        idx = torch.where(torch.isneginf(vals[..., :take]), torch.full_like(idx[..., :take], -1), idx[..., :take])
        out[start:start + s1, :, :take] = idx.permute(1, 0, 2).to(torch.int32)
    return out.reshape(out_shape), empty


def _softmax_lse_shape(query_index, key_index, weights, layout, sparse_mode, pre_tokens, next_tokens):
    """The checks that need no tensor values; returns the shape of both outputs."""
    op = "npu_dense_lightning_indexer_softmax_lse"
    check(sparse_mode in (0, 3), op, "sparse_mode must be 0 or 3, got %d", sparse_mode)
    check(pre_tokens == _MAX and next_tokens == _MAX, op, "pre_tokens/next_tokens only support 2^63-1")
    n1, n2 = query_index.shape[-2], key_index.shape[-2]
    check(n1 % n2 == 0, op, "query heads %d are not a multiple of key heads %d", (n1, n2))
    check(tuple(weights.shape) == tuple(query_index.shape[:-1]), op, "weights shape must be query shape without D")
    if layout == "BSND":
        return (query_index.shape[0], n2, query_index.shape[1])
    return (n2, query_index.shape[0])


def _softmax_lse_fake(query_index, key_index, weights, *, actual_seq_qlen=None, actual_seq_klen=None, layout="BSND",
                      sparse_mode=3, pre_tokens=_MAX, next_tokens=_MAX):
    shape = _softmax_lse_shape(query_index, key_index, weights, layout, sparse_mode, pre_tokens, next_tokens)
    return query_index.new_empty(shape, dtype=torch.float32), query_index.new_empty(shape, dtype=torch.float32)


# opaque: the per-batch lengths are read on the host
@opaque("npu_dense_lightning_indexer_softmax_lse", fake=_softmax_lse_fake)
def npu_dense_lightning_indexer_softmax_lse(query_index, key_index, weights, *, actual_seq_qlen=None,
                                            actual_seq_klen=None, layout="BSND", sparse_mode=3, pre_tokens=_MAX,
                                            next_tokens=_MAX):
    """Softmax statistics of the dense indexer score ``sum_h w_h ReLU(q_h . k_j)`` (same score
    and sparse_mode 3 mask as npu_lightning_indexer): per query row, ``softmax_max = max_j
    score`` and ``softmax_sum = sum_j exp(score - max)``, float32, shaped [B, N2, S1] for
    BSND and [N2, T1] for TND (the element order of the op-plugin golden, which compares
    flattened values). Rows past ``actual_seq_qlen`` hold 0."""
    op = "npu_dense_lightning_indexer_softmax_lse"
    _softmax_lse_shape(query_index, key_index, weights, layout, sparse_mode, pre_tokens, next_tokens)
    n2 = key_index.shape[-2]
    rows = QueryRows(op, query_index, layout, actual_seq_qlen)
    keys = KeyRows(op, key_index, layout, actual_seq_klen, None, rows.batch)
    cdt = _compute_dtype(query_index)
    qf, wf = rows.flat(query_index), rows.flat(weights)
    smax = torch.zeros((n2, qf.shape[0]), dtype=torch.float32, device=query_index.device)
    ssum = torch.zeros_like(smax)
    for b in range(rows.batch):
        s1, start = rows.lengths[b], rows.starts[b]
        k = keys.keys(key_index, b)
        if s1 == 0:
            continue
        scores = indexer_scores(qf[start:start + s1], wf[start:start + s1], k, cdt)  # [N2, S1, S2]
        if sparse_mode == 3:
            scores = scores.masked_fill(causal_mask(s1, k.shape[0], query_index.device), float("-inf"))
        m = scores.amax(-1)
        safe = torch.where(torch.isneginf(m), torch.zeros_like(m), m)
        smax[:, start:start + s1] = m.float()
        ssum[:, start:start + s1] = torch.exp(scores - safe.unsqueeze(-1)).sum(-1).float()
    if layout == "BSND":
        b_, s_ = query_index.shape[0], query_index.shape[1]
        smax = smax.view(n2, b_, s_).transpose(0, 1).contiguous()
        ssum = ssum.view(n2, b_, s_).transpose(0, 1).contiguous()
    return smax, ssum


non_differentiable("npu_lightning_indexer", "npu_dense_lightning_indexer_softmax_lse")


def _cumulative(op, name, t, total):
    check(t is not None, op, "%s is required for layout TND", name)
    vals = [int(v) for v in (t.tolist() if torch.is_tensor(t) else t)]
    check(len(vals) > 0 and vals[-1] == total and all(b >= a for a, b in zip([0] + vals, vals)), op,
          "%s must be non-decreasing cumulative lengths ending at %d, got %s", (name, total, vals))
    return vals


def _lightning_indexer_grad_fake(query, key, dy, sparse_indices, weights, actual_seq_lengths_query=None,
                                 actual_seq_lengths_key=None, layout="BSND", sparse_mode=3, pre_tokens=_MAX,
                                 next_tokens=_MAX):
    return torch.empty_like(query), torch.empty_like(key), torch.empty_like(weights)


@opaque("npu_lightning_indexer_grad", fake=_lightning_indexer_grad_fake)
def npu_lightning_indexer_grad(query, key, dy, sparse_indices, weights, actual_seq_lengths_query=None,
                               actual_seq_lengths_key=None, layout="BSND", sparse_mode=3, pre_tokens=_MAX,
                               next_tokens=_MAX):
    """(d_query like query, d_key like key, d_weights like weights); see the module docstring."""
    op = "npu_lightning_indexer_grad"
    check(layout in ("BSND", "TND"), op, "layout must be BSND or TND, got %r", (layout,))
    check(sparse_mode in (0, 3), op, "sparse_mode must be 0 or 3, got %s", sparse_mode)
    if pre_tokens != _MAX or next_tokens != _MAX:
        raise NotImplementedError("%s: only the default pre_tokens/next_tokens are emulated" % op)
    check(sparse_indices.dtype == torch.int32, op, "sparse_indices must be int32, got %s", sparse_indices.dtype)
    tnd = layout == "TND"
    check(query.dim() == (3 if tnd else 4) and key.dim() == query.dim(), op,
          "query and key must be %s", ("[T, N, D]" if tnd else "[B, S, N, D]"))
    lead = 1 if tnd else 2                       # token dims of query: (T,) or (B, S1)
    n1, d = query.shape[-2], query.shape[-1]
    n2 = key.shape[-2]
    check(key.shape[-1] == d, op, "key D (%d) must equal query D (%d)", (key.shape[-1], d))
    check(n1 % n2 == 0, op, "query heads (%d) must be a multiple of key heads (%d)", (n1, n2))
    check(tuple(weights.shape) == tuple(query.shape[:-1]), op, "weights must be %s, got %s",
          (tuple(query.shape[:-1]), tuple(weights.shape)))
    idx = sparse_indices
    if idx.dim() == lead + 1:
        check(n2 == 1, op, "sparse_indices without a head dim needs N2 = 1, got %d", n2)
        idx = idx.unsqueeze(-2)
    check(idx.dim() == lead + 2 and tuple(idx.shape[:lead]) == tuple(query.shape[:lead]) and idx.shape[-2] == n2, op,
          "sparse_indices must be %s + [N2=%d, K], got %s",
          (tuple(query.shape[:lead]), n2, tuple(sparse_indices.shape)))
    check(tuple(dy.shape) == tuple(sparse_indices.shape), op, "dy shape %s must equal sparse_indices shape %s",
          (tuple(dy.shape), tuple(sparse_indices.shape)))
    g = dy.reshape(idx.shape)
    cdt = torch.float64 if query.dtype == torch.float64 else torch.float32
    kk = idx.shape[-1]
    q = query.to(cdt).reshape(-1, n2, n1 // n2, d)             # [tokens, N2, G, D]
    w = weights.to(cdt).reshape(-1, n2, n1 // n2)
    idx_f = idx.reshape(-1, n2, kk)
    valid = idx_f >= 0
    rel = idx_f.long().clamp(min=0)
    if tnd:
        cum_q = _cumulative(op, "actual_seq_lengths_query", actual_seq_lengths_query, query.shape[0])
        cum_k = _cumulative(op, "actual_seq_lengths_key", actual_seq_lengths_key, key.shape[0])
        check(len(cum_q) == len(cum_k), op, "actual_seq_lengths_query and _key must have the same batch count")
        starts, prev = [], 0
        for b, end in enumerate(cum_q):
            starts.extend([0 if b == 0 else cum_k[b - 1]] * (end - prev))
            prev = end
        rows = rel + torch.tensor(starts, dtype=torch.long, device=query.device).view(-1, 1, 1)
        k_rows = key.to(cdt)                                   # [T2, N2, D]
    else:
        b, s1, s2 = query.shape[0], query.shape[1], key.shape[1]
        rows = rel + (torch.arange(b, device=query.device) * s2).repeat_interleave(s1).view(-1, 1, 1)
        k_rows = key.to(cdt).reshape(-1, n2, d)                # [B*S2, N2, D]
    heads = torch.arange(n2, device=query.device).view(1, -1, 1)
    k_sel = k_rows[rows, heads]                                # [tokens, N2, K, D]
    r = torch.einsum("tngd,tnkd->tngk", q, k_sel)
    g_eff = (g.reshape(-1, n2, kk).to(cdt) * valid).unsqueeze(2)  # [tokens, N2, 1, K]
    relu_grad = (r > 0).to(cdt) * w.unsqueeze(-1) * g_eff
    d_query = torch.einsum("tngk,tnkd->tngd", relu_grad, k_sel).reshape(query.shape)
    d_weights = (torch.relu(r) * g_eff).sum(-1).reshape(weights.shape)
    dk_sel = torch.einsum("tngk,tngd->tnkd", relu_grad, q)
    flat = (rows * n2 + heads).reshape(-1)
    d_key = torch.zeros(k_rows.shape[0] * n2, d, dtype=cdt, device=query.device)
    d_key = d_key.index_add(0, flat, dk_sel.reshape(-1, d)).reshape(key.shape)
    return d_query.to(query.dtype), d_key.to(key.dtype), d_weights.to(weights.dtype)



non_differentiable("npu_lightning_indexer_grad")
