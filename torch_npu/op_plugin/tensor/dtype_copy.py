"""Internal tensor, loss-gradient, dtype and optimizer ops of ``torch.ops.npu``.

Emulated (each docstring states the formula and where it comes from):

* dtype casts: ``_npu_dtype_cast``, ``npu_dtype_cast`` (``dtype`` a ScalarType code or a
  ``torch_npu.<dtype>`` constant), ``npu_dtype_cast_``, and their backward ops;
* copies and views: ``copy_memory_``, ``npu_view_copy``, ``one_``, ``npu_reshape(.out)``,
  ``npu_stride_copy(.out)``, ``get_storage_size``;
* ``npu_scatter`` (the ArgMaxGrad kernel: scatter along ``dim`` with one index per
  position of the other dims), ``npu_sort_v2(.out)``, ``npu_masked_fill_range`` and
  ``npu_stride_add`` (semantics from the op-plugin test goldens);
* loss gradients: ``kl_div_backward``, ``kl_div_target_backward``, ``l1_loss_backward``,
  ``npu_binary_cross_entropy_with_logits_backward``,
  ``npu_softmax_cross_entropy_with_logits_backward`` (the derivatives of PyTorch's losses);
* dropout with a byte mask: ``_dropout_with_byte_mask(_backward)``;
* ``_amp_foreach_non_finite_check``, ``batch_norm_gather_stats_update`` (SyncBatchNorm's
  statistics merge), ``npu_apply_adam(.out)`` (CANN ApplyAdam), and
  ``_quantize_per_{tensor,channel}_impl.out``.

Meta kernels only (the computation is not documented precisely enough to emulate):
``_npu_dropout_gen_mask.Tensor``, ``_npu_index_add(_)``, ``batch_norm_reduce``,
``npu_normalize_batch`` (``npu_sub_sample`` is emulated in ``detection_more_r9.py``).

``npu_change_data_ptr`` (re-points one tensor's storage at another's memory) stays
not emulated: the emulated device cannot move a live tensor's data pointer.
"""
import torch

from torch_npu.op_plugin._common import acc, check
from torch_npu.op_plugin._registry import impl, meta
from torch_npu.op_plugin.quant.quantize import _decode_dtype, _dtype_name

__all__ = []

_REDUCTION_NONE, _REDUCTION_MEAN, _REDUCTION_SUM = 0, 1, 2


def _reduce_grad(op, grad_output, elementwise, reduction, numel):
    """``elementwise`` is d loss_i / d x_i; scale by the incoming gradient per ``reduction``."""
    if reduction == _REDUCTION_NONE:
        return grad_output * elementwise
    check(reduction in (_REDUCTION_MEAN, _REDUCTION_SUM), op, "reduction must be 0, 1 or 2, got %r" % (reduction,))
    scale = grad_output / numel if reduction == _REDUCTION_MEAN else grad_output
    return scale * elementwise


# ----------------------------------------------------------------- dtype casts


def _dtype_of(op, value):
    dt = _decode_dtype(value)
    if dt is None:
        raise NotImplementedError("%s: dtype %s has no torch dtype on the CPU-emulated NPU" % (op, _dtype_name(value)))
    return dt


@impl("_npu_dtype_cast")
def _npu_dtype_cast(self, dtype):
    """``self`` converted to ``dtype`` (as ``Tensor.to(dtype)``; a copy even for the same dtype)."""
    return self.to(dtype, copy=True)


@impl("_npu_dtype_cast_backward")
def _npu_dtype_cast_backward(grad, dtype):
    """Gradient of a cast: ``grad`` converted back to the input's ``dtype``."""
    return grad.to(dtype, copy=True)


@impl("npu_dtype_cast")
def npu_dtype_cast(self, dtype, input_dtype=None):
    """``self`` converted to ``dtype`` (a ScalarType code, as a ``torch.dtype`` argument
    arrives, or a ``torch_npu.<dtype>`` constant with a torch equivalent). ``input_dtype`` (how
    to read ``self``'s bytes, for types torch lacks) must be None."""
    if input_dtype is not None:
        raise NotImplementedError("npu_dtype_cast: input_dtype=%r is not supported" % (input_dtype,))
    return self.to(_dtype_of("npu_dtype_cast", dtype), copy=True)


