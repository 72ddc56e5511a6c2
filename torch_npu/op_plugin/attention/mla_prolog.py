"""npu_mla_prolog, _v2, _v3, _v3_functional: the pre-processing of DeepSeek's multi-head latent attention.

Documented formula (torch_npu docs, aclnnMlaProlog docs and design note, op-plugin goldens),
per token t (B and S are flattened to T = B*S):

    c^Q   = RmsNorm_cq(x @ W^DQ)                        [T, Hcq]
    [q^C | q^R'] = c^Q @ W^UQ_QR, split per head         [T, N, D] and [T, N, Dr]
    query      = q^C @ W^UK[n]   (per head n)            [T, N, Hckv]
    query_rope = ROPE(q^R')                              [T, N, Dr]
    [c^KV | k^R'] = x @ W^DKV_KR                         [T, Hckv] and [T, Dr]
    kv_cache[slot] = RmsNorm_ckv(c^KV),  kr_cache[slot] = ROPE(k^R'),  slot = cache_index[t]

``RmsNorm(v) = gamma * v / sqrt(mean(v^2) + eps)``. ROPE is the de-interleaving form of the
design note (formula 15), also what the goldens compute: the even elements of the input go to
the first half, the odd ones to the second half, then ``out = v * cos + rotate_half(v) * sin``
with ``rotate_half(v) = [-v[Dr/2:], v[:Dr/2]]`` and ``rope_cos``/``rope_sin`` used elementwise.

Caches: slot s is block ``s // BlockSize``, row ``s % BlockSize``. ``PA_BSND`` writes the row
into ``cache[block, row, :, :]`` (every Nkv head gets the same row, as the golden). ``PA_NZ``
stores each block as FRACTAL_NZ in the same memory (design note: H cut into 32-byte pieces of
c0 elements, piece c of row r at ``block_base + c * BlockSize * c0 + r * c0``); the tensor keeps
its declared shape, only the element order inside a block differs. The caches are updated in
place and returned as ``kv_cache_out``/``kr_cache_out`` (the same tensors, as op-plugin does).

Precision: float32 compute (float64 stays float64); the inputs of the second and third matmul
(c^Q, q^C) are rounded to the weights' dtype as the cube unit consumes them.

Quantised scenarios emulated (formulas of the op-plugin goldens):
* partial quant, kv_cache not quantised: ``weight_uq_qr`` int8 with per-channel
  ``dequant_scale_w_uq_qr`` (1, N*(D+Dr)); c^Q is dynamically quantised per token
  (``scale_t = max|c^Q_t * smooth| / 127``, ``round(c^Q_t * smooth / scale_t)``; smooth is
  ``smooth_scales_cq`` (1, Hcq) or 1), the int product is dequantised by ``scale_t *
  dequant_scale_w_uq_qr``.
* v2 full quant, kv_cache not quantised: ``token_x``, ``weight_dq``, ``weight_dkv_kr`` int8 too,
  with ``dequant_scale_x`` (T, 1), ``dequant_scale_w_dq`` (1, Hcq), ``dequant_scale_w_dkv_kr``
  (1, Hckv+Dr): ``x @ W`` is computed in integers and scaled by ``dequant_scale_x[t] *
  dequant_scale_w[col]``.
int8 ``kv_cache``/``kr_cache`` (quantised cache output, and v2's dynamically quantised query
with ``dequant_scale_q_nope`` (T, N, 1)) raise NotImplementedError: the per-channel cache
quantisation is not fully stated for these ops. v2's ``dequant_scale_q_nope`` is then the (1,)
float32 tensor the op allocates and does not write; it is returned as zeros here.

v3 (docs of torch_npu.npu_mla_prolog_v3 and aclnnMlaPrologV3WeightNz): ``c^Q = qc_qr_scale *
RmsNorm(..)`` (so both query and query_rope scale) and ``c^KV = kc_scale * RmsNorm(..)``;
``cache_mode`` "BSND"/"TND" take caches shaped like the tokens (B, S, Nkv, Hckv) / (T, Nkv, Hckv),
one row per token and no cache_index; ``weight_quant_mode`` 0/1/2 select the non-quant / partial /
full scenarios above (checked against the dtypes). ``query_norm`` is c^Q as fed to the W^UQ_QR
matmul (weight_uq_qr's dtype) with ``query_norm_flag``; dequant_scale_q_nope / dequant_scale_q_norm
are the (0,) tensors of these scenarios. ``_functional`` writes into copies of the caches and
returns them as outputs 6 and 7. NotImplementedError: kv_cache_quant_mode / query_quant_mode /
ckvkr_repo_mode / quant_scale_repo_mode other than 0, weight_quant_mode 3, PA_BLK_* cache modes,
actual_seq_len, k_nope_clip_alpha, the ``*_dtype`` arguments, and query_norm together with
quantisation or a qc_qr_scale other than 1 (the docs do not say what it holds then).
"""
import math

