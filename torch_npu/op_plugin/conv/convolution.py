"""Convolution ops and their backward ops.

These are the internal ops the real torch_npu's autograd formulas call (its
``derivatives.yaml``); each has the meaning of the PyTorch function of the same name:

* ``npu_conv2d`` / ``npu_convolution`` = ``aten::convolution`` (not transposed);
  ``npu_conv_transpose2d`` / ``npu_convolution_transpose`` = the transposed convolution (their
  argument order is ``padding, output_padding, stride, dilation, groups``).
* ``*_backward(input, grad, weight, ..., output_mask)`` return ``(grad_input, grad_weight,
  grad_bias)``, each only where ``output_mask`` asks for it (an undefined output is ``None``),
  computed by ``aten::convolution_backward``.
* ``npu_conv3d(.out)``: ``aten::convolution`` of 5-D inputs.
"""
import torch
import torch.nn.functional as F

from torch_npu.op_plugin._common import check, write_out
from torch_npu.op_plugin._registry import impl

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
    check(input.dim() in (3, 4), "npu_conv2d", "input must be 3-D or 4-D, got %d-D", input.dim())
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
    check(input.dim() in (3, 4), "npu_conv_transpose2d", "input must be 3-D or 4-D, got %d-D", input.dim())
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
    check(input.dim() == 5, "npu_conv3d_backward", "input must be 5-D (N, C, D, H, W), got %d-D", input.dim())
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
          "input must be 5-D (N, C, D, H, W), got %d-D", input.dim())
    return _conv_backward(grad_output, input, weight, stride, padding, dilation, True, output_padding, groups,
                          output_mask)


@impl("slow_conv_dilated2d_backward")
def slow_conv_dilated2d_backward(grad_output, self, weight, kernel_size, stride, padding, dilation, output_mask):
    """``(grad_input, grad_weight, grad_bias)`` of a dilated 2-D convolution (groups = 1)."""
    check(list(weight.shape[2:]) == list(kernel_size), "slow_conv_dilated2d_backward",
          "kernel_size %s must match weight %s", (list(kernel_size), tuple(weight.shape)))
    return _conv_backward(grad_output, self, weight, stride, padding, dilation, False, [0, 0], 1, output_mask)


@impl("slow_conv_transpose2d_backward")
def slow_conv_transpose2d_backward(grad_output, self, weight, kernel_size, stride, padding, output_padding,
                                   dilation, output_mask):
    """``(grad_input, grad_weight, grad_bias)`` of a 2-D transposed convolution (groups = 1)."""
    check(list(weight.shape[2:]) == list(kernel_size), "slow_conv_transpose2d_backward",
          "kernel_size %s must match weight %s", (list(kernel_size), tuple(weight.shape)))
    return _conv_backward(grad_output, self, weight, stride, padding, dilation, True, output_padding, 1,
                          output_mask)


@impl("_conv_depthwise2d_backward")
def _conv_depthwise2d_backward(grad_output, self, weight, kernel_size, stride, padding, dilation, output_mask):
    """``(grad_input, grad_weight)`` of a depthwise 2-D convolution (groups = input channels,
    weight ``[C * multiplier, 1, kh, kw]``) per the two-element ``output_mask``."""
    op = "_conv_depthwise2d_backward"
    check(self.dim() == 4 and weight.dim() == 4 and weight.shape[1] == 1, op,
          "input must be 4-D and weight [C*m, 1, kh, kw], got %s and %s", (tuple(self.shape), tuple(weight.shape)))
    check(list(weight.shape[2:]) == list(kernel_size), op,
          "kernel_size %s must match weight %s", (list(kernel_size), tuple(weight.shape)))
    g_in, g_w, _ = _conv_backward(grad_output, self, weight, stride, padding, dilation, False, [0, 0],
                                  self.shape[1], [output_mask[0], output_mask[1], False])
    return g_in, g_w


# ----------------------------------------------------------------- matmul / bmm


# ----------------------------------------------------------------- FFT


# ----------------------------------------------------------------- gather / max / min / repeat / renorm


def _conv3d(op, input, weight, bias, stride, padding, dilation, groups):
    check(input.dim() == 5 and weight.dim() == 5, op, "input (N, C, D, H, W) and weight (O, C/groups, kD, kH, kW) "
          "must be 5-D, got %s and %s", (tuple(input.shape), tuple(weight.shape)))
    return F.conv3d(input, weight, bias, list(stride), list(padding), list(dilation), groups)


@impl("npu_conv3d")
def npu_conv3d(input, weight, bias, stride, padding, dilation, groups):
    """3-D convolution (cross-correlation) of ``input`` (N, C, D, H, W) with ``weight``
    (O, C/groups, kD, kH, kW), zero ``padding`` on both sides, ``stride``, ``dilation``, ``groups``,
    plus ``bias`` (O,): ``torch.nn.functional.conv3d``. Differentiable."""
    return _conv3d("npu_conv3d", input, weight, bias, stride, padding, dilation, groups)


@impl("npu_conv3d.out")
def npu_conv3d_out(input, weight, bias, stride, padding, dilation, groups, *, out):
    """:func:`npu_conv3d` written into ``out`` (resized if needed)."""
    return write_out(out, _conv3d("npu_conv3d", input, weight, bias, stride, padding, dilation, groups))
