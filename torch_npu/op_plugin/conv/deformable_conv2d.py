"""npu_deformable_conv2d / npu_deformable_conv2dbk: modulated deformable convolution (DCNv2).

As on hardware the op is two steps (op-plugin runs CANN ``DeformableOffsets`` then ``npu_conv2d``):

1. ``offset_out`` (the "deformed columns", [N, C, Ho*kh, Wo*kw]): for output pixel (ho, wo),
   kernel tap (i, j), channel c in deformable group g = c // (C / dg)::

       y = ho*stride[2] - padding[0] + i*dilation[2] + dy[g, i, j, ho, wo]
       x = wo*stride[3] - padding[2] + j*dilation[3] + dx[g, i, j, ho, wo]
       offset_out[n, c, ho*kh + i, wo*kw + j] = mask[g, i, j, ho, wo] * bilinear(input[n, c], y, x)

   ``offset`` is [N, 3*dg*kh*kw, Ho, Wo] in NCHW, channel ``part*dg*kh*kw + g*kh*kw + i*kw + j``
   with part 0 = x (width) offsets, 1 = y (height) offsets, 2 = mask; the mask multiplies as given
   (callers such as ModulatedDeformConv apply the sigmoid). Bilinear sampling uses floor corners and
   reads 0 for a corner outside the image; a point with y <= -1, y >= H, x <= -1 or x >= W is 0.
2. ``output = conv2d(offset_out, weight, bias, stride=kernel_size, padding=0, groups=groups)``.

``npu_deformable_conv2dbk`` is the backward of that composition: the convolution backward on the
given ``offset_out`` gives (grad_cols, grad_weight, grad_bias), then the adjoint of step 1 gives
grad_input and grad_offset (x, y, mask parts in the offset layout). The real adapter casts every
tensor to float32 and returns float32; here float16/bfloat16 are computed and returned in float32
too, and float64 inputs stay float64 (an emulator extension, so gradcheck sees full precision).
Autograd of ``npu_deformable_conv2d`` flows through the ATen composition.
"""
import collections

import torch

from torch_npu.op_plugin._common import check
from torch_npu.op_plugin._registry import impl

__all__ = []

_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)

_Geometry = collections.namedtuple(
    "_Geometry", "n c h w kh kw sh sw pad_top pad_left dh dw ho wo dg groups cout")


def _compute_dtype(input):
    # The adapter casts to float32; float64 is kept only so gradcheck can run in float64.
    return torch.float64 if input.dtype == torch.float64 else torch.float32


