"""npu_kv_rmsnorm_rope_cache (+ _v2, _v2_functional): the MLA kv RMSNorm + RoPE + cache update.

The last dim of ``kv`` splits into the latent part (RMSNorm with ``gamma``) and the rope part
(rotary embedding with ``cos`` / ``sin``); both are written into their caches at the slots of
``index`` in the layout ``cache_mode`` names ("Norm", "PA", "PA_BNSD", "PA_NZ", "PA_BLK_BNSD",
"PA_BLK_NZ"), optionally quantised with the given scales. Each function's docstring and
docs/ops-cache.md give the formula and its source. The ``_v2`` forms are registered opaque (slot
indices are read on the host).
"""
import torch

from torch_npu.op_plugin._common import check
from torch_npu.op_plugin._registry import impl, opaque

__all__ = []


_KV_CACHE_MODES = ("Norm", "PA", "PA_BNSD", "PA_NZ", "PA_BLK_BNSD", "PA_BLK_NZ")


# elements per FRACTAL_NZ piece of the NZ cache modes (op-plugin golden: 16, 32 for int8 caches)
_NZ_PIECE = {False: 16, True: 32}


def _kv_rmsnorm_rope(op, kv, gamma, cos, sin, epsilon):
    """(k_embed, y) in float32 (float64 kept): RMSNorm of the first gamma.size(0) features of
    ``kv`` [B, 1, S, H] and the de-interleaving RoPE (evens then odds, ``k*cos +
    rotate_half(k)*sin``) of the remaining cos.size(3) features."""
    rms_dim, rope_dim = gamma.size(0), cos.size(3)
    check(kv.size(1) == 1, op, "kv must be [batch, 1, seq_len, hidden], got %s", (tuple(kv.shape),))
    check(kv.size(3) == rms_dim + rope_dim, op, "kv's last dim %d must be gamma.size(0) + cos.size(3) = %d",
          (kv.size(3), rms_dim + rope_dim))
    for name, t in (("cos", cos), ("sin", sin)):
        check(tuple(t.shape) == tuple(kv.shape[:3]) + (rope_dim,), op, "%s must be %s, got %s",
              (name, tuple(kv.shape[:3]) + (rope_dim,), tuple(t.shape)))
    compute = torch.float64 if kv.dtype == torch.float64 else torch.float32
    rms_in, rope_in = kv.to(compute).split([rms_dim, rope_dim], dim=-1)
    y = rms_in * torch.rsqrt(rms_in.pow(2).mean(-1, keepdim=True) + epsilon) * gamma.to(compute)
    k = torch.cat((rope_in[..., 0::2], rope_in[..., 1::2]), -1)
    half = rope_dim // 2
    k_embed = k * cos.to(compute) + torch.cat((-k[..., half:], k[..., :half]), -1) * sin.to(compute)
    return k_embed, y


def _kv_cache_rows(rows, cache, scale):
    """Rows as stored: ``round(rows * scale)`` clipped to int8 with a scale, else the cache dtype."""
    if scale is None:
        return rows.to(cache.dtype)
    return torch.round(rows * scale.to(rows.dtype)).clamp(-128, 127).to(torch.int8)


