"""Training ops: cross-entropy loss, BertAdam / AdamW optimizer steps, dropout with a bit-packed mask."""
import torch
import torch.nn.functional as F

from torch_npu.op_plugin._common import acc, check, stat_dtype, unsupported
from torch_npu.op_plugin._registry import impl

__all__ = []

_REDUCTIONS = ("mean", "sum", "none")


# ------------------------------------------------------------------ cross entropy


def _ce_checks(op, input, target, weight, reduction):
    if reduction not in _REDUCTIONS:
        unsupported(op, "reduction=%r (expected one of %s)" % (reduction, ", ".join(_REDUCTIONS)))
    check(input.dim() == 2, op, "input must be 2-D (N, C), got %d-D" % input.dim())
    check(input.is_floating_point(), op, "input must be a floating tensor, got %s" % input.dtype)
    check(target.dim() == 1 and target.shape[0] == input.shape[0], op,
          "target must be 1-D of length N=%d, got shape %s" % (input.shape[0], tuple(target.shape)))
    if target.dtype not in (torch.int64, torch.int32):
        unsupported(op, "target dtype %s (int64/int32 only)" % target.dtype)
    if weight is not None:
        check(weight.dim() == 1 and weight.shape[0] == input.shape[1], op,
              "weight must be 1-D of length C=%d, got shape %s" % (input.shape[1], tuple(weight.shape)))


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
    check(0.0 <= label_smoothing <= 1.0, op, "label_smoothing must be in [0, 1], got %s" % label_smoothing)
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
        check(g.numel() == n, op, "grad_loss must have N=%d elements for reduction='none'" % n)
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


# ------------------------------------------------------------------ optimizers


def _f(x):
    return x.item() if isinstance(x, torch.Tensor) else x


def _bert_adam(op, lr, beta1, beta2, epsilon, grad, max_grad_norm, global_grad_norm, weight_decay,
               step_size, adam_mode, var, m, v):
    if adam_mode != 0:
        unsupported(op, "adam_mode=%r (only 0, 'adam')" % (adam_mode,))
    if step_size is not None:
        unsupported(op, "step_size=%r (only None, used by adam_mode 'mbart_adam')" % (_f(step_size),))
    for name, t in (("var", var), ("m", m), ("v", v)):
        check(t.shape == grad.shape, op, "%s shape %s must equal grad shape %s" % (name, tuple(t.shape), tuple(grad.shape)))
    lr, beta1, beta2, epsilon = _f(lr), _f(beta1), _f(beta2), _f(epsilon)
    max_grad_norm, global_grad_norm, weight_decay = _f(max_grad_norm), _f(global_grad_norm), _f(weight_decay)
    g = acc(grad)
    if max_grad_norm > 0:
        coef = max_grad_norm / (global_grad_norm + 1e-6)
        if coef < 1:
            g = g * coef
    m_new = beta1 * acc(m) + (1 - beta1) * g
    v_new = beta2 * acc(v) + (1 - beta2) * g * g
    update = m_new / (v_new.sqrt() + epsilon)
    if weight_decay > 0:
        update = update + weight_decay * acc(var)
    var_new = acc(var) - lr * update
    return var_new.to(var.dtype), m_new.to(m.dtype), v_new.to(v.dtype)


_BERT_DOC = """BertAdam step (pytorch-pretrained-bert ``BertAdam``, ``adam_mode=0``):

    if max_grad_norm > 0 and max_grad_norm / (global_grad_norm + 1e-6) < 1:
        grad = grad * max_grad_norm / (global_grad_norm + 1e-6)
    m = beta1 * m + (1 - beta1) * grad
    v = beta2 * v + (1 - beta2) * grad**2
    update = m / (sqrt(v) + epsilon) + (weight_decay * var if weight_decay > 0 else 0)
    var = var - lr * update

Only ``adam_mode=0`` with ``step_size=None``; other values raise NotImplementedError.
"""


@impl("npu_bert_apply_adam")
def npu_bert_apply_adam(lr, beta1, beta2, epsilon, grad, max_grad_norm, global_grad_norm, weight_decay,
                        step_size=None, adam_mode=0):
    z = torch.zeros_like(grad)
    return _bert_adam("npu_bert_apply_adam", lr, beta1, beta2, epsilon, grad, max_grad_norm,
                      global_grad_norm, weight_decay, step_size, adam_mode, z, z, z)


npu_bert_apply_adam.__doc__ = _BERT_DOC + """
The functional overload has no var/m/v inputs (the device kernel starts from freshly
allocated buffers); the emulation starts from zeros. Returns new ``(var, m, v)``.
"""


