"""Fused normalisation ops: AddLayerNorm (+grad), DeepNorm (+grad), GemmaRmsNorm,
AddRmsNormCast, InplaceAddRmsNorm (npu_add_rms_norm_v2 and its functional form) and
npu_layernorm_grad.

Formulas (CANN ops-nn docs of the aclnn kernels these ops call; ``D`` = the normalised
trailing dims, which are the last ``gamma.dim()`` dims of the input):

* AddLayerNorm: ``x = x1 + x2``, ``mean = E_D(x)``, ``rstd = 1 / sqrt(Var_D(x) + eps)``
  (biased variance), ``y = (x - mean) * rstd * gamma + beta``. Returns ``(y, mean, rstd, x)``;
  ``mean``/``rstd`` are float32 with shape ``x1.shape[:-gamma.dim()] + (1,)`` (the adapter
  allocates one trailing 1 whatever ``gamma.dim()``); ``y``/``x`` have x1's dtype, or float32
  when x1 and x2 differ in dtype.
* AddLayerNormGrad: the LayerNorm input gradient of ``x`` plus ``dsum`` (the gradient that
  reached the ``x`` output); ``dgamma = sum dy * xhat``, ``dbeta = sum dy`` (float32).
  Returns ``(dx, dx, dgamma, dbeta)`` (x1 and x2 get the same gradient).
* DeepNorm: ``x' = alpha * x + gx`` then LayerNorm of ``x'``; returns ``(mean, rstd, y)``
  with keepdim float32 statistics. Its grad gives ``dgx`` = LayerNorm input gradient,
  ``dx = alpha * dgx``, ``dbeta``/``dgamma`` float32.
* GemmaRmsNorm: ``y = x * rstd * (1 + gamma)``, ``rstd = 1 / sqrt(mean_D(x^2) + eps)``.
* AddRmsNormCast: ``x = x1 + x2``, ``y2 = RmsNorm(x)`` in x1's dtype (float16/bfloat16 only),
  ``y1 = float(y2)``; returns ``(y1, y2, rstd, x)``.
* InplaceAddRmsNorm (npu_add_rms_norm_v2): x1 is overwritten with ``RmsNorm(x1 + x2)``, x2
  with ``x1 + x2``; returns ``rstd`` (float32). The functional form returns
  ``(rstd, y, x)`` and leaves its inputs alone.
* npu_layernorm_grad: op-plugin's ``native_layer_norm_backward`` with every output wanted:
  ``(dx, dweight, dbias)`` from the saved ``mean``/``rstd``.

Arithmetic runs in float32 (float64 stays float64, so gradcheck sees full precision), as the
NPU vector units accumulate; results are cast to the documented output dtypes. Each kernel
is a composition of ATen ops, so autograd, Meta and FakeTensor work through it.
"""
import torch

from torch_npu.op_plugin._common import acc, check, stat_dtype
from torch_npu.op_plugin._registry import impl
from torch_npu.op_plugin.norm.rms_norm import _norm_dims  # the trailing dims gamma covers

__all__ = []

_NORM_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def _check_float(op, name, t):
    check(t.dtype in _NORM_DTYPES, op, "%s must be float16, bfloat16 or float32, got %s", (name, t.dtype))


def _compute_dtype(*tensors):
    """float32, or float64 when any input is float64 (gradcheck precision)."""
    return torch.float64 if any(t.dtype == torch.float64 for t in tensors) else torch.float32


def _stat(t, lead):
    """A saved per-row statistic broadcast against the input: its values reshaped to the
    leading dims followed by ones (whatever trailing-1 layout it was saved with)."""
    return t.reshape(lead)


def _layer_norm_stats(xf, dims, epsilon):
    mean = xf.mean(dims, keepdim=True)
    var = (xf - mean).square().mean(dims, keepdim=True)
    return mean, torch.rsqrt(var + epsilon)


