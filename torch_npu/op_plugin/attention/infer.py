"""Inference attention ops: npu_prompt_flash_attention, npu_incre_flash_attention,
npu_fused_infer_attention_score.

All share one float32 core: ``out = softmax(mask(scale * q @ k^T)) @ v`` on [B, N, S, D]
views, key/value heads shared by ``N / N_kv`` query heads (GQA), ``atten_mask`` True (or
non-zero) = masked. A row whose keys are all masked (or whose valid kv length is 0)
outputs zeros (and a softmax_lse of +inf). Arguments outside the emulated subset raise
NotImplementedError naming the argument.
"""
import torch

from torch_npu.op_plugin._common import acc, check, reject_given, unsupported
from torch_npu.op_plugin._registry import impl
from torch_npu.op_plugin.attention.flash import from_bnsd as _from_bnsd, to_bnsd as _to_bnsd

__all__ = []

_MAX_TOKENS = 2147483647


def _split(op, query, key, value, num_heads, num_kv_heads, layout, layouts):
    if layout not in layouts:
        unsupported(op, "input_layout %r (supported: %s)" % (layout, ", ".join(layouts)))
    check(num_heads > 0, op, "num_heads must be positive, got %d", num_heads)
    check(query.dtype == key.dtype == value.dtype, op, "query, key and value must have one dtype")
    n_kv = num_heads if num_kv_heads == 0 else num_kv_heads
    check(n_kv > 0 and num_heads % n_kv == 0, op, "num_heads %d is not a multiple of num_key_value_heads %d", (num_heads, n_kv))
    if layout == "BSH":
        check(query.dim() == 3, op, "query must be 3-D for layout BSH, got %d-D", query.dim())
        check(query.shape[2] % num_heads == 0, op, "query hidden size %d is not divisible by num_heads %d", (query.shape[2], num_heads))
        head_dim = query.shape[2] // num_heads
    else:
        check(query.dim() == 4, op, "query must be 4-D for layout %s, got %d-D", (layout, query.dim()))
        head_dim = query.shape[3]
    q = _to_bnsd(op, query, layout, head_dim, "query")
    k = _to_bnsd(op, key, layout, head_dim, "key")
    v = _to_bnsd(op, value, layout, head_dim, "value")
    check(q.shape[1] == num_heads, op, "query has %d heads but num_heads is %d", (q.shape[1], num_heads))
    check(k.shape[1] == n_kv, op, "key has %d heads but num_key_value_heads gives %d", (k.shape[1], n_kv))
    check(tuple(k.shape) == tuple(v.shape), op, "key %s and value %s shapes differ", (tuple(key.shape), tuple(value.shape)))
    check(k.shape[0] == q.shape[0], op, "key batch %d differs from the query's %d", (k.shape[0], q.shape[0]))
    return q, k, v


def _split_paged(op, query, key, value, block_table, block_size, num_heads, num_kv_heads, layout, layouts,
                 lengths):
    """Like _split for page attention: query in ``layout``, key/value caches of blocks."""
    if layout not in layouts:
        unsupported(op, "input_layout %r (supported: %s)" % (layout, ", ".join(layouts)))
    check(num_heads > 0, op, "num_heads must be positive, got %d", num_heads)
    n_kv = num_heads if num_kv_heads == 0 else num_kv_heads
    check(num_heads % n_kv == 0, op, "num_heads %d is not a multiple of num_key_value_heads %d", (num_heads, n_kv))
    check(key.dtype == value.dtype and tuple(key.shape) == tuple(value.shape), op,
          "key and value caches must have one dtype and shape")
    head_dim = query.shape[2] // num_heads if layout == "BSH" else query.shape[3]
    q = _to_bnsd(op, query, layout, head_dim, "query")
    check(q.shape[1] == num_heads, op, "query has %d heads but num_heads is %d", (q.shape[1], num_heads))
    if key.dim() == 4:
        check(layout == "BNSD", op, "a (blocknum, numKvHeads, blocksize, headDims) cache needs query layout BNSD")
    lens = None if lengths is None else [int(x) for x in (lengths.tolist() if torch.is_tensor(lengths) else lengths)]
    k = _paged_kv(op, key, block_table, block_size, n_kv, head_dim, q.shape[0], lens, "key")
    v = _paged_kv(op, value, block_table, block_size, n_kv, head_dim, q.shape[0], lens, "value")
    # rows past a sequence's length are never read on hardware: whatever they hold (even NaN
    # in a fresh cache) must not reach the result through 0 * NaN
    if lens is not None:
        lens_b = lens * q.shape[0] if len(lens) == 1 else lens
        dead = torch.arange(k.shape[2], device=k.device).view(1, 1, -1, 1) >= torch.tensor(
            lens_b, device=k.device).view(-1, 1, 1, 1)
        k, v = k.masked_fill(dead, 0), v.masked_fill(dead, 0)
    check(key.dtype == query.dtype, op, "key cache dtype %s differs from the query's %s (int8 caches need antiquant, "
          "not emulated)", (key.dtype, query.dtype))
    return q, k, v