@impl("npu_bert_apply_adam.out")
def npu_bert_apply_adam_out(lr, beta1, beta2, epsilon, grad, max_grad_norm, global_grad_norm, weight_decay,
                            step_size=None, adam_mode=0, *, var, m, v):
    new = _bert_adam("npu_bert_apply_adam", lr, beta1, beta2, epsilon, grad, max_grad_norm,
                     global_grad_norm, weight_decay, step_size, adam_mode, var, m, v)
    with torch.no_grad():
        for dst, src in zip((var, m, v), new):
            dst.copy_(src)
    return var, m, v


npu_bert_apply_adam_out.__doc__ = _BERT_DOC + "\nUpdates ``var``, ``m``, ``v`` in place and returns them."


def _adam_w(op, beta1_power, beta2_power, lr, weight_decay, beta1, beta2, epsilon, grad, max_grad_norm,
            amsgrad, maximize, var, m, v):
    amsgrad = bool(amsgrad) if amsgrad is not None else False
    maximize = bool(maximize) if maximize is not None else False
    for name, t in (("var", var), ("m", m), ("v", v)):
        check(t.shape == grad.shape, op, "%s shape %s must equal grad shape %s" % (name, tuple(t.shape), tuple(grad.shape)))
    if amsgrad and max_grad_norm is None:
        unsupported(op, "amsgrad=True without max_grad_norm (the running max of v)")
    b1p, b2p, lr, wd = _f(beta1_power), _f(beta2_power), _f(lr), _f(weight_decay)
    beta1, beta2, epsilon = _f(beta1), _f(beta2), _f(epsilon)
    g = acc(grad)
    if maximize:
        g = -g
    var_f = acc(var) * (1 - lr * wd)
    m_new = beta1 * acc(m) + (1 - beta1) * g
    v_new = beta2 * acc(v) + (1 - beta2) * g * g
    vv = torch.maximum(acc(max_grad_norm).to(v_new.dtype), v_new) if amsgrad else v_new
    denom = vv.sqrt() / (1 - b2p) ** 0.5 + epsilon
    var_new = var_f - (lr / (1 - b1p)) * m_new / denom
    return var_new.to(var.dtype), m_new.to(m.dtype), v_new.to(v.dtype)


_ADAMW_DOC = """AdamW step (CANN ApplyAdamW, as ``torch.optim.AdamW``); ``beta1_power = beta1**t``,
``beta2_power = beta2**t``:

    g = -grad if maximize else grad
    var = var * (1 - lr * weight_decay)
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g**2
    vmax = max(max_grad_norm, v) if amsgrad else v     # max_grad_norm: running max of v
    var = var - lr / (1 - beta1_power) * m / (sqrt(vmax) / sqrt(1 - beta2_power) + epsilon)

``max_grad_norm`` is read only (the schema does not update it). ``amsgrad=True``
without ``max_grad_norm`` raises NotImplementedError.
"""


@impl("npu_apply_adam_w")
def npu_apply_adam_w(beta1_power, beta2_power, lr, weight_decay, beta1, beta2, epsilon, grad,
                     max_grad_norm=None, amsgrad=None, maximize=None):
    z = torch.zeros_like(grad)
    return _adam_w("npu_apply_adam_w", beta1_power, beta2_power, lr, weight_decay, beta1, beta2, epsilon,
                   grad, max_grad_norm, amsgrad, maximize, z, z, z)


npu_apply_adam_w.__doc__ = _ADAMW_DOC + """
The functional overload has no var/m/v inputs (the device kernel starts from freshly
allocated buffers); the emulation starts from zeros. Returns new ``(var, m, v)``.
"""


@impl("npu_apply_adam_w.out")
def npu_apply_adam_w_out(beta1_power, beta2_power, lr, weight_decay, beta1, beta2, epsilon, grad,
                         max_grad_norm=None, amsgrad=None, maximize=None, *, var, m, v):
    new = _adam_w("npu_apply_adam_w", beta1_power, beta2_power, lr, weight_decay, beta1, beta2, epsilon,
                  grad, max_grad_norm, amsgrad, maximize, var, m, v)
    with torch.no_grad():
        for dst, src in zip((var, m, v), new):
            dst.copy_(src)
    return var, m, v


npu_apply_adam_w_out.__doc__ = _ADAMW_DOC + "\nUpdates ``var``, ``m``, ``v`` in place and returns them."


# ------------------------------------------------------------------ dropout

