"""npu_qkv_rms_norm_rope_cache (+ _functional): split a fused qkv, RMSNorm + RoPE q and k,
optionally quantise k and v, and scatter them into PA_NZ paged caches.

Semantics from CANN's QkvRmsNormRopeCache doc (ops-transformer
``posembedding/qkv_rms_norm_rope_cache/README.md``) and op-plugin's golden
``test_npu_qkv_rms_norm_rope_cache.py``, which agree (quantisation divides by the scale):

* ``qkv [T, (Nq + Nk + Nv) * D]`` (``T = B * S`` from ``qkv_size = [B, S, N, D]``,
  ``head_nums = [Nq, Nk, Nv]``) splits into q, k, v heads of size D.
* q, k: ``y = x / sqrt(mean(x^2) + epsilon) * gamma`` over D, then the half rotation
  ``y * cos + cat(-y[D/2:], y[:D/2]) * sin`` with ``cos``/``sin`` ``[T, D]`` shared by all heads.
* ``q_out`` (``[T, Nq * D]``) is overwritten with q.
* k (after RoPE) and v (untouched): with ``k_scale``/``v_scale`` (``[N, D]`` float32)
  ``round(x / scale (+ offset))`` saturated to int8 (half to even), else cast to the cache dtype.
* PA_NZ scatter: a cache ``[BlockNum, N * D / c0, BlockSize, c0]`` (c0 = 32 for int8, 16 for
  float16/bfloat16 caches) is read as ``[BlockNum, N, D / c0, BlockSize, c0]``; token t with
  ``index[t] = p >= 0`` writes its ``[N, D]`` row to block ``p // BlockSize``, slot
  ``p % BlockSize`` (chunk i of D to ``[:, i, slot, :]``); ``index[t] = -1`` skips the token.
* Returns ``(q, k, v)`` before quantisation (``[T, heads * D]`` in qkv's dtype) when
  ``is_output_qkv``, else three 0-dim zero placeholders (the real op returns undefined tensors).
  The functional variant leaves its inputs alone and also returns the updated copies of
  ``q_out``, ``k_cache``, ``v_cache``.

Arithmetic in float32. The scatter sends skipped tokens to a spare slot that is dropped, so there
is no host read of ``index`` (CPU, npu and Meta/FakeTensor run the same composition). Only
``cache_mode="PA_NZ"`` is documented; other modes raise NotImplementedError, as does an offset
without its scale. Inference op: no backward.
"""
import torch

from torch_npu.op_plugin._common import check
from torch_npu.op_plugin._registry import impl

__all__ = []

_FLOATS = (torch.float16, torch.bfloat16, torch.float32)


def _rms_rope(x, gamma, cos, sin, epsilon):
    """x float32 [T, N, D]; cos/sin [T, 1, D]."""
    y = x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + epsilon) * gamma.float()
    half = y.shape[-1] // 2
    rotated = torch.cat([-y[..., half:], y[..., :half]], dim=-1)
    return y * cos + rotated * sin


def _quantise(op, name, v, scale, offset, cache):
    """v float32 [T, N, D] -> values in the cache's dtype."""
    if scale is None:
        if offset is not None:
            raise NotImplementedError("%s: %s_offset without %s_scale is not supported by the CPU-emulated NPU"
                                      % (op, name, name))
        check(cache.dtype != torch.int8, op, "%s_scale is required for an int8 %s_cache", (name, name))
        return v.to(cache.dtype)
    check(cache.dtype == torch.int8, op, "%s_cache must be int8 when %s_scale is given, got %s",
          (name, name, cache.dtype))
    n, d = v.shape[1], v.shape[2]
    check(scale.numel() == n * d, op, "%s_scale must be [%d, %d], got %s", (name, n, d, tuple(scale.shape)))
    q = v / scale.float().reshape(n, d)
    if offset is not None:
        check(offset.numel() == n * d, op, "%s_offset must be [%d, %d], got %s", (name, n, d, tuple(offset.shape)))
        q = q + offset.float().reshape(n, d)
    return torch.round(q).clamp(-128, 127).to(torch.int8)


