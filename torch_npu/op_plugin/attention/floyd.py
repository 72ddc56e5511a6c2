"""npu_fused_floyd_attention (+ _backward), q [B,H,N,M,D], k1/v1 [B,H,N,K,D], k2/v2 [B,H,K,M,D]:

    w = softmax(mask(scale * (q.k1 + q.k2)), over K),   out = w.v1 + w.v2

softmax_max / softmax_sum [B,H,N,M,8] (the row max and the row sum of exp(x - max), repeated
8 times). The backward returns the gradients of q, k1, v1, k2, v2. Low-precision inputs are
computed in float32 and returned in their dtype (float64 stays float64 for gradcheck).
"""
import torch

from torch_npu.op_plugin._common import acc, check
from torch_npu.op_plugin._registry import impl

__all__ = []


def _floyd_check(op, q, k1, v1, k2, v2, atten_mask):
    for name, t in (("query_ik", q), ("key_ij", k1), ("value_ij", v1), ("key_jk", k2), ("value_jk", v2)):
        check(t.dim() == 5, op, "%s must be 5-D, got %d-D", (name, t.dim()))
        check(t.dtype == q.dtype, op, "%s dtype %s must equal query_ik dtype %s", (name, t.dtype, q.dtype))
    check(q.dtype in (torch.float16, torch.bfloat16, torch.float64), op,
          "dtype must be float16 or bfloat16, got %s", q.dtype)
    b, h, n, m, d = q.shape
    kk = k1.shape[3]
    check(tuple(k1.shape) == (b, h, n, kk, d) and tuple(v1.shape) == tuple(k1.shape), op,
          "key_ij / value_ij must be [B, H, N, K, D] = [%d, %d, %d, K, %d]", (b, h, n, d))
    check(tuple(k2.shape) == (b, h, kk, m, d) and tuple(v2.shape) == tuple(k2.shape), op,
          "key_jk / value_jk must be [B, H, K, M, D] = [%d, %d, %d, %d, %d]", (b, h, kk, m, d))
    if atten_mask is not None:
        check(atten_mask.dtype in (torch.bool, torch.uint8), op, "atten_mask must be bool or uint8")
        check(tuple(atten_mask.shape) == (b, 1, n, 1, kk), op, "atten_mask must be [B, 1, N, 1, K] = %s, got %s", ((b, 1, n, 1, kk), tuple(atten_mask.shape)))


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
          "softmax_max / softmax_sum must be %s", (shape8,))
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
