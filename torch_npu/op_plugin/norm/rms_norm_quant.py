"""RmsNorm fused with int8 quantisation: npu_rms_norm_quant, npu_add_rms_norm_quant,
npu_add_rms_norm_dynamic_quant.

Formulas (torch_npu docs of the three ops; ``D`` = the last ``gamma.dim()`` dims):

* ``rstd = 1 / sqrt(mean_D(x^2) + epsilon)``, ``y = x * rstd * gamma + beta`` (beta optional
  where the op has it), with ``x = x1 + x2`` for the Add variants.
* npu_rms_norm_quant: ``out = round(y * scale + offset)``, ``scale``/``offset`` of shape (1,).
* npu_add_rms_norm_quant: ``y1 = round(y / scales1 + zero_points1)`` (``div_mode=True``) or
  ``round(y * scales1 + zero_points1)``, the same for ``y2`` with ``scales2``/``zero_points2``;
  scales/zero points have gamma's shape. Returns ``(y1, y2, x)``.
* npu_add_rms_norm_dynamic_quant: per row ``input = y * smooth_scale`` (optional),
  ``scale = max|input| / 127``, ``out = round(input / scale)``. Returns
  ``(y1, y2, x, scale1, scale2)``.

``round`` is round-half-to-even (the documented CAST_RINT) with saturation to int8; the
arithmetic runs in float32 on the float16/bfloat16 inputs (not rounded to the input dtype in
between). Only int8 results are emulated: quint4x2/int4 and the float8/hifloat8 destinations
raise NotImplementedError naming the argument (their packing / rounding is not documented).
What the real kernels leave unwritten is defined here: ``y2`` of npu_add_rms_norm_quant without
``scales2`` is zeros, and an output switched off by ``output_mask`` is a 0-d zero (the adapter
allocates a 0-d tensor for it). An all-zero row in the dynamic quantisation gets scale 0 and
zeros.

npu_rms_norm_quant_v2 (aclnnRmsNormQuantV3), int8 destination.

Formula (torch_npu doc ``torch_npu-npu_rms_norm_quant_v2.md`` and op-plugin's golden
``test_npu_rms_norm_quant_v2.py``): in float32,
``rstd = 1 / sqrt(mean(x^2 over the last dim) + epsilon)``, ``n = x * rstd * gamma (+ beta)``,
``q = n / scale + offset`` (``div_mode=True``) or ``n * scale + offset`` (False), and
``y = round(q)`` (half to even) saturated to int8. ``scale`` / ``offset`` are one number or one
per channel (``[N]``). The second output is ``rstd`` (float32 ``x.shape[:-1] + (1,)``) when x
requires grad, else an empty ``[0]`` float32 tensor, as op-plugin's adapter allocates it.

Not emulated (NotImplementedError naming the argument): ``gamma`` with more than one dim (the
golden reduces over a different axis than the adapter's rstd shape implies), int4 output
(``torch.quint4x2``: the golden packs without saying how out-of-range values saturate) and the
float8 / hifloat8 destinations.

_npu_rms_norm_backward_quant (aclnnRmsNormGradQuant; op-plugin golden
``test_npu_rms_norm_backward_quant.py``): exactly the golden's composition,
``(dx, dgamma) = npu_rms_norm_backward(dy, x, gamma, rstd)`` followed by
``npu_quantize(dx, scale_x, offset_x, dtype=dst_type, div_mode=div_mode)`` (dx is rounded to
x's dtype first, as the golden does); dgamma is float32. ``rstd`` may be given with or without
the kept normalised dims (the golden passes ``x.shape[:-1]``). Only ``quant_mode="static"`` and a
per-tensor ``scale_x`` (one value, as in the golden) are emulated.
"""
import torch

from torch_npu.op_plugin._common import check
from torch_npu.op_plugin._registry import impl

__all__ = []

_X_DTYPES = (torch.float16, torch.bfloat16)


def _int8_only(op, argname, value):
    """Accept None / torch.int8 (ScalarType code 1) as the destination dtype."""
    if value is None or value == 1 or value == torch.int8:
        return
    raise NotImplementedError("%s: %s=%r is not supported by the CPU-emulated NPU (only int8)"
                              % (op, argname, value))


def _gamma_dims(op, x, gamma):
    k = gamma.dim()
    check(1 <= k <= x.dim() and tuple(x.shape[x.dim() - k:]) == tuple(gamma.shape), op,
          "gamma shape %s must equal the last dims of x %s", (tuple(gamma.shape), tuple(x.shape)))
    return list(range(x.dim() - k, x.dim()))


def _rms_norm(x, gamma, beta, dims, epsilon):
    """``x * rstd * gamma + beta`` in float32 (x already float32)."""
    rstd = torch.rsqrt(x.square().mean(dims, keepdim=True) + epsilon)
    y = x * rstd * gamma.float()
    return y if beta is None else y + beta.float()


def _to_int8(v):
    return torch.round(v).clamp(-128, 127).to(torch.int8)