def _layer_norm_input_grad(g, xhat, rstd, dims):
    """d loss / d x of LayerNorm, given ``g = dy * gamma`` and ``xhat = (x - mean) * rstd``."""
    return rstd * (g - g.mean(dims, keepdim=True) - xhat * (g * xhat).mean(dims, keepdim=True))


def _sum_lead(t, n_lead):
    return t.sum(list(range(n_lead))) if n_lead else t


# ------------------------------------------------------------------ AddLayerNorm


@impl("npu_add_layer_norm")
def npu_add_layer_norm(x1, x2, gamma, beta, epsilon=1e-05, additional_output=False):
    """``(y, mean, rstd, x)`` of LayerNorm(x1 + x2) * gamma + beta. See the module doc.
    ``x`` is always the sum (the real kernel only guarantees it when ``additional_output``)."""
    op = "npu_add_layer_norm"
    for name, t in (("x1", x1), ("x2", x2), ("gamma", gamma), ("beta", beta)):
        _check_float(op, name, t)
    check(x1.shape == x2.shape, op, "x1 %s and x2 %s must have the same shape", (tuple(x1.shape), tuple(x2.shape)))
    check(beta.shape == gamma.shape, op, "beta %s must have gamma's shape %s", (tuple(beta.shape), tuple(gamma.shape)))
    dims = _norm_dims(op, x1, gamma)
    out_dtype = x1.dtype if x1.dtype == x2.dtype else torch.float32
    cd = _compute_dtype(x1, x2)
    xf = x1.to(cd) + x2.to(cd)
    mean, rstd = _layer_norm_stats(xf, dims, epsilon)
    y = (xf - mean) * rstd * acc(gamma) + acc(beta)
    lead = list(x1.shape[:x1.dim() - gamma.dim()])
    stat_shape = lead + [1]
    sd = stat_dtype(xf)
    return (y.to(out_dtype), mean.reshape(stat_shape).to(sd), rstd.reshape(stat_shape).to(sd),
            xf.to(out_dtype))


@impl("npu_add_layer_norm_backward")
def npu_add_layer_norm_backward(dy_opt, x1, x2, rstd, mean, gamma, dsum_opt):
    """``(dx, dx, dgamma, dbeta)``: the LayerNorm gradient w.r.t. ``x = x1 + x2`` plus
    ``dsum`` (both optional, None counts as zeros). ``dx`` has x1's dtype; ``dgamma`` and
    ``dbeta`` are float32 with gamma's shape."""
    op = "npu_add_layer_norm_backward"
    check(x1.shape == x2.shape, op, "x1 %s and x2 %s must have the same shape", (tuple(x1.shape), tuple(x2.shape)))
    dims = _norm_dims(op, x1, gamma)
    n_lead = x1.dim() - gamma.dim()
    lead = list(x1.shape[:n_lead]) + [1] * gamma.dim()
    n_rows = 1
    for s in x1.shape[:n_lead]:
        n_rows *= s
    for name, t in (("mean", mean), ("rstd", rstd)):
        check(t.numel() == n_rows, op, "%s must hold one value per row (%d), got shape %s",
              (name, n_rows, tuple(t.shape)))
    cd = _compute_dtype(x1, x2)
    xf = x1.to(cd) + x2.to(cd)
    r = _stat(rstd, lead).to(cd)
    xhat = (xf - _stat(mean, lead).to(cd)) * r
    dy = torch.zeros_like(xf) if dy_opt is None else acc(dy_opt).to(cd)
    dx = _layer_norm_input_grad(dy * acc(gamma).to(cd), xhat, r, dims)
    if dsum_opt is not None:
        dx = dx + acc(dsum_opt).to(cd)
    dx = dx.to(x1.dtype)
    sd = stat_dtype(x1)
    return dx, dx, _sum_lead(dy * xhat, n_lead).to(sd), _sum_lead(dy, n_lead).to(sd)