@impl("npu_dtype_cast_backward")
def npu_dtype_cast_backward(grad, dtype, grad_dtype=None, input_dtype=None):
    """Gradient of :func:`npu_dtype_cast`: ``grad`` converted to ``dtype``; ``grad_dtype`` and
    ``input_dtype`` must be None."""
    for name, v in (("grad_dtype", grad_dtype), ("input_dtype", input_dtype)):
        if v is not None:
            raise NotImplementedError("npu_dtype_cast_backward: %s=%r is not supported" % (name, v))
    return grad.to(dtype, copy=True)


@impl("npu_dtype_cast_")
def npu_dtype_cast_(self, src):
    """Writes ``src`` converted to ``self``'s dtype into ``self`` (shapes must match)."""
    check(tuple(self.shape) == tuple(src.shape), "npu_dtype_cast_",
          "self %s and src %s must have the same shape" % (tuple(self.shape), tuple(src.shape)))
    return self.copy_(src)


# ----------------------------------------------------------------- copies, views, fills


@impl("copy_memory_")
def copy_memory_(self, src, non_blocking=False):
    """Copies ``src`` into ``self``; both must be npu tensors of the same dtype on the same
    device (the documented constraint), and the same shape."""
    op = "copy_memory_"
    check(self.device.type in ("npu", "meta") and src.device.type in ("npu", "meta"), op,
          "copy_memory_ only supports npu tensors, got %s and %s" % (self.device, src.device))
    check(self.dtype == src.dtype, op, "self dtype %s and src dtype %s must match" % (self.dtype, src.dtype))
    check(self.device == src.device, op, "self and src must be on the same device")
    check(tuple(self.shape) == tuple(src.shape), op,
          "self %s and src %s must have the same shape" % (tuple(self.shape), tuple(src.shape)))
    return self.copy_(src)


@impl("npu_view_copy")
def npu_view_copy(self, other, non_blocking):
    """Copies ``other`` into ``self`` (which may be a view), as ``self.copy_(other)``."""
    return self.copy_(other)


@impl("one_")
def one_(self):
    """Fills ``self`` with ones."""
    return self.fill_(1)


@impl("npu_reshape")
def npu_reshape(self, shape, can_refresh=False):
    """``self`` with the new ``shape`` and the same data (a new tensor; ``can_refresh`` only
    lets the hardware reuse the input's memory)."""
    return self.reshape(list(shape)).clone()


@impl("npu_reshape.out")
def npu_reshape_out(self, shape, can_refresh=False, *, out):
    """:func:`npu_reshape` written into ``out``."""
    result = self.reshape(list(shape))
    out.resize_(result.shape)
    return out.copy_(result)


@impl("npu_stride_copy")
def npu_stride_copy(self, shape, stride, storage_offset):
    """A contiguous copy of the view of ``self``'s storage with ``shape``, ``stride`` and
    ``storage_offset`` (as ``torch.as_strided(self, shape, stride, storage_offset).clone()``)."""
    return torch.as_strided(self, list(shape), list(stride), int(storage_offset)).clone()


@impl("npu_stride_copy.out")
def npu_stride_copy_out(self, shape, stride, storage_offset, *, out):
    """:func:`npu_stride_copy` written into ``out``."""
    result = torch.as_strided(self, list(shape), list(stride), int(storage_offset))
    out.resize_(result.shape)
    return out.copy_(result)


@impl("get_storage_size")
def get_storage_size(self):
    """Number of elements of ``self``'s storage (its allocation, not the view's numel)."""
    return self.untyped_storage().nbytes() // self.element_size()


# ----------------------------------------------------------------- scatter / sort / fill


