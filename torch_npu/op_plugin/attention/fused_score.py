"""Older fused attention-score blocks (BERT era): npu_dropout_with_add_softmax (+ _backward) and
npu_fused_attention_score (+ _fwd, _backward, _grad); npu_multi_head_attention is in
``attention/multi_head.py``.

Semantics from torch_npu's docs and the op-plugin kernels and tests that call them:

* ``npu_dropout_with_add_softmax``: ``softmax(x1 + alpha * self, dim)`` then dropout with
  drop probability ``prob`` (kept values times ``1 / (1 - prob)``); the mask is the byte
  mask of DropOutGenMaskV3 (one uint8 per element, 1 = kept, length padded to a multiple
  of 128).
* ``npu_fused_attention_score``: q, k, v (B, N, S, D); ``softmax(q @ k^T * scale + mask)``,
  dropout with ``keep_prob``, ``@ v``, permuted to (B*S, N*D); the saved softmax is the one
  before dropout; the drop mask is one uint8 per softmax element (1 = kept).

Masks are drawn from the generator of the input's device (``torch.npu.manual_seed`` for npu
tensors, ``torch.manual_seed`` for CPU ones); the bits
are not the NPU's Philox stream. Low-precision inputs are computed in float32 (the real
kernels compute in float16 only).
"""
import torch

from torch_npu.op_plugin._common import acc, check, unsupported
from torch_npu.op_plugin._registry import impl
from torch_npu.op_plugin.training.dropout import _gen_keep

__all__ = []


def _byte_mask_len(numel):
    # DropOutGenMaskV3 as torch_npu allocates it: one byte per element, padded to 128
    return (numel + 127) // 128 * 128


def _byte_keep(numel, drop_p, device):
    """uint8 mask (1 = kept) of ``_byte_mask_len(numel)`` bytes, padding bytes 0."""
    mask = torch.zeros(_byte_mask_len(numel), dtype=torch.uint8, device=device)
    mask[:numel] = _gen_keep(numel, drop_p, device).to(torch.uint8)
    return mask


def _apply_keep(x, keep, keep_prob):
    if keep_prob == 0.0:
        return x * 0
    return x * keep.reshape(x.shape).to(x.dtype) * (1.0 / keep_prob)


# ------------------------------------------------------------------ dropout + add + softmax


@impl("npu_dropout_with_add_softmax")
def npu_dropout_with_add_softmax(self, x1, alpha, prob, dim):
    """``y = x1 + self * alpha``; ``softmax_out = softmax(y, dim)``; ``output`` keeps each
    element with probability ``1 - prob`` and scales kept ones by ``1 / (1 - prob)``.

    Returns ``(mask, softmax_out, output)``: ``mask`` uint8 of ``ceil(numel / 128) * 128``
    bytes, one per element (1 = kept, padding 0). Differentiable (gradient of the formula:
    ``alpha * dS`` for ``self``, ``dS`` for ``x1``)."""
    op = "npu_dropout_with_add_softmax"
    check(self.shape == x1.shape, op, "self and x1 must have the same shape, got %s and %s", (tuple(self.shape), tuple(x1.shape)))
    if not 0.0 <= prob <= 1.0:
        unsupported(op, "prob=%r (must be in [0, 1])" % (prob,))
    mask = _byte_keep(self.numel(), prob, self.device)
    soft = torch.softmax(acc(x1) + acc(self) * alpha, dim)
    out = _apply_keep(soft, mask[:self.numel()], 1.0 - prob)
    return mask, soft.to(x1.dtype), out.to(x1.dtype)


@impl("npu_dropout_with_add_softmax_backward")
def npu_dropout_with_add_softmax_backward(grad, mask, softmax_out, alpha, prob, dim):
    """As the torch_npu kernel wrapper: ``(alpha * dS, grad)`` with ``dS`` the softmax
    gradient of ``grad * mask / (1 - prob)`` at ``softmax_out``; the second output is
    ``grad`` itself (what torch_npu returns for ``x1``)."""
    op = "npu_dropout_with_add_softmax_backward"
    n = softmax_out.numel()
    check(mask.dtype == torch.uint8 and mask.numel() >= n, op,
          "mask must be uint8 with at least %d bytes, got %s %s", (n, mask.dtype, tuple(mask.shape)))
    s = acc(softmax_out)
    g = _apply_keep(acc(grad), mask.reshape(-1)[:n], 1.0 - prob)
    ds = s * (g - (g * s).sum(dim, keepdim=True))
    return (ds * alpha).to(softmax_out.dtype), grad.clone()


# ------------------------------------------------------------------ fused attention score


def _fas_checks(op, q, k, v, flags):
    if any(flags):
        unsupported(op, "the transpose flags (their layouts are not documented; all must be False)")
    check(q.dim() == 4, op, "query_layer must be 4-D (B, N, S, D), got %d-D", q.dim())
    check(k.shape == q.shape and v.shape == q.shape, op,
          "key_layer and value_layer must have the shape of query_layer %s, got %s and %s", (tuple(q.shape), tuple(k.shape), tuple(v.shape)))