def _geometry(op, input, weight, offset, kernel_size, stride, padding, dilation, groups, deformable_groups,
              modulated):
    """Validates the documented shapes and arguments and returns the sampling geometry."""
    check(modulated, op, "modulated=False (DCNv1) is not supported: the NPU kernel supports only "
                         "modulated=True (v2), whose offset carries x, y and mask")
    for name, t in (("input", input), ("weight", weight), ("offset", offset)):
        check(t.dim() == 4, op, "%s must be 4-D (NCHW), got %d-D", (name, t.dim()))
        check(t.dtype in _FLOATS, op, "%s must be float16, bfloat16, float32 (or float64), got %s", (name, t.dtype))
    check(len(kernel_size) == 2 and all(k > 0 for k in kernel_size), op,
          "kernel_size must be 2 positive ints [kh, kw], got %s", (list(kernel_size),))
    check(len(stride) == 4 and stride[0] == 1 and stride[1] == 1 and stride[2] > 0 and stride[3] > 0, op,
          "stride must be [1, 1, stride_h, stride_w] with positive strides, got %s", (list(stride),))
    check(len(padding) == 4 and all(p >= 0 for p in padding), op,
          "padding must be 4 non-negative ints [top, bottom, left, right], got %s", (list(padding),))
    check(len(dilation) == 4 and dilation[0] == 1 and dilation[1] == 1 and dilation[2] > 0 and dilation[3] > 0,
          op, "dilation must be [1, 1, dilation_h, dilation_w] with positive values, got %s", (list(dilation),))
    n, c, h, w = input.shape
    cout, cin_per_group, kh, kw = weight.shape
    check([kh, kw] == list(kernel_size), op,
          "kernel_size %s must equal the weight's spatial size [kh, kw] = [%d, %d] (the columns are "
          "convolved with stride kernel_size)", (list(kernel_size), kh, kw))
    check(groups > 0 and c % groups == 0 and cout % groups == 0, op,
          "groups=%d must divide in_channels=%d and out_channels=%d", (groups, c, cout))
    check(cin_per_group == c // groups, op,
          "weight must be [out_channels, in_channels / groups = %d, kh, kw], got %s",
          (c // groups, tuple(weight.shape)))
    dg = deformable_groups
    check(dg > 0 and c % dg == 0, op, "deformable_groups=%d must divide in_channels=%d", (dg, c))
    sh, sw, dh, dw = stride[2], stride[3], dilation[2], dilation[3]
    ho = (h + padding[0] + padding[1] - ((kh - 1) * dh + 1)) // sh + 1
    wo = (w + padding[2] + padding[3] - ((kw - 1) * dw + 1)) // sw + 1
    check(ho > 0 and wo > 0, op, "the input %s is too small for the kernel, padding and dilation (output %dx%d)",
          (tuple(input.shape), ho, wo))
    expected = (n, 3 * dg * kh * kw, ho, wo)
    check(tuple(offset.shape) == expected, op,
          "offset must be [N, 3 * deformable_groups * kh * kw, Ho, Wo] = %s, got %s",
          (list(expected), tuple(offset.shape)))
    return _Geometry(n, c, h, w, kh, kw, sh, sw, padding[0], padding[2], dh, dw, ho, wo, dg, groups, cout)


def _taps(g, like):
    """Sampling positions and mask, each [N*dg, Ho*kh, Wo*kw] (row ho*kh + i, column wo*kw + j)."""
    parts = like.view(g.n, 3, g.dg, g.kh, g.kw, g.ho, g.wo).permute(1, 0, 2, 5, 3, 6, 4)
    parts = parts.reshape(3, g.n * g.dg, g.ho * g.kh, g.wo * g.kw)
    dx, dy, mask = parts[0], parts[1], parts[2]
    opts = dict(dtype=like.dtype, device=like.device)
    rows = (torch.arange(g.ho, **opts) * g.sh - g.pad_top).unsqueeze(1) + torch.arange(g.kh, **opts) * g.dh
    cols = (torch.arange(g.wo, **opts) * g.sw - g.pad_left).unsqueeze(1) + torch.arange(g.kw, **opts) * g.dw
    ys = rows.reshape(-1, 1) + dy
    xs = cols.reshape(1, -1) + dx
    return ys, xs, mask


def _corners(g, ys, xs):
    """The four bilinear corners: (flat index [N*dg, P], weight, d weight/dx, d weight/dy), with the weight
    and its derivatives zero where the corner lies outside the image or the point has no support."""
    inside = (ys > -1) & (ys < g.h) & (xs > -1) & (xs < g.w)
    y0, x0 = ys.floor(), xs.floor()
    fy, fx = ys - y0, xs - x0
    zero = ys.new_zeros(())
    result = []
    for cy, wy, sy in ((y0, 1 - fy, -1.0), (y0 + 1, fy, 1.0)):
        for cx, wx, sx in ((x0, 1 - fx, -1.0), (x0 + 1, fx, 1.0)):
            valid = inside & (cy >= 0) & (cy <= g.h - 1) & (cx >= 0) & (cx <= g.w - 1)
            # integer arithmetic: a float32 flat index is inexact beyond 2**24 pixels
            index = (torch.where(valid, cy, zero).long() * g.w + torch.where(valid, cx, zero).long()).flatten(1)
            weight = torch.where(valid, wy * wx, zero).flatten(1)
            d_x = torch.where(valid, wy * sx, zero).flatten(1)
            d_y = torch.where(valid, wx * sy, zero).flatten(1)
            result.append((index, weight, d_x, d_y))
    return result


def _gather(image, index):
    """image [B, Cg, H*W], index [B, P] -> [B, Cg, P]."""
    return image.gather(2, index.unsqueeze(1).expand(-1, image.shape[1], -1))


def _deformed_columns(g, x, offset):
    """Step 1 (DeformableOffsets): [N, C, Ho*kh, Wo*kw]."""
    ys, xs, mask = _taps(g, offset)
    image = x.reshape(g.n * g.dg, g.c // g.dg, g.h * g.w)
    sampled = None
    for index, weight, _, _ in _corners(g, ys, xs):
        term = _gather(image, index) * weight.unsqueeze(1)
        sampled = term if sampled is None else sampled + term
    columns = sampled * mask.flatten(1).unsqueeze(1)
    return columns.reshape(g.n, g.c, g.ho * g.kh, g.wo * g.kw)


def _deformed_columns_backward(g, grad_columns, x, offset):
    """Adjoint of step 1 (DeformableOffsetsGrad): (grad_input [N, C, H, W], grad_offset like offset)."""
    ys, xs, mask = _taps(g, offset)
    cg = g.c // g.dg
    image = x.reshape(g.n * g.dg, cg, g.h * g.w)
    grad = grad_columns.reshape(g.n * g.dg, cg, -1)
    mask = mask.flatten(1)
    grad_image = image.new_zeros(image.shape)
    grad_mask = grad_x = grad_y = None
    for index, weight, d_x, d_y in _corners(g, ys, xs):
        # <grad, value> summed over the group's channels: what each corner weight multiplies.
        response = (grad * _gather(image, index)).sum(1)
        grad_image = grad_image.scatter_add(
            2, index.unsqueeze(1).expand(-1, cg, -1), grad * (mask * weight).unsqueeze(1))
        terms = (response * weight, response * d_x, response * d_y)
        if grad_mask is None:
            grad_mask, grad_x, grad_y = terms
        else:
            grad_mask, grad_x, grad_y = grad_mask + terms[0], grad_x + terms[1], grad_y + terms[2]
    parts = torch.stack((grad_x * mask, grad_y * mask, grad_mask))  # [3, N*dg, Ho*kh*Wo*kw]
    parts = parts.view(3, g.n, g.dg, g.ho, g.kh, g.wo, g.kw).permute(1, 0, 2, 4, 6, 3, 5)
    grad_offset = parts.reshape(g.n, 3 * g.dg * g.kh * g.kw, g.ho, g.wo)
    return grad_image.reshape(g.n, g.c, g.h, g.w), grad_offset


@impl("npu_deformable_conv2d")
def npu_deformable_conv2d(input, weight, offset, bias, kernel_size, stride, padding, dilation=(1, 1, 1, 1),
                          groups=1, deformable_groups=1, modulated=True):
    """Modulated deformable conv2d (DCNv2) on NCHW tensors; see the module docstring for the formula and
    the offset layout. Returns ``(output [N, Cout, Ho, Wo], offset_out [N, C, Ho*kh, Wo*kw])`` in float32
    (float64 for float64 input)."""
    op = "npu_deformable_conv2d"
    g = _geometry(op, input, weight, offset, kernel_size, stride, padding, dilation, groups, deformable_groups,
                  modulated)
    if bias is not None:
        check(bias.dim() == 1 and bias.shape[0] == g.cout, op,
              "bias must be 1-D [out_channels=%d], got %s", (g.cout, tuple(bias.shape)))
    dtype = _compute_dtype(input)
    columns = _deformed_columns(g, input.to(dtype), offset.to(dtype))
    output = torch.nn.functional.conv2d(columns, weight.to(dtype), None if bias is None else bias.to(dtype),
                                        stride=(g.kh, g.kw), groups=g.groups)
    return output, columns


@impl("npu_deformable_conv2dbk")
def npu_deformable_conv2dbk(input, grad_output, offset_out, weight, offset, kernel_size, stride, padding,
                            dilation=(1, 1, 1, 1), groups=1, deformable_groups=1, modulated=True):
    """Backward of :func:`npu_deformable_conv2d`: ``(grad_input, grad_weight, grad_offset, grad_bias)``.
    grad_weight/grad_bias come from the convolution of the given ``offset_out``; grad_bias is
    ``grad_output.sum((0, 2, 3))`` whether or not the forward had a bias."""
    op = "npu_deformable_conv2dbk"
    g = _geometry(op, input, weight, offset, kernel_size, stride, padding, dilation, groups, deformable_groups,
                  modulated)
    columns_shape = (g.n, g.c, g.ho * g.kh, g.wo * g.kw)
    check(tuple(offset_out.shape) == columns_shape, op,
          "offset_out must be [N, C, Ho*kh, Wo*kw] = %s, got %s", (list(columns_shape), tuple(offset_out.shape)))
    out_shape = (g.n, g.cout, g.ho, g.wo)
    check(tuple(grad_output.shape) == out_shape, op,
          "grad_output must be [N, Cout, Ho, Wo] = %s, got %s", (list(out_shape), tuple(grad_output.shape)))
    dtype = _compute_dtype(input)
    grad_columns, grad_weight, grad_bias = torch.ops.aten.convolution_backward(
        grad_output.to(dtype), offset_out.to(dtype), weight.to(dtype), [g.cout], [g.kh, g.kw], [0, 0], [1, 1],
        False, [0, 0], g.groups, [True, True, True])
    grad_input, grad_offset = _deformed_columns_backward(g, grad_columns, input.to(dtype), offset.to(dtype))
    return grad_input, grad_weight, grad_offset, grad_bias
