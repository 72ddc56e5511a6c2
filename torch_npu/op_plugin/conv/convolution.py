"""Convolution ops and the backward ops torch_npu registers for convolution, matmul, FFT,
reductions and repeat_interleave.

These are the internal ops the real torch_npu's autograd formulas call (its
``derivatives.yaml``); each has the meaning of the PyTorch function of the same name:

* ``npu_conv2d`` / ``npu_convolution`` = ``aten::convolution`` (not transposed);
  ``npu_conv_transpose2d`` / ``npu_convolution_transpose`` = the transposed convolution (their
  argument order is ``padding, output_padding, stride, dilation, groups``).
* ``*_backward(input, grad, weight, ..., output_mask)`` return ``(grad_input, grad_weight,
  grad_bias)``, each only where ``output_mask`` asks for it (an undefined output is ``None``),
  computed by ``aten::convolution_backward``.
* ``matmul_double_backward``: the gradients of ``matmul_backward(grad_out, self, other)`` =
  ``(grad_out @ other^T, self^T @ grad_out)``.
* ``fft_c2r_backward`` / ``fft_r2c_backward``: PyTorch's formulas for ``_fft_c2r`` / ``_fft_r2c``.
* ``stft_backward`` is not emulated (which framing the npu stft uses - centre padding, pad
  mode - is not in its schema or docs); its Meta kernel gives the gradient's shape, ``self``'s.
* ``npu_gather_backward``, ``npu_max_backward`` / ``npu_min_backward``,
  ``repeat_interleave_backward_*``, ``npu_renorm_backward``: the gradients of gather, max/min
  along a dim, repeat_interleave and renorm.
"""
import torch

from torch_npu.op_plugin._common import check
from torch_npu.op_plugin._registry import impl, meta

__all__ = []


# ----------------------------------------------------------------- forward convolutions