def _add_inputs(op, x1, x2, gamma):
    check(x1.dtype in _X_DTYPES, op, "x1 must be float16 or bfloat16, got %s", x1.dtype)
    check(x2.dtype == x1.dtype and x2.shape == x1.shape, op,
          "x2 (%s %s) must have x1's dtype and shape (%s %s)",
          (x2.dtype, tuple(x2.shape), x1.dtype, tuple(x1.shape)))
    check(gamma.dtype == x1.dtype, op, "gamma dtype %s must be x1's %s", (gamma.dtype, x1.dtype))
    return _gamma_dims(op, x1, gamma), x1.float() + x2.float()


def _like_gamma(op, name, t, gamma):
    if t is not None:
        check(tuple(t.shape) == tuple(gamma.shape), op, "%s shape %s must be gamma's %s",
              (name, tuple(t.shape), tuple(gamma.shape)))


@impl("npu_rms_norm_quant")
def npu_rms_norm_quant(x, gamma, beta, scale, offset, epsilon=1e-06, *, dst_dtype=None):
    """int8 ``round(RmsNorm(x) * gamma + beta) * scale + offset)`` with x's shape."""
    op = "npu_rms_norm_quant"
    _int8_only(op, "dst_dtype", dst_dtype)
    check(x.dtype in _X_DTYPES + (torch.float32,), op, "x must be float16, bfloat16 or float32, got %s", x.dtype)
    n = x.shape[-1]
    for name, t in (("gamma", gamma), ("beta", beta)):
        check(tuple(t.shape) in ((n,), (1, n)), op, "%s must be (%d,) or (1, %d), got %s",
              (name, n, n, tuple(t.shape)))
    for name, t in (("scale", scale), ("offset", offset)):
        check(tuple(t.shape) == (1,), op, "%s must have shape (1,), got %s", (name, tuple(t.shape)))
    y = _rms_norm(x.float(), gamma.reshape(n), beta.reshape(n), [x.dim() - 1], epsilon)
    return _to_int8(y * scale.float() + offset.float())


@impl("npu_add_rms_norm_quant")
def npu_add_rms_norm_quant(x1, x2, gamma, scales1, zero_points1, beta=None, scales2=None, zero_points2=None, *,
                           axis=-1, epsilon=1e-06, div_mode=True, dst_type=None):
    """``(y1, y2, x)``: int8 quantisations of ``RmsNorm(x1 + x2) * gamma + beta`` and the sum
    ``x`` in x1's dtype. See the module doc."""
    op = "npu_add_rms_norm_quant"
    check(axis == -1, op, "axis only support -1.")
    _int8_only(op, "dst_type", dst_type)
    dims, x = _add_inputs(op, x1, x2, gamma)
    for name, t in (("scales1", scales1), ("zero_points1", zero_points1), ("beta", beta),
                    ("scales2", scales2), ("zero_points2", zero_points2)):
        _like_gamma(op, name, t, gamma)
    check(zero_points2 is None or scales2 is not None, op, "zero_points2 needs scales2")
    y = _rms_norm(x, gamma, beta, dims, epsilon)

    def quantise(scales, zero_points):
        v = y / scales.float() if div_mode else y * scales.float()
        return _to_int8(v if zero_points is None else v + zero_points.float())

    y1 = quantise(scales1, zero_points1)
    y2 = torch.zeros_like(y1) if scales2 is None else quantise(scales2, zero_points2)
    return y1, y2, x.to(x1.dtype)


def _dynamic_int8(v):
    """Per-row symmetric int8: ``scale = max|v| / 127``, ``round(v / scale)`` (zero rows -> 0)."""
    scale = v.abs().amax(-1) / 127.0
    safe = torch.where(scale == 0, torch.ones_like(scale), scale)
    return _to_int8(v / safe.unsqueeze(-1)), scale


@impl("npu_add_rms_norm_dynamic_quant")
def npu_add_rms_norm_dynamic_quant(x1, x2, gamma, *, smooth_scale1=None, smooth_scale2=None, beta=None, epsilon=1e-6,
                                   output_mask=None, y_dtype=None):
    """``(y1, y2, x, scale1, scale2)``: per-row dynamic int8 quantisation of
    ``RmsNorm(x1 + x2) * gamma + beta`` (times the optional smooth scales). Without
    ``output_mask``, y1 is always produced and y2 only when both smooth scales are given."""
    op = "npu_add_rms_norm_dynamic_quant"
    _int8_only(op, "y_dtype", y_dtype)
    check(2 <= x1.dim() <= 8, op, "The x1 should be in 2~8D")
    dims, x = _add_inputs(op, x1, x2, gamma)
    check(gamma.dim() == 1, op, "gamma must be 1-D, got %d-D", gamma.dim())
    for name, t in (("smooth_scale1", smooth_scale1), ("smooth_scale2", smooth_scale2), ("beta", beta)):
        _like_gamma(op, name, t, gamma)
    if output_mask is not None:
        want1, want2 = bool(output_mask[0]), bool(output_mask[1])
        check(want1 or want2, op, "When the output_mask is not empty, at least one of y1 and y2 must be output.")
        check(smooth_scale1 is None or want1, op, "smooth_scale1 is given, so output_mask[0] must be True")
        check(smooth_scale2 is None or want2, op, "smooth_scale2 is given, so output_mask[1] must be True")
    else:
        want1, want2 = True, smooth_scale1 is not None and smooth_scale2 is not None
    y = _rms_norm(x, gamma, beta, dims, epsilon)

    def branch(want, smooth):
        if not want:
            return x1.new_zeros((), dtype=torch.int8), x1.new_zeros((), dtype=torch.float32)
        return _dynamic_int8(y if smooth is None else y * smooth.float())

    y1, s1 = branch(want1, smooth_scale1)
    y2, s2 = branch(want2, smooth_scale2)
    return y1, y2, x.to(x1.dtype), s1, s2