@impl("npu_scatter")
def npu_scatter(self, indices, updates, dim):
    """``self`` with one element per position of the other dims replaced along ``dim``:
    ``out[..., indices[p], ...] = updates[p]`` where ``p`` runs over ``self``'s shape without
    ``dim`` (the hardware ArgMaxGrad kernel; the documented example has ``self`` [2, 2],
    ``dim`` 0, ``indices`` [0, 1] and replaces ``out[0, 0]`` and ``out[1, 1]``)."""
    op = "npu_scatter"
    d = dim % self.dim()
    expected = list(self.shape[:d]) + list(self.shape[d + 1:])
    check(list(indices.shape) == expected, op,
          "indices shape %s must be self's shape without dim %d, %s" % (list(indices.shape), dim, expected))
    check(list(updates.shape) == expected, op,
          "updates shape %s must be self's shape without dim %d, %s" % (list(updates.shape), dim, expected))
    return self.scatter(d, indices.long().unsqueeze(d), updates.to(self.dtype).unsqueeze(d))


@impl("npu_sort_v2")
def npu_sort_v2(self, dim=-1, descending=False):
    """The values of ``self`` sorted along ``dim`` (``torch.sort(...).values``)."""
    return torch.sort(self, dim, descending).values


@impl("npu_sort_v2.out")
def npu_sort_v2_out(self, dim=-1, descending=False, *, out):
    """:func:`npu_sort_v2` written into ``out``."""
    result = torch.sort(self, dim, descending).values
    out.resize_(result.shape)
    return out.copy_(result)


@impl("npu_masked_fill_range")
def npu_masked_fill_range(self, start, end, value, axis=-1):
    """Fills index ranges along ``axis`` with ``value[i]``, as the op-plugin golden defines it:
    for each ``i < num`` and ``j < N`` every ``k`` in ``[start[i, j], end[i, j])`` is filled -
    at ``out[j, k]`` (2-D, axis 1) or ``out[j, :, k]`` (3-D, axis 2), i.e. row ``j`` when
    ``axis`` is the last dim of a 2-D/3-D ``self``, and across the whole slice ``k`` of
    ``axis`` otherwise (1-D ``self``, or a leading axis). Later ``i`` overwrite earlier ones.
    ``start``/``end`` int32 ``[num, N]``, ``value`` ``[num]``."""
    op = "npu_masked_fill_range"
    nd = self.dim()
    check(1 <= nd <= 3, op, "self must be 1-D, 2-D or 3-D, got %d-D" % nd)
    ax = axis % nd
    check(start.dim() == 2 and tuple(start.shape) == tuple(end.shape), op,
          "start and end must be 2-D [num, N] of the same shape, got %s and %s"
          % (tuple(start.shape), tuple(end.shape)))
    num, n = start.shape
    check(value.numel() == num, op, "value must have num=%d elements, got %d" % (num, value.numel()))
    per_row = nd >= 2 and ax == nd - 1
    if per_row:
        check(n <= self.shape[0], op, "N=%d must not exceed self.shape[0]=%d" % (n, self.shape[0]))
    positions = torch.arange(self.shape[ax], device=self.device)
    out = self
    values = value.reshape(-1).to(self.dtype)
    for i in range(num):
        inside = (positions >= start[i].unsqueeze(-1)) & (positions < end[i].unsqueeze(-1))  # [N, D_axis]
        if per_row:
            mask = torch.zeros((self.shape[0], self.shape[ax]), dtype=torch.bool, device=self.device)
            mask[:n] = inside
            mask = mask.reshape([self.shape[0]] + [1] * (nd - 2) + [self.shape[ax]])
        else:
            shape = [1] * nd
            shape[ax] = self.shape[ax]
            mask = inside.any(0).reshape(shape)
        out = torch.where(mask, values[i], out)
    return out


@impl("npu_stride_add")
def npu_stride_add(self, other, offset1, offset2, c1_len):
    """Adds the channel slices ``self[:, offset1:]`` and ``other[:, offset2:]`` of two 5-D
    (NC1HWC0) tensors, each zero-padded along dim 1 to ``16 * c1_len`` channels (the op-plugin
    golden)."""
    op = "npu_stride_add"
    check(self.dim() == 5 and other.dim() == 5, op, "self and other must be 5-D (NC1HWC0)")
    width = 16 * int(c1_len)
    a = self[:, int(offset1):]
    b = other[:, int(offset2):]
    check(a.shape[1] <= width and b.shape[1] <= width, op,
          "the sliced channels (%d, %d) must not exceed 16 * c1_len = %d" % (a.shape[1], b.shape[1], width))

    def pad(t):
        zeros = t.new_zeros([t.shape[0], width - t.shape[1]] + list(t.shape[2:]))
        return torch.cat([t, zeros], 1)
    return pad(a) + pad(b)