import torch

from torch_npu.op_plugin._common import check, symbolic, unsupported
from torch_npu.op_plugin._registry import impl

__all__ = []

_CACHE_MODES = ("PA_BSND", "PA_NZ")
_V3_CACHE_MODES = ("PA_BSND", "PA_NZ", "BSND", "TND")
_NZ_PIECE_BYTES = 32
_FLOATS = (torch.bfloat16, torch.float16, torch.float32, torch.float64)


def _compute_dtype(t):
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def _rms_norm(v, gamma, eps):
    return v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + eps) * gamma.to(v.dtype)


def _rope(v, cos, sin):
    """De-interleave (evens, then odds), then ``v * cos + rotate_half(v) * sin``."""
    half = v.shape[-1] // 2
    v = torch.cat((v[..., 0::2], v[..., 1::2]), -1)
    rotated = torch.cat((-v[..., half:], v[..., :half]), -1)
    return v * cos + rotated * sin


def _int_matmul(a, w):
    """Product of integer-valued ``a`` and int8 ``w``, exact (float64 holds int32 sums exactly)."""
    return a.to(torch.float64) @ w.to(torch.float64)


def _dynamic_quant_per_token(c, smooth):
    """Per-token symmetric int8 quantisation of ``c`` [T, H]: (integer values, scale [T, 1])."""
    if smooth is not None:
        c = c * smooth.to(c.dtype).reshape(1, -1)
    scale = c.abs().amax(-1, keepdim=True) / 127
    return torch.round(c / scale), scale


def _check_shape(op, name, t, shape):
    check(t is not None and tuple(t.shape) == tuple(shape), op, "%s must have shape %s, got %s", (name, tuple(shape), None if t is None else tuple(t.shape)))