def _fas_forward(op, q, k, v, mask, scale, keep_prob, flags):
    _fas_checks(op, q, k, v, flags)
    if not 0.0 <= keep_prob <= 1.0:
        unsupported(op, "keep_prob=%r (must be in [0, 1])" % (keep_prob,))
    b, n, s, d = q.shape
    probs = torch.softmax(acc(q) @ acc(k).transpose(-1, -2) * scale + acc(mask), -1)
    drop_mask = torch.ones(probs.numel(), dtype=torch.uint8, device=q.device) if keep_prob == 1.0 \
        else _gen_keep(probs.numel(), 1.0 - keep_prob, q.device).to(torch.uint8)
    ctx = _apply_keep(probs, drop_mask, keep_prob) @ acc(v)
    ctx = ctx.permute(0, 2, 1, 3).reshape(b * s, n * d)
    return ctx.to(q.dtype), probs.to(q.dtype), drop_mask


@impl("npu_fused_attention_score")
def npu_fused_attention_score(query_layer, key_layer, value_layer, attention_mask, scale, keep_prob,
                              query_transpose=False, key_transpose=False, bmm_score_transpose_a=False,
                              bmm_score_transpose_b=False, value_transpose=False, dx_transpose=False):
    """Transformer attention score, fused: for q, k, v of shape (B, N, S, D),
    ``P = softmax(q @ k^T * scale + attention_mask)`` (mask broadcast to (B, N, S, S)),
    ``context = dropout(P, keep_prob) @ v`` permuted to (B, S, N, D) and flattened to
    (B*S, N*D). Differentiable in q, k, v. The transpose flags must be False (their layouts
    are not documented)."""
    return _fas_forward("npu_fused_attention_score", query_layer, key_layer, value_layer, attention_mask,
                        scale, keep_prob, (query_transpose, key_transpose, bmm_score_transpose_a,
                                           bmm_score_transpose_b, value_transpose, dx_transpose))[0]


@impl("npu_fused_attention_score_fwd")
def npu_fused_attention_score_fwd(query_layer, key_layer, value_layer, attention_mask, scale, keep_prob,
                                  query_transpose=False, key_transpose=False, bmm_score_transpose_a=False,
                                  bmm_score_transpose_b=False, value_transpose=False, dx_transpose=False):
    """:func:`npu_fused_attention_score` returning ``(context (B*S, N*D), softmax_output
    (B, N, S, S) before dropout, drop_mask)``; ``drop_mask`` is uint8, one byte per softmax
    element, 1 = kept (all ones for ``keep_prob=1``)."""
    return _fas_forward("npu_fused_attention_score_fwd", query_layer, key_layer, value_layer, attention_mask,
                        scale, keep_prob, (query_transpose, key_transpose, bmm_score_transpose_a,
                                           bmm_score_transpose_b, value_transpose, dx_transpose))


def _fas_grads(op, grad_output, softmax_output, q, k, v, drop_mask, scale, keep_prob, flags):
    _fas_checks(op, q, k, v, flags)
    b, n, s, d = q.shape
    check(grad_output.numel() == b * s * n * d, op, "grad_output must have B*S*N*D = %d elements, got %s", (b * s * n * d, tuple(grad_output.shape)))
    check(drop_mask.numel() >= softmax_output.numel(), op, "drop_mask has %d bytes, needs %d", (drop_mask.numel(), softmax_output.numel()))
    do = acc(grad_output).reshape(b, s, n, d).permute(0, 2, 1, 3)
    p = acc(softmax_output)
    keep = drop_mask.reshape(-1)[:p.numel()]
    pd = _apply_keep(p, keep, keep_prob)
    dv = pd.transpose(-1, -2) @ do
    dp = _apply_keep(do @ acc(v).transpose(-1, -2), keep, keep_prob)
    ds = p * (dp - (dp * p).sum(-1, keepdim=True)) * scale
    dq = ds @ acc(k)
    dk = ds.transpose(-1, -2) @ acc(q)
    return dq, dk, dv


@impl("npu_fused_attention_score_backward")
def npu_fused_attention_score_backward(grad_output, softmax_output, query_layer, key_layer, value_layer, mask,
                                       scale, keep_prob, query_transpose=False, key_transpose=False,
                                       value_transpose=False, dx_transpose=False):
    """Gradients ``(dq, dk, dv)`` of :func:`npu_fused_attention_score`, each (B, N, S, D),
    from the (B*S, N*D) ``grad_output``, the saved ``softmax_output`` (before dropout) and
    the byte drop ``mask`` of :func:`npu_fused_attention_score_fwd`."""
    op = "npu_fused_attention_score_backward"
    grads = _fas_grads(op, grad_output, softmax_output, query_layer, key_layer, value_layer, mask, scale,
                       keep_prob, (query_transpose, key_transpose, value_transpose, dx_transpose))
    return tuple(g.to(grad_output.dtype) for g in grads)


@impl("npu_fused_attention_score_grad")
def npu_fused_attention_score_grad(grad_output, softmax_output, query_layer, key_layer, value_layer, mask,
                                   scale, keep_prob, query_transpose=False, key_transpose=False,
                                   value_transpose=False, dx_transpose=False):
    """:func:`npu_fused_attention_score_backward` with each gradient in the (B*S, N*D)
    layout of ``grad_output`` (as the kernel writes them)."""
    op = "npu_fused_attention_score_grad"
    b, n, s, d = query_layer.shape
    grads = _fas_grads(op, grad_output, softmax_output, query_layer, key_layer, value_layer, mask, scale,
                       keep_prob, (query_transpose, key_transpose, value_transpose, dx_transpose))
    return tuple(g.permute(0, 2, 1, 3).reshape(b * s, n * d).to(grad_output.dtype) for g in grads)


# ------------------------------------------------------------------ multi-head attention
