"""BERT fused self-attention (optionally with the preceding LayerNorm), as torch_npu.contrib chains
the fused kernels:

* ``npu_fused_attention``: ``q/k/v = hidden_states @ kernel + bias`` (``npu_linear`` with the
  kernel transposed), each reshaped to (B, S, N, 64) and permuted to (B, N, S, 64)
  (``npu_confusion_transpose``), then ``npu_fused_attention_score_fwd``:
  ``context = dropout(softmax(q @ k^T * scale + attention_mask), keep_prob) @ v`` as (B*S, H).
  Backward: ``npu_fused_attention_score_grad`` (same drop mask) then
  ``npu_fused_attention_qkv_grad``.
* ``npu_fused_attention_with_layernorm``: the projections read ``LayerNorm(hidden_states)``
  (``npu_fused_attention_layernorm_qkv_fwd``, eps 1e-5); returns ``(context, norm)``. Backward
  adds the gradient reaching ``norm`` and goes back through the LayerNorm with
  ``npu_layernorm_grad``.

B = attention_mask.size(0), S = rows / B, head dim 64 (N = H / 64), as torch_npu fixes them.
On the first call in a process (torch_npu checks once) the inputs must match what the fused
kernels take: hidden_states, attention_mask and the three kernels in FRACTAL_NZ (format 29,
``torch_npu.npu_format_cast(x, 29)``), biases (and gamma/beta) in ND (format 2);
hidden_states (B*S, 768 or 1024) with B*S a multiple of 32; attention_mask (B, 1, S, S)
(additive); kernels (768 or 1024, ·). The emulated ops compute in float32 (float16 inputs are
upcast and the results cast back), the format is only a tag (the data stays ND), and the drop
mask comes from the npu generator (not the hardware's bit stream).
"""
import torch

import torch_npu
from torch_npu.utils._error_code import ErrCode, ops_error

__all__ = ["npu_fused_attention", "npu_fused_attention_with_layernorm"]

_NZ, _ND = 29, 2
_HEAD_DIM = 64
# the eight tensors torch_npu checks, in its order: hidden_states, attention_mask, 3 kernels, 3 biases
_VALID_FORMATS = [_NZ] * 5 + [_ND] * 3
# torch_npu runs the compatibility check only once per process (exec_once)
_compatibility = {"checked": False}


def _check_compatibility(hidden_states, attention_mask, query_kernel, key_kernel, value_kernel, query_bias,
                         key_bias, value_bias, gamma=None, beta=None):
    tensors = [hidden_states, attention_mask, query_kernel, key_kernel, value_kernel, query_bias, key_bias,
               value_bias]
    if [torch_npu.get_npu_format(t) for t in tensors] != _VALID_FORMATS:
        raise RuntimeError("fused attention check compatibility failed, format not matches" + ops_error(ErrCode.VALUE))
    if gamma is not None and beta is not None:
        if torch_npu.get_npu_format(gamma) != _ND or torch_npu.get_npu_format(beta) != _ND:
            raise RuntimeError("fused attention check compatibility failed, gamma or beta format not matches"
                               + ops_error(ErrCode.VALUE))
    if hidden_states.dim() != 2 or hidden_states.shape[0] % 32 != 0 or hidden_states.shape[1] not in (1024, 768):
        raise RuntimeError("fused attention check compatibility failed, shape of hidden_states not matches"
                           + ops_error(ErrCode.VALUE))
    if attention_mask.dim() != 4 or attention_mask.shape[1] != 1 or attention_mask.shape[2] != attention_mask.shape[3]:
        raise RuntimeError("fused attention check compatibility failed, shape of attention_mask not matches"
                           + ops_error(ErrCode.VALUE))
    if any(k.shape[0] not in (1024, 768) for k in (query_kernel, key_kernel, value_kernel)):
        raise RuntimeError("fused attention check compatibility failed, shape of kernel not matches"
                           + ops_error(ErrCode.VALUE))


def _check_once(*tensors):
    if not _compatibility["checked"]:
        _compatibility["checked"] = True
        _check_compatibility(*tensors)


def _bsnd(hidden_states, attention_mask):
    b = attention_mask.shape[0]
    return b, hidden_states.shape[0] // b, hidden_states.shape[1] // _HEAD_DIM, _HEAD_DIM


def _heads(x, bsnd):
    """(B*S, H) -> (B, N, S, 64) in FRACTAL_NZ, as the score kernel takes it."""
    return torch_npu.npu_format_cast(torch_npu.npu_confusion_transpose(x, (0, 2, 1, 3), bsnd, False), _NZ)