def _pa_nz_scattered(op, name, cache, rows, index):
    """``cache`` with each token's ``rows[t]`` ([N, D]) written at slot ``index[t]`` (PA_NZ)."""
    check(cache.dim() == 4, op, "%s_cache must be 4-D [BlockNum, N*D/c0, BlockSize, c0], got %d-D",
          (name, cache.dim()))
    bn, chunks, bs, c0 = cache.shape
    t, n, d = rows.shape
    check(c0 > 0 and d % c0 == 0 and chunks == n * d // c0, op,
          "%s_cache must be [BlockNum, %d, BlockSize, c0] with c0 dividing %d, got %s",
          (name, n * d // max(c0, 1), d, tuple(cache.shape)))
    slots = cache.reshape(bn, n, d // c0, bs, c0).permute(0, 3, 1, 2, 4).reshape(bn * bs, n, d)
    # index -1 (skip) goes to a spare slot appended at the end and dropped afterwards
    slots = torch.cat([slots, slots.new_zeros(1, n, d)])
    dest = torch.where(index >= 0, index, torch.full_like(index, bn * bs))
    slots = slots.index_copy(0, dest, rows)
    return slots[:-1].reshape(bn, bs, n, d // c0, c0).permute(0, 2, 3, 1, 4).reshape(cache.shape)


def _compute(op, qkv, q_gamma, k_gamma, cos, sin, index, q_out, k_cache, v_cache, qkv_size, head_nums,
             k_scale, v_scale, k_offset, v_offset, epsilon, cache_mode, is_output_qkv):
    """``(before-quant outputs, new q_out, new k_cache, new v_cache)``."""
    check(len(qkv_size) == 4, op, "qkv_size must be [B, S, N, D], got %s", (list(qkv_size),))
    check(len(head_nums) == 3, op, "head_nums must be [n_q, n_k, n_v], got %s", (list(head_nums),))
    if cache_mode != "PA_NZ":
        raise NotImplementedError("%s: cache_mode=%r is not supported by the CPU-emulated NPU (only 'PA_NZ')"
                                  % (op, cache_mode))
    b, s, n, d = qkv_size
    nq, nk, nv = head_nums
    t = b * s
    check(qkv.dim() == 2 and qkv.dtype in _FLOATS, op, "qkv must be a 2-D float tensor, got %s %s",
          (tuple(qkv.shape), qkv.dtype))
    check(n == nq + nk + nv and tuple(qkv.shape) == (t, n * d), op,
          "qkv must be [B*S, N*D] = [%d, %d] with N = n_q + n_k + n_v, got %s", (t, n * d, tuple(qkv.shape)))
    check(d % 2 == 0, op, "D must be even for the rotation, got %d", d)
    check(tuple(q_gamma.shape) == (d,) and tuple(k_gamma.shape) == (d,), op, "q_gamma and k_gamma must be [%d]", d)
    check(cos.numel() == t * d and sin.numel() == t * d, op, "cos and sin must be [%d, %d]", (t, d))
    check(index.dim() == 1 and index.shape[0] == t, op, "index must be [%d], got %s", (t, tuple(index.shape)))
    check(tuple(q_out.shape) == (t, nq * d), op, "q_out must be [%d, %d], got %s", (t, nq * d, tuple(q_out.shape)))
    x = qkv.float().reshape(t, n, d)
    c = cos.float().reshape(t, 1, d)
    sn = sin.float().reshape(t, 1, d)
    q = _rms_rope(x[:, :nq], q_gamma, c, sn, epsilon)
    k = _rms_rope(x[:, nq:nq + nk], k_gamma, c, sn, epsilon)
    v = x[:, nq + nk:]
    idx = index.long()
    new_k = _pa_nz_scattered(op, "k", k_cache, _quantise(op, "k", k, k_scale, k_offset, k_cache), idx)
    new_v = _pa_nz_scattered(op, "v", v_cache, _quantise(op, "v", v, v_scale, v_offset, v_cache), idx)
    new_q = q.reshape(t, nq * d).to(q_out.dtype)
    if is_output_qkv:
        # copies: v may be a view of qkv, and q of new_q, for float32 inputs
        before = (q.reshape(t, nq * d).to(qkv.dtype, copy=True), k.reshape(t, nk * d).to(qkv.dtype, copy=True),
                  v.reshape(t, nv * d).to(qkv.dtype, copy=True))
    else:
        before = tuple(qkv.new_zeros(()) for _ in range(3))
    return before, new_q, new_k, new_v


@impl("npu_qkv_rms_norm_rope_cache")
def npu_qkv_rms_norm_rope_cache(qkv, q_gamma, k_gamma, cos, sin, index, q_out, k_cache, v_cache, qkv_size, head_nums,
                                *, k_scale=None, v_scale=None, k_offset=None, v_offset=None, epsilon=1e-6,
                                cache_mode="PA_NZ", is_output_qkv=False):
    """Writes q_out, k_cache, v_cache in place; returns q/k/v before quantisation. See the module doc."""
    before, new_q, new_k, new_v = _compute("npu_qkv_rms_norm_rope_cache", qkv, q_gamma, k_gamma, cos, sin, index,
                                           q_out, k_cache, v_cache, qkv_size, head_nums, k_scale, v_scale, k_offset,
                                           v_offset, epsilon, cache_mode, is_output_qkv)
    q_out.copy_(new_q)
    k_cache.copy_(new_k)
    v_cache.copy_(new_v)
    return before


@impl("npu_qkv_rms_norm_rope_cache_functional")
def npu_qkv_rms_norm_rope_cache_functional(qkv, q_gamma, k_gamma, cos, sin, index, q_out, k_cache, v_cache, qkv_size,
                                           head_nums, *, k_scale=None, v_scale=None, k_offset=None, v_offset=None,
                                           epsilon=1e-6, cache_mode="PA_NZ", is_output_qkv=False):
    """As npu_qkv_rms_norm_rope_cache, inputs untouched: also returns the new q_out, k_cache, v_cache."""
    before, new_q, new_k, new_v = _compute("npu_qkv_rms_norm_rope_cache_functional", qkv, q_gamma, k_gamma, cos, sin,
                                           index, q_out, k_cache, v_cache, qkv_size, head_nums, k_scale, v_scale,
                                           k_offset, v_offset, epsilon, cache_mode, is_output_qkv)
    return before + (new_q, new_k, new_v)
