"""The FlashAttention engine behind npu_fusion_attention(_v2) and their grad ops.

Work is split into *segments* (the whole batch of a fixed-length call, or one batch of a
TND varlen call) and each segment into blocks of query rows, so at most one block of
logits ``[b, N, rows, S2]`` (about ``CHUNK_ELEMENTS`` values, a few temporaries of that
size) exists at a time, whatever S1 and S2 are: never more than PyTorch's own SDPA math
path, which holds the whole [B, N, S1, S2] score matrix and its softmax. The forward
keeps only the output and the per-row log-sum-exp; the backward recomputes each block's
probabilities from them (as the NPU kernel does from softmax_max / softmax_sum) and
regenerates the dropout keep mask from (seed, offset).

Formula (query row i, key j, head n, key/value head ``n // (N / N_kv)``)::

    x = scale * (q k^T + pse)            pse_type 1 (npu_fusion_attention)
    x = scale * q k^T + pse              pse_type 0 (npu_fusion_attention_v2)
    x[masked] = -inf;  p = softmax(x);   out = (p * keep / keep_prob) @ v

A row whose keys are all masked outputs zeros (and zero gradients).
Computed in float32 for float16/bfloat16 inputs, in float64 for float64.
"""
import torch

from torch_npu.op_plugin._common import acc, check
from torch_npu.op_plugin.attention.dropout_mask import BLOCK_ROWS, keep_rows
from torch_npu.op_plugin.attention.masks import SegmentMask

__all__ = []

# logits per block (float32: 64 MiB); blocks are whole multiples of the dropout block
CHUNK_ELEMENTS = 1 << 24


