"""GroupNorm followed by an activation: npu_group_norm_swish (+ npu_group_norm_swish_grad) and
npu_group_norm_silu (swish with scale 1).

Documented formula: per (sample, group) ``mean = E[x]``, ``rstd = 1 / sqrt(Var[x] + eps)``
(biased variance), ``h = (x - mean) * rstd * weight[c] + bias[c]``, and
``y = h / (1 + exp(-swish_scale * h))``. Returns ``(y, mean, rstd)``; ``mean``/``rstd`` have
shape ``(N, num_groups)``. Statistics are float32 for float16/bfloat16 inputs (float64 for
float64) and returned in float32 for low-precision inputs (the emulator's choice: the docs do
not name their dtype); ``y`` has the input dtype.

The forward is a composite of ATen ops (autograd included); ``npu_group_norm_swish_grad``
is the analytic backward from the saved ``mean``/``rstd``.
"""
import torch
import torch.nn.functional as F

from torch_npu.op_plugin._common import acc, check, stat_dtype
from torch_npu.op_plugin._registry import impl

__all__ = []


def _check(op, input, num_groups, weight, bias):
    check(2 <= input.dim() <= 8, op, "input must have 2 to 8 dims, got %d", input.dim())
    c = input.shape[1]
    check(num_groups > 0 and c % num_groups == 0, op, "C=%d must be divisible by num_groups=%d", (c, num_groups))
    for name, t in (("weight", weight), ("bias", bias)):
        check(t.dim() == 1 and t.shape[0] == c, op, "%s must be 1-d of length C=%d", (name, c))


def _swish_scale(v):
    return 1.0 if v is None else float(v)


@impl("npu_group_norm_swish")
def npu_group_norm_swish(input, num_groups, weight, bias, eps=1e-5, swish_scale=1.0):
    """See the module doc."""
    op = "npu_group_norm_swish"
    _check(op, input, num_groups, weight, bias)
    eps = 1e-5 if eps is None else eps
    n, c = input.shape[0], input.shape[1]
    x = acc(input)
    xg = x.reshape(n, num_groups, -1)
    mean = xg.mean(-1)
    var = (xg - mean[..., None]).square().mean(-1)
    rstd = torch.rsqrt(var + eps)
    bshape = [1, c] + [1] * (input.dim() - 2)
    h = ((xg - mean[..., None]) * rstd[..., None]).reshape(x.shape)
    h = h * acc(weight).to(h.dtype).view(bshape) + acc(bias).to(h.dtype).view(bshape)
    y = h * torch.sigmoid(_swish_scale(swish_scale) * h)
    sd = stat_dtype(input)
    return y.to(input.dtype), mean.to(sd), rstd.to(sd)


@impl("npu_group_norm_swish_grad")
def npu_group_norm_swish_grad(grad, input, num_groups, weight, bias, mean, rstd, grad_input_mask, swish_scale=1.0):
    """``(grad_input, grad_weight, grad_bias)`` of npu_group_norm_swish from its saved
    ``mean``/``rstd``. The schema returns three Tensors, so all three are always computed
    (``grad_input_mask`` is checked for length only)."""
    op = "npu_group_norm_swish_grad"
    _check(op, input, num_groups, weight, bias)
    s = _swish_scale(swish_scale)
    n, c = input.shape[0], input.shape[1]
    x = acc(input)
    bshape = [1, c] + [1] * (input.dim() - 2)
    m = acc(mean).to(x.dtype).reshape(n, num_groups, 1)
    r = acc(rstd).to(x.dtype).reshape(n, num_groups, 1)
    z = ((x.reshape(n, num_groups, -1) - m) * r).reshape(x.shape)         # normalised input
    w = acc(weight).to(x.dtype).view(bshape)
    h = z * w + acc(bias).to(x.dtype).view(bshape)
    sig = torch.sigmoid(s * h)
    g_h = acc(grad).to(x.dtype) * (sig + s * h * sig * (1 - sig))         # d swish / d h
    reduce_dims = [0] + list(range(2, input.dim()))
    check(len(grad_input_mask) == 3, op, "grad_input_mask must have 3 entries")
    grad_bias = g_h.sum(reduce_dims)
    grad_weight = (g_h * z).sum(reduce_dims)
    g_z = (g_h * w).reshape(n, num_groups, -1)
    zg = z.reshape(n, num_groups, -1)
    dx = r * (g_z - g_z.mean(-1, keepdim=True) - zg * (g_z * zg).mean(-1, keepdim=True))
    return dx.reshape(input.shape).to(input.dtype), grad_weight.to(weight.dtype), grad_bias.to(bias.dtype)


@impl("npu_group_norm_silu")
def npu_group_norm_silu(input, weight, bias, group, eps=1e-5):
    """GroupNorm over ``group`` channel groups of an (N, C, *) input followed by SiLU.

    ``y = silu((x - mean) * rstd * weight[c] + bias[c])`` with biased per-(N, group)
    statistics; returns ``(y, mean, rstd)``, ``mean``/``rstd`` of shape (N, group) in
    the input dtype. Computed in float32 for float16/bfloat16 inputs.
    """
    op = "npu_group_norm_silu"
    check(input.dim() >= 2, op, "input must be (N, C, *)")
    n, c = input.size(0), input.size(1)
    check(group > 0 and c % group == 0, op, "C=%d must be divisible by group=%d", (c, group))
    x = acc(input)
    xg = x.reshape(n, group, -1)
    mean = xg.mean(-1)
    var = (xg - mean[..., None]).square().mean(-1)
    rstd = torch.rsqrt(var + eps)
    y = ((xg - mean[..., None]) * rstd[..., None]).reshape(x.shape)
    bshape = [1, c] + [1] * (input.dim() - 2)
    if weight is not None:
        y = y * acc(weight).to(y.dtype).view(bshape)
    if bias is not None:
        y = y + acc(bias).to(y.dtype).view(bshape)
    return F.silu(y).to(input.dtype), mean.to(input.dtype), rstd.to(input.dtype)
