"""Round-8 attention-family ops emulated from their documented formulas.

* npu_interleave_rope(x, cos, sin), x [B, N, S, D]: the D axis is de-interleaved
  (x.view(.., D/2, 2).transpose(-1, -2)), then RoPE with rotate_half:
  out = q * cos + rotate_half(q) * sin, rotate_half(q) = cat(-q[D/2:], q[:D/2]).
* npu_masked_softmax_with_rel_pos_bias(x, atten_mask, bias, scale_value):
  softmax(scale_value * x + atten_mask + relative_pos_bias, -1), x (B*W, N, S1, S2) or
  (B, W, N, S1, S2), the additive mask per window W, the bias per head N.
* npu_attention_update(lse[], out[], update_type): merges partial attentions:
  lse = max_i lse_i + log(sum_i exp(lse_i - max)), out = sum_i out_i * exp(lse_i - lse).
* npu_attn_softmax_(x): x <- softmax(x, -1) in place.
  npu_attn_softmax_backward_(self, grad_output, values): self holds softmax(x); it becomes
  the gradient w.r.t. x of softmax(x) @ values: self <- self * (g - sum(g * self, -1)),
  g = grad_output @ values^T.
* npu_masked_causal_conv1d_backward: the gradients of npu_masked_causal_conv1d.
* npu_nsa_compress / npu_nsa_compress_grad (Native Sparse Attention KV compression):
  per batch b of length S (actual_seq_len holds the cumulative lengths) the windows
  i = 0 .. floor((S - L) / d) (none when S < L) give
  out[i, n, :] = sum_{j<L} weight[j, n] * input[start_b + i*d + j, n, :].
* npu_fused_floyd_attention (+ _backward), q [B,H,N,M,D], k1/v1 [B,H,N,K,D], k2/v2 [B,H,K,M,D]:
  w = softmax(mask(scale * (q.k1 + q.k2)), over K), out = w.v1 + w.v2; softmax_max / sum
  [B,H,N,M,8] (the row max and the row sum of exp(x - max), repeated 8 times).

Low-precision inputs are computed in float32 and returned in their dtype (float64 stays
float64 for gradcheck).
"""
import torch

from torch_npu.op_plugin._common import acc, check
from torch_npu.op_plugin._registry import impl

__all__ = []

_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


# ---------------------------------------------------------------- interleave rope

