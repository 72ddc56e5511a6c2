"""Losses and their gradients.

* ``npu_cross_entropy_loss`` (+ ``_backward``): cross-entropy over the last dim with class
  weights, ``ignore_index``, label smoothing and the optional z-loss (``lse_square_scale_for_zloss``).
* ``npu_softmax_cross_entropy_with_logits`` (TensorFlow's: ``-sum(labels * log_softmax(x), -1)``)
  and its backward.
* loss gradients: ``kl_div_backward``, ``kl_div_target_backward``, ``l1_loss_backward``,
  ``npu_binary_cross_entropy_with_logits_backward`` (the derivatives of PyTorch's losses,
  ``reduction`` as the ``at::Reduction`` code).
"""
import torch
import torch.nn.functional as F

from torch_npu.op_plugin._common import acc, check, stat_dtype, unsupported
from torch_npu.op_plugin._registry import impl

__all__ = []

_REDUCTION_NONE, _REDUCTION_MEAN, _REDUCTION_SUM = 0, 1, 2  # at::Reduction codes

_REDUCTIONS = ("mean", "sum", "none")


# ------------------------------------------------------------------ cross entropy


def _ce_checks(op, input, target, weight, reduction):
    if reduction not in _REDUCTIONS:
        unsupported(op, "reduction=%r (expected one of %s)" % (reduction, ", ".join(_REDUCTIONS)))
    check(input.dim() == 2, op, "input must be 2-D (N, C), got %d-D", input.dim())
    check(input.is_floating_point(), op, "input must be a floating tensor, got %s", input.dtype)
    check(target.dim() == 1 and target.shape[0] == input.shape[0], op,
          "target must be 1-D of length N=%d, got shape %s", (input.shape[0], tuple(target.shape)))
    if target.dtype not in (torch.int64, torch.int32):
        unsupported(op, "target dtype %s (int64/int32 only)" % target.dtype)
    if weight is not None:
        check(weight.dim() == 1 and weight.shape[0] == input.shape[1], op,
              "weight must be 1-D of length C=%d, got shape %s", (input.shape[1], tuple(weight.shape)))


def _reduce_rows(vals, valid, reduction):
    if reduction == "none":
        return vals
    s = vals.sum()
    return s if reduction == "sum" else s / valid.sum()


@impl("npu_cross_entropy_loss")
def npu_cross_entropy_loss(input, target, weight=None, reduction="mean", ignore_index=-100,
                           label_smoothing=0.0, lse_square_scale_for_zloss=0.0, return_zloss=False):
    """Softmax cross entropy over the class dim of ``input`` (N, C) with class ``target`` (N,).

    * ``loss`` equals ``torch.nn.functional.cross_entropy(input, target, weight,
      ignore_index=ignore_index, reduction=reduction, label_smoothing=label_smoothing)``
      (shape (N,) for ``'none'``, 0-d otherwise), in the input dtype.
    * ``log_prob = log_softmax(input, -1)`` (N, C), input dtype.
    * ``zloss``: when ``return_zloss``, ``lse_square_scale_for_zloss * lse**2`` per row,
      0 for rows whose target is ``ignore_index``, reduced like ``loss`` (``'mean'``
      divides by the number of non-ignored rows, unweighted); otherwise an empty tensor.
    * ``lse_for_zloss = logsumexp(input, -1)`` (N,), float32 (float64 for float64 input).

    Computed in float32 for float16/bfloat16. Returns ``(loss, log_prob, zloss, lse_for_zloss)``.
    """
    op = "npu_cross_entropy_loss"
    _ce_checks(op, input, target, weight, reduction)
    check(0.0 <= label_smoothing <= 1.0, op, "label_smoothing must be in [0, 1], got %s", label_smoothing)
    xf = acc(input)
    t = target.long()
    w = None if weight is None else weight.to(xf.dtype)
    loss = F.cross_entropy(xf, t, w, ignore_index=ignore_index, reduction=reduction,
                           label_smoothing=label_smoothing)
    lse = torch.logsumexp(xf, -1)
    log_prob = xf - lse.unsqueeze(-1)
    if return_zloss:
        valid = t != ignore_index
        z = torch.where(valid, lse_square_scale_for_zloss * lse * lse, torch.zeros_like(lse))
        zloss = _reduce_rows(z, valid, reduction).to(input.dtype)
    else:
        zloss = input.new_empty((0,))
    return loss.to(input.dtype), log_prob.to(input.dtype), zloss, lse.to(stat_dtype(input))