def _write_cache(op, name, cache, rows, slots, cache_mode):
    """Writes rows [T, H] (already in the cache dtype) at ``slots`` [T], in place."""
    nb, bs, nkv, h = cache.shape
    if rows.shape[0] == 0 or nb * bs == 0:
        return  # documented: empty inputs or an empty cache leave the caches untouched
    check(cache.is_contiguous(), op, "%s must be contiguous", name)
    if cache_mode == "PA_BSND":
        flat = cache.view(nb * bs, nkv, h)
        flat[slots] = rows.unsqueeze(1).expand(-1, nkv, -1)
        return
    c0 = _NZ_PIECE_BYTES // cache.element_size()
    check(h % c0 == 0, op, "PA_NZ: the last dim of %s (%d) must be a multiple of %d (32 bytes)", (name, h, c0))
    check(nkv == 1, op, "PA_NZ: Nkv must be 1, got %d", nkv)
    nz = cache.view(nb, h // c0, bs, c0)
    nz[slots // bs, :, slots % bs, :] = rows.reshape(rows.shape[0], h // c0, c0)


def _mla_prolog(op, v2, token_x, weight_dq, weight_uq_qr, weight_uk, weight_dkv_kr, rmsnorm_gamma_cq,
                rmsnorm_gamma_ckv, rope_sin, rope_cos, cache_index, kv_cache, kr_cache, dequant_scale_x,
                dequant_scale_w_dq, dequant_scale_w_uq_qr, dequant_scale_w_dkv_kr, quant_scale_ckv,
                quant_scale_ckr, smooth_scales_cq, eps_cq, eps_ckv, cache_mode, cache_modes=_CACHE_MODES,
                qc_qr_scale=1.0, kc_scale=1.0):
    """The shared pipeline; returns (query, query_rope, c^Q as fed to the W^UQ_QR matmul [T, Hcq])."""
    # --- shapes -------------------------------------------------------------------------------
    check(token_x.dim() in (2, 3), op, "token_x dim num should be 2 or 3, but the actual value is %d", token_x.dim())
    check(weight_uk.dim() == 3, op, "weight_uk dim num should be 3, but the actual value is %d", weight_uk.dim())
    check(rope_sin.dim() in (2, 3), op, "rope_sin dim num should be 2 or 3, but the actual value is %d", rope_sin.dim())
    check(cache_mode in cache_modes, op, "cache_mode must be one of %s, got %r", (cache_modes, cache_mode))
    paged = cache_mode.startswith("PA_")
    lead = tuple(token_x.shape[:-1])
    he = token_x.shape[-1]
    n, d, hckv = weight_uk.shape
    dr = rope_sin.shape[-1]
    check(dr % 2 == 0, op, "the rope dim Dr must be even, got %d", dr)
    check(weight_dq.dim() == 2 and weight_dq.shape[0] == he, op, "weight_dq must be (He=%d, Hcq), got %s", (he, tuple(weight_dq.shape)))
    hcq = weight_dq.shape[1]
    _check_shape(op, "weight_uq_qr", weight_uq_qr, (hcq, n * (d + dr)))
    _check_shape(op, "weight_dkv_kr", weight_dkv_kr, (he, hckv + dr))
    _check_shape(op, "rmsnorm_gamma_cq", rmsnorm_gamma_cq, (hcq,))
    _check_shape(op, "rmsnorm_gamma_ckv", rmsnorm_gamma_ckv, (hckv,))
    _check_shape(op, "rope_sin", rope_sin, lead + (dr,))
    _check_shape(op, "rope_cos", rope_cos, lead + (dr,))
    if paged:
        _check_shape(op, "cache_index", cache_index, lead)
        check(cache_index.dtype == torch.int64, op, "cache_index must be int64, got %s", cache_index.dtype)
        check(kv_cache.dim() == 4 and kv_cache.shape[-1] == hckv, op,
              "kv_cache must be (BlockNum, BlockSize, Nkv, Hckv=%d), got %s", (hckv, tuple(kv_cache.shape)))
        _check_shape(op, "kr_cache", kr_cache, tuple(kv_cache.shape[:3]) + (dr,))
    else:  # BSND / TND: one cache row per token, in token order
        check((cache_mode == "BSND") == (len(lead) == 2), op, "cache_mode %s needs token_x %s", (cache_mode, "(B, S, He)" if cache_mode == "BSND" else "(T, He)"))
        check(kv_cache.dim() == len(lead) + 2 and tuple(kv_cache.shape[:len(lead)]) == lead
              and kv_cache.shape[-1] == hckv, op, "kv_cache must be %s + (Nkv, Hckv=%d), got %s", (lead, hckv, tuple(kv_cache.shape)))
        _check_shape(op, "kr_cache", kr_cache, tuple(kv_cache.shape[:-1]) + (dr,))

    # --- scenario -----------------------------------------------------------------------------
    full_quant = token_x.dtype == torch.int8
    partial_quant = not full_quant and weight_uq_qr.dtype == torch.int8
    if full_quant and not v2:
        check(False, op, "token_x must be bfloat16 (int8 token_x is npu_mla_prolog_v2's full-quant scenario)")
    if kv_cache.dtype == torch.int8 or kr_cache.dtype == torch.int8:
        unsupported(op, "int8 kv_cache/kr_cache (kv-cache quantisation with quant_scale_ckv/quant_scale_ckr)")
    check(kv_cache.dtype in _FLOATS and kr_cache.dtype in _FLOATS, op, "kv_cache/kr_cache must be bfloat16 or int8")
    for name, value in (("quant_scale_ckv", quant_scale_ckv), ("quant_scale_ckr", quant_scale_ckr)):
        check(value is None, op, "%s must be None when kv_cache/kr_cache are not int8", name)
    if full_quant:
        check(weight_dq.dtype == torch.int8 and weight_uq_qr.dtype == torch.int8 and weight_dkv_kr.dtype == torch.int8,
              op, "full quant (int8 token_x) needs int8 weight_dq, weight_uq_qr and weight_dkv_kr")
        tokens = math.prod(lead)
        check(dequant_scale_x is not None and tuple(dequant_scale_x.shape) in ((tokens, 1), (tokens,)), op,
              "dequant_scale_x must have shape (%d, 1), got %s", (tokens, None if dequant_scale_x is None else tuple(dequant_scale_x.shape)))
        _check_shape(op, "dequant_scale_w_dq", dequant_scale_w_dq, (1, hcq))
        _check_shape(op, "dequant_scale_w_dkv_kr", dequant_scale_w_dkv_kr, (1, hckv + dr))
    else:
        reserved = "reserved in npu_mla_prolog" if not v2 else "only used with int8 token_x (full quant)"
        for name, value in (("dequant_scale_x", dequant_scale_x), ("dequant_scale_w_dq", dequant_scale_w_dq),
                            ("dequant_scale_w_dkv_kr", dequant_scale_w_dkv_kr)):
            check(value is None, op, "%s must be None (%s)", (name, reserved))
        check(token_x.dtype in _FLOATS, op, "token_x must be bfloat16 (or int8 in v2), got %s", token_x.dtype)
        check(weight_dq.dtype == token_x.dtype and weight_dkv_kr.dtype == token_x.dtype, op,
              "weight_dq and weight_dkv_kr must have token_x's dtype %s, got %s and %s", (token_x.dtype, weight_dq.dtype, weight_dkv_kr.dtype))
    if full_quant or partial_quant:
        _check_shape(op, "dequant_scale_w_uq_qr", dequant_scale_w_uq_qr, (1, n * (d + dr)))
        if smooth_scales_cq is not None:
            _check_shape(op, "smooth_scales_cq", smooth_scales_cq, (1, hcq))
    else:
        check(weight_uq_qr.dtype == token_x.dtype, op, "weight_uq_qr must be %s or int8, got %s", (token_x.dtype, weight_uq_qr.dtype))
        for name, value in (("dequant_scale_w_uq_qr", dequant_scale_w_uq_qr), ("smooth_scales_cq", smooth_scales_cq)):
            check(value is None, op, "%s must be None when weight_uq_qr is not int8 (non-quant scenario)", name)
    check(weight_uk.dtype in _FLOATS, op, "weight_uk must be bfloat16, got %s", weight_uk.dtype)

    # --- compute ------------------------------------------------------------------------------
    out_dtype = rope_sin.dtype
    cdt = torch.float64 if out_dtype == torch.float64 else torch.float32
    x = token_x.reshape(-1, he)
    t = x.shape[0]
    slots = cache_index.reshape(t) if paged else None
    cos = rope_cos.reshape(t, dr).to(cdt)
    sin = rope_sin.reshape(t, dr).to(cdt)
    if paged and t and kv_cache.shape[0] * kv_cache.shape[1] and not symbolic(cache_index):
        lo, hi = int(slots.min()), int(slots.max())  # host read: a bad slot would corrupt memory on hardware
        cap = kv_cache.shape[0] * kv_cache.shape[1]
        check(0 <= lo and hi < cap, op, "cache_index values must lie in [0, BlockNum*BlockSize) = [0, %d), got [%d, %d]", (cap, lo, hi + 1))
    elif paged and t and kv_cache.shape[0] * kv_cache.shape[1]:
        # tracing (torch.compile): the same bound, checked by the compiled graph at run time
        # (indexing alone would accept negative slots, counting from the end of the cache)
        cap = kv_cache.shape[0] * kv_cache.shape[1]
        torch._assert_async(((slots >= 0) & (slots < cap)).all(),
                            "%s: cache_index values must lie in [0, BlockNum*BlockSize) = [0, %d)" % (op, cap))

    if full_quant:
        sx = dequant_scale_x.reshape(t, 1).to(cdt)
        c_q = (_int_matmul(x, weight_dq).to(cdt) * sx) * dequant_scale_w_dq.to(cdt)
        ckv_kr = (_int_matmul(x, weight_dkv_kr).to(cdt) * sx) * dequant_scale_w_dkv_kr.to(cdt)
    else:
        c_q = torch.matmul(x.to(cdt), weight_dq.to(cdt))
        ckv_kr = torch.matmul(x.to(cdt), weight_dkv_kr.to(cdt))
    c_q = qc_qr_scale * _rms_norm(c_q, rmsnorm_gamma_cq, eps_cq)
    if full_quant or partial_quant:
        c_int, c_scale = _dynamic_quant_per_token(c_q, smooth_scales_cq)
        q_all = _int_matmul(c_int, weight_uq_qr).to(cdt) * c_scale * dequant_scale_w_uq_qr.to(cdt)
    else:
        c_q = c_q.to(weight_uq_qr.dtype)
        q_all = torch.matmul(c_q.to(cdt), weight_uq_qr.to(cdt))
    q_all = q_all.reshape(t, n, d + dr)
    q_c = q_all[..., :d].to(weight_uk.dtype).to(cdt)
    query = torch.einsum("tnd,ndh->tnh", q_c, weight_uk.to(cdt))
    query_rope = _rope(q_all[..., d:], cos.unsqueeze(1), sin.unsqueeze(1))

    c_kv = kc_scale * _rms_norm(ckv_kr[:, :hckv], rmsnorm_gamma_ckv, eps_ckv)
    k_rope = _rope(ckv_kr[:, hckv:], cos, sin)
    if paged:
        _write_cache(op, "kv_cache", kv_cache, c_kv.to(kv_cache.dtype), slots, cache_mode)
        _write_cache(op, "kr_cache", kr_cache, k_rope.to(kr_cache.dtype), slots, cache_mode)
    else:
        kv_cache.copy_(c_kv.to(kv_cache.dtype).reshape(lead + (1, hckv)).expand(kv_cache.shape))
        kr_cache.copy_(k_rope.to(kr_cache.dtype).reshape(lead + (1, dr)).expand(kr_cache.shape))

    rope_dtype = torch.bfloat16 if v2 else out_dtype  # v2 allocates query_rope as bfloat16
    return (query.to(out_dtype).reshape(lead + (n, hckv)), query_rope.to(rope_dtype).reshape(lead + (n, dr)),
            c_q.reshape(lead + (hcq,)))


@impl("npu_mla_prolog")
def npu_mla_prolog(token_x, weight_dq, weight_uq_qr, weight_uk, weight_dkv_kr, rmsnorm_gamma_cq, rmsnorm_gamma_ckv,
                   rope_sin, rope_cos, cache_index, kv_cache, kr_cache, *, dequant_scale_x=None,
                   dequant_scale_w_dq=None, dequant_scale_w_uq_qr=None, dequant_scale_w_dkv_kr=None,
                   quant_scale_ckv=None, quant_scale_ckr=None, smooth_scales_cq=None, rmsnorm_epsilon_cq=1e-05,
                   rmsnorm_epsilon_ckv=1e-05, cache_mode="PA_BSND"):
    """MLA prolog (see the module doc). Returns (query [.., N, Hckv], query_rope [.., N, Dr],
    kv_cache, kr_cache), the caches updated in place at ``cache_index``."""
    query, query_rope, _ = _mla_prolog(
        "npu_mla_prolog", False, token_x, weight_dq, weight_uq_qr, weight_uk, weight_dkv_kr, rmsnorm_gamma_cq,
        rmsnorm_gamma_ckv, rope_sin, rope_cos, cache_index, kv_cache, kr_cache, dequant_scale_x, dequant_scale_w_dq,
        dequant_scale_w_uq_qr, dequant_scale_w_dkv_kr, quant_scale_ckv, quant_scale_ckr, smooth_scales_cq,
        rmsnorm_epsilon_cq, rmsnorm_epsilon_ckv, cache_mode)
    return query, query_rope, kv_cache, kr_cache


@impl("npu_mla_prolog_v2")
def npu_mla_prolog_v2(token_x, weight_dq, weight_uq_qr, weight_uk, weight_dkv_kr, rmsnorm_gamma_cq,
                      rmsnorm_gamma_ckv, rope_sin, rope_cos, cache_index, kv_cache, kr_cache, *, dequant_scale_x=None,
                      dequant_scale_w_dq=None, dequant_scale_w_uq_qr=None, dequant_scale_w_dkv_kr=None,
                      quant_scale_ckv=None, quant_scale_ckr=None, smooth_scales_cq=None, rmsnorm_epsilon_cq=1e-05,
                      rmsnorm_epsilon_ckv=1e-05, cache_mode="PA_BSND"):
    """MLA prolog v2 (see the module doc): as npu_mla_prolog plus the full-quant scenario and a
    fifth output ``dequant_scale_q_nope``, here always the (1,) float32 tensor of the scenarios
    without kv-cache quantisation (zeros: the op does not write it there)."""
    query, query_rope, _ = _mla_prolog(
        "npu_mla_prolog_v2", True, token_x, weight_dq, weight_uq_qr, weight_uk, weight_dkv_kr, rmsnorm_gamma_cq,
        rmsnorm_gamma_ckv, rope_sin, rope_cos, cache_index, kv_cache, kr_cache, dequant_scale_x, dequant_scale_w_dq,
        dequant_scale_w_uq_qr, dequant_scale_w_dkv_kr, quant_scale_ckv, quant_scale_ckr, smooth_scales_cq,
        rmsnorm_epsilon_cq, rmsnorm_epsilon_ckv, cache_mode)
    dequant_scale_q_nope = torch.zeros(1, dtype=torch.float32, device=query.device)
    return query, query_rope, kv_cache, kr_cache, dequant_scale_q_nope


_V3_DTYPE_ARGS = ("token_x_dtype", "weight_dq_dtype", "weight_uq_qr_dtype", "weight_dkv_kr_dtype", "kv_cache_dtype")


def _mla_prolog_v3(op, token_x, weight_dq, weight_uq_qr, weight_uk, weight_dkv_kr, rmsnorm_gamma_cq, rmsnorm_gamma_ckv,
                   rope_sin, rope_cos, kv_cache, kr_cache, cache_index, dequant_scale_x, dequant_scale_w_dq,
                   dequant_scale_w_uq_qr, dequant_scale_w_dkv_kr, quant_scale_ckv, quant_scale_ckr, smooth_scales_cq,
                   actual_seq_len, k_nope_clip_alpha, rmsnorm_epsilon_cq, rmsnorm_epsilon_ckv, cache_mode,
                   query_norm_flag, weight_quant_mode, kv_cache_quant_mode, query_quant_mode, ckvkr_repo_mode,
                   quant_scale_repo_mode, qc_qr_scale, kc_scale, dtype_args):
    """v3 on top of the shared pipeline; returns its five outputs (the caches are written in place)."""
    if cache_mode in ("PA_BLK_BSND", "PA_BLK_NZ"):
        unsupported(op, "cache_mode=%r (block-wise cache_index / actual_seq_len)" % cache_mode)
    for name, value in (("kv_cache_quant_mode", kv_cache_quant_mode), ("query_quant_mode", query_quant_mode),
                        ("ckvkr_repo_mode", ckvkr_repo_mode), ("quant_scale_repo_mode", quant_scale_repo_mode)):
        if value != 0:
            unsupported(op, "%s=%r (quantised or merged kv_cache layouts)" % (name, value))
    for name, value in (("k_nope_clip_alpha", k_nope_clip_alpha), ("actual_seq_len", actual_seq_len)):
        if value is not None:
            unsupported(op, "%s (per-tile quantisation / PA_BLK cache modes)" % name)
    for name, value in zip(_V3_DTYPE_ARGS, dtype_args):
        if value is not None:
            unsupported(op, "%s=%r (low-bit dtypes beyond the documented int8/bfloat16)" % (name, value))
    check(weight_quant_mode in (0, 1, 2, 3), op, "weight_quant_mode must be 0, 1, 2 or 3, got %r", weight_quant_mode)
    if weight_quant_mode == 3:
        unsupported(op, "weight_quant_mode=3 (per-tile kv_cache quantisation)")
    want = {0: (False, False), 1: (False, True), 2: (True, True)}[weight_quant_mode]
    got = (token_x.dtype == torch.int8, weight_uq_qr.dtype == torch.int8)
    if weight_quant_mode == 2 and not got[0]:
        unsupported(op, "weight_quant_mode=2 with bfloat16 token_x (per-channel kv_cache quantisation)")
    check(got == want, op, "weight_quant_mode=%d needs int8 %s, got token_x %s and weight_uq_qr %s", (weight_quant_mode, {0: "nothing", 1: "weight_uq_qr", 2: "token_x and weights"}[weight_quant_mode],
             token_x.dtype, weight_uq_qr.dtype))
    if query_norm_flag and weight_quant_mode != 0:
        unsupported(op, "query_norm_flag=True with weight_quant_mode=%d (quantised query_norm)" % weight_quant_mode)
    if query_norm_flag and qc_qr_scale != 1.0:
        unsupported(op, "query_norm_flag=True with qc_qr_scale != 1 (whether query_norm carries the scale "
                          "is not documented)")
    if cache_index is None:
        check(cache_mode in ("BSND", "TND"), op, "cache_index is required with cache_mode %r", cache_mode)
        cache_index = token_x.new_zeros(token_x.shape[:-1], dtype=torch.int64)  # placeholder, unused
    query, query_rope, c_q = _mla_prolog(
        op, True, token_x, weight_dq, weight_uq_qr, weight_uk, weight_dkv_kr, rmsnorm_gamma_cq, rmsnorm_gamma_ckv,
        rope_sin, rope_cos, cache_index, kv_cache, kr_cache, dequant_scale_x, dequant_scale_w_dq,
        dequant_scale_w_uq_qr, dequant_scale_w_dkv_kr, quant_scale_ckv, quant_scale_ckr, smooth_scales_cq,
        rmsnorm_epsilon_cq, rmsnorm_epsilon_ckv, cache_mode, _V3_CACHE_MODES, qc_qr_scale, kc_scale)
    empty = torch.empty(0, dtype=torch.float32, device=query.device)
    query_norm = c_q if query_norm_flag else torch.empty(0, dtype=weight_uq_qr.dtype, device=query.device)
    return query, query_rope, empty, query_norm, empty.clone()


@impl("npu_mla_prolog_v3")
def npu_mla_prolog_v3(token_x, weight_dq, weight_uq_qr, weight_uk, weight_dkv_kr, rmsnorm_gamma_cq, rmsnorm_gamma_ckv,
                      rope_sin, rope_cos, kv_cache, kr_cache, *, cache_index=None, dequant_scale_x=None,
                      dequant_scale_w_dq=None, dequant_scale_w_uq_qr=None, dequant_scale_w_dkv_kr=None,
                      quant_scale_ckv=None, quant_scale_ckr=None, smooth_scales_cq=None, actual_seq_len=None,
                      k_nope_clip_alpha=None, rmsnorm_epsilon_cq=1e-05, rmsnorm_epsilon_ckv=1e-05,
                      cache_mode="PA_BSND", query_norm_flag=False, weight_quant_mode=0, kv_cache_quant_mode=0,
                      query_quant_mode=0, ckvkr_repo_mode=0, quant_scale_repo_mode=0, tile_size=128,
                      qc_qr_scale=1.0, kc_scale=1.0, token_x_dtype=None, weight_dq_dtype=None,
                      weight_uq_qr_dtype=None, weight_dkv_kr_dtype=None, kv_cache_dtype=None):
    """MLA prolog v3 (see the module doc): v2's pipeline with ``c^Q = qc_qr_scale * RmsNorm(..)``
    and ``c^KV = kc_scale * RmsNorm(..)``, the BSND/TND caches, and outputs (query, query_rope,
    dequant_scale_q_nope (0,), query_norm (c^Q [.., Hcq] with query_norm_flag, else (0,)),
    dequant_scale_q_norm (0,)); kv_cache/kr_cache are updated in place. ``tile_size`` only
    matters for the per-tile quantisation, which is not emulated."""
    return _mla_prolog_v3(
        "npu_mla_prolog_v3", token_x, weight_dq, weight_uq_qr, weight_uk, weight_dkv_kr, rmsnorm_gamma_cq,
        rmsnorm_gamma_ckv, rope_sin, rope_cos, kv_cache, kr_cache, cache_index, dequant_scale_x, dequant_scale_w_dq,
        dequant_scale_w_uq_qr, dequant_scale_w_dkv_kr, quant_scale_ckv, quant_scale_ckr, smooth_scales_cq,
        actual_seq_len, k_nope_clip_alpha, rmsnorm_epsilon_cq, rmsnorm_epsilon_ckv, cache_mode, query_norm_flag,
        weight_quant_mode, kv_cache_quant_mode, query_quant_mode, ckvkr_repo_mode, quant_scale_repo_mode,
        qc_qr_scale, kc_scale, (token_x_dtype, weight_dq_dtype, weight_uq_qr_dtype, weight_dkv_kr_dtype,
                                kv_cache_dtype))


@impl("npu_mla_prolog_v3_functional")
def npu_mla_prolog_v3_functional(token_x, weight_dq, weight_uq_qr, weight_uk, weight_dkv_kr, rmsnorm_gamma_cq,
                                 rmsnorm_gamma_ckv, rope_sin, rope_cos, kv_cache, kr_cache, *, cache_index=None,
                                 dequant_scale_x=None, dequant_scale_w_dq=None, dequant_scale_w_uq_qr=None,
                                 dequant_scale_w_dkv_kr=None, quant_scale_ckv=None, quant_scale_ckr=None,
                                 smooth_scales_cq=None, actual_seq_len=None, k_nope_clip_alpha=None,
                                 rmsnorm_epsilon_cq=1e-05, rmsnorm_epsilon_ckv=1e-05, cache_mode="PA_BSND",
                                 query_norm_flag=False, weight_quant_mode=0, kv_cache_quant_mode=0,
                                 query_quant_mode=0, ckvkr_repo_mode=0, quant_scale_repo_mode=0, tile_size=128,
                                 qc_qr_scale=1.0, kc_scale=1.0, token_x_dtype=None, weight_dq_dtype=None,
                                 weight_uq_qr_dtype=None, weight_dkv_kr_dtype=None, kv_cache_dtype=None):
    """npu_mla_prolog_v3 without side effects: the inputs are left alone and the updated caches
    come back as two new tensors after the five outputs (seven in all)."""
    kv_out = kv_cache.clone(memory_format=torch.contiguous_format)
    kr_out = kr_cache.clone(memory_format=torch.contiguous_format)
    outs = _mla_prolog_v3(
        "npu_mla_prolog_v3_functional", token_x, weight_dq, weight_uq_qr, weight_uk, weight_dkv_kr, rmsnorm_gamma_cq,
        rmsnorm_gamma_ckv, rope_sin, rope_cos, kv_out, kr_out, cache_index, dequant_scale_x, dequant_scale_w_dq,
        dequant_scale_w_uq_qr, dequant_scale_w_dkv_kr, quant_scale_ckv, quant_scale_ckr, smooth_scales_cq,
        actual_seq_len, k_nope_clip_alpha, rmsnorm_epsilon_cq, rmsnorm_epsilon_ckv, cache_mode, query_norm_flag,
        weight_quant_mode, kv_cache_quant_mode, query_quant_mode, ckvkr_repo_mode, quant_scale_repo_mode,
        qc_qr_scale, kc_scale, (token_x_dtype, weight_dq_dtype, weight_uq_qr_dtype, weight_dkv_kr_dtype,
                                kv_cache_dtype))
    return outs + (kv_out, kr_out)
