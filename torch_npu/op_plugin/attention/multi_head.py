"""npu_multi_head_attention and npu_multi_head_attention_backward.

* ``npu_multi_head_attention``: the torch_npu test's reference: linear projections
  (``x @ W^T + b``), ``q * D^-0.5``, (B, N, S, D) heads, ``q @ k^T + attn_mask``, float32
  softmax, dropout with the bit-packed mask of ``_npu_dropout`` (or the given one), ``@ v``,
  (B*T, N*D) context, output projection. Returns (y, dropout_mask, q, k, v, scores, probs,
  context). Masks are drawn from the generator of the input's device; the bits are not the
  NPU's Philox stream.
* ``npu_multi_head_attention_backward``: torch_npu's autograd passes the forward's saved
  results back as (query_res, key_res, value_res, attn_scores, attn_res, context) with
  ``y_grad``; the op returns (dWq, dWk, dWv, dWout, d_query, d_key, d_value, dbq, dbk, dbv,
  dbout), weights (E, E), inputs as given, bias gradients (1, E) (op-plugin's shapes). A bias
  that is absent gets the gradient it would have had (the kernel leaves that output unwritten).

Computed in float32 (float64 stays float64), returned in the matching input's dtype.
"""
import torch

from torch_npu.op_plugin._common import acc, check, unsupported
from torch_npu.op_plugin._registry import impl
from torch_npu.op_plugin.attention.fused_score import _apply_keep
from torch_npu.op_plugin.training.dropout import _gen_keep, _pack, _unpack

__all__ = []


def _linear(x, w, b):
    y = x @ w.transpose(0, 1)
    return y if b is None else y + acc(b)


@impl("npu_multi_head_attention")
def npu_multi_head_attention(query, key, value, query_weight, key_weight, value_weight, attn_mask,
                             out_proj_weight, query_bias, key_bias, value_bias, out_proj_bias, dropout_mask,
                             attn_head_num, attn_dim_per_head, src_len, tgt_len, dropout_prob,
                             softmax_use_float):
    """Multi-head attention of a Transformer layer. ``query`` (B*tgt_len, E), ``key``/``value``
    (B*src_len, E), weights (E, E) with E = heads * dim, biases (E,) or None,
    ``attn_mask`` broadcast to (B, heads, tgt_len, src_len):

    ``q = (query @ Wq^T + bq) * dim^-0.5``, ``k``, ``v`` likewise unscaled, each as
    (B, heads, len, dim); ``scores = softmax(q @ k^T + attn_mask)`` in float32;
    ``probs = dropout(scores)`` (bit-packed keep mask of ``_npu_dropout``: the given
    ``dropout_mask``, else a fresh one; drop probability ``dropout_prob``);
    ``context = probs @ v`` as (B*tgt_len, E); ``y = context @ Wout^T + bout``.

    Returns ``(y, dropout_mask, q, k, v, scores, probs, context)``; ``scores`` is float32 with
    ``softmax_use_float`` (else the input dtype). The lengths, heads and dim must be positive
    multiples of 16 (as torch_npu checks). Differentiable."""
    op = "npu_multi_head_attention"
    check(tgt_len > 0 and src_len > 0 and attn_head_num > 0 and attn_dim_per_head > 0, op,
          "tgt_len, src_len, attn_head_num, attn_dim_per_head should not equal zero.")
    check(all(x % 16 == 0 for x in (tgt_len, src_len, attn_head_num, attn_dim_per_head)), op,
          "tgt_len, src_len, attn_head_num, attn_dim_per_head should align to 16.")
    if not 0.0 <= dropout_prob < 1.0:
        unsupported(op, "dropout_prob=%r (must be in [0, 1))" % (dropout_prob,))
    e = attn_head_num * attn_dim_per_head
    check(query.dim() == 2 and query.size(1) == e and query.size(0) % tgt_len == 0, op,
          "query must be (B*tgt_len, %d), got %s", (e, tuple(query.shape)))
    batch = query.size(0) // tgt_len
    for name, t in (("key", key), ("value", value)):
        check(tuple(t.shape) == (batch * src_len, e), op, "%s must be (%d, %d), got %s", (name, batch * src_len, e, tuple(t.shape)))
    dt = query.dtype

    def heads(x, length):
        return x.reshape(batch, length, attn_head_num, attn_dim_per_head).permute(0, 2, 1, 3)

    q = heads(_linear(acc(query), acc(query_weight), query_bias) * attn_dim_per_head ** -0.5, tgt_len)
    k = heads(_linear(acc(key), acc(key_weight), key_bias), src_len)
    v = heads(_linear(acc(value), acc(value_weight), value_bias), src_len)
    q, k, v = q.to(dt), k.to(dt), v.to(dt)
    scores = torch.softmax(acc(q) @ acc(k).transpose(-1, -2) + acc(attn_mask), -1, dtype=torch.float32
                           if dt != torch.float64 else torch.float64)
    numel = scores.numel()
    if dropout_mask is None:
        dropout_mask = _pack(_gen_keep(numel, dropout_prob, query.device))
    keep = _unpack(op, dropout_mask, numel)
    probs = _apply_keep(scores.to(dt), keep, 1.0 - dropout_prob)
    context = (acc(probs) @ acc(v)).permute(0, 2, 1, 3).reshape(batch * tgt_len, e)
    y = _linear(context, acc(out_proj_weight), out_proj_bias)
    out_scores = scores if softmax_use_float or dt == torch.float64 else scores.to(dt)
    return (y.to(dt), dropout_mask.clone(), q, k, v, out_scores, probs, context.to(dt))


