"""Native Sparse Attention (NSA) ops.

Emulated from their documented formulas:

* npu_nsa_compress / npu_nsa_compress_grad (KV compression): per batch b of length S
  (actual_seq_len holds the cumulative lengths) the windows i = 0 .. floor((S - L) / d) (none
  when S < L) give out[i, n, :] = sum_{j<L} weight[j, n] * input[start_b + i*d + j, n, :];
  npu_nsa_compress_infer.cache writes the same windows into a paged cache.
* npu_nsa_select_attention (+ _grad): attention over the selected key blocks of each query.
* npu_nsa_compress_attention: attention over the compressed keys, with the importance scores
  of the key blocks for the selection.

Meta-only (shapes and dtypes from each op's documentation and the op-plugin meta registrations,
op_api allocation code; a real CPU / npu call raises NotImplementedError naming the op):
npu_nsa_compress_attention_infer and npu_nsa_select_attention_infer (paged inference).

Low-precision inputs are computed in float32 and returned in their dtype (float64 stays
float64 for gradcheck).
"""
import torch

from torch_npu.op_plugin._common import acc, check
from torch_npu.op_plugin._registry import impl, meta

__all__ = []

_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


# ---------------------------------------------------------------- interleave rope


# ---------------------------------------------------------------- masked softmax with relative position bias


# ---------------------------------------------------------------- attention update (lse merge)


# ---------------------------------------------------------------- in-place attention softmax


# ---------------------------------------------------------------- masked causal conv1d backward


# ---------------------------------------------------------------- NSA compress