def _mask4(op, atten_mask, b, s1, s2, decode):
    """atten_mask -> bool broadcastable to [B, N, S1, S2] (True = masked)."""
    m = atten_mask if atten_mask.dtype == torch.bool else atten_mask != 0
    if m.dim() == 2:
        m = m.view(b, 1, 1, s2) if decode and m.shape[0] == b and m.shape[1] == s2 else m
    elif m.dim() == 3:
        m = m.unsqueeze(1)
    check(2 <= m.dim() <= 4, op, "atten_mask must be 2-D to 4-D, got %d-D", atten_mask.dim())
    m = m[..., :s1, :s2] if m.shape[-2] >= s1 and m.shape[-1] >= s2 else m
    try:
        torch.broadcast_shapes(tuple(m.shape), (b, 1, s1, s2))
    except RuntimeError:
        check(False, op, "atten_mask shape %s does not broadcast to [B, N, S1, S2] = [%d, *, %d, %d]", (tuple(atten_mask.shape), b, s1, s2))
    return m


def _kv_len_mask(op, lengths, b, s2, device, what):
    lengths = list(lengths)
    check(len(lengths) in (1, b), op, "%s must have 1 or B=%d entries, got %d", (what, b, len(lengths)))
    if len(lengths) == 1:
        lengths = lengths * b
    for n in lengths:
        check(0 <= n <= s2, op, "%s entries must be in [0, %d], got %s", (what, s2, n))
    lens = torch.tensor(lengths, dtype=torch.long, device=device).view(b, 1, 1, 1)
    return torch.arange(s2, device=device).view(1, 1, 1, s2) >= lens


