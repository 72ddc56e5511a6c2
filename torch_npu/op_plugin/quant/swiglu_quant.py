"""SwiGLU + int8 quantisation and int32 dequantisation: npu_swiglu_quant,
npu_dequant_swiglu_quant, npu_dequant_bias.

Semantics come from op-plugin's goldens (``test/test_custom_ops/test_npu_swiglu_quant*.py``,
``test_npu_dequant_swiglu_quant.py``) and CANN's DequantBias kernel source, which settle what
the prose docs leave open (see docs/ops-quant.md):

* npu_swiglu_quant, dynamic mode (quant_mode=1): ``s = swish(A) * B`` (``activate_left``) or
  ``A * swish(B)`` (A, B the two halves of the last dim); ``s *= smooth_scales[g]`` for the
  group ``g`` of the row (rows past the last group keep factor 1, as the golden leaves them);
  per row ``scale = 127 / max|s|`` (the golden and aclnnSwiGluQuantV2 both return this
  reciprocal) and ``y = round(s * scale)`` saturated to int8. ``offsets`` has no effect here.
* npu_dequant_swiglu_quant, dynamic mode: ``d = x * weight_scale * activation_scale``,
  ``s = swish(second half) * first half`` (``activate_left=False``; the halves swap when True),
  ``s *= quant_scale``, per row ``scale = max|s| / 127`` and ``y = round(s * 127 / max|s|)``
  saturated to int8 (here the returned scale is the dequantisation factor).
* npu_swiglu_group_quant_backward (op-plugin golden ``test_npu_swiglu_group_quant_backward.py``):
  the gradient of ``y = weight * swish(A) * B`` (A, B the halves of x; when ``clamp_limit != 0``
  A is clamped to ``<= clamp_limit`` and B to ``[-clamp_limit, clamp_limit]``, and the gradient
  is 0 where the input lay outside the strict open limits); ``grad_weight = sum(grad_y *
  y_origin)`` per row; rows at or past ``sum(group_index)`` get zero gradients.
* npu_dequant_bias: ``y = (x + bias) * weight_scale * activation_scale`` for an int32 bias
  (integer add first), ``y = x * weight_scale * activation_scale + bias`` for a float bias;
  float32 arithmetic, one round-to-nearest-even cast to the output dtype.

``round`` is half-to-even (torch.round), float32 arithmetic. A row whose max is 0 quantises to
zeros. Modes whose results are not established raise NotImplementedError naming the argument.
All kernels are CompositeImplicitAutograd compositions of ATen ops (no host reads): CPU, npu,
Meta/FakeTensor alike. None of these ops has a backward of its own (inference ops, or a
backward op itself).
"""
import torch
import torch.nn.functional as F

from torch_npu.op_plugin._common import check, unsupported
from torch_npu.op_plugin._registry import impl

__all__ = []

_FLOATS = (torch.float16, torch.bfloat16, torch.float32)
_INT8_MAX = 127.0


def _swiglu(v, activate_left):
    """swish on the left half times the right half, or the right half's swish times the left."""
    a, b = v.chunk(2, dim=-1)
    return F.silu(a) * b if activate_left else a * F.silu(b)


def _row_max(s):
    return s.abs().amax(dim=-1, keepdim=True)


def _to_int8(v):
    return torch.round(v).clamp(-128, 127).to(torch.int8)


# ------------------------------------------------------------------ npu_swiglu_quant


def _group_factors(op, smooth_scales, group_index, group_list_type, rows, n, device):
    """``[rows, n or 1]`` float32 smooth factor of every (flattened) row."""
    g = smooth_scales.shape[0]
    check(smooth_scales.dim() in (1, 2), op, "smooth_scales must be [G, N] or [G], got %s",
          (tuple(smooth_scales.shape),))
    if smooth_scales.dim() == 2:
        check(smooth_scales.shape[1] == n, op, "smooth_scales must be [G, %d], got %s",
              (n, tuple(smooth_scales.shape)))
    table = smooth_scales.float().reshape(g, -1)
    if group_index is None:
        check(g == 1, op, "without group_index smooth_scales must hold one group, got %d", g)
        return table
    check(group_index.dim() == 1 and group_index.shape[0] == g, op,
          "group_index must be 1-D of length %d (smooth_scales' groups), got %s", (g, tuple(group_index.shape)))
    check(group_index.dtype in (torch.int32, torch.int64), op, "group_index must be int32, got %s", group_index.dtype)
    ends = group_index if group_list_type == 0 else group_index.cumsum(0)
    r = torch.arange(rows, device=device, dtype=ends.dtype)
    # group of row r: number of group ends <= r; rows past the last end use the appended 1s row
    gid = torch.searchsorted(ends.contiguous(), r, right=True)
    table = torch.cat([table, table.new_ones(1, table.shape[1])])
    return table.index_select(0, gid)


