"""npu_rms_norm_quant_v2 (aclnnRmsNormQuantV3), int8 destination.

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

_FLOATS = (torch.float16, torch.bfloat16, torch.float32)
_INT8_CODE = 1


def _per_channel(op, name, t, n):
    check(t.dtype in _FLOATS, op, "%s must be float16, bfloat16 or float32, got %s" % (name, t.dtype))
    check(t.numel() in (1, n), op, "%s must hold 1 or %d values, got shape %s" % (name, n, tuple(t.shape)))
    return t.float().reshape(-1)


@impl("npu_rms_norm_quant_v2")
def npu_rms_norm_quant_v2(x, gamma, scale, *, offset=None, beta=None, epsilon=1e-06, div_mode=True, dst_dtype=None):
    """``(y int8 like x, rstd)``. See the module doc."""
    op = "npu_rms_norm_quant_v2"
    code = _INT8_CODE if dst_dtype is None else dst_dtype
    if code != _INT8_CODE:
        raise NotImplementedError("%s: dst_dtype=%r is not supported by the CPU-emulated NPU (only int8)"
                                  % (op, dst_dtype))
    check(x.dtype in _FLOATS, op, "x must be float16, bfloat16 or float32, got %s" % x.dtype)
    check(1 <= x.dim() <= 8, op, "x must have 1 to 8 dims, got %d" % x.dim())
    if gamma.dim() != 1:
        raise NotImplementedError("%s: gamma with %d dims is not supported by the CPU-emulated NPU (only 1-D)"
                                  % (op, gamma.dim()))
    n = x.shape[-1]
    check(gamma.shape[0] == n, op, "gamma must be [%d], got %s" % (n, tuple(gamma.shape)))
    xf = x.float()
    rstd = torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + epsilon)
    v = xf * rstd * gamma.float()
    if beta is not None:
        check(tuple(beta.shape) == (n,), op, "beta must be [%d], got %s" % (n, tuple(beta.shape)))
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
    check(dy.shape == x.shape, op, "dy must have x's shape %s, got %s" % (tuple(x.shape), tuple(dy.shape)))
    check(1 <= gamma.dim() <= x.dim(), op, "gamma must have 1 to %d dims, got %d" % (x.dim(), gamma.dim()))
    lead = list(x.shape[:x.dim() - gamma.dim()])
    check(rstd.numel() == max(1, _numel(lead)), op, "rstd must hold one value per normalised row (%s), got %s"
          % (tuple(lead), tuple(rstd.shape)))
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