def to_bnsd(op, x, layout, head_dim, what):
    """``x`` in ``layout`` (BSH / SBH / BSND / BNSD) -> a [B, N, S, D] view (N derived from
    the last dim for BSH/SBH)."""
    if layout in ("BSH", "SBH"):
        check(x.dim() == 3, op, "%s must be 3-D for layout %s, got %d-D", (what, layout, x.dim()))
        h = x.shape[2]
        check(h % head_dim == 0, op, "%s hidden size %d is not a multiple of the head dim %d", (what, h, head_dim))
        if layout == "BSH":
            b, s = x.shape[0], x.shape[1]
            return x.view(b, s, h // head_dim, head_dim).transpose(1, 2)
        s, b = x.shape[0], x.shape[1]
        return x.view(s, b, h // head_dim, head_dim).permute(1, 2, 0, 3)
    check(x.dim() == 4, op, "%s must be 4-D for layout %s, got %d-D", (what, layout, x.dim()))
    check(x.shape[3] == head_dim, op, "%s head dim %d differs from the query's %d", (what, x.shape[3], head_dim))
    return x.transpose(1, 2) if layout == "BSND" else x


def from_bnsd(x, layout):
    """[B, N, S, D] -> a contiguous tensor in ``layout``."""
    b, n, s, d = x.shape
    if layout == "BSH":
        return x.transpose(1, 2).reshape(b, s, n * d)
    if layout == "SBH":
        return x.permute(2, 0, 1, 3).reshape(s, b, n * d)
    if layout == "BSND":
        return x.transpose(1, 2).contiguous()
    return x.contiguous()


class Segment:
    """One independent attention problem: q [b, N, S1, D], k/v [b, N_kv, S2, D] (views),
    ``pse`` broadcastable to [b, N, S1, S2] (4-D) or None, ``mask`` an
    attention.masks.SegmentMask, ``index`` its dropout stream id."""

    def __init__(self, q, k, v, pse, mask, index):
        self.q, self.k, self.v, self.pse, self.mask, self.index = q, k, v, pse, mask, index


class Dropout:
    def __init__(self, keep_prob, seed, offset):
        self.keep_prob, self.seed, self.offset = keep_prob, seed, offset

    def keep(self, seg, i0, i1, like):
        b, n = seg.q.shape[0], seg.q.shape[1]
        return keep_rows(self.seed, self.offset, seg.index, i0, i1, (b, n), seg.k.shape[2], self.keep_prob, like)


def _rows_per_block(b, n, s1, s2):
    rows = CHUNK_ELEMENTS // max(1, b * n * s2)
    return min(max(BLOCK_ROWS, rows // BLOCK_ROWS * BLOCK_ROWS), max(s1, 1))


def _grouped(x, n_kv):
    """[b, N, r, c] -> [b, N_kv, G * r, c]: query heads of one key/value head side by side."""
    b, n, r, c = x.shape
    return x.reshape(b, n_kv, (n // n_kv) * r, c)


def _logits(seg, i0, i1, scale, pse_type, dtype):
    q = acc(seg.q[:, :, i0:i1]).to(dtype)
    k = acc(seg.k).to(dtype)
    b, n, r, _ = q.shape
    n_kv, s2 = k.shape[1], k.shape[2]
    x = torch.matmul(_grouped(q, n_kv), k.transpose(-1, -2)).view(b, n, r, s2)
    if seg.pse is not None:
        p = seg.pse if seg.pse.shape[-2] == 1 else seg.pse[..., i0:i1, :]
        p = acc(p).to(dtype)
        if pse_type == 1:
            x.add_(p).mul_(scale)
        else:
            x.mul_(scale).add_(p)
    else:
        x.mul_(scale)
    m = seg.mask.rows(i0, i1, x.device)
    if m is not None:
        x.masked_fill_(m, float("-inf"))
    return x


def _sdpa_causal(seg, dropout, scale):
    """Whether ATen's CPU flash-attention kernel computes ``seg`` exactly as the formula
    above: None when it cannot (pse, dropout, empty sides, a mask other than none or
    top-left causal, Dv != D, causal with scale <= 0: that kernel's causal path returns
    NaN then), else its ``is_causal`` flag. No row is fully masked then."""
    if seg.pse is not None or dropout is not None:
        return None
    s1, s2 = seg.q.shape[2], seg.k.shape[2]
    if s1 == 0 or s2 == 0 or seg.v.shape[3] != seg.q.shape[3]:
        return None
    mask = seg.mask
    if not isinstance(mask, SegmentMask):
        return None  # another op's mask rule (block-sparse blocks): only the general path knows it
    if mask.user is None:
        return False  # no atten_mask: full computation whatever sparse_mode says
    if mask.mode == 2 or (mask.mode == 3 and s1 == s2):
        return True if scale > 0 else None  # j > i masked: SDPA's is_causal (top-left aligned)
    return None


_CAUSAL_ROWS = 128  # smallest row block of the causal row max (fewer blocks: fewer ops)


def _in(t, dtype):
    return t if t.dtype == dtype else t.to(dtype)


def _sdpa_inputs(seg, dtype):
    """q, k, v in ``dtype``. Key/value keep their own head count: the CPU flash kernel
    takes grouped-query attention as is (each query head reads key/value head
    ``h // (N // N_kv)``) and sums a key/value head's gradient over its query heads."""
    return _in(seg.q, dtype), _in(seg.k, dtype), _in(seg.v, dtype)


def _row_max(q, k, scale, causal):
    """softmax_max: the row max of the scaled logits (j > i masked when ``causal``), block by
    block; k may have fewer heads than q (GQA). For scale > 0, max(scale * x) is
    scale * max(x) exactly (rounding is monotone), which saves a pass over the logits. A zero
    max is +0 (its sign would depend on the order amax reduces in), as in the C++ path
    (aten/FusionAttentionSdpa.cpp), whose direct loop gives these bits."""
    b, n, s1, _ = q.shape
    n_kv, s2 = k.shape[1], k.shape[2]
    kt = k.transpose(-1, -2)
    rows = _rows_per_block(b, n, s1, s2)
    if causal:  # row block [i0, i1) sees keys [0, i1) only: eighths skip about half the products
        rows = min(rows, max(_CAUSAL_ROWS, -(-s1 // 8)))
    parts = []
    for i0 in range(0, s1, rows):
        i1 = min(s1, i0 + rows)
        cols = min(s2, i1) if causal else s2
        x = torch.matmul(_grouped(q[:, :, i0:i1], n_kv), kt[..., :cols]).view(b, n, i1 - i0, cols)
        if scale <= 0:
            x.mul_(scale)
        if causal:  # j > i to -inf (a NaN logit there does not reach the max)
            x.masked_fill_(torch.ones(i1 - i0, cols, dtype=torch.bool, device=x.device).triu_(i0 + 1),
                           float("-inf"))
        parts.append(x.amax(-1))
    m = parts[0] if len(parts) == 1 else torch.cat(parts, dim=2)
    return (m.mul_(scale) if scale > 0 else m).add_(0.0)


def sdpa_attention(seg, scale, causal, dtype):
    """``seg`` through ATen's CPU flash kernel: (out [b, N, S1, Dv], row max, row sum of
    exp(x - max), lse [b, N, S1]). Under autograd, gradients flow to seg.q/k/v through the
    kernel's own derivative (which, for GQA, sums a key/value head's gradient over its
    query heads); the statistics carry none. For the calls _sdpa_causal
    accepts."""
    q, k, v = _sdpa_inputs(seg, dtype)
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal, scale=scale)
    with torch.no_grad():
        row_max = _row_max(q.detach(), k.detach(), scale, causal)
        # sum_j exp(x_j - max) = exp(lse - max): no row is fully masked on this path
        row_sum = torch.exp(lse - row_max)
    return out, row_max, row_sum, lse


def _sdpa_forward(seg, scale, causal, dtype):
    out, row_max, row_sum, lse = sdpa_attention(seg, scale, causal, dtype)
    return out, row_max, row_sum, lse.unsqueeze(-1)


# Below this many logits a dropout call runs as one block of differentiable ATen ops
# (small_dropout_attention): per-op cost dominates there, not memory.
SMALL_ELEMENTS = 1 << 20


def small_dropout_attention(seg, scale, dropout, dtype):
    """A small call with dropout and no pse / a mask SDPA can express (_sdpa_causal not
    None): the forward formula of ``forward`` in one block, written with out-of-place ops
    so that autograd differentiates it (the keep mask is kept by autograd instead of being
    regenerated). The same ops in the same order as the blocked engine, so the results
    are the same. -> (out [b, N, S1, Dv], row max, row sum), stats without grad."""
    b, n, s1, _ = seg.q.shape
    n_kv, s2, dv = seg.v.shape[1], seg.v.shape[2], seg.v.shape[3]
    q, k, v = acc(seg.q).to(dtype), acc(seg.k).to(dtype), acc(seg.v).to(dtype)
    x = torch.matmul(_grouped(q, n_kv), k.transpose(-1, -2)).view(b, n, s1, s2) * scale
    m = seg.mask.rows(0, s1, x.device)
    if m is not None:
        x = x.masked_fill(m, float("-inf"))
    row_max = x.detach().amax(-1, keepdim=True)  # no row is fully masked on this path
    e = torch.exp(x - row_max)
    total = e.sum(-1, keepdim=True)
    p = e / total
    p = p.masked_fill(~dropout.keep(seg, 0, s1, p), 0.0) * (1.0 / dropout.keep_prob)
    out = torch.matmul(_grouped(p, n_kv), v).view(b, n, s1, dv)
    return out, row_max.squeeze(-1), total.detach().squeeze(-1)


def _sdpa_backward(seg, scale, causal, dtype, out, lse, dout):
    q, k, v = _sdpa_inputs(seg, dtype)
    dq, dk, dv = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
        dout, q, k, v, out, lse.squeeze(-1), 0.0, causal, scale=scale)
    return dq, dk, dv, None


def forward(seg, scale, pse_type, dropout, dtype):
    """-> (out [b, N, S1, Dv], row max [b, N, S1], row sum of exp(x - max) [b, N, S1],
    lse [b, N, S1, 1]) in ``dtype``; fully masked rows: out 0, max -inf, sum 0, lse +inf.
    What ATen's CPU flash kernel can express (no pse, no dropout, no mask or top-left
    causal) runs there; the rest on the blocked composition below."""
    causal = _sdpa_causal(seg, dropout, scale)
    if causal is not None:
        return _sdpa_forward(seg, scale, causal, dtype)
    b, n, s1, _ = seg.q.shape
    n_kv, s2, dv = seg.v.shape[1], seg.v.shape[2], seg.v.shape[3]
    dev = seg.q.device
    out = torch.zeros(b, n, s1, dv, dtype=dtype, device=dev)
    row_max = torch.full((b, n, s1), float("-inf"), dtype=dtype, device=dev)
    row_sum = torch.zeros(b, n, s1, dtype=dtype, device=dev)
    if s1 == 0 or s2 == 0:
        return out, row_max, row_sum, torch.full((b, n, s1, 1), float("inf"), dtype=dtype, device=dev)
    v = acc(seg.v).to(dtype)
    rows = _rows_per_block(b, n, s1, s2)
    for i0 in range(0, s1, rows):
        i1 = min(s1, i0 + rows)
        x = _logits(seg, i0, i1, scale, pse_type, dtype)
        m = x.amax(-1, keepdim=True)
        dead = torch.isneginf(m)
        safe = m.masked_fill(dead, 0.0)
        x.sub_(safe).exp_()
        total = x.sum(-1, keepdim=True)
        x.div_(total.masked_fill(dead, 1.0))
        if dropout is not None:
            x.masked_fill_(~dropout.keep(seg, i0, i1, x), 0.0).mul_(1.0 / dropout.keep_prob)
        out[:, :, i0:i1] = torch.matmul(_grouped(x, n_kv), v).view(b, n, i1 - i0, dv)
        row_max[:, :, i0:i1] = m.squeeze(-1)
        row_sum[:, :, i0:i1] = total.squeeze(-1)
    lse = torch.where(torch.isneginf(row_max), torch.full_like(row_max, float("inf")),
                      row_max + torch.log(row_sum)).unsqueeze(-1)
    return out, row_max, row_sum, lse


def backward(seg, scale, pse_type, dropout, dtype, out, lse, dout, want_dpse):
    """Gradients of one segment for upstream ``dout`` [b, N, S1, Dv]: (dq [b, N, S1, D],
    dk, dv [b, N_kv, S2, D], dpse shaped like seg.pse or None) in ``dtype``."""
    causal = _sdpa_causal(seg, dropout, scale)
    if causal is not None:
        return _sdpa_backward(seg, scale, causal, dtype, out, lse, dout)
    b, n, s1, d = seg.q.shape
    n_kv, s2, dvd = seg.v.shape[1], seg.v.shape[2], seg.v.shape[3]
    dev = seg.q.device
    dq = torch.zeros(b, n, s1, d, dtype=dtype, device=dev)
    dk = torch.zeros(b, n_kv, s2, d, dtype=dtype, device=dev)
    dv = torch.zeros(b, n_kv, s2, dvd, dtype=dtype, device=dev)
    dpse = torch.zeros(seg.pse.shape, dtype=dtype, device=dev) if (want_dpse and seg.pse is not None) else None
    if s1 == 0 or s2 == 0:
        return dq, dk, dv, dpse
    k, v = acc(seg.k).to(dtype), acc(seg.v).to(dtype)
    rows = _rows_per_block(b, n, s1, s2)
    for i0 in range(0, s1, rows):
        i1 = min(s1, i0 + rows)
        r = i1 - i0
        go = dout[:, :, i0:i1]
        p = _logits(seg, i0, i1, scale, pse_type, dtype).sub_(lse[:, :, i0:i1]).exp_()
        dp = torch.matmul(_grouped(go, n_kv), v.transpose(-1, -2)).view(b, n, r, s2)
        if dropout is not None:
            kept = dropout.keep(seg, i0, i1, p).to(dtype).mul_(1.0 / dropout.keep_prob)
            dp.mul_(kept)
            used = kept.mul_(p)
        else:
            used = p
        dv += torch.matmul(_grouped(used, n_kv).transpose(-1, -2), _grouped(go, n_kv))
        del used
        delta = (go * out[:, :, i0:i1]).sum(-1, keepdim=True)
        ds = p.mul_(dp.sub_(delta))  # d loss / d x
        del dp
        if dpse is not None:
            g = ds * scale if pse_type == 1 else ds
            # sum over the dims pse broadcasts along (batch, heads, and rows for [.., 1, S2])
            dims = [i for i in range(3) if seg.pse.shape[i] == 1 and g.shape[i] != 1]
            g = g.sum(dims, keepdim=True) if dims else g
            if seg.pse.shape[-2] == 1:
                dpse += g
            else:
                dpse[..., i0:i1, :] += g
        ds.mul_(scale)
        dq[:, :, i0:i1] = torch.matmul(_grouped(ds, n_kv), k).view(b, n, r, d)
        q = acc(seg.q[:, :, i0:i1]).to(dtype)
        dk += torch.matmul(_grouped(ds, n_kv).transpose(-1, -2), _grouped(q, n_kv))
    return dq, dk, dv, dpse