@impl("npu_cross_entropy_loss_backward")
def npu_cross_entropy_loss_backward(grad_loss, log_prob, target, weight=None, grad_zloss=None,
                                    lse_for_zloss=None, reduction="mean", ignore_index=-100,
                                    label_smoothing=0.0, lse_square_scale_for_zloss=0.0):
    """Gradient of :func:`npu_cross_entropy_loss` w.r.t. ``input`` from the saved ``log_prob``.

    With ``p = exp(log_prob)``, ``w`` the class weights (ones if None), ``eps =
    label_smoothing``, valid rows ``t != ignore_index`` and ``wt = w[t] * valid``:
    ``d = (1-eps) * wt * (p - onehot(t)) + eps/C * valid * (sum(w) * p - w)``, scaled per
    row by ``grad_loss`` (``'none'``), ``grad_loss`` (``'sum'``) or ``grad_loss / sum(wt)``
    (``'mean'``), as ``F.cross_entropy``. When ``grad_zloss`` is given (needs
    ``lse_for_zloss``), ``2 * lse_square_scale_for_zloss * lse * p * valid`` scaled by
    ``grad_zloss`` (``'mean'``: divided by the number of valid rows) is added.
    Returns the input gradient (N, C) in ``log_prob``'s dtype.
    """
    op = "npu_cross_entropy_loss_backward"
    _ce_checks(op, log_prob, target, weight, reduction)
    lp = acc(log_prob)
    n, c = lp.shape
    p = lp.exp()
    t = target.long()
    valid = t != ignore_index
    tc = torch.where(valid, t, torch.zeros_like(t))
    w = torch.ones(c, dtype=lp.dtype, device=lp.device) if weight is None else weight.to(lp.dtype)
    vf = valid.to(lp.dtype)
    wt = w[tc] * vf
    onehot = F.one_hot(tc, c).to(lp.dtype)
    eps = label_smoothing
    d = (1 - eps) * wt.unsqueeze(-1) * (p - onehot) + (eps / c) * vf.unsqueeze(-1) * (w.sum() * p - w)
    g = acc(grad_loss).to(lp.dtype)
    if reduction == "none":
        check(g.numel() == n, op, "grad_loss must have N=%d elements for reduction='none'", n)
        scale = g.reshape(n)
    elif reduction == "sum":
        scale = g.reshape(()).expand(n)
    else:
        scale = (g.reshape(()) / wt.sum()).expand(n)
    grad = d * scale.unsqueeze(-1)
    if grad_zloss is not None and grad_zloss.numel() > 0:
        check(lse_for_zloss is not None, op, "grad_zloss needs lse_for_zloss")
        gz = acc(grad_zloss).to(lp.dtype)
        if reduction == "none":
            zs = gz.reshape(n)
        elif reduction == "sum":
            zs = gz.reshape(()).expand(n)
        else:
            zs = (gz.reshape(()) / vf.sum()).expand(n)
        lse = lse_for_zloss.to(lp.dtype)
        grad = grad + (2 * lse_square_scale_for_zloss * lse * vf * zs).unsqueeze(-1) * p
    return grad.to(log_prob.dtype)


# Mask format (as the DropOutGenMask kernel): uint8, 1-D, one bit per element, LSB first
# (element i is bit i % 8 of byte i // 8), the element count padded up to a multiple of
# 128 bits (so numel(mask) = ceil(numel / 128) * 16), padding bits 0. Bit 1 = keep.


def _reduce_grad(op, grad_output, elementwise, reduction, numel):
    """``elementwise`` is d loss_i / d x_i; scale by the incoming gradient per ``reduction``."""
    if reduction == _REDUCTION_NONE:
        return grad_output * elementwise
    check(reduction in (_REDUCTION_MEAN, _REDUCTION_SUM), op, "reduction must be 0, 1 or 2, got %r", (reduction,))
    scale = grad_output / numel if reduction == _REDUCTION_MEAN else grad_output
    return scale * elementwise