def _conv(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    return torch.ops.aten.convolution(input, weight, bias, list(stride), list(padding), list(dilation),
                                      transposed, list(output_padding), groups)


def _zeros_like_stride(stride):
    return [0] * len(stride)


@impl("npu_conv2d")
def npu_conv2d(input, weight, bias, stride, padding, dilation, groups):
    """2-D convolution, as ``torch.nn.functional.conv2d(input, weight, bias, stride, padding,
    dilation, groups)``."""
    check(input.dim() in (3, 4), "npu_conv2d", "input must be 3-D or 4-D, got %d-D" % input.dim())
    return _conv(input, weight, bias, stride, padding, dilation, False, _zeros_like_stride(stride), groups)


@impl("npu_conv2d.out")
def npu_conv2d_out(input, weight, bias, stride, padding, dilation, groups, *, out):
    """``npu_conv2d`` written into ``out`` (resized to the result's shape)."""
    result = npu_conv2d(input, weight, bias, stride, padding, dilation, groups)
    out.resize_(result.shape)
    return out.copy_(result)


@impl("npu_convolution")
def npu_convolution(input, weight, bias, stride, padding, dilation, groups):
    """N-d convolution (1-d, 2-d or 3-d by ``weight``'s rank), as ``aten::convolution`` with
    ``transposed=False``."""
    return _conv(input, weight, bias, stride, padding, dilation, False, _zeros_like_stride(stride), groups)


@impl("npu_conv_transpose2d")
def npu_conv_transpose2d(input, weight, bias, padding, output_padding, stride, dilation, groups):
    """2-D transposed convolution, as ``torch.nn.functional.conv_transpose2d(input, weight, bias,
    stride, padding, output_padding, groups, dilation)``."""
    check(input.dim() in (3, 4), "npu_conv_transpose2d", "input must be 3-D or 4-D, got %d-D" % input.dim())
    return _conv(input, weight, bias, stride, padding, dilation, True, output_padding, groups)


@impl("npu_convolution_transpose")
def npu_convolution_transpose(input, weight, bias, padding, output_padding, stride, dilation, groups):
    """N-d transposed convolution, as ``aten::convolution`` with ``transposed=True``."""
    return _conv(input, weight, bias, stride, padding, dilation, True, output_padding, groups)


# ----------------------------------------------------------------- convolution backward


def _conv_backward(grad_output, input, weight, stride, padding, dilation, transposed, output_padding,
                   groups, output_mask):
    mask = [bool(m) for m in output_mask]
    bias_channels = weight.shape[1] * groups if transposed else weight.shape[0]
    grads = torch.ops.aten.convolution_backward(
        grad_output, input, weight, [bias_channels], list(stride), list(padding), list(dilation),
        transposed, list(output_padding), groups, mask)
    return tuple(g if m else None for g, m in zip(grads, mask))


@impl("npu_convolution_backward")
def npu_convolution_backward(input, grad_output, weight, stride, padding, dilation, groups, output_mask):
    """``(grad_input, grad_weight, grad_bias)`` of :func:`npu_convolution`, each only where
    ``output_mask`` is True (the others are None)."""
    return _conv_backward(grad_output, input, weight, stride, padding, dilation, False,
                          _zeros_like_stride(stride), groups, output_mask)


@impl("npu_conv2d_backward")
def npu_conv2d_backward(input, grad_output, weight, stride, padding, dilation, groups, output_mask):
    """``(grad_input, grad_weight, grad_bias)`` of :func:`npu_conv2d` per ``output_mask``."""
    return npu_convolution_backward(input, grad_output, weight, stride, padding, dilation, groups, output_mask)


@impl("npu_conv3d_backward")
def npu_conv3d_backward(input, grad, weight, stride, padding, dilation, groups, output_mask):
    """``(grad_input, grad_weight, grad_bias)`` of a 3-D convolution per ``output_mask``."""
    check(input.dim() == 5, "npu_conv3d_backward", "input must be 5-D (N, C, D, H, W), got %d-D" % input.dim())
    return npu_convolution_backward(input, grad, weight, stride, padding, dilation, groups, output_mask)


@impl("npu_convolution_transpose_backward")
def npu_convolution_transpose_backward(input, grad, weight, padding, output_padding, stride, dilation, groups,
                                       grad_input_mask):
    """``(grad_input, grad_weight, grad_bias)`` of :func:`npu_convolution_transpose` per mask."""
    return _conv_backward(grad, input, weight, stride, padding, dilation, True, output_padding, groups,
                          grad_input_mask)


@impl("npu_conv_transpose2d_backward")
def npu_conv_transpose2d_backward(input, grad_output, weight, padding, output_padding, stride, dilation, groups,
                                  output_mask):
    """``(grad_input, grad_weight, grad_bias)`` of :func:`npu_conv_transpose2d` per mask."""
    return _conv_backward(grad_output, input, weight, stride, padding, dilation, True, output_padding, groups,
                          output_mask)


@impl("npu_conv_transpose3d_backward")
def npu_conv_transpose3d_backward(input, grad_output, weight, padding, output_padding, stride, dilation, groups,
                                  output_mask):
    """``(grad_input, grad_weight, grad_bias)`` of a 3-D transposed convolution per mask."""
    check(input.dim() == 5, "npu_conv_transpose3d_backward",
          "input must be 5-D (N, C, D, H, W), got %d-D" % input.dim())
    return _conv_backward(grad_output, input, weight, stride, padding, dilation, True, output_padding, groups,
                          output_mask)


@impl("slow_conv_dilated2d_backward")
def slow_conv_dilated2d_backward(grad_output, self, weight, kernel_size, stride, padding, dilation, output_mask):
    """``(grad_input, grad_weight, grad_bias)`` of a dilated 2-D convolution (groups = 1)."""
    check(list(weight.shape[2:]) == list(kernel_size), "slow_conv_dilated2d_backward",
          "kernel_size %s must match weight %s" % (list(kernel_size), tuple(weight.shape)))
    return _conv_backward(grad_output, self, weight, stride, padding, dilation, False, [0, 0], 1, output_mask)


@impl("slow_conv_transpose2d_backward")
def slow_conv_transpose2d_backward(grad_output, self, weight, kernel_size, stride, padding, output_padding,
                                   dilation, output_mask):
    """``(grad_input, grad_weight, grad_bias)`` of a 2-D transposed convolution (groups = 1)."""
    check(list(weight.shape[2:]) == list(kernel_size), "slow_conv_transpose2d_backward",
          "kernel_size %s must match weight %s" % (list(kernel_size), tuple(weight.shape)))
    return _conv_backward(grad_output, self, weight, stride, padding, dilation, True, output_padding, 1,
                          output_mask)


@impl("_conv_depthwise2d_backward")
def _conv_depthwise2d_backward(grad_output, self, weight, kernel_size, stride, padding, dilation, output_mask):
    """``(grad_input, grad_weight)`` of a depthwise 2-D convolution (groups = input channels,
    weight ``[C * multiplier, 1, kh, kw]``) per the two-element ``output_mask``."""
    op = "_conv_depthwise2d_backward"
    check(self.dim() == 4 and weight.dim() == 4 and weight.shape[1] == 1, op,
          "input must be 4-D and weight [C*m, 1, kh, kw], got %s and %s" % (tuple(self.shape), tuple(weight.shape)))
    check(list(weight.shape[2:]) == list(kernel_size), op,
          "kernel_size %s must match weight %s" % (list(kernel_size), tuple(weight.shape)))
    g_in, g_w, _ = _conv_backward(grad_output, self, weight, stride, padding, dilation, False, [0, 0],
                                  self.shape[1], [output_mask[0], output_mask[1], False])
    return g_in, g_w


# ----------------------------------------------------------------- matmul / bmm


def _as_matrix_operands(self, other, grad_out):
    """Promote 1-D operands (and grad_out) to matrices as torch.matmul does."""
    a, b, g = self, other, grad_out
    if a.dim() == 1:
        a, g = a.unsqueeze(0), g.unsqueeze(-2)
    if b.dim() == 1:
        b, g = b.unsqueeze(-1), g.unsqueeze(-1)
    return a, b, g


@impl("matmul_double_backward")
def matmul_double_backward(grad_self, grad_other, grad_out, self, other, mask):
    """Gradients of ``matmul_backward(grad_out, self, other) = (grad_out @ other^T, self^T @ grad_out)``
    given the incoming ``grad_self`` / ``grad_other`` (either may be None = zero):
    ``(d grad_out, d self, d other) = (grad_self @ other + self @ grad_other,
    grad_out @ grad_other^T, grad_self^T @ grad_out)``, each summed over broadcast batch dims and
    returned where ``mask`` is True (None elsewhere)."""
    a, b, g = _as_matrix_operands(self, other, grad_out)
    gs = None if grad_self is None else grad_self.reshape(a.shape) if self.dim() == 1 else grad_self
    go = None if grad_other is None else grad_other.reshape(b.shape) if other.dim() == 1 else grad_other
    d_grad_out = d_self = d_other = None
    if mask[0]:
        d = torch.zeros_like(g) if gs is None and go is None else None
        if gs is not None:
            d = torch.matmul(gs, b)
        if go is not None:
            d = torch.matmul(a, go) if d is None else d + torch.matmul(a, go)
        d_grad_out = d.sum_to_size(g.shape).reshape(grad_out.shape)
    if mask[1]:
        d_self = (torch.zeros_like(self) if go is None
                  else torch.matmul(g, go.transpose(-1, -2)).sum_to_size(a.shape).reshape(self.shape))
    if mask[2]:
        d_other = (torch.zeros_like(other) if gs is None
                   else torch.matmul(gs.transpose(-1, -2), g).sum_to_size(b.shape).reshape(other.shape))
    return d_grad_out, d_self, d_other


@impl("npu_bmm_v2_mat1_backward")
def npu_bmm_v2_mat1_backward(grad, mat1, mat2, size):
    """Gradient of ``npu_bmmV2(mat1, mat2)`` w.r.t. ``mat1``: ``grad @ mat2^T`` summed to ``size``
    (mat1's shape)."""
    return torch.matmul(grad, mat2.transpose(-1, -2)).sum_to_size(list(size))


@impl("npu_bmm_v2_mat2_backward")
def npu_bmm_v2_mat2_backward(grad, mat1, mat2, size):
    """Gradient of ``npu_bmmV2(mat1, mat2)`` w.r.t. ``mat2``: ``mat1^T @ grad`` summed to ``size``
    (mat2's shape)."""
    return torch.matmul(mat1.transpose(-1, -2), grad).sum_to_size(list(size))


# ----------------------------------------------------------------- FFT


@impl("fft_c2r_backward")
def fft_c2r_backward(grad, dim, normalization):
    """Gradient of the one-sided complex-to-real FFT ``_fft_c2r(x, dim, normalization, n)``:
    the one-sided real-to-complex FFT of ``grad`` with the bins that conjugate symmetry folds
    (indices ``1 .. n - n//2 - 1`` of the last dim) doubled."""
    g = torch.ops.aten._fft_r2c(grad, list(dim), normalization, True)
    last = dim[-1]
    double_length = grad.shape[last] - g.shape[last]
    if double_length > 0:
        scale = torch.ones(g.shape[last], dtype=grad.dtype, device=grad.device)
        scale[1:1 + double_length] = 2
        shape = [1] * g.dim()
        shape[last] = g.shape[last]
        g = g * scale.reshape(shape)
    return g


@impl("fft_r2c_backward")
def fft_r2c_backward(grad, dim, normalization, onesided, last_dim_size):
    """Gradient of the real-to-complex FFT ``_fft_r2c(x, dim, normalization, onesided)``: the real
    part of the inverse complex FFT of ``grad``, zero-padded back to ``last_dim_size`` along the
    last transformed dim when ``onesided``."""
    full = grad
    if onesided:
        last = dim[-1] % grad.dim()
        pad = last_dim_size - grad.shape[last]
        if pad > 0:
            shape = list(grad.shape)
            shape[last] = pad
            full = torch.cat([grad, grad.new_zeros(shape)], dim=last)
    return torch.real(torch.ops.aten._fft_c2c(full, list(dim), normalization, False))


# ----------------------------------------------------------------- gather / max / min / repeat / renorm


@impl("npu_gather_backward")
def npu_gather_backward(grad, self_size, dim, index, sparse_grad):
    """Gradient of ``gather(self, dim, index)``: ``zeros(self_size).scatter_add(dim, index, grad)``.
    ``sparse_grad=True`` raises NotImplementedError (the npu gradient is dense)."""
    if sparse_grad:
        raise NotImplementedError("npu_gather_backward: sparse_grad=True is not supported")
    return grad.new_zeros(list(self_size)).scatter_add(dim, index.long(), grad)


def _select_backward(grad, dim, indices, sizes, keepdim):
    if not keepdim and len(sizes) > 0:
        grad, indices = grad.unsqueeze(dim), indices.unsqueeze(dim)
    return grad.new_zeros(list(sizes)).scatter(dim, indices.long(), grad)


@impl("npu_max_backward")
def npu_max_backward(grad, dim, indices, sizes, keepdim):
    """Gradient of ``npu_max(self, dim, keepdim)``: ``grad`` placed at ``indices`` along ``dim`` in
    a zero tensor of ``sizes``."""
    return _select_backward(grad, dim, indices, sizes, keepdim)


@impl("npu_min_backward")
def npu_min_backward(grad, dim, indices, sizes, keepdim):
    """Gradient of ``npu_min(self, dim, keepdim)``: ``grad`` placed at ``indices`` along ``dim`` in
    a zero tensor of ``sizes``."""
    return _select_backward(grad, dim, indices, sizes, keepdim)


@impl("npu_min.dim")
def npu_min_dim(self, dim, keepdim=False):
    """``(values, indices)`` of the minimum along ``dim`` (as ``torch.min``), indices int32 (as
    ``npu_max``)."""
    values, indices = torch.min(self, dim, keepdim)
    return values, indices.to(torch.int32)


@impl("repeat_interleave_backward_int")
def repeat_interleave_backward_int(grad, self, repeats, dim=None):
    """Gradient of ``repeat_interleave(self, repeats, dim)`` with an int ``repeats``: each group
    of ``repeats`` consecutive gradient entries along ``dim`` (of flattened ``self`` when ``dim``
    is None) summed."""
    if dim is None:
        return grad.reshape(self.numel(), repeats).sum(1).reshape(self.shape)
    d = dim % max(self.dim(), 1)
    shape = list(self.shape)
    grouped = grad.reshape(shape[:d] + [shape[d], repeats] + shape[d + 1:])
    return grouped.sum(d + 1)


@impl("repeat_interleave_backward_tensor")
def repeat_interleave_backward_tensor(grad, self, repeats, dim=None):
    """Gradient of ``repeat_interleave(self, repeats, dim)`` with a tensor ``repeats``: the
    gradient entries of each repeated element summed back onto it (``index_add``)."""
    flat = dim is None
    src = self.reshape(-1) if flat else self
    d = 0 if flat else dim % max(self.dim(), 1)
    n = src.shape[d]
    reps = repeats.expand(n) if repeats.numel() == 1 else repeats
    owner = torch.repeat_interleave(torch.arange(n, device=grad.device), reps.to(grad.device),
                                    output_size=grad.shape[d])
    out = grad.new_zeros(src.shape).index_add(d, owner, grad)
    return out.reshape(self.shape)


@impl("npu_renorm_backward")
def npu_renorm_backward(grad, self, p, dim, maxnorm):
    """Gradient of ``torch.renorm(self, p, dim, maxnorm)``. With ``norm`` the p-norm of each
    slice along ``dim`` and ``f = maxnorm / (norm + 1e-7)``: slices with ``norm <= maxnorm``
    pass ``grad`` through; the others get ``f * grad - maxnorm / (norm + 1e-7)^2 *
    sum(grad * self) * d norm / d self``."""
    p = float(p)
    maxnorm = float(maxnorm)
    check(p > 0, "npu_renorm_backward", "p must be positive, got %s" % p)
    d = dim % self.dim()
    reduce_dims = [i for i in range(self.dim()) if i != d]
    x = self
    norm = torch.linalg.vector_norm(x, p, reduce_dims, keepdim=True)
    if p == float("inf"):
        at_max = (x.abs() == norm).to(x.dtype)
        dnorm = torch.sign(x) * at_max / at_max.sum(reduce_dims, keepdim=True)
    elif p == 1.0:
        dnorm = torch.sign(x)
    else:
        dnorm = x * x.abs().pow(p - 2) / norm.pow(p - 1)
        dnorm = torch.where(norm > 0, dnorm, torch.zeros_like(dnorm))
    inv = 1.0 / (norm + 1e-7)
    inner = (grad * x).sum(reduce_dims, keepdim=True)
    scaled = maxnorm * inv * grad - maxnorm * inv * inv * inner * dnorm
    return torch.where(norm > maxnorm, scaled, grad)


@meta("stft_backward")
def stft_backward_meta(grad_output, self, n_fft, hop_length=None, win_length=None, window=None,
                       normalized=False, onesided=None, return_complex=None):
    """The gradient of ``stft`` w.r.t. its real input has the input's shape and dtype."""
    return torch.empty_like(self)