# ------------------------------------------------------------------ DeepNorm


@impl("npu_deep_norm")
def npu_deep_norm(x, gx, beta, gamma, alpha=0.3, epsilon=1e-06):
    """``(mean, rstd, y)`` of LayerNorm(alpha * x + gx) * gamma + beta; ``mean``/``rstd``
    float32 keepdim, ``y`` in x's dtype."""
    op = "npu_deep_norm"
    for name, t in (("x", x), ("gx", gx), ("beta", beta), ("gamma", gamma)):
        _check_float(op, name, t)
    check(x.shape == gx.shape, op, "x %s and gx %s must have the same shape", (tuple(x.shape), tuple(gx.shape)))
    check(beta.shape == gamma.shape, op, "beta %s must have gamma's shape %s", (tuple(beta.shape), tuple(gamma.shape)))
    dims = _norm_dims(op, x, gamma)
    xf = alpha * acc(x) + acc(gx)
    mean, rstd = _layer_norm_stats(xf, dims, epsilon)
    y = (xf - mean) * rstd * acc(gamma) + acc(beta)
    sd = stat_dtype(x)
    return mean.to(sd), rstd.to(sd), y.to(x.dtype)


@impl("npu_deep_norm_backward")
def npu_deep_norm_backward(dy, x, gx, gamma, mean, rstd, alpha=0.3):
    """``(dx, dgx, dbeta, dgamma)`` of :func:`npu_deep_norm`: ``dgx`` is the LayerNorm input
    gradient at ``x' = alpha * x + gx``, ``dx = alpha * dgx``; ``dbeta = sum dy``,
    ``dgamma = sum dy * xhat`` (float32, gamma's shape)."""
    op = "npu_deep_norm_backward"
    check(x.shape == gx.shape == dy.shape, op, "dy %s, x %s and gx %s must have the same shape",
          (tuple(dy.shape), tuple(x.shape), tuple(gx.shape)))
    dims = _norm_dims(op, x, gamma)
    n_lead = x.dim() - gamma.dim()
    lead = list(x.shape[:n_lead]) + [1] * gamma.dim()
    xf = alpha * acc(x) + acc(gx)
    r = _stat(rstd, lead).to(xf.dtype)
    xhat = (xf - _stat(mean, lead).to(xf.dtype)) * r
    dyf = acc(dy).to(xf.dtype)
    dgx = _layer_norm_input_grad(dyf * acc(gamma).to(xf.dtype), xhat, r, dims)
    sd = stat_dtype(x)
    return ((alpha * dgx).to(x.dtype), dgx.to(gx.dtype), _sum_lead(dyf, n_lead).to(sd),
            _sum_lead(dyf * xhat, n_lead).to(sd))


# ------------------------------------------------------------------ RmsNorm variants


def _rms(xf, dims, epsilon):
    return torch.rsqrt(xf.square().mean(dims, keepdim=True) + epsilon)


@impl("npu_gemma_rms_norm")
def npu_gemma_rms_norm(self, gamma, epsilon=1e-06):
    """``(y, rstd)``: ``y = x * rstd * (1 + gamma)`` in x's dtype, ``rstd`` float32 keepdim."""
    op = "npu_gemma_rms_norm"
    _check_float(op, "x", self)
    _check_float(op, "gamma", gamma)
    dims = _norm_dims(op, self, gamma)
    xf = acc(self)
    rstd = _rms(xf, dims, epsilon)
    y = xf * rstd * (1 + acc(gamma))
    return y.to(self.dtype), rstd.to(stat_dtype(self))


def _add_rms_norm(op, x1, x2, gamma, epsilon):
    """(y float, rstd, x float) of RmsNorm(x1 + x2) * gamma, validated."""
    for name, t in (("x1", x1), ("x2", x2), ("gamma", gamma)):
        _check_float(op, name, t)
    check(x1.shape == x2.shape, op, "x1 %s and x2 %s must have the same shape", (tuple(x1.shape), tuple(x2.shape)))
    dims = _norm_dims(op, x1, gamma)
    xf = acc(x1) + acc(x2)
    rstd = _rms(xf, dims, epsilon)
    return xf * rstd * acc(gamma), rstd.to(stat_dtype(x1)), xf