def _nsa_windows(op, total, block, stride, actual_seq_len):
    """Start row of every compression window, from the cumulative lengths (host ints)."""
    check(actual_seq_len is not None and len(actual_seq_len) > 0, op, "actual_seq_len is required")
    check(block > 0 and stride > 0, op, "compress_block_size and compress_stride must be positive")
    check(int(actual_seq_len[-1]) == total, op, "actual_seq_len[-1] (%d) must equal input.shape[0] (%d)", (int(actual_seq_len[-1]), total))
    starts, prev = [], 0
    for end in actual_seq_len:
        end = int(end)
        check(end >= prev, op, "actual_seq_len must be non-decreasing cumulative lengths")
        length = end - prev
        if length >= block:
            starts.extend(prev + i * stride for i in range((length - block) // stride + 1))
        prev = end
    return starts


def _nsa_check(op, input, weight, block, stride):
    check(input.dim() == 3, op, "input must be 3-D [T, N, D], got %d-D", input.dim())
    check(input.dtype in (torch.float16, torch.bfloat16, torch.float64), op,
          "input dtype must be float16 or bfloat16, got %s", input.dtype)
    check(weight.dtype == input.dtype, op, "weight dtype %s must equal input dtype %s", (weight.dtype, input.dtype))
    check(weight.dim() == 2 and tuple(weight.shape) == (block, input.shape[1]), op,
          "weight must be [compress_block_size=%d, N=%d], got %s", (block, input.shape[1], tuple(weight.shape)))
    check(input.shape[1] <= 128, op, "N must be <= 128, got %d", input.shape[1])
    check(input.shape[2] % 16 == 0 and input.shape[2] <= 256, op,
          "D must be a multiple of 16 and <= 256, got %d", input.shape[2])
    check(block % 16 == 0 and block <= 128, op,
          "compress_block_size must be a multiple of 16 and <= 128, got %d", block)
    check(stride % 16 == 0 and 0 < stride <= block, op,
          "compress_stride must be a multiple of 16 and <= compress_block_size, got %d", stride)


def _window_index(starts, block, device):
    base = torch.tensor(starts, dtype=torch.long, device=device).reshape(-1, 1)
    return base + torch.arange(block, device=device)


@impl("npu_nsa_compress")
def npu_nsa_compress(input, weight, compress_block_size, compress_stride, *, actual_seq_len=None):
    """[T, N, D] -> [R, N, D], R the number of whole windows over all batches."""
    op = "npu_nsa_compress"
    _nsa_check(op, input, weight, compress_block_size, compress_stride)
    starts = _nsa_windows(op, input.shape[0], compress_block_size, compress_stride, actual_seq_len)
    idx = _window_index(starts, compress_block_size, input.device)          # [R, L]
    windows = acc(input)[idx]                                               # [R, L, N, D]
    return torch.einsum("rlnd,ln->rnd", windows, acc(weight)).to(input.dtype)


@impl("npu_nsa_compress_grad")
def npu_nsa_compress_grad(grad, input, weight, compress_block_size, compress_stride, *, actual_seq_len=None):
    """Gradients (input_grad [T, N, D], weight_grad [L, N]) of npu_nsa_compress for ``grad`` [R, N, D]."""
    op = "npu_nsa_compress_grad"
    _nsa_check(op, input, weight, compress_block_size, compress_stride)
    starts = _nsa_windows(op, input.shape[0], compress_block_size, compress_stride, actual_seq_len)
    r = len(starts)
    check(tuple(grad.shape) == (r, input.shape[1], input.shape[2]), op, "grad must be [%d, %d, %d], got %s", (r, input.shape[1], input.shape[2], tuple(grad.shape)))
    idx = _window_index(starts, compress_block_size, input.device)
    g = acc(grad)
    weight_grad = torch.einsum("rlnd,rnd->ln", acc(input)[idx], g)
    contrib = torch.einsum("ln,rnd->rlnd", acc(weight), g).reshape(-1, input.shape[1], input.shape[2])
    input_grad = torch.zeros(input.shape, dtype=g.dtype, device=input.device).index_add(0, idx.reshape(-1), contrib)
    return input_grad.to(input.dtype), weight_grad.to(weight.dtype)


@impl("npu_nsa_compress_infer.cache")
def npu_nsa_compress_infer_cache(input, weight, slot_mapping, compress_block_size, compress_stride, page_block_size,
                                 *, block_table=None, actual_seq_len=None, cache):
    """Decode-time NSA compression (the op-plugin golden): for every batch b whose length
    S = actual_seq_len[b] just completed a window (S >= L and (S - L) % stride == 0), the last L
    tokens of its paged KV (logical token j is row j % page_block_size of block
    block_table[b, j // page_block_size]) are compressed, sum_j weight[j, n] * kv[j, n, :], into
    cache[slot_mapping[b]]. Other batches leave the cache alone. Returns ``cache``."""
    op = "npu_nsa_compress_infer"
    check(input.dim() == 4 and input.shape[1] == page_block_size, op,
          "input must be the paged KV [block_num, page_block_size=%d, N, D], got %s", (page_block_size, tuple(input.shape)))
    n, d = input.shape[2], input.shape[3]
    block = compress_block_size
    check(weight.dim() == 2 and tuple(weight.shape) == (block, n), op, "weight must be [compress_block_size=%d, N=%d]", (block, n))
    check(block > 0 and compress_stride > 0, op, "compress_block_size and compress_stride must be positive")
    check(block_table is not None and block_table.dim() == 2, op, "block_table [B, max_blocks] is required")
    check(actual_seq_len is not None and len(actual_seq_len) == slot_mapping.shape[0] == block_table.shape[0], op,
          "actual_seq_len, slot_mapping and block_table must have one entry per batch")
    check(cache.dim() == 3 and tuple(cache.shape[1:]) == (n, d), op, "cache must be [slots, N=%d, D=%d]", (n, d))
    done = [b for b, s in enumerate(actual_seq_len) if int(s) >= block and (int(s) - block) % compress_stride == 0]
    if not done:
        return cache
    dev = input.device
    pos = torch.tensor([[int(actual_seq_len[b]) - block + j for j in range(block)] for b in done], device=dev)
    blocks = block_table[torch.tensor(done, device=dev)].long().gather(1, pos // page_block_size)
    rows = blocks * page_block_size + pos % page_block_size                 # [done, L]
    kv = acc(input).reshape(-1, n, d)[rows]                                 # [done, L, N, D]
    compressed = torch.einsum("blnd,ln->bnd", kv, acc(weight))
    slots = slot_mapping[torch.tensor(done, device=dev)].long()
    return cache.index_copy_(0, slots, compressed.to(cache.dtype))


# ---------------------------------------------------------------- floyd attention


# ---------------------------------------------------------------- NSA select attention

def _nsa_select_rows(op, query, key, value, topk_indices, head_num, block, count, atten_mask, actual_seq_qlen,
                     actual_seq_kvlen):
    """Absolute key/value rows [T1, N2, count * block] each query token attends to: the selected
    blocks (topk_indices, relative to the token's batch) of its batch's key range."""
    if atten_mask is not None:
        raise NotImplementedError("%s: atten_mask is not emulated (documented as not supported yet)" % op)
    check(query.dim() == 3 and key.dim() == 3 and value.dim() == 3, op, "query, key and value must be TND (3-D)")
    check(query.dtype == key.dtype == value.dtype, op, "query, key and value dtypes must match")
    check(query.dtype in (torch.float16, torch.bfloat16, torch.float64), op,
          "dtype must be float16 or bfloat16, got %s", query.dtype)
    t1, n1, d1 = query.shape
    t2, n2, d2 = value.shape
    check(n1 == head_num, op, "query N (%d) must equal head_num (%d)", (n1, head_num))
    check(tuple(key.shape) == (t2, n2, d1), op, "key must be [T2=%d, N2=%d, D1=%d], got %s", (t2, n2, d1, tuple(key.shape)))
    check(n1 % n2 == 0, op, "query heads (%d) must be a multiple of key heads (%d)", (n1, n2))
    check(d1 >= d2, op, "query/key D (%d) must be >= value D (%d)", (d1, d2))
    check(topk_indices.dtype == torch.int32 and tuple(topk_indices.shape) == (t1, n2, count), op,
          "topk_indices must be int32 [T1=%d, N2=%d, select_block_count=%d], got %s %s", (t1, n2, count, topk_indices.dtype, tuple(topk_indices.shape)))
    check(actual_seq_qlen is not None and actual_seq_kvlen is not None, op,
          "actual_seq_qlen and actual_seq_kvlen are required")
    check(len(actual_seq_qlen) == len(actual_seq_kvlen), op, "actual_seq_qlen and actual_seq_kvlen lengths differ")
    check(int(actual_seq_qlen[-1]) == t1 and int(actual_seq_kvlen[-1]) == t2, op,
          "the last cumulative lengths must equal T1 (%d) and T2 (%d)", (t1, t2))
    starts, prev_q, prev_kv = [], 0, 0
    for end_q, end_kv in zip(actual_seq_qlen, actual_seq_kvlen):
        end_q, end_kv = int(end_q), int(end_kv)
        check(prev_kv % block == 0, op, "each batch's key range must start at a multiple of select_block_size")
        starts.extend([prev_kv] * (end_q - prev_q))
        prev_q, prev_kv = end_q, end_kv
    base = torch.tensor(starts, dtype=torch.long, device=query.device).view(t1, 1, 1, 1)
    blocks = topk_indices.long().unsqueeze(-1) * block + torch.arange(block, device=query.device)
    return (base + blocks).reshape(t1, n2, count * block)


def _nsa_gather(t, rows):
    """t [T2, N2, D], rows [T1, N2, L] -> [T1, N2, L, D]."""
    heads = torch.arange(t.shape[1], device=t.device).view(1, -1, 1)
    return t.permute(1, 0, 2)[heads, rows]


@impl("npu_nsa_select_attention")
def npu_nsa_select_attention(query, key, value, topk_indices, scale_value, head_num, select_block_size,
                             select_block_count, *, atten_mask=None, actual_seq_qlen=None, actual_seq_kvlen=None):
    """(attention_out [T1, N1, D2], softmax_max [T1, N1, 8], softmax_sum [T1, N1, 8] float32): each
    query head attends, with softmax(scale * q k^T), to the select_block_count blocks of
    select_block_size keys that topk_indices picks for its key head."""
    op = "npu_nsa_select_attention"
    rows = _nsa_select_rows(op, query, key, value, topk_indices, head_num, select_block_size, select_block_count,
                            atten_mask, actual_seq_qlen, actual_seq_kvlen)
    t1, n1, d1 = query.shape
    n2 = value.shape[1]
    k_sel, v_sel = _nsa_gather(acc(key), rows), _nsa_gather(acc(value), rows)     # [T1, N2, L, D]
    q = acc(query).view(t1, n2, n1 // n2, d1)
    s = torch.einsum("tngd,tnld->tngl", q, k_sel) * scale_value
    row_max = s.amax(-1, keepdim=True)
    e = torch.exp(s - row_max)
    row_sum = e.sum(-1, keepdim=True)
    p = (e / row_sum).to(query.dtype).to(s.dtype)   # probabilities rounded to the input dtype before P.V
    out = torch.einsum("tngl,tnld->tngd", p, v_sel).reshape(t1, n1, -1)
    stat = torch.float64 if query.dtype == torch.float64 else torch.float32
    shape8 = (t1, n1, 8)
    return (out.to(query.dtype), row_max.reshape(t1, n1, 1).to(stat).expand(shape8).contiguous(),
            row_sum.reshape(t1, n1, 1).to(stat).expand(shape8).contiguous())


@impl("npu_nsa_select_attention_grad")
def npu_nsa_select_attention_grad(grad, query, key, value, attention_out, softmax_max, softmax_sum, topk_indices,
                                  scale_value, head_num, select_block_size, select_block_count, *, atten_mask=None,
                                  actual_seq_qlen=None, actual_seq_kvlen=None):
    """(d_query, d_key, d_value) of npu_nsa_select_attention for ``grad`` [T1, N1, D2]; the
    probabilities are rebuilt from softmax_max / softmax_sum, keys selected by several tokens
    accumulate their gradients."""
    op = "npu_nsa_select_attention_grad"
    rows = _nsa_select_rows(op, query, key, value, topk_indices, head_num, select_block_size, select_block_count,
                            atten_mask, actual_seq_qlen, actual_seq_kvlen)
    t1, n1, d1 = query.shape
    t2, n2, d2 = value.shape
    g_heads = n1 // n2
    check(tuple(grad.shape) == (t1, n1, d2) and tuple(attention_out.shape) == (t1, n1, d2), op,
          "grad / attention_out must be [T1=%d, N1=%d, D2=%d]", (t1, n1, d2))
    check(tuple(softmax_max.shape) == (t1, n1, 8) and tuple(softmax_sum.shape) == (t1, n1, 8), op,
          "softmax_max / softmax_sum must be [T1=%d, N1=%d, 8]", (t1, n1))
    k_sel, v_sel = _nsa_gather(acc(key), rows), _nsa_gather(acc(value), rows)
    q = acc(query).view(t1, n2, g_heads, d1)
    s = torch.einsum("tngd,tnld->tngl", q, k_sel) * scale_value
    cdt = s.dtype
    mx = softmax_max[..., :1].to(cdt).view(t1, n2, g_heads, 1)
    sm = softmax_sum[..., :1].to(cdt).view(t1, n2, g_heads, 1)
    p = torch.exp(s - mx) / sm
    g = acc(grad).view(t1, n2, g_heads, d2)
    dp = torch.einsum("tngd,tnld->tngl", g, v_sel)
    delta = (g * acc(attention_out).view(t1, n2, g_heads, d2)).sum(-1, keepdim=True)
    ds = p * (dp - delta) * scale_value
    dq = torch.einsum("tngl,tnld->tngd", ds, k_sel).reshape(t1, n1, d1)
    dk_sel = torch.einsum("tngl,tngd->tnld", ds, q)
    dv_sel = torch.einsum("tngl,tngd->tnld", p, g)
    flat = (torch.arange(n2, device=rows.device).view(1, -1, 1) * t2 + rows).reshape(-1)

    def scatter(sel, d):
        dest = torch.zeros(n2 * t2, d, dtype=sel.dtype, device=sel.device)
        return dest.index_add(0, flat, sel.reshape(-1, d)).view(n2, t2, d).permute(1, 0, 2)

    dt = query.dtype
    return dq.to(dt), scatter(dk_sel, d1).to(dt).contiguous(), scatter(dv_sel, d2).to(dt).contiguous()


# ---------------------------------------------------------------- NSA compress attention

def _importance_weights(m, n, device, dtype):
    """Weight of compressed position m*i - j (j = 0 .. m+n-2) in selection block i-1 (the golden)."""
    inner = m + n - 1
    w = [min(j + 1 if j < inner / 2 else inner - j, n) for j in range(inner)]
    return torch.tensor(w, dtype=dtype, device=device)


@impl("npu_nsa_compress_attention")
def npu_nsa_compress_attention(query, key, value, scale_value, head_num, compress_block_size, compress_stride,
                               select_block_size, select_block_count, *, topk_mask=None, atten_mask=None,
                               actual_seq_qlen=None, actual_cmp_seq_kvlen=None, actual_sel_seq_kvlen=None):
    """NSA compress attention and top-k block selection (the op-plugin golden), per batch b
    (cumulative lengths: queries, compressed keys, selection blocks):

        P   = softmax(scale * q k^T - 40000 * atten_mask)     (atten_mask [S1, S2], 1 = masked)
        out = P v;  softmax_max / softmax_sum [T, N1, 8] float32 (the row max and sum, repeated)
        score[j] = sum over the group's heads of sum_t w_t P[m*(j+1) - t]   (m = select/stride,
                   n = compress/stride, t < m+n-1, w_t = min(t+1 or m+n-1-t, n), terms outside
                   the compressed keys skipped); topk_mask [S1, S_sel] True forces a block (23333)
        topk_indices = the select_block_count highest scores (stable, lower index first)

    Returns (attention_out [T, N1, D2], topk_indices [T, N2, count] int32, softmax_max, softmax_sum)."""
    op = "npu_nsa_compress_attention"
    check(query.dim() == 3 and key.dim() == 3 and value.dim() == 3, op, "query, key and value must be TND (3-D)")
    check(query.dtype == key.dtype == value.dtype, op, "query, key and value dtypes must match")
    check(query.dtype in (torch.float16, torch.bfloat16, torch.float64), op,
          "dtype must be float16 or bfloat16, got %s", query.dtype)
    t1, n1, d1 = query.shape
    t2, n2, d2 = value.shape
    check(n1 == head_num and n1 % n2 == 0, op, "query heads (%d) must equal head_num (%d) and be a multiple of key "
          "heads (%d)", (n1, head_num, n2))
    check(tuple(key.shape) == (t2, n2, d1) and d1 >= d2, op, "key must be [T2, N2, D1] with D1 >= value D")
    for name, size in (("compress_block_size", compress_block_size), ("compress_stride", compress_stride),
                       ("select_block_size", select_block_size)):
        check(size > 0 and size % 16 == 0, op, "%s must be a positive multiple of 16, got %d", (name, size))
    check(compress_block_size >= compress_stride, op, "compress_block_size must be >= compress_stride")
    check(select_block_size % compress_stride == 0 and compress_block_size % compress_stride == 0, op,
          "select_block_size and compress_block_size must be multiples of compress_stride")
    lists = (actual_seq_qlen, actual_cmp_seq_kvlen, actual_sel_seq_kvlen)
    check(all(x is not None for x in lists) and len(set(len(x) for x in lists)) == 1, op,
          "actual_seq_qlen, actual_cmp_seq_kvlen and actual_sel_seq_kvlen are required, one entry per batch")
    check(int(actual_seq_qlen[-1]) == t1 and int(actual_cmp_seq_kvlen[-1]) == t2, op,
          "the last cumulative lengths must equal T1 (%d) and T2 (%d)", (t1, t2))
    grp = n1 // n2
    m, n = select_block_size // compress_stride, compress_block_size // compress_stride
    cdt = torch.float64 if query.dtype == torch.float64 else torch.float32
    weights = _importance_weights(m, n, query.device, cdt)
    outs, maxes, sums, tops = [], [], [], []
    bounds = [tuple(int(x) for x in (0, 0, 0))] + [tuple(int(v) for v in vals) for vals in zip(*lists)]
    for (q0, k0, s0), (q1, k1, s_end) in zip(bounds[:-1], bounds[1:]):
        s1, s2, nsel = q1 - q0, k1 - k0, s_end - s0
        check(s1 >= 0 and s2 >= 0 and nsel >= 0, op, "cumulative lengths must be non-decreasing")
        if select_block_count > nsel:
            raise NotImplementedError("%s: select_block_count %d exceeds a batch's %d selection blocks (what the "
                                      "kernel returns then is not documented)" % (op, select_block_count, nsel))
        q = acc(query[q0:q1]).to(cdt).view(s1, n2, grp, d1)
        k, v = acc(key[k0:k1]).to(cdt), acc(value[k0:k1]).to(cdt)
        logits = torch.einsum("sngd,tnd->ngst", q, k) * scale_value            # [N2, G, S1, S2]
        if atten_mask is not None:
            logits = logits - 40000.0 * atten_mask[:s1, :s2].to(torch.bool).to(cdt)
        row_max = logits.amax(-1, keepdim=True)
        e = torch.exp(logits - row_max)
        row_sum = e.sum(-1, keepdim=True)
        p = e / row_sum
        outs.append(torch.einsum("ngst,tnd->sngd", p, v).reshape(s1, n1, d2))
        maxes.append(row_max.reshape(n1, s1).t())
        sums.append(row_sum.reshape(n1, s1).t())
        # importance of selection block j: compressed positions m*(j+1) - t, t < m+n-1
        pos = (torch.arange(1, nsel + 1, device=query.device) * m).unsqueeze(1) - torch.arange(len(weights),
                                                                                           device=query.device)
        inside = (pos >= 0) & (pos < s2)
        gathered = p.sum(1)[..., pos.clamp(0, max(s2 - 1, 0))]                # [N2, S1, nsel, m+n-1]
        score = (gathered * (weights * inside)).sum(-1)                         # [N2, S1, nsel]
        if topk_mask is not None:
            score = score.masked_fill(topk_mask[:s1, :nsel].to(torch.bool), 23333.0)
        order = torch.sort(score, dim=-1, descending=True, stable=True).indices[..., :select_block_count]
        tops.append(order.permute(1, 0, 2))
    stat = lambda parts: torch.cat(parts).to(torch.float32).unsqueeze(-1).expand(t1, n1, 8).contiguous()  # noqa: E731
    return (torch.cat(outs).to(query.dtype), torch.cat(tops).to(torch.int32), stat(maxes), stat(sums))


def _paged_value_dim(op, value, kv_heads):
    """Head dim of a paged value cache (block_num, block_size, H) or (block_num, block_size, N, D)."""
    check(value.dim() in (3, 4), op, "value must be (block_num, block_size, H) or (block_num, block_size, N, D)")
    if value.dim() == 4:
        return value.shape[3]
    check(kv_heads > 0 and value.shape[2] % kv_heads == 0, op, "value H (%d) must be a multiple of "
          "key_value_head_num (%d)", (value.shape[2], kv_heads))
    return value.shape[2] // kv_heads


@meta("npu_nsa_compress_attention_infer")
def npu_nsa_compress_attention_infer_meta(query, key, value, scale_value, head_num, key_value_head_num,
                                          select_block_size, select_block_count, page_block_size, compress_block_size,
                                          compress_stride, *, layout="TND", atten_mask=None, block_table=None,
                                          topk_mask=None, actual_seq_qlen=None, actual_cmp_seq_kvlen=None,
                                          actual_sel_seq_kvlen=None):
    """(attention_out [T, N, Dv] in query's dtype, topk_indices [T, N_kv, select_block_count] int32)
    for a TND query (S = 1 per batch) over paged (block_num, block_size, H) caches."""
    op = "npu_nsa_compress_attention_infer"
    check(query.dim() == 3, op, "query must be TND (3-D), got %d-D", query.dim())
    check(query.shape[1] == head_num, op, "query N (%d) must equal head_num (%d)", (query.shape[1], head_num))
    check(key_value_head_num > 0 and head_num % key_value_head_num == 0, op,
          "head_num must be a multiple of key_value_head_num")
    dv = _paged_value_dim(op, value, key_value_head_num)
    return (query.new_empty((query.shape[0], head_num, dv)),
            query.new_empty((query.shape[0], key_value_head_num, select_block_count), dtype=torch.int32))


@meta("npu_nsa_select_attention_infer")
def npu_nsa_select_attention_infer_meta(query, key, value, topk_indices, scale_value, head_num, key_value_head_num,
                                        select_block_size, select_block_count, page_block_size, *, layout="BSND",
                                        atten_mask=None, block_table=None, actual_seq_qlen=None,
                                        actual_seq_kvlen=None):
    """attention_out like query with value's head dim: BSND [B, S, N, Dv], BSH [B, S, N * Dv]
    (documented layouts) and TND [T, N, Dv] (the op-plugin test's layout)."""
    op = "npu_nsa_select_attention_infer"
    ranks = {"BSND": 4, "BSH": 3, "TND": 3}
    check(layout in ranks, op, "layout must be BSND, BSH or TND, got %r", (layout,))
    check(query.dim() == ranks[layout], op, "query must be %d-D for layout %s", (ranks[layout], layout))
    dv = _paged_value_dim(op, value, key_value_head_num)
    if layout == "BSND":
        return query.new_empty(tuple(query.shape[:3]) + (dv,))
    if layout == "TND":
        return query.new_empty((query.shape[0], query.shape[1], dv))
    return query.new_empty((query.shape[0], query.shape[1], head_num * dv))