# Mask format (as the DropOutGenMask kernel): uint8, 1-D, one bit per element, LSB first
# (element i is bit i % 8 of byte i // 8), the element count padded up to a multiple of
# 128 bits (so numel(mask) = ceil(numel / 128) * 16), padding bits 0. Bit 1 = keep.

def _mask_bytes(numel):
    return (numel + 127) // 128 * 16


def _pack(keep):
    n = keep.numel()
    bits = torch.zeros(_mask_bytes(n) * 8, dtype=torch.uint8, device=keep.device)
    bits[:n] = keep.reshape(-1).to(torch.uint8)
    weights = torch.tensor([1, 2, 4, 8, 16, 32, 64, 128], dtype=torch.uint8, device=keep.device)
    return (bits.reshape(-1, 8) * weights).sum(-1, dtype=torch.uint8)


def _unpack(op, mask, numel):
    check(mask.dtype == torch.uint8, op, "mask must be uint8, got %s" % mask.dtype)
    check(mask.numel() == _mask_bytes(numel), op,
          "mask must have ceil(%d/128)*16 = %d bytes, got %d" % (numel, _mask_bytes(numel), mask.numel()))
    shifts = torch.arange(8, dtype=torch.uint8, device=mask.device)
    bits = (mask.reshape(-1, 1) >> shifts) & 1
    return bits.reshape(-1)[:numel]


def _check_p(op, p):
    if not 0.0 <= p <= 1.0:
        unsupported(op, "p=%r (must be in [0, 1])" % (p,))


def _gen_keep(numel, p, device):
    if p == 0.0:
        return torch.ones(numel, dtype=torch.bool, device=device)
    return torch.rand(numel, device=device) >= p


def _apply_mask(x, keep, p):
    if p == 1.0:
        return x * 0
    return x * keep.reshape(x.shape).to(x.dtype) * (1.0 / (1.0 - p))


@impl("_npu_dropout")
def _npu_dropout(self, p):
    """Dropout with drop probability ``p``: each element is kept with probability ``1 - p``
    (uniform draws from the device's generator, ``torch.npu.manual_seed``),
    ``out = self * keep / (1 - p)`` (zeros for ``p = 1``).

    ``mask`` is the bit-packed uint8 keep mask: element i is bit ``i % 8`` (LSB first) of
    byte ``i // 8``, padded with zero bits to a multiple of 128 elements, so
    ``mask.numel() == ceil(self.numel() / 128) * 16``. Returns ``(out, mask)``.
    """
    op = "_npu_dropout"
    _check_p(op, p)
    keep = _gen_keep(self.numel(), p, self.device)
    return _apply_mask(self, keep, p), _pack(keep)


@impl("npu_dropout_backward")
def npu_dropout_backward(grad_output, mask, p):
    """Gradient of :func:`_npu_dropout`: ``grad_output * keep / (1 - p)`` with ``keep``
    unpacked from the bit-packed ``mask`` (zeros for ``p = 1``)."""
    op = "npu_dropout_backward"
    _check_p(op, p)
    keep = _unpack(op, mask, grad_output.numel())
    return _apply_mask(grad_output, keep, p)


@impl("npu_dropout_do_mask")
def npu_dropout_do_mask(self, mask, p):
    """Applies a bit-packed keep ``mask`` (format of :func:`_npu_dropout`):
    ``out = self * keep / (1 - p)``. Returns ``(out, mask)``."""
    op = "npu_dropout_do_mask"
    _check_p(op, p)
    keep = _unpack(op, mask, self.numel())
    return _apply_mask(self, keep, p), mask.clone()


@impl("npu_dropout_gen_mask")
def npu_dropout_gen_mask(size, p, *, dtype=None, layout=None, device=None, pin_memory=None):
    """Keep mask of a dropout over a tensor of shape ``size``, without applying it: the
    bit-packed uint8 mask of :func:`_npu_dropout` (element i kept with probability
    ``1 - p``, bit ``i % 8`` of byte ``i // 8``, ``ceil(numel / 128) * 16`` bytes).
    Draws from the generator of ``device`` (the current npu device when None), so the same
    seed gives the same mask as ``_npu_dropout`` on a tensor of that shape.
    ``dtype``/``layout``/``pin_memory`` describe the tensor the mask is for; the mask is uint8."""
    op = "npu_dropout_gen_mask"
    _check_p(op, p)
    if device is None:
        device = torch.device("npu", torch.npu.current_device())
    numel = 1
    for s in size:
        check(s >= 0, op, "size %s has a negative dim" % (list(size),))
        numel *= s
    return _pack(_gen_keep(numel, p, device))