# ----------------------------------------------------------------- loss gradients


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


# ----------------------------------------------------------------- dropout with a byte mask


def _check_p(op, p):
    check(0.0 <= p <= 1.0, op, "dropout probability has to be between 0 and 1, but got %r" % (p,))


@impl("_dropout_with_byte_mask")
def _dropout_with_byte_mask(self, p):
    """Dropout keeping each element with probability ``1 - p``: returns ``(self * mask / (1 - p),
    mask)`` with ``mask`` uint8 of ``self``'s shape (1 = kept), drawn from the device's
    generator. ``p = 1`` gives zeros."""
    op = "_dropout_with_byte_mask"
    _check_p(op, p)
    check(self.is_floating_point(), op, "dropout only supports floating-point dtypes")
    mask = (torch.rand(self.shape, device=self.device) >= p).to(torch.uint8)
    if p == 1.0:
        return self * 0, mask
    return self * mask.to(self.dtype) * (1.0 / (1.0 - p)), mask


@impl("_dropout_with_byte_mask_backward")
def _dropout_with_byte_mask_backward(grad_output, mask, p):
    """Gradient of :func:`_dropout_with_byte_mask`: ``grad_output * mask / (1 - p)``."""
    op = "_dropout_with_byte_mask_backward"
    _check_p(op, p)
    check(grad_output.is_floating_point(), op, "dropoutbackward only supports floating-point dtypes")
    check(mask.dtype == torch.uint8, op, "mask should be torch.uint8 dtype")
    if p == 1.0:
        return grad_output * 0
    return grad_output * mask.to(grad_output.dtype) * (1.0 / (1.0 - p))


# ----------------------------------------------------------------- AMP, SyncBatchNorm, Adam, quantize


@impl("_amp_foreach_non_finite_check")
def _amp_foreach_non_finite_check(scaled_grads):
    """True when any of ``scaled_grads`` holds an inf or NaN (reads the flag on the host)."""
    return any(bool((~torch.isfinite(g)).any()) for g in scaled_grads)


@impl("batch_norm_gather_stats_update")
def batch_norm_gather_stats_update(input, mean, invstd, running_mean, running_var, momentum, eps, counts):
    """Merges per-rank batch statistics (rows of ``mean``/``invstd``, ``counts`` elements each)
    into the global ``(mean, invstd)`` as ``torch.batch_norm_gather_stats_with_counts`` does:
    ``mean = sum(c_i * mean_i) / N``, ``var = sum(c_i * (1/invstd_i^2 - eps + (mean_i - mean)^2)) / N``,
    ``invstd = 1 / sqrt(var + eps)``; ``running_mean``/``running_var`` (if given) are updated in
    place with ``momentum``, the running variance unbiased (``var * N / (N - 1)``)."""
    c = counts.to(torch.float32 if mean.dtype != torch.float64 else torch.float64).reshape(-1, 1)
    m = mean.to(c.dtype)
    var_i = 1.0 / invstd.to(c.dtype) ** 2 - eps
    total = c.sum()
    g_mean = (c * m).sum(0) / total
    g_var = (c * (var_i + (m - g_mean) ** 2)).sum(0) / total
    g_invstd = 1.0 / torch.sqrt(g_var + eps)
    with torch.no_grad():
        if running_mean is not None:
            running_mean.mul_(1 - momentum).add_(g_mean.to(running_mean.dtype) * momentum)
        if running_var is not None:
            unbiased = g_var * total / (total - 1)
            running_var.mul_(1 - momentum).add_(unbiased.to(running_var.dtype) * momentum)
    return g_mean.to(mean.dtype), g_invstd.to(invstd.dtype)


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


npu_apply_adam.__doc__ = _APPLY_ADAM_DOC + """
The functional overload has no var/m/v inputs; the emulation starts them from zeros (as
``npu_bert_apply_adam``). Returns new ``(var, m, v)``."""