class _FusedAttention(torch.autograd.Function):

    @staticmethod
    def forward(ctx, hidden_states, attention_mask, query_kernel, key_kernel, value_kernel, query_bias, key_bias,
                value_bias, scale=1, keep_prob=0):
        _check_once(hidden_states, attention_mask, query_kernel, key_kernel, value_kernel, query_bias, key_bias,
                    value_bias)
        bsnd = _bsnd(hidden_states, attention_mask)
        with torch.no_grad():
            layers = [_heads(torch_npu.npu_linear(hidden_states, kernel.t(), bias), bsnd)
                      for kernel, bias in ((query_kernel, query_bias), (key_kernel, key_bias),
                                           (value_kernel, value_bias))]
        context, softmax_out, drop_mask = torch_npu.npu_fused_attention_score_fwd(
            layers[0], layers[1], layers[2], attention_mask, scale, keep_prob)
        ctx.scale, ctx.keep_prob = scale, keep_prob
        ctx.save_for_backward(query_kernel, key_kernel, value_kernel, *layers, hidden_states, softmax_out, drop_mask)
        return context

    @staticmethod
    def backward(ctx, grad_context):
        q_w, k_w, v_w, q_l, k_l, v_l, hidden, softmax_out, drop_mask = ctx.saved_tensors
        grad_q, grad_k, grad_v = torch_npu.npu_fused_attention_score_grad(
            grad_context, softmax_out, q_l, k_l, v_l, drop_mask, ctx.scale, ctx.keep_prob)
        # no LayerNorm output here: nothing else reaches hidden_states
        no_ln_grad = torch_npu.npu_format_cast(torch.zeros_like(hidden), _NZ)
        g_h, g_wq, g_wk, g_wv, g_bq, g_bk, g_bv = torch_npu.npu_fused_attention_qkv_grad(
            grad_q, grad_k, grad_v, q_w, k_w, v_w, hidden, no_ln_grad)
        return g_h, None, g_wq, g_wk, g_wv, g_bq, g_bk, g_bv, None, None


class _FusedAttentionWithLayerNorm(torch.autograd.Function):

    @staticmethod
    def forward(ctx, hidden_states, attention_mask, query_kernel, key_kernel, value_kernel, query_bias, key_bias,
                value_bias, gamma, beta, scale=1, keep_prob=0):
        _check_once(hidden_states, attention_mask, query_kernel, key_kernel, value_kernel, query_bias, key_bias,
                    value_bias, gamma, beta)
        b, s, n, _ = _bsnd(hidden_states, attention_mask)
        norm, q_l, k_l, v_l, mean, rstd = torch_npu.npu_fused_attention_layernorm_qkv_fwd(
            hidden_states, query_kernel, key_kernel, value_kernel, gamma, beta, query_bias, key_bias, value_bias,
            s, n)
        context, softmax_out, drop_mask = torch_npu.npu_fused_attention_score_fwd(
            q_l, k_l, v_l, attention_mask, scale, keep_prob)
        ctx.scale, ctx.keep_prob = scale, keep_prob
        ctx.save_for_backward(query_kernel, key_kernel, value_kernel, q_l, k_l, v_l, hidden_states, softmax_out,
                              drop_mask, norm, mean, rstd, gamma, beta)
        return context, norm

    @staticmethod
    def backward(ctx, grad_context, grad_norm):
        q_w, k_w, v_w, q_l, k_l, v_l, hidden, softmax_out, drop_mask, norm, mean, rstd, gamma, beta = \
            ctx.saved_tensors
        grad_q, grad_k, grad_v = torch_npu.npu_fused_attention_score_grad(
            grad_context, softmax_out, q_l, k_l, v_l, drop_mask, ctx.scale, ctx.keep_prob)
        g_norm, g_wq, g_wk, g_wv, g_bq, g_bk, g_bv = torch_npu.npu_fused_attention_qkv_grad(
            grad_q, grad_k, grad_v, q_w, k_w, v_w, norm, torch_npu.npu_format_cast(grad_norm, _NZ))
        g_h, g_gamma, g_beta = torch_npu.npu_layernorm_grad(
            g_norm, hidden, (g_norm.shape[1],), mean, rstd, gamma, beta)
        return g_h, None, g_wq, g_wk, g_wv, g_bq, g_bk, g_bv, g_gamma, g_beta, None, None


def npu_fused_attention(hidden_states, attention_mask, query_kernel, key_kernel, value_kernel, query_bias, key_bias,
                        value_bias, scale=1, keep_prob=0):
    """Fused BERT self-attention: (B*S, H) context of ``hidden_states`` (B*S, H) with the additive
    ``attention_mask`` (B, 1, S, S), kernels (H, H) (``q = hidden_states @ query_kernel +
    query_bias``), heads of 64; dropout on the probabilities with ``keep_prob``. Differentiable in
    hidden_states, the kernels and the biases. See the module docstring for the input formats."""
    return _FusedAttention.apply(hidden_states, attention_mask, query_kernel, key_kernel, value_kernel, query_bias,
                                 key_bias, value_bias, scale, keep_prob)


def npu_fused_attention_with_layernorm(hidden_states, attention_mask, query_kernel, key_kernel, value_kernel,
                                       query_bias, key_bias, value_bias, gamma, beta, scale=1, keep_prob=0):
    """:func:`npu_fused_attention` on ``LayerNorm(hidden_states)`` (gamma, beta, eps 1e-5); returns
    ``(context, norm)``. Differentiable in hidden_states, the kernels, biases, gamma and beta."""
    return _FusedAttentionWithLayerNorm.apply(hidden_states, attention_mask, query_kernel, key_kernel, value_kernel,
                                              query_bias, key_bias, value_bias, gamma, beta, scale, keep_prob)
