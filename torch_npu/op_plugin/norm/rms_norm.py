"""Normalisation ops: RMSNorm family and layer_norm_eval."""
import torch
import torch.nn.functional as F

from torch_npu.op_plugin._common import acc, check, stat_dtype
from torch_npu.op_plugin._registry import impl

__all__ = []


def _norm_dims(op, x, gamma):
    k = gamma.dim()
    check(1 <= k <= x.dim(), op, "gamma must have 1..%d dims, got %d", (x.dim(), k))
    check(tuple(x.shape[x.dim() - k:]) == tuple(gamma.shape), op,
          "gamma shape %s must equal the last %d dims of the input %s", (tuple(gamma.shape), k, tuple(x.shape)))
    return list(range(x.dim() - k, x.dim()))


def _rms_norm(op, x, gamma, epsilon):
    dims = _norm_dims(op, x, gamma)
    xf = acc(x)
    rstd = torch.rsqrt(xf.square().mean(dims, keepdim=True) + epsilon)
    y = (xf * rstd * acc(gamma)).to(x.dtype)
    return y, rstd.to(stat_dtype(x))


@impl("npu_rms_norm")
def npu_rms_norm(self, gamma, epsilon=1e-6):
    """RMSNorm over the trailing ``gamma.dim()`` dimensions.

    ``rstd = 1 / sqrt(mean(x^2 over those dims) + epsilon)`` (kept dims, so its shape
    is the input's with the normalised dims set to 1), ``y = x * rstd * gamma``.
    Computed in float32 for float16/bfloat16 inputs; ``y`` has the input dtype,
    ``rstd`` is float32 (float64 for float64 inputs). Returns ``(y, rstd)``.
    """
    return _rms_norm("npu_rms_norm", self, gamma, epsilon)


@impl("npu_rms_norm_backward")
def npu_rms_norm_backward(dy, self, gamma, rstd):
    """Gradients of :func:`npu_rms_norm` given the saved ``rstd``.

    With ``xhat = x * rstd`` and ``g = dy * gamma`` (normalised dims D):
    ``dx = rstd * (g - xhat * mean_D(g * xhat))`` and
    ``dgamma = sum over the leading dims of dy * xhat``.
    Returns ``(dx, dgamma)``; ``dx`` has the input dtype, ``dgamma`` is float32
    (float64 for float64 inputs).
    """
    op = "npu_rms_norm_backward"
    dims = _norm_dims(op, self, gamma)
    xf = acc(self)
    r = rstd.to(xf.dtype)
    xhat = xf * r
    dyf = acc(dy).to(xf.dtype)
    g = dyf * acc(gamma).to(xf.dtype)
    dx = r * (g - xhat * (g * xhat).mean(dims, keepdim=True))
    lead = list(range(self.dim() - gamma.dim()))
    dgamma = dyf * xhat
    if lead:
        dgamma = dgamma.sum(lead)
    return dx.to(self.dtype), dgamma.to(stat_dtype(self))


@impl("npu_add_rms_norm")
def npu_add_rms_norm(x1, x2, gamma, epsilon=1e-6):
    """Residual add followed by RMSNorm.

    ``x = x1 + x2`` (rounded to the input dtype, as the kernel writes it out),
    then ``(y, rstd) = npu_rms_norm(x, gamma, epsilon)``. Returns ``(y, rstd, x)``.
    """
    x = x1 + x2
    y, rstd = _rms_norm("npu_add_rms_norm", x, gamma, epsilon)
    return y, rstd, x


@impl("npu_layer_norm_eval")
def npu_layer_norm_eval(input, normalized_shape, weight=None, bias=None, eps=1e-5):
    """Inference LayerNorm over ``normalized_shape``:
    ``y = (x - mean) / sqrt(var + eps) * weight + bias`` (biased variance),
    i.e. ``torch.nn.functional.layer_norm``."""
    return F.layer_norm(input, list(normalized_shape), weight, bias, eps)