@impl("npu_swiglu_quant")
def npu_swiglu_quant(x, *, smooth_scales=None, offsets=None, group_index=None, activate_left=False, quant_mode=0,
                     group_list_type=0, dst_type=None):
    """``(y int8 [..., N], scale float32 [...])``; dynamic mode only. See the module doc."""
    op = "npu_swiglu_quant"
    check(quant_mode in (0, 1), op, "quant_mode only support 0(static) or 1(dynamic), but got %r", (quant_mode,))
    check(group_list_type in (0, 1), op,
          "group_list_type only support 0(cumsum) or 1(count), but got %r", (group_list_type,))
    check(dst_type in (None, torch.int8, torch.quint4x2), op,
          "dtype must be torch.int8 for int8 or torch.quint4x2 for int4")
    check(x.dim() > 1, op, "x must have more than 1 dim, got %d", x.dim())
    check(x.dtype in _FLOATS, op, "x must be float16, bfloat16 or float32, got %s", x.dtype)
    check(x.shape[-1] % 2 == 0, op, "x last dim size should be even")
    if dst_type == torch.quint4x2:
        unsupported(op, "dst_type=torch.quint4x2 (the order of two int4 in an int8 is not documented)")
    if quant_mode == 0:
        unsupported(op, "quant_mode=0 (static: the scale output's content is not documented)")
    n = x.shape[-1] // 2
    s = _swiglu(x.float(), activate_left).reshape(-1, n)
    if smooth_scales is not None:
        check(smooth_scales.dtype == torch.float32, op, "smooth_scales must be float32, got %s", smooth_scales.dtype)
        s = s * _group_factors(op, smooth_scales, group_index, group_list_type, s.shape[0], n, x.device)
    elif group_index is not None:
        unsupported(op, "group_index without smooth_scales")
    peak = _row_max(s)
    scale = _INT8_MAX / peak
    y = _to_int8(torch.where(peak > 0, s * scale, torch.zeros_like(s)))
    lead = list(x.shape[:-1])
    return y.reshape(lead + [n]), scale.reshape(lead)


# ------------------------------------------------------------------ npu_dequant_swiglu_quant


def _per_last_dim(op, name, t, size):
    """A float32 ``[size]`` or ``[1, size]`` parameter as a broadcastable ``[size]``."""
    check(t.dtype == torch.float32, op, "%s must be float32, got %s", (name, t.dtype))
    check(t.numel() == size and t.shape[-1] == size, op,
          "%s must be [%d] or [1, %d], got %s", (name, size, size, tuple(t.shape)))
    return t.reshape(size)


@impl("npu_dequant_swiglu_quant")
def npu_dequant_swiglu_quant(x, *, weight_scale=None, activation_scale=None, bias=None, quant_scale=None,
                             quant_offset=None, group_index=None, activate_left=False, quant_mode=0, dst_type=None,
                             round_mode=None, activate_dim=None, swiglu_mode=0, clamp_limit=7.0, glu_alpha=1.702,
                             glu_bias=1.0):
    """``(y int8 [..., H], scale float32 [...])`` of an int32 ``x [..., 2H]``; the golden's
    dynamic mode only. See the module doc."""
    op = "npu_dequant_swiglu_quant"
    check(x.dim() > 1, op, "x dim should larger than 1")
    check(quant_mode in (0, 1), op, "quant_mode only support 0 or 1, but got %r", (quant_mode,))
    check(x.shape[-1] % 2 == 0, op, "x last dim size should be even")
    if quant_mode == 0:
        unsupported(op, "quant_mode=0 (static quantisation is not in the golden)")
    if x.dtype != torch.int32:
        unsupported(op, "x of dtype %s (only int32 x is in the golden)" % x.dtype)
    if weight_scale is None or activation_scale is None:
        unsupported(op, "int32 x without weight_scale and activation_scale")
    for name, value in (("bias", bias), ("quant_offset", quant_offset), ("group_index", group_index)):
        if value is not None:
            unsupported(op, "%s (not in the golden)" % name)
    if dst_type not in (None, 1):
        unsupported(op, "dst_type=%r (only int8)" % (dst_type,))
    if round_mode not in (None, 0):
        unsupported(op, "round_mode=%r (only rint)" % (round_mode,))
    if activate_dim is not None and activate_dim % x.dim() != x.dim() - 1:
        unsupported(op, "activate_dim=%r (only the last dim)" % (activate_dim,))
    if swiglu_mode != 0:
        unsupported(op, "swiglu_mode=%r (only 0)" % (swiglu_mode,))
    two_h = x.shape[-1]
    h = two_h // 2
    rows = x.numel() // two_h if two_h else 0
    ws = _per_last_dim(op, "weight_scale", weight_scale, two_h)
    check(activation_scale.dtype == torch.float32, op,
          "activation_scale must be float32, got %s", activation_scale.dtype)
    check(activation_scale.numel() == rows, op, "activation_scale must hold one value per token (%d), got %s",
          (rows, tuple(activation_scale.shape)))
    d = x.reshape(-1, two_h).float() * ws * activation_scale.reshape(-1, 1)
    s = _swiglu(d, activate_left)
    if quant_scale is not None:
        s = s * _per_last_dim(op, "quant_scale", quant_scale, h)
    peak = _row_max(s)
    y = _to_int8(torch.where(peak > 0, s * (_INT8_MAX / peak), torch.zeros_like(s)))
    lead = list(x.shape[:-1])
    return y.reshape(lead + [h]), (peak / _INT8_MAX).reshape(lead)