@impl("npu_interleave_rope")
def npu_interleave_rope(x, cos, sin):
    """RoPE on the de-interleaved D axis of ``x`` [B, N, S, D]; cos/sin [B, 1, S or 1, D]."""
    op = "npu_interleave_rope"
    check(x.dim() == 4, op, "x must be 4-D [B, N, S, D], got %d-D" % x.dim())
    check(cos.dim() == 4 and sin.dim() == 4, op, "cos and sin must be 4-D [B, 1, S, D]")
    check(tuple(cos.shape) == tuple(sin.shape), op, "sin shape %s must equal cos shape %s"
          % (tuple(sin.shape), tuple(cos.shape)))
    check(cos.dtype == x.dtype and sin.dtype == x.dtype, op, "cos/sin dtype must equal x dtype %s" % x.dtype)
    b, _, s, d = x.shape
    check(d % 2 == 0, op, "D must be even, got %d" % d)
    check(cos.shape[0] == b and cos.shape[1] == 1 and cos.shape[2] in (1, s) and cos.shape[3] == d, op,
          "cos/sin must be [B=%d, 1, S=%d or 1, D=%d], got %s" % (b, s, d, tuple(cos.shape)))
    q = acc(x)
    q = q.reshape(*q.shape[:-1], d // 2, 2).transpose(-1, -2).reshape(q.shape)
    half = d // 2
    rotated = torch.cat((-q[..., half:], q[..., :half]), dim=-1)
    return (q * acc(cos) + rotated * acc(sin)).to(x.dtype)


# ---------------------------------------------------------------- masked softmax with relative position bias

def _as_5d(t, kind, op):
    """Mask (W, S1, S2) | (W, 1, S1, S2) | (1, W, 1, S1, S2) -> (1, W, 1, S1, S2);
    bias (N, S1, S2) | (1, N, S1, S2) | (1, 1, N, S1, S2) -> (1, 1, N, S1, S2)."""
    if kind == "mask":
        shapes = {3: lambda: t.unsqueeze(0).unsqueeze(2), 4: lambda: t.unsqueeze(0), 5: lambda: t}
    else:
        shapes = {3: lambda: t.unsqueeze(0).unsqueeze(0), 4: lambda: t.unsqueeze(0), 5: lambda: t}
    check(t.dim() in shapes, op, "%s must be 3-, 4- or 5-D, got %d-D" % (kind, t.dim()))
    return shapes[t.dim()]()


@impl("npu_masked_softmax_with_rel_pos_bias")
def npu_masked_softmax_with_rel_pos_bias(x, atten_mask, relative_pos_bias, scale_value=1.0, inner_precision_mode=0):
    """softmax(scale_value * x + atten_mask + relative_pos_bias, -1) in x's shape and dtype.
    ``inner_precision_mode`` only selects the hardware's internal precision; the emulator always
    computes in float32 (float64 for float64 inputs)."""
    op = "npu_masked_softmax_with_rel_pos_bias"
    check(x.dim() in (4, 5), op, "x must be 4-D (B*W, N, S1, S2) or 5-D (B, W, N, S1, S2), got %d-D" % x.dim())
    check(x.dtype in _FLOATS, op, "x dtype must be float32, float16 or bfloat16, got %s" % x.dtype)
    n, s1, s2 = x.shape[-3], x.shape[-2], x.shape[-1]
    bias = _as_5d(relative_pos_bias, "bias", op)
    check(tuple(bias.shape) == (1, 1, n, s1, s2), op, "relative_pos_bias must hold (N=%d, S1=%d, S2=%d), got %s"
          % (n, s1, s2, tuple(relative_pos_bias.shape)))
    if atten_mask is not None:
        mask = _as_5d(atten_mask, "mask", op)
        w = mask.shape[1]
        check(tuple(mask.shape) == (1, w, 1, s1, s2), op, "atten_mask must hold (W, S1=%d, S2=%d), got %s"
              % (s1, s2, tuple(atten_mask.shape)))
    else:
        mask, w = None, (x.shape[1] if x.dim() == 5 else 1)
    if x.dim() == 5:
        check(x.shape[1] == w, op, "x W dim %d must equal atten_mask W %d" % (x.shape[1], w))
        x5 = x
    else:
        check(x.shape[0] % w == 0, op, "x dim 0 (B*W = %d) must be a multiple of W = %d" % (x.shape[0], w))
        x5 = x.reshape(x.shape[0] // w, w, n, s1, s2)
    y = acc(x5) * scale_value + acc(bias)
    if mask is not None:
        y = y + acc(mask)
    return torch.softmax(y, dim=-1).to(x.dtype).reshape(x.shape)


# ---------------------------------------------------------------- attention update (lse merge)

@impl("npu_attention_update")
def npu_attention_update(lse, local_out, update_type):
    """Merge K partial attentions: lse_i [N] float32, out_i [N, H] -> (out [N, H] in out dtype,
    lse [N] float32). The merged lse is returned for update_type 0 too (update_type 1 asks for it)."""
    op = "npu_attention_update"
    check(len(lse) > 0 and len(lse) == len(local_out), op, "lse and local_out must be non-empty lists of the "
          "same length, got %d and %d" % (len(lse), len(local_out)))
    check(update_type in (0, 1), op, "update_type must be 0 or 1, got %s" % update_type)
    n, h = local_out[0].shape[0], local_out[0].shape[-1]
    out_dtype = local_out[0].dtype
    for i, (l_i, o_i) in enumerate(zip(lse, local_out)):
        check(l_i.dtype in (torch.float32, torch.float64), op, "lse[%d] must be float32, got %s" % (i, l_i.dtype))
        check(l_i.dim() == 1 and l_i.shape[0] == n, op, "lse[%d] must be [N=%d], got %s" % (i, n, tuple(l_i.shape)))
        check(o_i.dim() == 2 and tuple(o_i.shape) == (n, h), op, "local_out[%d] must be [N=%d, H=%d], got %s"
              % (i, n, h, tuple(o_i.shape)))
        check(o_i.dtype == out_dtype, op, "local_out[%d] dtype %s differs from %s" % (i, o_i.dtype, out_dtype))
    lses = torch.stack([acc(t) for t in lse])
    outs = torch.stack([acc(t) for t in local_out])
    top = lses.amax(dim=0)
    merged = top + torch.log(torch.exp(lses - top).sum(dim=0))
    out = (outs * torch.exp(lses - merged).unsqueeze(-1)).sum(dim=0)
    return out.to(out_dtype), merged.to(lse[0].dtype)


# ---------------------------------------------------------------- in-place attention softmax

@impl("npu_attn_softmax_")
def npu_attn_softmax_(self):
    """self <- softmax(self, -1); returns self."""
    check(self.dtype in _FLOATS, "npu_attn_softmax_", "self must be a floating tensor, got %s" % self.dtype)
    return self.copy_(torch.softmax(acc(self), dim=-1))


@impl("npu_attn_softmax_backward_")
def npu_attn_softmax_backward_(self, grad_output, values):
    """self (= softmax(x)) <- d/dx of softmax(x) @ values for ``grad_output``; returns self."""
    op = "npu_attn_softmax_backward_"
    check(self.dim() >= 2 and values.dim() == self.dim() and grad_output.dim() == self.dim(), op,
          "self, grad_output and values must have the same rank >= 2")
    check(values.shape[-2] == self.shape[-1], op, "values dim -2 (%d) must equal self dim -1 (%d)"
          % (values.shape[-2], self.shape[-1]))
    check(grad_output.shape[-1] == values.shape[-1] and grad_output.shape[-2] == self.shape[-2], op,
          "grad_output must be [..., %d, %d], got %s" % (self.shape[-2], values.shape[-1], tuple(grad_output.shape)))
    y = acc(self)
    g = torch.matmul(acc(grad_output), acc(values).transpose(-2, -1))
    return self.copy_(y * (g - (g * y).sum(-1, keepdim=True)))


# ---------------------------------------------------------------- masked causal conv1d backward

@impl("npu_masked_causal_conv1d_backward")
def npu_masked_causal_conv1d_backward(grad_output, input, weight, *, mask=None):
    """Gradients (grad_input [S, B, H] in input's dtype, grad_weight [W, H] in weight's dtype) of
    output[s] = sum_k weight[k] * input[s - (W-1-k)] (zeros before s = 0), rows with mask False zero."""
    op = "npu_masked_causal_conv1d_backward"
    check(input.dim() == 3, op, "input must be 3-D [S, B, H], got %d-D" % input.dim())
    check(weight.dim() == 2 and weight.shape[0] == 3 and weight.shape[1] == input.shape[2], op,
          "weight must be [W=3, H=%d], got %s" % (input.shape[2], tuple(weight.shape)))
    check(tuple(grad_output.shape) == tuple(input.shape), op, "grad_output shape %s must equal input shape %s"
          % (tuple(grad_output.shape), tuple(input.shape)))
    s, b = input.shape[0], input.shape[1]
    g = acc(grad_output)
    if mask is not None:
        check(mask.dtype == torch.bool and tuple(mask.shape) == (b, s), op,
              "mask must be bool [B=%d, S=%d], got %s %s" % (b, s, mask.dtype, tuple(mask.shape)))
        g = g.masked_fill(~mask.t().unsqueeze(-1), 0)
    width = weight.shape[0]
    x, w = acc(input), acc(weight)
    padded = torch.nn.functional.pad(x, (0, 0, 0, 0, width - 1, 0))
    grad_w = torch.stack([(g * padded[k:k + s]).sum((0, 1)) for k in range(width)])
    # input row t feeds output row t + (W-1-k) through weight[k]
    g_padded = torch.nn.functional.pad(g, (0, 0, 0, 0, 0, width - 1))
    grad_x = g_padded[width - 1:width - 1 + s] * w[0]
    for k in range(1, width):
        grad_x = grad_x + g_padded[width - 1 - k:width - 1 - k + s] * w[k]
    return grad_x.to(input.dtype), grad_w.to(weight.dtype)


# ---------------------------------------------------------------- NSA compress

def _nsa_windows(op, total, block, stride, actual_seq_len):
    """Start row of every compression window, from the cumulative lengths (host ints)."""
    check(actual_seq_len is not None and len(actual_seq_len) > 0, op, "actual_seq_len is required")
    check(block > 0 and stride > 0, op, "compress_block_size and compress_stride must be positive")
    check(int(actual_seq_len[-1]) == total, op, "actual_seq_len[-1] (%d) must equal input.shape[0] (%d)"
          % (int(actual_seq_len[-1]), total))
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
    check(input.dim() == 3, op, "input must be 3-D [T, N, D], got %d-D" % input.dim())
    check(input.dtype in (torch.float16, torch.bfloat16, torch.float64), op,
          "input dtype must be float16 or bfloat16, got %s" % input.dtype)
    check(weight.dtype == input.dtype, op, "weight dtype %s must equal input dtype %s" % (weight.dtype, input.dtype))
    check(weight.dim() == 2 and tuple(weight.shape) == (block, input.shape[1]), op,
          "weight must be [compress_block_size=%d, N=%d], got %s" % (block, input.shape[1], tuple(weight.shape)))
    check(input.shape[1] <= 128, op, "N must be <= 128, got %d" % input.shape[1])
    check(input.shape[2] % 16 == 0 and input.shape[2] <= 256, op,
          "D must be a multiple of 16 and <= 256, got %d" % input.shape[2])
    check(block % 16 == 0 and block <= 128, op,
          "compress_block_size must be a multiple of 16 and <= 128, got %d" % block)
    check(stride % 16 == 0 and 0 < stride <= block, op,
          "compress_stride must be a multiple of 16 and <= compress_block_size, got %d" % stride)


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
    check(tuple(grad.shape) == (r, input.shape[1], input.shape[2]), op, "grad must be [%d, %d, %d], got %s"
          % (r, input.shape[1], input.shape[2], tuple(grad.shape)))
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
          "input must be the paged KV [block_num, page_block_size=%d, N, D], got %s"
          % (page_block_size, tuple(input.shape)))
    n, d = input.shape[2], input.shape[3]
    block = compress_block_size
    check(weight.dim() == 2 and tuple(weight.shape) == (block, n), op, "weight must be [compress_block_size=%d, N=%d]"
          % (block, n))
    check(block > 0 and compress_stride > 0, op, "compress_block_size and compress_stride must be positive")
    check(block_table is not None and block_table.dim() == 2, op, "block_table [B, max_blocks] is required")
    check(actual_seq_len is not None and len(actual_seq_len) == slot_mapping.shape[0] == block_table.shape[0], op,
          "actual_seq_len, slot_mapping and block_table must have one entry per batch")
    check(cache.dim() == 3 and tuple(cache.shape[1:]) == (n, d), op, "cache must be [slots, N=%d, D=%d]" % (n, d))
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

def _floyd_check(op, q, k1, v1, k2, v2, atten_mask):
    for name, t in (("query_ik", q), ("key_ij", k1), ("value_ij", v1), ("key_jk", k2), ("value_jk", v2)):
        check(t.dim() == 5, op, "%s must be 5-D, got %d-D" % (name, t.dim()))
        check(t.dtype == q.dtype, op, "%s dtype %s must equal query_ik dtype %s" % (name, t.dtype, q.dtype))
    check(q.dtype in (torch.float16, torch.bfloat16, torch.float64), op,
          "dtype must be float16 or bfloat16, got %s" % q.dtype)
    b, h, n, m, d = q.shape
    kk = k1.shape[3]
    check(tuple(k1.shape) == (b, h, n, kk, d) and tuple(v1.shape) == tuple(k1.shape), op,
          "key_ij / value_ij must be [B, H, N, K, D] = [%d, %d, %d, K, %d]" % (b, h, n, d))
    check(tuple(k2.shape) == (b, h, kk, m, d) and tuple(v2.shape) == tuple(k2.shape), op,
          "key_jk / value_jk must be [B, H, K, M, D] = [%d, %d, %d, %d, %d]" % (b, h, kk, m, d))
    if atten_mask is not None:
        check(atten_mask.dtype in (torch.bool, torch.uint8), op, "atten_mask must be bool or uint8")
        check(tuple(atten_mask.shape) == (b, 1, n, 1, kk), op, "atten_mask must be [B, 1, N, 1, K] = %s, got %s"
              % ((b, 1, n, 1, kk), tuple(atten_mask.shape)))


def _floyd_logits(q, k1, k2, atten_mask, scale):
    q, k1, k2 = acc(q), acc(k1), acc(k2)
    x = scale * (torch.einsum("bhnmd,bhnkd->bhnmk", q, k1) + torch.einsum("bhnmd,bhkmd->bhnmk", q, k2))
    if atten_mask is not None:
        x = x.masked_fill(atten_mask.bool(), float("-inf"))
    return x


@impl("npu_fused_floyd_attention")
def npu_fused_floyd_attention(query_ik, key_ij, value_ij, key_jk, value_jk, *, atten_mask=None, scale_value=1.):
    """-> (softmax_max [B,H,N,M,8] float32, softmax_sum [B,H,N,M,8] float32, attention_out like query_ik)."""
    op = "npu_fused_floyd_attention"
    _floyd_check(op, query_ik, key_ij, value_ij, key_jk, value_jk, atten_mask)
    x = _floyd_logits(query_ik, key_ij, key_jk, atten_mask, scale_value)
    row_max = x.amax(-1, keepdim=True)
    e = torch.exp(x - row_max)
    row_sum = e.sum(-1, keepdim=True)
    w = e / row_sum
    out = torch.einsum("bhnmk,bhnkd->bhnmd", w, acc(value_ij)) + torch.einsum("bhnmk,bhkmd->bhnmd", w, acc(value_jk))
    stat = torch.float64 if query_ik.dtype == torch.float64 else torch.float32
    shape8 = tuple(query_ik.shape[:4]) + (8,)
    return (row_max.to(stat).expand(shape8).contiguous(), row_sum.to(stat).expand(shape8).contiguous(),
            out.to(query_ik.dtype))


@impl("npu_fused_floyd_attention_backward")
def npu_fused_floyd_attention_backward(grad_output, query_ik, key_ij, value_ij, key_jk, value_jk, attention_out,
                                       softmax_max, softmax_sum, *, atten_mask=None, scale_value=1.):
    """Gradients (dquery, dkey_ij, dvalue_ij, dkey_jk, dvalue_jk) of npu_fused_floyd_attention; the
    probabilities are rebuilt from softmax_max / softmax_sum as the kernel does."""
    op = "npu_fused_floyd_attention_backward"
    _floyd_check(op, query_ik, key_ij, value_ij, key_jk, value_jk, atten_mask)
    shape8 = tuple(query_ik.shape[:4]) + (8,)
    check(tuple(softmax_max.shape) == shape8 and tuple(softmax_sum.shape) == shape8, op,
          "softmax_max / softmax_sum must be %s" % (shape8,))
    check(tuple(grad_output.shape) == tuple(query_ik.shape) and tuple(attention_out.shape) == tuple(query_ik.shape),
          op, "grad_output / attention_out must be shaped like query_ik")
    x = _floyd_logits(query_ik, key_ij, key_jk, atten_mask, scale_value)
    cdt = x.dtype
    p = torch.exp(x - softmax_max[..., :1].to(cdt)) / softmax_sum[..., :1].to(cdt)
    g = acc(grad_output)
    v1, v2 = acc(value_ij), acc(value_jk)
    dp = torch.einsum("bhnmd,bhnkd->bhnmk", g, v1) + torch.einsum("bhnmd,bhkmd->bhnmk", g, v2)
    delta = (g * acc(attention_out)).sum(-1, keepdim=True)
    ds = p * (dp - delta) * scale_value
    q, k1, k2 = acc(query_ik), acc(key_ij), acc(key_jk)
    dq = torch.einsum("bhnmk,bhnkd->bhnmd", ds, k1) + torch.einsum("bhnmk,bhkmd->bhnmd", ds, k2)
    dk1 = torch.einsum("bhnmk,bhnmd->bhnkd", ds, q)
    dk2 = torch.einsum("bhnmk,bhnmd->bhkmd", ds, q)
    dv1 = torch.einsum("bhnmk,bhnmd->bhnkd", p, g)
    dv2 = torch.einsum("bhnmk,bhnmd->bhkmd", p, g)
    dt = query_ik.dtype
    return dq.to(dt), dk1.to(dt), dv1.to(dt), dk2.to(dt), dv2.to(dt)


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
          "dtype must be float16 or bfloat16, got %s" % query.dtype)
    t1, n1, d1 = query.shape
    t2, n2, d2 = value.shape
    check(n1 == head_num, op, "query N (%d) must equal head_num (%d)" % (n1, head_num))
    check(tuple(key.shape) == (t2, n2, d1), op, "key must be [T2=%d, N2=%d, D1=%d], got %s"
          % (t2, n2, d1, tuple(key.shape)))
    check(n1 % n2 == 0, op, "query heads (%d) must be a multiple of key heads (%d)" % (n1, n2))
    check(d1 >= d2, op, "query/key D (%d) must be >= value D (%d)" % (d1, d2))
    check(topk_indices.dtype == torch.int32 and tuple(topk_indices.shape) == (t1, n2, count), op,
          "topk_indices must be int32 [T1=%d, N2=%d, select_block_count=%d], got %s %s"
          % (t1, n2, count, topk_indices.dtype, tuple(topk_indices.shape)))
    check(actual_seq_qlen is not None and actual_seq_kvlen is not None, op,
          "actual_seq_qlen and actual_seq_kvlen are required")
    check(len(actual_seq_qlen) == len(actual_seq_kvlen), op, "actual_seq_qlen and actual_seq_kvlen lengths differ")
    check(int(actual_seq_qlen[-1]) == t1 and int(actual_seq_kvlen[-1]) == t2, op,
          "the last cumulative lengths must equal T1 (%d) and T2 (%d)" % (t1, t2))
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
          "grad / attention_out must be [T1=%d, N1=%d, D2=%d]" % (t1, n1, d2))
    check(tuple(softmax_max.shape) == (t1, n1, 8) and tuple(softmax_sum.shape) == (t1, n1, 8), op,
          "softmax_max / softmax_sum must be [T1=%d, N1=%d, 8]" % (t1, n1))
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
          "dtype must be float16 or bfloat16, got %s" % query.dtype)
    t1, n1, d1 = query.shape
    t2, n2, d2 = value.shape
    check(n1 == head_num and n1 % n2 == 0, op, "query heads (%d) must equal head_num (%d) and be a multiple of key "
          "heads (%d)" % (n1, head_num, n2))
    check(tuple(key.shape) == (t2, n2, d1) and d1 >= d2, op, "key must be [T2, N2, D1] with D1 >= value D")
    for name, size in (("compress_block_size", compress_block_size), ("compress_stride", compress_stride),
                       ("select_block_size", select_block_size)):
        check(size > 0 and size % 16 == 0, op, "%s must be a positive multiple of 16, got %d" % (name, size))
    check(compress_block_size >= compress_stride, op, "compress_block_size must be >= compress_stride")
    check(select_block_size % compress_stride == 0 and compress_block_size % compress_stride == 0, op,
          "select_block_size and compress_block_size must be multiples of compress_stride")
    lists = (actual_seq_qlen, actual_cmp_seq_kvlen, actual_sel_seq_kvlen)
    check(all(x is not None for x in lists) and len(set(len(x) for x in lists)) == 1, op,
          "actual_seq_qlen, actual_cmp_seq_kvlen and actual_sel_seq_kvlen are required, one entry per batch")
    check(int(actual_seq_qlen[-1]) == t1 and int(actual_cmp_seq_kvlen[-1]) == t2, op,
          "the last cumulative lengths must equal T1 (%d) and T2 (%d)" % (t1, t2))
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