def _kv_cache_targets(op, index, cache_mode, batch, seq_len, block_size):
    """(token ids into the flattened [B*S] rows, page ids, rows in page) of the tokens to write;
    tokens whose offset is negative are skipped (as the op-plugin golden)."""
    tokens = torch.arange(batch * seq_len)
    if cache_mode in ("PA_BLK_BNSD", "PA_BLK_NZ"):
        check(index.dim() == 1 and index.numel() % batch == 0, op,
              "%s: index must be [batch * ceil(seq_len / block_size)], got %s", (cache_mode, tuple(index.shape)))
        pages_per_batch = index.numel() // batch
        in_batch = tokens % seq_len
        check((seq_len + block_size - 1) // block_size <= pages_per_batch, op,
              "%s: index holds %d pages per batch, seq_len %d needs %d",
              (cache_mode, pages_per_batch, seq_len, (seq_len + block_size - 1) // block_size))
        offsets = index.detach().cpu().long()[(tokens // seq_len) * pages_per_batch + in_batch // block_size]
        keep = offsets >= 0
        return tokens[keep], offsets[keep] // block_size, in_batch[keep] % block_size
    check(index.numel() == batch * seq_len, op, "%s: index must hold one offset per token (%d), got %s",
          (cache_mode, batch * seq_len, tuple(index.shape)))
    offsets = index.detach().cpu().long().reshape(-1)
    keep = offsets >= 0
    return tokens[keep], offsets[keep] // block_size, offsets[keep] % block_size


def _kv_write(op, cache, rows, index, cache_mode, batch, seq_len, quant, name):
    """Writes ``rows`` [B, 1, S, D] (already in the stored dtype) into ``cache`` in place."""
    dim = rows.size(-1)
    flat_rows = rows.reshape(batch * seq_len, dim)
    if cache_mode == "Norm":
        check(cache.dim() == 4 and cache.size(0) == batch and cache.size(1) == 1 and cache.size(3) == dim, op,
              "Norm: %s must be [batch, 1, cache_length, %d], got %s", (name, dim, tuple(cache.shape)))
        check(tuple(index.shape) == (batch, seq_len), op, "Norm: index must be [batch, seq_len] = %s, got %s",
              ((batch, seq_len), tuple(index.shape)))
        offsets = index.detach().cpu().long().reshape(-1)
        keep = offsets >= 0
        tokens = torch.arange(batch * seq_len)[keep]
        check(bool((offsets[keep] < cache.size(2)).all()), op, "Norm: index values must be < cache_length %d",
              cache.size(2))
        b = (tokens // seq_len).to(cache.device)
        cache[b, 0, offsets[keep].to(cache.device)] = flat_rows[tokens.to(rows.device)]
        return
    check(cache.dim() == 4 and cache.size(2) == 1 and cache.size(3) == dim, op,
          "%s: %s must be [block_num, block_size, 1, %d], got %s", (cache_mode, name, dim, tuple(cache.shape)))
    block_num, block_size = cache.size(0), cache.size(1)
    tokens, pages, in_page = _kv_cache_targets(op, index, cache_mode, batch, seq_len, block_size)
    check(bool((pages < block_num).all()), op, "%s: index points past block_num %d", (cache_mode, block_num))
    tokens, pages, in_page = tokens.to(cache.device), pages.to(cache.device), in_page.to(cache.device)
    if cache_mode.endswith("NZ"):
        piece = _NZ_PIECE[quant]
        check(dim % piece == 0 and cache.is_contiguous(), op, "%s: %s's last dim must be a multiple of %d",
              (cache_mode, name, piece))
        nz = cache.view(block_num, dim // piece, block_size, piece)   # each block stored as FRACTAL_NZ
        nz[pages, :, in_page, :] = flat_rows[tokens].reshape(-1, dim // piece, piece)
    else:
        cache[pages, in_page, 0] = flat_rows[tokens]


def _kv_rmsnorm_rope_cache(op, kv, gamma, cos, sin, index, k_cache, ckv_cache, k_rope_scale, c_kv_scale,
                           k_rope_offset, c_kv_offset, v, epsilon, cache_mode, cache_dtypes=(None, None)):
    """Updates the caches in place; returns (k_rope, c_kv) in kv's dtype."""
    if v is not None:
        raise NotImplementedError("%s: the v input (separate value tensor) is not emulated on the CPU-emulated NPU"
                                  % op)
    if k_rope_offset is not None or c_kv_offset is not None:
        raise NotImplementedError("%s: k_rope_offset / c_kv_offset (asymmetric cache quantisation) are not emulated "
                                  "on the CPU-emulated NPU" % op)
    if any(d is not None for d in cache_dtypes):
        raise NotImplementedError("%s: k_cache_dtype / ckv_cache_dtype are not emulated on the CPU-emulated NPU" % op)
    check(cache_mode in _KV_CACHE_MODES, op, "cache_mode must be one of %s, got %r", (_KV_CACHE_MODES, cache_mode))
    check(kv.dim() == 4 and gamma.dim() == 1 and cos.dim() == 4, op, "kv and cos must be 4-D, gamma 1-D")
    check((k_rope_scale is None) == (c_kv_scale is None), op, "k_rope_scale and c_kv_scale must be given together")
    quant = k_rope_scale is not None
    if quant:
        check(k_cache.dtype == torch.int8 and ckv_cache.dtype == torch.int8, op,
              "quantised caches (k_rope_scale given) must be int8")
    k_embed, y = _kv_rmsnorm_rope(op, kv, gamma, cos, sin, epsilon)
    batch, _, seq_len, _ = kv.shape
    _kv_write(op, k_cache, _kv_cache_rows(k_embed, k_cache, k_rope_scale), index, cache_mode, batch, seq_len, quant,
              "k_cache")
    _kv_write(op, ckv_cache, _kv_cache_rows(y, ckv_cache, c_kv_scale), index, cache_mode, batch, seq_len, quant,
              "ckv_cache")
    return k_embed.to(kv.dtype), y.to(kv.dtype)


def _kv_fake_outputs(kv, gamma, cos):
    lead = list(kv.shape[:3])
    return kv.new_empty(lead + [cos.size(3)]), kv.new_empty(lead + [gamma.size(0)])


@impl("npu_kv_rmsnorm_rope_cache")
def npu_kv_rmsnorm_rope_cache(kv, gamma, cos, sin, index, k_cache, ckv_cache, *, k_rope_scale=None, c_kv_scale=None,
                              k_rope_offset=None, c_kv_offset=None, v=None, epsilon=1e-5, cache_mode="Norm",
                              is_output_kv=False):
    """MLA kv branch (KvRmsNormRopeCache): ``kv`` [B, 1, S, 512+64] splits into the RMSNorm part
    (``y = x / sqrt(mean(x^2) + epsilon) * gamma``) and the RoPE part (de-interleaved, then
    ``k*cos + rotate_half(k)*sin``); ``y`` goes to ``ckv_cache``, the rotated k to ``k_cache``
    (int8 ``round(v * scale)`` with ``k_rope_scale`` / ``c_kv_scale``), at the positions of
    ``index`` per ``cache_mode`` (see docs/ops-cache.md); negative offsets are skipped.
    The caches are updated in place and returned (as the real op); then k_rope, c_kv in kv's
    dtype. With ``is_output_kv=False`` the real kernel leaves k_rope / c_kv unwritten; the
    computed values are returned here.

    This schema (as the real one) does not declare that it writes the caches, so it is not an
    opaque op itself: under torch.compile an unannotated write is invisible (the call was
    dead-code eliminated when its outputs were unused, reads of the caches could be reordered
    across it). It delegates to ``npu_kv_rmsnorm_rope_cache_v2``, whose schema marks the caches
    ``(a!)``: eager writes in place, compiled graphs functionalize the write and copy it back."""
    k_rope, c_kv = torch.ops.npu.npu_kv_rmsnorm_rope_cache_v2(
        kv, gamma, cos, sin, index, k_cache, ckv_cache, k_rope_scale=k_rope_scale, c_kv_scale=c_kv_scale,
        k_rope_offset=k_rope_offset, c_kv_offset=c_kv_offset, v=v, epsilon=epsilon, cache_mode=cache_mode,
        is_output_kv=is_output_kv)
    return k_cache, ckv_cache, k_rope, c_kv


def _kv_rmsnorm_rope_cache_v2_fake(kv, gamma, cos, sin, index, k_cache, ckv_cache, *, k_rope_scale=None,
                                   c_kv_scale=None, k_rope_offset=None, c_kv_offset=None, v=None, epsilon=1e-5,
                                   cache_mode="Norm", is_output_kv=False, k_cache_dtype=None, ckv_cache_dtype=None):
    return _kv_fake_outputs(kv, gamma, cos)


@opaque("npu_kv_rmsnorm_rope_cache_v2", _kv_rmsnorm_rope_cache_v2_fake)
def npu_kv_rmsnorm_rope_cache_v2(kv, gamma, cos, sin, index, k_cache, ckv_cache, *, k_rope_scale=None,
                                 c_kv_scale=None, k_rope_offset=None, c_kv_offset=None, v=None, epsilon=1e-5,
                                 cache_mode="Norm", is_output_kv=False, k_cache_dtype=None, ckv_cache_dtype=None):
    """:func:`npu_kv_rmsnorm_rope_cache` with the caches as in-place arguments: returns (k_rope, c_kv)."""
    return _kv_rmsnorm_rope_cache("npu_kv_rmsnorm_rope_cache_v2", kv, gamma, cos, sin, index, k_cache, ckv_cache,
                                  k_rope_scale, c_kv_scale, k_rope_offset, c_kv_offset, v, epsilon, cache_mode,
                                  (k_cache_dtype, ckv_cache_dtype))


def _kv_rmsnorm_rope_cache_v2_functional_fake(kv, gamma, cos, sin, index, k_cache, ckv_cache, *, k_rope_scale=None,
                                              c_kv_scale=None, k_rope_offset=None, c_kv_offset=None, v=None,
                                              epsilon=1e-5, cache_mode="Norm", is_output_kv=False,
                                              k_cache_dtype=None, ckv_cache_dtype=None):
    return _kv_fake_outputs(kv, gamma, cos) + (torch.empty_like(k_cache), torch.empty_like(ckv_cache))


@opaque("npu_kv_rmsnorm_rope_cache_v2_functional", _kv_rmsnorm_rope_cache_v2_functional_fake)
def npu_kv_rmsnorm_rope_cache_v2_functional(kv, gamma, cos, sin, index, k_cache, ckv_cache, *, k_rope_scale=None,
                                            c_kv_scale=None, k_rope_offset=None, c_kv_offset=None, v=None,
                                            epsilon=1e-5, cache_mode="Norm", is_output_kv=False, k_cache_dtype=None,
                                            ckv_cache_dtype=None):
    """Out-of-place v2: (k_rope, c_kv, updated copy of k_cache, updated copy of ckv_cache)."""
    k_out, ckv_out = k_cache.clone(), ckv_cache.clone()
    k_rope, c_kv = _kv_rmsnorm_rope_cache("npu_kv_rmsnorm_rope_cache_v2_functional", kv, gamma, cos, sin, index,
                                          k_out, ckv_out, k_rope_scale, c_kv_scale, k_rope_offset, c_kv_offset, v,
                                          epsilon, cache_mode, (k_cache_dtype, ckv_cache_dtype))
    return k_rope, c_kv, k_out, ckv_out