@impl("l1_loss_backward")
def l1_loss_backward(grad_output, self, target, reduction):
    """Gradient of ``l1_loss(self, target, reduction)`` w.r.t. ``self``: ``sign(self - target)``
    times the incoming gradient (divided by the element count for ``reduction`` 1 = mean)."""
    diff = self - target
    return _reduce_grad("l1_loss_backward", grad_output, torch.sign(diff), reduction, diff.numel())


@impl("kl_div_backward")
def kl_div_backward(grad_output, self, target, reduction=1, *, log_target=False):
    """Gradient of ``kl_div(self, target)`` w.r.t. ``self`` (log-probabilities):
    ``-target`` (``-exp(target)`` when ``log_target``), scaled per ``reduction``."""
    elementwise = -torch.exp(target) if log_target else -target
    return _reduce_grad("kl_div_backward", grad_output, elementwise.expand(self.shape), reduction, self.numel())


@impl("kl_div_target_backward")
def kl_div_target_backward(grad_output, self, target, reduction=1, *, log_target=False):
    """Gradient of ``kl_div(self, target)`` w.r.t. ``target``: ``log(target) + 1 - self`` where
    ``target > 0`` (0 elsewhere), or ``exp(target) * (target + 1 - self)`` when ``log_target``."""
    if log_target:
        elementwise = torch.exp(target) * (target + 1 - self)
    else:
        safe = torch.where(target > 0, target, torch.ones_like(target))
        elementwise = torch.where(target > 0, torch.log(safe) + 1 - self, torch.zeros_like(target))
    return _reduce_grad("kl_div_target_backward", grad_output, elementwise, reduction, elementwise.numel())


@impl("npu_binary_cross_entropy_with_logits_backward")
def npu_binary_cross_entropy_with_logits_backward(grad_output, self, target, weight_opt, pos_weight_opt, reduction):
    """Gradient of ``binary_cross_entropy_with_logits(self, target, weight, pos_weight)`` w.r.t.
    ``self``: ``w * (sigmoid(x) * (p * t + 1 - t) - p * t)`` (``p`` = pos_weight, default 1;
    ``w`` = weight, default 1), scaled per ``reduction``."""
    x = acc(self)
    t = target.to(x.dtype)
    sig = torch.sigmoid(x)
    if pos_weight_opt is not None:
        pt = pos_weight_opt.to(x.dtype) * t
        elementwise = sig * (pt + 1 - t) - pt
    else:
        elementwise = sig - t
    if weight_opt is not None:
        elementwise = elementwise * weight_opt.to(x.dtype)
    out = _reduce_grad("npu_binary_cross_entropy_with_logits_backward", acc(grad_output), elementwise,
                       reduction, self.numel())
    return out.to(self.dtype)


@impl("npu_softmax_cross_entropy_with_logits_backward")
def npu_softmax_cross_entropy_with_logits_backward(grad, self, labels):
    """Gradient of ``npu_softmax_cross_entropy_with_logits(self, labels)`` (per-row loss
    ``-sum(labels * log_softmax(self))``) w.r.t. ``self``:
    ``grad[:, None] * (softmax(self) * sum(labels) - labels)``."""
    x = acc(self)
    lab = labels.to(x.dtype)
    d = torch.softmax(x, -1) * lab.sum(-1, keepdim=True) - lab
    return (acc(grad).unsqueeze(-1) * d).to(self.dtype)


@impl("npu_softmax_cross_entropy_with_logits")
def npu_softmax_cross_entropy_with_logits(self, labels):
    """Per-row ``loss[i] = -sum_j labels[i, j] * log_softmax(self[i])[j]`` for 2-D (N, C)
    logits and same-shape (soft) labels; returns (N,) in the input dtype."""
    op = "npu_softmax_cross_entropy_with_logits"
    check(self.dim() == 2, op, "self must be 2-D (N, C)")
    check(tuple(labels.shape) == tuple(self.shape), op, "labels must have self's shape")
    x = acc(self)
    return (-(acc(labels).to(x.dtype) * torch.log_softmax(x, -1)).sum(-1)).to(self.dtype)