def _paged_kv(op, cache, block_table, block_size, n_kv, head_dim, batch, lengths, what):
    """PageAttention: a kv cache of whole blocks read through ``block_table`` [B, blocks] ->
    [B, N_kv, blocks * block_size, D]. Documented cache layouts: (blocknum, blocksize, H) and
    (blocknum, numKvHeads, blocksize, headDims); logical token j of batch b is row
    ``j % block_size`` of block ``block_table[b, j // block_size]``."""
    check(block_table.dim() == 2 and block_table.shape[0] == batch, op,
          "block_table must be 2-D with B=%d rows, got %s", (batch, tuple(block_table.shape)))
    check(lengths is not None, op, "page attention needs the per-batch actual sequence lengths")
    check(block_size > 0, op, "block_size must be positive with block_table, got %d", block_size)
    if cache.dim() == 3:
        check(tuple(cache.shape[1:]) == (block_size, n_kv * head_dim), op,
              "%s cache must be (blocknum, %d, %d), got %s", (what, block_size, n_kv * head_dim, tuple(cache.shape)))
        blocks = cache.view(cache.shape[0], block_size, n_kv, head_dim).transpose(1, 2)
    else:
        check(cache.dim() == 4 and tuple(cache.shape[1:]) == (n_kv, block_size, head_dim), op,
              "%s cache must be (blocknum, %d, %d, %d), got %s", (what, n_kv, block_size, head_dim, tuple(cache.shape)))
        blocks = cache
    need = max((n + block_size - 1) // block_size for n in lengths)
    check(block_table.shape[1] >= need, op, "block_table has %d columns, the longest sequence needs %d", (block_table.shape[1], need))
    # columns past a sequence's blocks may hold anything: clamp them to a valid id, the
    # length mask hides those keys
    table = block_table.long().clamp(0, cache.shape[0] - 1)
    gathered = blocks[table]  # [B, blocks, N_kv, bs, D]
    b, nb = table.shape
    return gathered.permute(0, 2, 1, 3, 4).reshape(b, n_kv, nb * block_size, head_dim)


def _left_padding_mask(op, kv_padding_size, lengths, b, s2, device):
    """KV left padding: batch b's keys are ``[S - pad - len, S - pad)``; a start or end below 0
    gives an all-zero output (documented). Returns (mask True = masked, rows to zero)."""
    pad = max(int(kv_padding_size.reshape(-1)[0]) if torch.is_tensor(kv_padding_size) else int(kv_padding_size), 0)
    lengths = list(lengths) * (b if len(lengths) == 1 else 1)
    check(len(lengths) == b, op, "actual_seq_lengths must have 1 or B=%d entries", b)
    j = torch.arange(s2, device=device).view(1, 1, 1, s2)
    end = s2 - pad
    starts = torch.tensor([end - n for n in lengths], dtype=torch.long, device=device).view(b, 1, 1, 1)
    zero = torch.tensor([end - n < 0 or end < 0 for n in lengths], device=device).view(b, 1, 1, 1)
    return (j < starts) | (j >= end), zero


def _core(q, k, v, mask, scale):
    """q [B,N,S1,D], k/v [B,Nkv,S2,D], mask bool broadcastable to [B,N,S1,S2] or None.
    Returns (out [B,N,S1,D] float32, lse [B,N,S1,1] float32)."""
    b, n, s1, d = q.shape
    n_kv, s2 = k.shape[1], k.shape[2]
    g = n // n_kv
    qf, kf, vf = acc(q), acc(k), acc(v)
    scores = torch.matmul(qf.reshape(b, n_kv, g, s1, d), kf.unsqueeze(2).transpose(-1, -2)).reshape(b, n, s1, s2)
    scores = scores * scale
    if mask is not None:
        scores = scores.masked_fill(mask, float("-inf"))
    row_max = scores.amax(-1, keepdim=True)
    dead = torch.isneginf(row_max)  # every key masked
    safe_max = torch.where(dead, torch.zeros_like(row_max), row_max).detach()
    exp = torch.exp(scores - safe_max)
    row_sum = exp.sum(-1, keepdim=True)
    probs = exp / torch.where(dead, torch.ones_like(row_sum), row_sum)
    out = torch.matmul(probs.reshape(b, n_kv, g, s1, s2), vf.unsqueeze(2)).reshape(b, n, s1, d)
    lse = torch.where(dead, torch.full_like(row_max, float("inf")), safe_max + torch.log(row_sum))
    return out, lse


def _band(mask, s1, s2, pre_tokens, next_tokens, device):
    """sparse_mode 0 with an atten_mask: only -pre_tokens <= j - i <= next_tokens is computed."""
    if pre_tokens >= s1 - 1 and next_tokens >= s2 - 1:
        return mask
    i = torch.arange(s1, device=device).unsqueeze(1)
    j = torch.arange(s2, device=device).unsqueeze(0)
    return mask | (j - i > next_tokens) | (i - j > pre_tokens)


def _prompt(op, query, key, value, atten_mask, actual_seq_lengths_kv, num_heads, scale, pre_tokens,
            next_tokens, layout, num_kv_heads, sparse_mode, layouts, block_table=None, block_size=0):
    if sparse_mode != 0:
        unsupported(op, "sparse_mode %d (supported: 0)" % sparse_mode)
    if block_table is None:
        q, k, v = _split(op, query, key, value, num_heads, num_kv_heads, layout, layouts)
    else:
        q, k, v = _split_paged(op, query, key, value, block_table, block_size, num_heads, num_kv_heads, layout,
                               layouts, actual_seq_lengths_kv)
    b, _, s1, _ = q.shape
    s2 = k.shape[2]
    mask = None
    if atten_mask is not None:
        # sparse_mode 0 with a mask: the pre/next tokens band applies too (without a mask both
        # are ignored, per the spec)
        mask = _band(_mask4(op, atten_mask, b, s1, s2, decode=False), s1, s2, pre_tokens, next_tokens, q.device)
    if actual_seq_lengths_kv is not None:
        kvm = _kv_len_mask(op, actual_seq_lengths_kv, b, s2, q.device, "actual_seq_lengths_kv")
        mask = kvm if mask is None else (mask | kvm)
    out, lse = _core(q, k, v, mask, scale)
    return _from_bnsd(out.to(query.dtype), layout), lse


@impl("npu_prompt_flash_attention")
def npu_prompt_flash_attention(query, key, value, padding_mask=None, atten_mask=None, pse_shift=None,
                               actual_seq_lengths=None, deq_scale1=None, quant_scale1=None, deq_scale2=None,
                               quant_scale2=None, quant_offset2=None, num_heads=1, scale_value=1.0,
                               pre_tokens=_MAX_TOKENS, next_tokens=0, input_layout="BSH",
                               num_key_value_heads=0, actual_seq_lengths_kv=None, sparse_mode=0):
    """Prompt (full-sequence) attention ``softmax(mask(scale_value * q @ k^T)) @ v``.

    Layouts BSH / BSND / BNSD; GQA via ``num_key_value_heads`` (0 = num_heads); ``atten_mask``
    (bool or 0/1, True = masked) of shape [S1, S2], [B, S1, S2] or [B, 1, S1, S2] (a larger
    mask is cropped to its top-left [S1, S2]); with a mask, the ``pre_tokens``/``next_tokens``
    band ``-pre <= j - i <= next`` is also applied (sparse_mode 0 semantics; without a mask
    both are ignored). ``actual_seq_lengths_kv`` limits the valid keys per batch. Only
    sparse_mode 0; padding_mask, pse_shift, actual_seq_lengths (query) and the quantization
    arguments raise NotImplementedError. Fully masked rows output zeros. Computed in float32."""
    op = "npu_prompt_flash_attention"
    reject_given(op, padding_mask=padding_mask, pse_shift=pse_shift, actual_seq_lengths=actual_seq_lengths,
            deq_scale1=deq_scale1, quant_scale1=quant_scale1, deq_scale2=deq_scale2, quant_scale2=quant_scale2,
            quant_offset2=quant_offset2)
    out, _ = _prompt(op, query, key, value, atten_mask, actual_seq_lengths_kv, num_heads, scale_value, pre_tokens,
                     next_tokens, input_layout, num_key_value_heads, sparse_mode, ("BSH", "BSND", "BNSD"))
    return out


@impl("npu_incre_flash_attention")
def npu_incre_flash_attention(query, key, value, padding_mask=None, atten_mask=None, pse_shift=None,
                              actual_seq_lengths=None, antiquant_scale=None, antiquant_offset=None,
                              block_table=None, dequant_scale1=None, quant_scale1=None, dequant_scale2=None,
                              quant_scale2=None, quant_offset2=None, kv_padding_size=None, num_heads=1,
                              scale_value=1.0, input_layout="BSH", num_key_value_heads=0, block_size=0,
                              inner_precise=1):
    """Incremental (decode) attention: query S = 1 attends to the kv cache.

    Layouts BSH / BSND / BNSD; GQA via ``num_key_value_heads``; ``atten_mask`` (True = masked)
    of shape [B, S2], [B, 1, S2] or [B, 1, 1, S2]; ``actual_seq_lengths`` (1 or B entries)
    keeps only the first ``actual_seq_lengths[b]`` keys of batch b (a length 0 outputs zeros).
    Page attention: with ``block_table`` [B, blocks] (int32) and ``block_size``, key/value are
    caches of blocks, (blocknum, block_size, H) or (blocknum, N_kv, block_size, D) (the latter
    with query layout BNSD); logical token j of batch b is row ``j % block_size`` of block
    ``block_table[b, j // block_size]``; ``actual_seq_lengths`` is then required. KV left
    padding: with ``kv_padding_size`` and ``actual_seq_lengths`` the keys of batch b are
    ``[S - pad - len, S - pad)`` (pad < 0 counts as 0; a start or end below 0 outputs
    zeros), as documented; without actual_seq_lengths it is ignored (right padding).
    padding_mask, pse_shift (its place relative to scale_value is not given in the docs'
    text), kv_padding_size together with block_table and the (anti)quantization arguments
    raise NotImplementedError. Computed in float32."""
    op = "npu_incre_flash_attention"
    reject_given(op, padding_mask=padding_mask, pse_shift=pse_shift, antiquant_scale=antiquant_scale,
            antiquant_offset=antiquant_offset, dequant_scale1=dequant_scale1,
            quant_scale1=quant_scale1, dequant_scale2=dequant_scale2, quant_scale2=quant_scale2,
            quant_offset2=quant_offset2)
    layouts = ("BSH", "BSND", "BNSD")
    if block_table is not None and kv_padding_size is not None:
        unsupported(op, "kv_padding_size with block_table")
    if block_table is None:
        q, k, v = _split(op, query, key, value, num_heads, num_key_value_heads, input_layout, layouts)
    else:
        q, k, v = _split_paged(op, query, key, value, block_table, block_size, num_heads, num_key_value_heads,
                               input_layout, layouts, actual_seq_lengths)
    b, _, s1, _ = q.shape
    s2 = k.shape[2]
    check(s1 == 1, op, "query sequence length must be 1 (decode), got %d", s1)
    mask = None
    if atten_mask is not None:
        mask = _mask4(op, atten_mask, b, s1, s2, decode=True)
    zero_rows = None
    if kv_padding_size is not None and actual_seq_lengths is not None and block_table is None:
        kvm, zero_rows = _left_padding_mask(op, kv_padding_size, actual_seq_lengths, b, s2, q.device)
        mask = kvm if mask is None else (mask | kvm)
    elif actual_seq_lengths is not None:
        kvm = _kv_len_mask(op, actual_seq_lengths, b, s2, q.device, "actual_seq_lengths")
        mask = kvm if mask is None else (mask | kvm)
    out, _ = _core(q, k, v, mask, scale_value)
    if zero_rows is not None:
        out = out.masked_fill(zero_rows, 0.0)
    return _from_bnsd(out.to(query.dtype), input_layout)


@impl("npu_fused_infer_attention_score")
def npu_fused_infer_attention_score(query, key, value, pse_shift=None, atten_mask=None, actual_seq_lengths=None,
                                    actual_seq_lengths_kv=None, dequant_scale1=None, quant_scale1=None,
                                    dequant_scale2=None, quant_scale2=None, quant_offset2=None,
                                    antiquant_scale=None, antiquant_offset=None, key_antiquant_scale=None,
                                    key_antiquant_offset=None, value_antiquant_scale=None,
                                    value_antiquant_offset=None, block_table=None, query_padding_size=None,
                                    kv_padding_size=None, key_shared_prefix=None, value_shared_prefix=None,
                                    actual_shared_prefix_len=None, query_rope=None, key_rope=None,
                                    key_rope_antiquant_scale=None, num_heads=1, scale=1.0,
                                    pre_tokens=_MAX_TOKENS, next_tokens=_MAX_TOKENS, input_layout="BSH",
                                    num_key_value_heads=0, sparse_mode=0, inner_precise=0, block_size=0,
                                    antiquant_mode=0, key_antiquant_mode=0, value_antiquant_mode=0,
                                    softmax_lse_flag=False):
    """Prompt or decode attention with the same emulated subset as npu_prompt_flash_attention
    (layouts BSH / BSND / BNSD, GQA, atten_mask with the pre/next tokens band, sparse_mode 0,
    ``actual_seq_lengths_kv``). Returns ``(attention_out`` in the input layout and dtype,
    ``softmax_lse)``: with ``softmax_lse_flag`` the float32 [B, N, S1, 1] log-sum-exp of the
    scaled, masked logits (+inf for a fully masked row), else an empty float32 tensor.
    Page attention (``block_table``, ``block_size``, caches of blocks) as in
    npu_incre_flash_attention, with ``actual_seq_lengths_kv`` required.
    pse_shift, actual_seq_lengths (query: what rows past it output is not documented), left
    padding, shared prefixes, rope splits and (anti)quantization raise NotImplementedError."""
    op = "npu_fused_infer_attention_score"
    reject_given(op, pse_shift=pse_shift, actual_seq_lengths=actual_seq_lengths, dequant_scale1=dequant_scale1,
            quant_scale1=quant_scale1, dequant_scale2=dequant_scale2, quant_scale2=quant_scale2,
            quant_offset2=quant_offset2, antiquant_scale=antiquant_scale, antiquant_offset=antiquant_offset,
            key_antiquant_scale=key_antiquant_scale, key_antiquant_offset=key_antiquant_offset,
            value_antiquant_scale=value_antiquant_scale, value_antiquant_offset=value_antiquant_offset,
            query_padding_size=query_padding_size, kv_padding_size=kv_padding_size,
            key_shared_prefix=key_shared_prefix, value_shared_prefix=value_shared_prefix,
            actual_shared_prefix_len=actual_shared_prefix_len, query_rope=query_rope, key_rope=key_rope,
            key_rope_antiquant_scale=key_rope_antiquant_scale)
    for arg, val in (("antiquant_mode", antiquant_mode), ("key_antiquant_mode", key_antiquant_mode),
                     ("value_antiquant_mode", value_antiquant_mode)):
        if val != 0:
            unsupported(op, "%s %d" % (arg, val))
    out, lse = _prompt(op, query, key, value, atten_mask, actual_seq_lengths_kv, num_heads, scale, pre_tokens,
                       next_tokens, input_layout, num_key_value_heads, sparse_mode, ("BSH", "BSND", "BNSD"),
                       block_table, block_size)
    if softmax_lse_flag:
        lse = lse.detach().float().contiguous()
    else:
        lse = query.new_empty([0], dtype=torch.float32)
    return out, lse