@impl("npu_add_rms_norm_cast")
def npu_add_rms_norm_cast(x1, x2, gamma, epsilon=1e-06):
    """``(y1 float32, y2, rstd float32, x)``: ``y2 = RmsNorm(x1 + x2) * gamma`` in x1's dtype
    (float16/bfloat16), ``y1 = float(y2)``, ``x = x1 + x2``."""
    op = "npu_add_rms_norm_cast"
    check(x1.dtype in (torch.float16, torch.bfloat16), op,
          "x1 must be float16 or bfloat16, got %s", x1.dtype)
    y, rstd, xf = _add_rms_norm(op, x1, x2, gamma, epsilon)
    y2 = y.to(x1.dtype)
    return y2.float(), y2, rstd, xf.to(x1.dtype)


@impl("npu_add_rms_norm_v2")
def npu_add_rms_norm_v2(x1, x2, gamma, epsilon=1e-06):
    """In place: ``x1 <- RmsNorm(x1 + x2) * gamma``, ``x2 <- x1 + x2``; returns ``rstd``."""
    y, rstd, xf = _add_rms_norm("npu_add_rms_norm_v2", x1, x2, gamma, epsilon)
    x1.copy_(y)
    x2.copy_(xf)
    return rstd


@impl("npu_add_rms_norm_v2_functional")
def npu_add_rms_norm_v2_functional(x1, x2, gamma, epsilon=1e-06):
    """``(rstd, y, x)``: what npu_add_rms_norm_v2 would write into x1 and x2, as new tensors."""
    y, rstd, xf = _add_rms_norm("npu_add_rms_norm_v2_functional", x1, x2, gamma, epsilon)
    return rstd, y.to(x1.dtype), xf.to(x2.dtype)


# ------------------------------------------------------------------ LayerNorm grad


@impl("npu_layernorm_grad")
def npu_layernorm_grad(grad_out, input, normalized_shape, mean, rstd, weight, bias):
    """``(dx, dweight, dbias)`` of LayerNorm over ``normalized_shape`` from the saved
    ``mean``/``rstd`` (one value per row). ``dx`` has the input's dtype; ``dweight``/``dbias``
    have weight's (bias's) dtype, or the input's when it is None."""
    op = "npu_layernorm_grad"
    k = len(normalized_shape)
    check(1 <= k <= input.dim() and tuple(input.shape[input.dim() - k:]) == tuple(normalized_shape), op,
          "Given normalized_shape=%s, expected input with shape [*, %s], but got input of size %s",
          (list(normalized_shape), ", ".join(str(s) for s in normalized_shape), list(input.shape)))
    check(grad_out.shape == input.shape, op, "grad_out %s must have the input's shape %s",
          (tuple(grad_out.shape), tuple(input.shape)))
    n_lead = input.dim() - k
    dims = list(range(n_lead, input.dim()))
    lead = list(input.shape[:n_lead]) + [1] * k
    xf = acc(input)
    r = _stat(rstd, lead).to(xf.dtype)
    xhat = (xf - _stat(mean, lead).to(xf.dtype)) * r
    dyf = acc(grad_out).to(xf.dtype)
    g = dyf if weight is None else dyf * acc(weight).to(xf.dtype)
    dx = _layer_norm_input_grad(g, xhat, r, dims)
    w_dtype = input.dtype if weight is None else weight.dtype
    b_dtype = input.dtype if bias is None else bias.dtype
    return (dx.to(input.dtype), _sum_lead(dyf * xhat, n_lead).to(w_dtype),
            _sum_lead(dyf, n_lead).to(b_dtype))