@impl("npu_apply_adam.out")
def npu_apply_adam_out(beta1_power, beta2_power, lr, beta1, beta2, epsilon, grad, use_locking, use_nesterov, *,
                       var, m, v):
    for name, t in (("var", var), ("m", m), ("v", v)):
        check(t.shape == grad.shape, "npu_apply_adam",
              "%s shape %s must equal grad shape %s" % (name, tuple(t.shape), tuple(grad.shape)))
    new = _apply_adam(beta1_power, beta2_power, lr, beta1, beta2, epsilon, grad, bool(use_nesterov), var, m, v)
    with torch.no_grad():
        for dst, src in zip((var, m, v), new):
            dst.copy_(src)
    return var, m, v


npu_apply_adam_out.__doc__ = _APPLY_ADAM_DOC + "\nUpdates ``var``, ``m``, ``v`` in place and returns them."

_QUANT_RANGE = {torch.qint8: (-128, 127), torch.quint8: (0, 255), torch.qint32: (-2 ** 31, 2 ** 31 - 1),
                torch.int8: (-128, 127), torch.uint8: (0, 255), torch.int32: (-2 ** 31, 2 ** 31 - 1)}


def _quantize_into(op, inputs, scales, zero_points, dtype, result):
    check(dtype in _QUANT_RANGE, op, "dtype must be qint8, quint8 or qint32, got %s" % (dtype,))
    lo, hi = _QUANT_RANGE[dtype]
    q = torch.round(acc(inputs).double() / scales.double()) + zero_points.double()
    q = q.clamp(lo, hi)
    result.resize_(inputs.shape)
    return result.copy_(q.to(result.dtype))


@impl("_quantize_per_tensor_impl.out")
def _quantize_per_tensor_impl_out(inputs, scales, zero_points, dtype, *, result):
    """``result = clamp(round(inputs / scale) + zero_point)`` to ``dtype``'s integer range (one
    scale and zero point), written into ``result`` (its integer dtype)."""
    return _quantize_into("_quantize_per_tensor_impl", inputs, scales.reshape(()), zero_points.reshape(()),
                          dtype, result)


@impl("_quantize_per_channel_impl.out")
def _quantize_per_channel_impl_out(inputs, scales, zero_points, axis, dtype, *, result):
    """Per-channel quantisation along ``axis``: ``result = clamp(round(inputs / scales[c]) +
    zero_points[c])`` to ``dtype``'s range, written into ``result``."""
    ax = axis % inputs.dim()
    shape = [1] * inputs.dim()
    shape[ax] = inputs.shape[ax]
    return _quantize_into("_quantize_per_channel_impl", inputs, scales.reshape(shape), zero_points.reshape(shape),
                          dtype, result)


# ----------------------------------------------------------------- Meta kernels only


@meta("_npu_dropout_gen_mask.Tensor")
def _npu_dropout_gen_mask_tensor_meta(self, size, p, seed, offset, *, parallel=True, sync=None):
    """The bit-packed keep mask of ``size`` (one bit per element, padded to 128):
    ``ceil(numel / 128) * 16`` uint8 bytes."""
    numel = 1
    for s in size:
        numel *= s
    return self.new_empty(((numel + 127) // 128 * 16,), dtype=torch.uint8)


@meta("_npu_index_add")
def _npu_index_add_meta(self, index, source, *, alpha=1):
    return torch.empty_like(self)


@meta("_npu_index_add_")
def _npu_index_add__meta(self, index, source, *, alpha=1):
    return self


@meta("batch_norm_reduce")
def batch_norm_reduce_meta(input, eps):
    """Per-channel (dim 1) statistics: two float32 vectors of ``C`` elements."""
    torch._check(input.dim() >= 2, lambda: "batch_norm_reduce: input must have a channel dim")
    c = input.shape[1]
    return input.new_empty((c,), dtype=torch.float32), input.new_empty((c,), dtype=torch.float32)


@meta("npu_normalize_batch")
def npu_normalize_batch_meta(self, seq_len, normalize_type=0):
    torch._check(self.dim() == 3, lambda: "npu_normalize_batch: self must be (n, c, d)")
    torch._check(seq_len.dim() == 1 and seq_len.shape[0] == self.shape[0],
                 lambda: "seq_len's length should be equal self' num")
    torch._check(normalize_type in (0, 1), lambda: "normalize_type expected to be in range [0, 1]")
    return torch.empty_like(self)