# ------------------------------------------------------------------ npu_swiglu_group_quant_backward


@impl("npu_swiglu_group_quant_backward")
def npu_swiglu_group_quant_backward(grad_y, x, *, weight=None, y_origin=None, group_index=None, clamp_limit=0.0):
    """``(grad_x like x, grad_weight like weight or float32 [0])``. See the module doc."""
    op = "npu_swiglu_group_quant_backward"
    check(x.shape[-1] % 2 == 0, op, "x last dim size should be even")
    check(x.dtype in _FLOATS and grad_y.dtype in _FLOATS, op,
          "x and grad_y must be float16, bfloat16 or float32, got %s and %s", (x.dtype, grad_y.dtype))
    h = x.shape[-1] // 2
    rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    check(grad_y.numel() == rows * h and grad_y.shape[-1] == h, op,
          "grad_y must have x's shape with the last dim halved, got %s", (tuple(grad_y.shape),))
    g = grad_y.float().reshape(rows, h)
    xf = x.float().reshape(rows, 2 * h)
    keep = None
    if group_index is not None:
        check(group_index.dim() == 1, op, "group_index must be 1-D, got %d-D", group_index.dim())
        # the kernel covers the first sum(group_index) rows only
        keep = (torch.arange(rows, device=x.device) < group_index.sum()).unsqueeze(1)
    grad_weight = x.new_empty((0,), dtype=torch.float32)
    if weight is not None:
        check(y_origin is not None, op, "y_origin is required when weight is given")
        check(weight.numel() == rows, op, "weight must hold one value per row (%d), got %s",
              (rows, tuple(weight.shape)))
        check(y_origin.numel() == rows * h, op, "y_origin must have grad_y's shape, got %s", (tuple(y_origin.shape),))
        gw = (g * y_origin.float().reshape(rows, h)).sum(dim=1, keepdim=True)
        if keep is not None:
            gw = torch.where(keep, gw, torch.zeros_like(gw))
        grad_weight = gw.reshape(weight.shape).to(weight.dtype)
        g = g * weight.float().reshape(rows, 1)
    a, b = xf[:, :h], xf[:, h:]
    if clamp_limit != 0:
        a_in = a < clamp_limit
        b_in = (b > -clamp_limit) & (b < clamp_limit)
        a = a.clamp(max=clamp_limit)
        b = b.clamp(-clamp_limit, clamp_limit)
    sig = torch.sigmoid(a)
    grad_a = g * b * (sig * (1 + a * (1 - sig)))
    grad_b = g * (a * sig)
    if clamp_limit != 0:
        grad_a = torch.where(a_in, grad_a, torch.zeros_like(grad_a))
        grad_b = torch.where(b_in, grad_b, torch.zeros_like(grad_b))
    grad_x = torch.cat([grad_a, grad_b], dim=1)
    if keep is not None:
        grad_x = torch.where(keep, grad_x, torch.zeros_like(grad_x))
    return grad_x.reshape(x.shape).to(x.dtype), grad_weight


# ------------------------------------------------------------------ npu_dequant_bias


@impl("npu_dequant_bias")
def npu_dequant_bias(x, weight_scale, activation_scale, bias, *, output_dtype=None):
    """``y [M, N]`` float16 / bfloat16 of an int32 ``x [M, N]``. See the module doc."""
    op = "npu_dequant_bias"
    out_dtype = torch.float16 if output_dtype is None else output_dtype
    check(out_dtype in (torch.float16, torch.bfloat16), op, "The dtype should be half or bfloat16")
    check(x.dim() == 2, op, "x must be 2-D [M, N], got %d-D", x.dim())
    check(x.dtype == torch.int32, op, "x must be int32, got %s", x.dtype)
    m, n = x.shape
    check(weight_scale.dtype in (torch.float32, torch.bfloat16), op,
          "weight_scale must be float32 or bfloat16, got %s", weight_scale.dtype)
    check(tuple(weight_scale.shape) == (n,), op, "weight_scale must be [%d], got %s", (n, tuple(weight_scale.shape)))
    int_bias = bias is not None and bias.dtype == torch.int32
    if bias is not None:
        check(bias.dtype in (torch.int32, torch.float32, torch.float16, torch.bfloat16), op,
              "bias must be int32, float32, float16 or bfloat16, got %s", bias.dtype)
        check(tuple(bias.shape) == (n,), op, "bias must be [%d], got %s", (n, tuple(bias.shape)))
    # an int32 bias is added to the integer accumulators, a float one after the scaling
    v = (x + bias if int_bias else x).float() * weight_scale.float()
    if activation_scale is not None:
        check(activation_scale.dtype == torch.float32, op,
              "activation_scale must be float32, got %s", activation_scale.dtype)
        check(tuple(activation_scale.shape) == (m,), op,
              "activation_scale must be [%d], got %s", (m, tuple(activation_scale.shape)))
        v = v * activation_scale.reshape(m, 1)
    if bias is not None and not int_bias:
        v = v + bias.float()
    return v.to(out_dtype)