@impl("npu_multi_head_attention_backward")
def npu_multi_head_attention_backward(query, key, value, query_weight, key_weight, value_weight, out_proj_weight,
                                      query_bias, key_bias, value_bias, out_proj_bias, query_res, key_res, value_res,
                                      attn_scores, attn_res, context, y_grad, dropout_mask, attn_head_num,
                                      attn_dim_per_head, src_len, tgt_len, dropout_prob, softmax_use_float):
    op = "npu_multi_head_attention_backward"
    check(tgt_len > 0 and src_len > 0 and attn_head_num > 0 and attn_dim_per_head > 0, op,
          "tgt_len, src_len, attn_head_num, attn_dim_per_head should not equal zero.")
    check(all(x % 16 == 0 for x in (tgt_len, src_len, attn_head_num, attn_dim_per_head)), op,
          "tgt_len, src_len, attn_head_num, attn_dim_per_head should align to 16.")
    check(0.0 <= dropout_prob < 1.0, op, "dropout_prob must be in [0, 1), got %r", (dropout_prob,))
    e = attn_head_num * attn_dim_per_head
    check(query.dim() == 2 and query.shape[1] == e and query.shape[0] % tgt_len == 0, op,
          "query must be (B*tgt_len, %d), got %s", (e, tuple(query.shape)))
    batch = query.shape[0] // tgt_len
    heads_t = (batch, attn_head_num, tgt_len, attn_dim_per_head)
    heads_s = (batch, attn_head_num, src_len, attn_dim_per_head)
    for name, t, shape in (("key", key, (batch * src_len, e)), ("value", value, (batch * src_len, e)),
                           ("query_res", query_res, heads_t), ("key_res", key_res, heads_s),
                           ("value_res", value_res, heads_s),
                           ("attn_scores", attn_scores, (batch, attn_head_num, tgt_len, src_len)),
                           ("attn_res", attn_res, (batch, attn_head_num, tgt_len, src_len)),
                           ("context", context, (batch * tgt_len, e)), ("y_grad", y_grad, (batch * tgt_len, e))):
        check(tuple(t.shape) == shape, op, "%s must be %s, got %s", (name, shape, tuple(t.shape)))
    g = acc(y_grad)
    d_context = g @ acc(out_proj_weight)
    d_wout = g.transpose(0, 1) @ acc(context)
    d_bout = g.sum(0, keepdim=True)
    dctx = d_context.reshape(batch, tgt_len, attn_head_num, attn_dim_per_head).permute(0, 2, 1, 3)
    q, k, v = acc(query_res), acc(key_res), acc(value_res)
    d_probs = dctx @ v.transpose(-1, -2)
    dv = acc(attn_res).transpose(-1, -2) @ dctx
    if dropout_prob > 0:
        keep = _unpack(op, dropout_mask, attn_scores.numel()).reshape(attn_scores.shape)
        d_scores = d_probs * keep.to(d_probs.dtype) / (1.0 - dropout_prob)
    else:
        d_scores = d_probs
    p = acc(attn_scores).to(d_scores.dtype)
    ds = p * (d_scores - (d_scores * p).sum(-1, keepdim=True))
    dq = ds @ k
    dk = ds.transpose(-1, -2) @ q

    def flat(t, length):
        return t.permute(0, 2, 1, 3).reshape(batch * length, e)

    d_qlin = flat(dq, tgt_len) * attn_dim_per_head ** -0.5
    d_klin, d_vlin = flat(dk, src_len), flat(dv, src_len)
    grads_w = [lin.transpose(0, 1) @ acc(x) for lin, x in ((d_qlin, query), (d_klin, key), (d_vlin, value))]
    grads_x = [lin @ acc(w) for lin, w in ((d_qlin, query_weight), (d_klin, key_weight), (d_vlin, value_weight))]
    grads_b = [lin.sum(0, keepdim=True) for lin in (d_qlin, d_klin, d_vlin)] + [d_bout]

    def bias_dtype(bias):
        return query.dtype if bias is None else bias.dtype

    return (grads_w[0].to(query_weight.dtype), grads_w[1].to(key_weight.dtype), grads_w[2].to(value_weight.dtype),
            d_wout.to(out_proj_weight.dtype), grads_x[0].to(query.dtype), grads_x[1].to(key.dtype),
            grads_x[2].to(value.dtype),
            *[gb.to(bias_dtype(b)) for gb, b in zip(grads_b, (query_bias, key_bias, value_bias, out_proj_bias))])