_FLOATS = (torch.float16, torch.bfloat16, torch.float32)


_INT8_CODE = 1


def _per_channel(op, name, t, n):
    check(t.dtype in _FLOATS, op, "%s must be float16, bfloat16 or float32, got %s", (name, t.dtype))
    check(t.numel() in (1, n), op, "%s must hold 1 or %d values, got shape %s", (name, n, tuple(t.shape)))
    return t.float().reshape(-1)


@impl("npu_rms_norm_quant_v2")
def npu_rms_norm_quant_v2(x, gamma, scale, *, offset=None, beta=None, epsilon=1e-06, div_mode=True, dst_dtype=None):
    """``(y int8 like x, rstd)``. See the module doc."""
    op = "npu_rms_norm_quant_v2"
    code = _INT8_CODE if dst_dtype is None else dst_dtype
    if code != _INT8_CODE:
        raise NotImplementedError("%s: dst_dtype=%r is not supported by the CPU-emulated NPU (only int8)"
                                  % (op, dst_dtype))
    check(x.dtype in _FLOATS, op, "x must be float16, bfloat16 or float32, got %s", x.dtype)
    check(1 <= x.dim() <= 8, op, "x must have 1 to 8 dims, got %d", x.dim())
    if gamma.dim() != 1:
        raise NotImplementedError("%s: gamma with %d dims is not supported by the CPU-emulated NPU (only 1-D)"
                                  % (op, gamma.dim()))
    n = x.shape[-1]
    check(gamma.shape[0] == n, op, "gamma must be [%d], got %s", (n, tuple(gamma.shape)))
    xf = x.float()
    rstd = torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + epsilon)
    v = xf * rstd * gamma.float()
    if beta is not None:
        check(tuple(beta.shape) == (n,), op, "beta must be [%d], got %s", (n, tuple(beta.shape)))
        v = v + beta.float()
    s = _per_channel(op, "scale", scale, n)
    v = v / s if div_mode else v * s
    if offset is not None:
        v = v + _per_channel(op, "offset", offset, n)
    y = torch.round(v).clamp(-128, 127).to(torch.int8)
    if x.requires_grad:
        return y, rstd
    return y, x.new_empty((0,), dtype=torch.float32)


@impl("_npu_rms_norm_backward_quant")
def _npu_rms_norm_backward_quant(dy, x, rstd, gamma, scale_x, *, offset_x=None, div_mode=True, quant_mode="static",
                                 dst_type=1):
    """``(dx quantised, dgamma float32)``. See the module doc."""
    op = "_npu_rms_norm_backward_quant"
    if quant_mode != "static":
        raise NotImplementedError("%s: quant_mode=%r is not supported by the CPU-emulated NPU (only 'static')"
                                  % (op, quant_mode))
    if scale_x.numel() != 1:
        raise NotImplementedError("%s: a per-channel scale_x (%d values) is not supported by the CPU-emulated NPU "
                                  "(only one value, as in the golden)" % (op, scale_x.numel()))
    check(dy.shape == x.shape, op, "dy must have x's shape %s, got %s", (tuple(x.shape), tuple(dy.shape)))
    check(1 <= gamma.dim() <= x.dim(), op, "gamma must have 1 to %d dims, got %d", (x.dim(), gamma.dim()))
    lead = list(x.shape[:x.dim() - gamma.dim()])
    check(rstd.numel() == max(1, _numel(lead)), op, "rstd must hold one value per normalised row (%s), got %s",
          (tuple(lead), tuple(rstd.shape)))
    rstd_kept = rstd.reshape(lead + [1] * gamma.dim())
    dx, dgamma = torch.ops.npu.npu_rms_norm_backward(dy, x, gamma, rstd_kept)
    dq = torch.ops.npu.npu_quantize(dx, scale_x.reshape(1), offset_x, 1 if dst_type is None else dst_type,
                                    div_mode=True if div_mode is None else div_mode)
    return dq, dgamma.float()


def _numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n
