"""Optimizer steps: ``npu_apply_adam`` (CANN ApplyAdam), ``npu_bert_apply_adam`` (BertAdam) and
``npu_apply_adam_w`` (AdamW), each with its ``.out`` overload updating ``var``, ``m``, ``v`` in
place. The formulas are in each op's docstring.
"""
import torch

from torch_npu.op_plugin._common import acc, check, unsupported
from torch_npu.op_plugin._registry import impl

__all__ = []


def _f(x):
    return x.item() if isinstance(x, torch.Tensor) else x


def _bert_adam(op, lr, beta1, beta2, epsilon, grad, max_grad_norm, global_grad_norm, weight_decay,
               step_size, adam_mode, var, m, v):
    if adam_mode != 0:
        unsupported(op, "adam_mode=%r (only 0, 'adam')" % (adam_mode,))
    if step_size is not None:
        unsupported(op, "step_size=%r (only None, used by adam_mode 'mbart_adam')" % (_f(step_size),))
    for name, t in (("var", var), ("m", m), ("v", v)):
        check(t.shape == grad.shape, op, "%s shape %s must equal grad shape %s", (name, tuple(t.shape), tuple(grad.shape)))
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


@impl("npu_bert_apply_adam.out")
def npu_bert_apply_adam_out(lr, beta1, beta2, epsilon, grad, max_grad_norm, global_grad_norm, weight_decay,
                            step_size=None, adam_mode=0, *, var, m, v):
    new = _bert_adam("npu_bert_apply_adam", lr, beta1, beta2, epsilon, grad, max_grad_norm,
                     global_grad_norm, weight_decay, step_size, adam_mode, var, m, v)
    with torch.no_grad():
        for dst, src in zip((var, m, v), new):
            dst.copy_(src)
    return var, m, v


def _adam_w(op, beta1_power, beta2_power, lr, weight_decay, beta1, beta2, epsilon, grad, max_grad_norm,
            amsgrad, maximize, var, m, v):
    amsgrad = bool(amsgrad) if amsgrad is not None else False
    maximize = bool(maximize) if maximize is not None else False
    for name, t in (("var", var), ("m", m), ("v", v)):
        check(t.shape == grad.shape, op, "%s shape %s must equal grad shape %s", (name, tuple(t.shape), tuple(grad.shape)))
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


@impl("npu_apply_adam_w.out")
def npu_apply_adam_w_out(beta1_power, beta2_power, lr, weight_decay, beta1, beta2, epsilon, grad,
                         max_grad_norm=None, amsgrad=None, maximize=None, *, var, m, v):
    new = _adam_w("npu_apply_adam_w", beta1_power, beta2_power, lr, weight_decay, beta1, beta2, epsilon,
                  grad, max_grad_norm, amsgrad, maximize, var, m, v)
    with torch.no_grad():
        for dst, src in zip((var, m, v), new):
            dst.copy_(src)
    return var, m, v


def _apply_adam(beta1_power, beta2_power, lr, beta1, beta2, epsilon, grad, use_nesterov, var, m, v):
    g = acc(grad)
    beta1, beta2 = float(beta1), float(beta2)
    lr_t = float(lr) * (1 - float(beta2_power)) ** 0.5 / (1 - float(beta1_power))
    m_new = acc(m) + (g - acc(m)) * (1 - beta1)
    v_new = acc(v) + (g * g - acc(v)) * (1 - beta2)
    step = (m_new * beta1 + (1 - beta1) * g) if use_nesterov else m_new
    var_new = acc(var) - lr_t * step / (v_new.sqrt() + float(epsilon))
    return var_new.to(var.dtype), m_new.to(m.dtype), v_new.to(v.dtype)


_APPLY_ADAM_DOC = """Adam step of CANN's ApplyAdam kernel (``beta1_power = beta1**t``, ``beta2_power = beta2**t``):

    lr_t = lr * sqrt(1 - beta2_power) / (1 - beta1_power)
    m = m + (grad - m) * (1 - beta1)
    v = v + (grad**2 - v) * (1 - beta2)
    var = var - lr_t * (m * beta1 + (1 - beta1) * grad if use_nesterov else m) / (sqrt(v) + epsilon)
"""


@impl("npu_apply_adam")
def npu_apply_adam(beta1_power, beta2_power, lr, beta1, beta2, epsilon, grad, use_locking, use_nesterov):
    z = torch.zeros_like(grad)
    return _apply_adam(beta1_power, beta2_power, lr, beta1, beta2, epsilon, grad, bool(use_nesterov), z, z, z)


@impl("npu_apply_adam.out")
def npu_apply_adam_out(beta1_power, beta2_power, lr, beta1, beta2, epsilon, grad, use_locking, use_nesterov, *,
                       var, m, v):
    for name, t in (("var", var), ("m", m), ("v", v)):
        check(t.shape == grad.shape, "npu_apply_adam",
              "%s shape %s must equal grad shape %s", (name, tuple(t.shape), tuple(grad.shape)))
    new = _apply_adam(beta1_power, beta2_power, lr, beta1, beta2, epsilon, grad, bool(use_nesterov), var, m, v)
    with torch.no_grad():
        for dst, src in zip((var, m, v), new):
            dst.copy_(src)
    return var, m, v


npu_bert_apply_adam.__doc__ = _BERT_DOC + """
The functional overload has no var/m/v inputs (the device kernel starts from freshly
allocated buffers); the emulation starts from zeros. Returns new ``(var, m, v)``.
"""


npu_bert_apply_adam_out.__doc__ = _BERT_DOC + "\nUpdates ``var``, ``m``, ``v`` in place and returns them."


npu_apply_adam_w.__doc__ = _ADAMW_DOC + """
The functional overload has no var/m/v inputs (the device kernel starts from freshly
allocated buffers); the emulation starts from zeros. Returns new ``(var, m, v)``.
"""


npu_apply_adam_w_out.__doc__ = _ADAMW_DOC + "\nUpdates ``var``, ``m``, ``v`` in place and returns them."


npu_apply_adam.__doc__ = _APPLY_ADAM_DOC + """
The functional overload has no var/m/v inputs; the emulation starts them from zeros (as
``npu_bert_apply_adam``). Returns new ``(var, m, v)``."""


npu_apply_adam_out.__doc__ = _APPLY_ADAM_DOC + "\nUpdates ``var``, ``m``, ``v`` in place and returns them."
