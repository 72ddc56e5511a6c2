"""npu_lightning_indexer_grad: gradients of the lightning indexer's scores at the selected keys.

The forward (npu_lightning_indexer) scores key j for a query token and key head n2 as
``I[j] = sum_h w[h] * ReLU(q[h] . k[j])`` over the query heads h of n2's group and returns the
top-k positions ``sparse_indices``. For ``dy``, the gradient of the loss w.r.t. the scores of
the selected keys (same shape as sparse_indices), this op returns the gradients of
``sum_t dy[t] * I[sparse_indices[t]]`` (the op-plugin golden):

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
is already in the indices), pre/next_tokens only their defaults. The TND lengths are read on the
host, so the op is registered opaque (one torch.compile node, fake kernel for the shapes) and
has no backward of its own.
"""
import torch

from torch_npu.op_plugin._common import check
from torch_npu.op_plugin._opaque_vjp import non_differentiable
from torch_npu.op_plugin._registry import opaque

__all__ = []

_MAX = 9223372036854775807


def _cumulative(op, name, t, total):
    check(t is not None, op, "%s is required for layout TND" % name)
    vals = [int(v) for v in (t.tolist() if torch.is_tensor(t) else t)]
    check(len(vals) > 0 and vals[-1] == total and all(b >= a for a, b in zip([0] + vals, vals)), op,
          "%s must be non-decreasing cumulative lengths ending at %d, got %s" % (name, total, vals))
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
    check(layout in ("BSND", "TND"), op, "layout must be BSND or TND, got %r" % (layout,))
    check(sparse_mode in (0, 3), op, "sparse_mode must be 0 or 3, got %s" % sparse_mode)
    if pre_tokens != _MAX or next_tokens != _MAX:
        raise NotImplementedError("%s: only the default pre_tokens/next_tokens are emulated" % op)
    check(sparse_indices.dtype == torch.int32, op, "sparse_indices must be int32, got %s" % sparse_indices.dtype)
    tnd = layout == "TND"
    check(query.dim() == (3 if tnd else 4) and key.dim() == query.dim(), op,
          "query and key must be %s" % ("[T, N, D]" if tnd else "[B, S, N, D]"))
    lead = 1 if tnd else 2                       # token dims of query: (T,) or (B, S1)
    n1, d = query.shape[-2], query.shape[-1]
    n2 = key.shape[-2]
    check(key.shape[-1] == d, op, "key D (%d) must equal query D (%d)" % (key.shape[-1], d))
    check(n1 % n2 == 0, op, "query heads (%d) must be a multiple of key heads (%d)" % (n1, n2))
    check(tuple(weights.shape) == tuple(query.shape[:-1]), op, "weights must be %s, got %s"
          % (tuple(query.shape[:-1]), tuple(weights.shape)))
    idx = sparse_indices
    if idx.dim() == lead + 1:
        check(n2 == 1, op, "sparse_indices without a head dim needs N2 = 1, got %d" % n2)
        idx = idx.unsqueeze(-2)
    check(idx.dim() == lead + 2 and tuple(idx.shape[:lead]) == tuple(query.shape[:lead]) and idx.shape[-2] == n2, op,
          "sparse_indices must be %s + [N2=%d, K], got %s"
          % (tuple(query.shape[:lead]), n2, tuple(sparse_indices.shape)))
    check(tuple(dy.shape) == tuple(sparse_indices.shape), op, "dy shape %s must equal sparse_indices shape %s"
          % (tuple(dy.shape), tuple(sparse_indices.shape)))
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
