"""Quantisation ops: npu_quantize, npu_anti_quant, npu_dynamic_quant(_asymmetric),
npu_quant_matmul, npu_weight_quant_batchmatmul, and the ``_quantize_per_{tensor,channel}_impl.out``
kernels behind ``torch.quantize_per_tensor`` / ``torch.quantize_per_channel``.

dtype arguments (``dtype=``, ``dst_dtype=``, ``dst_type=``, ``output_dtype=``) are
accepted as ``torch.dtype`` values (PyTorch passes them to the ``int`` schema slots as
their ScalarType codes, e.g. ``torch.int8`` -> 1, ``torch.float16`` -> 5,
``torch.qint8`` -> 12), and as torch_npu's own ``_cd.DType`` codes (``torch_npu.int8`` ->
258, ``torch_npu.float8_e4m3fn`` -> 292; see ``torch_npu.utils._custom_dtype``). Every dtype
value outside the documented supported set (e.g. ``torch_npu.hifloat8``, which has no torch
dtype), and every unsupported argument, raises ``NotImplementedError`` naming it.

Rounding is round-half-to-even (``torch.round``); arithmetic runs in float32 (float64
for float64 inputs), as the NPU vector units do.
"""
import torch

from torch_npu.op_plugin._common import acc, check, unsupported
from torch_npu.op_plugin._registry import impl
from torch_npu.op_plugin.quant.int4pack import unpack_int4_weight
from torch_npu.utils import _custom_dtype

__all__ = []

def _code(dtype):
    """ScalarType integer code of a torch.dtype (what an ``int`` schema argument receives)."""
    return {torch.uint8: 0, torch.int8: 1, torch.int16: 2, torch.int32: 3, torch.int64: 4,
            torch.float16: 5, torch.float32: 6, torch.float64: 7, torch.bool: 11,
            torch.qint8: 12, torch.quint8: 13, torch.qint32: 14, torch.bfloat16: 15,
            torch.quint4x2: 16, torch.float8_e5m2: 23, torch.float8_e4m3fn: 24,
            torch.float8_e8m0fnu: 44, torch.float4_e2m1fn_x2: 45}[dtype]


_CODE_TO_DTYPE = {}
for _dt in (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
            torch.float32, torch.float64, torch.bool, torch.qint8, torch.quint8, torch.qint32,
            torch.bfloat16, torch.quint4x2, torch.float8_e5m2, torch.float8_e4m3fn, torch.float8_e8m0fnu,
            torch.float4_e2m1fn_x2):
    _CODE_TO_DTYPE[_code(_dt)] = _dt


def _decode_dtype(value):
    """A dtype argument as a torch.dtype: a torch.dtype, a ScalarType code (what a torch.dtype
    becomes in an ``int`` schema slot) or a ``torch_npu.<dtype>`` constant (hifloat8 ...). None when
    PyTorch has no such dtype."""
    if isinstance(value, torch.dtype):
        return value
    code = int(value)
    if _custom_dtype.is_custom_code(code):
        return _custom_dtype.to_torch_dtype(code)
    return _CODE_TO_DTYPE.get(code)


def _dtype_name(value):
    """How an error message names a dtype argument (``torch_npu.hifloat8`` for the constants)."""
    if not isinstance(value, torch.dtype) and _custom_dtype.is_custom_code(int(value)):
        return _custom_dtype.code_name(int(value))
    return repr(value)


def _dtype_arg(op, argname, value, allowed):
    """Map an int/torch.dtype argument to a torch.dtype in ``allowed`` or raise NotImplementedError."""
    dt = _decode_dtype(value)
    if dt is None or dt not in allowed:
        unsupported(op, "%s=%s (supported: %s)" % (argname, _dtype_name(value), ", ".join(str(a) for a in allowed)))
    return dt


def _f(t):
    """float32 compute copy (float64 stays float64)."""
    return t if t.dtype == torch.float64 else t.float()


def _saturate_round(v, dtype):
    info = torch.iinfo(dtype)
    return torch.round(v).clamp(info.min, info.max).to(dtype)


# ------------------------------------------------------------------ npu_quantize


_QUANTIZE_OUT = {torch.qint8: torch.int8, torch.int8: torch.int8, torch.quint8: torch.uint8,
                 torch.uint8: torch.uint8, torch.qint32: torch.int32, torch.int32: torch.int32}


@impl("npu_quantize")
def npu_quantize(self, scales, zero_points, dtype, axis=1, div_mode=True):
    """Quantise ``self`` with per-tensor or per-channel ``scales``/``zero_points``.

    ``div_mode=True``: ``y = round(x / scales + zero_points)``;
    ``div_mode=False``: ``y = round(x * scales + zero_points)``;
    saturated to the output range. ``scales`` (and ``zero_points``, optional, default 0)
    have 1 element (per-tensor) or ``self.shape[axis]`` elements (per-channel along
    ``axis``). ``dtype``: torch.qint8/torch.int8 -> int8 output, torch.quint8/torch.uint8
    -> uint8, torch.qint32/torch.int32 -> int32. Other dtypes (e.g. torch.quint4x2)
    raise NotImplementedError.
    """
    op = "npu_quantize"
    dt = _dtype_arg(op, "dtype", dtype, tuple(_QUANTIZE_OUT))
    out_dtype = _QUANTIZE_OUT[dt]
    check(self.is_floating_point(), op, "input must be floating point, got %s", self.dtype)
    nd = self.dim()
    check(nd >= 1, op, "input must have at least 1 dim")
    check(-nd <= axis < nd, op, "axis %d out of range for a %d-d input", (axis, nd))
    ax = axis % nd

    def per_channel(t, name):
        check(t.dim() <= 1, op, "%s must be 1-d, got shape %s", (name, tuple(t.shape)))
        n = t.numel()
        check(n == 1 or n == self.shape[ax], op,
              "%s must have 1 or %d (input.shape[axis]) elements, got %d", (name, self.shape[ax], n))
        shape = [1] * nd
        shape[ax] = n
        return _f(t).reshape(shape)

    x = _f(self)
    s = per_channel(scales, "scales").to(x.dtype)
    v = x / s if div_mode else x * s
    if zero_points is not None:
        v = v + per_channel(zero_points, "zero_points").to(x.dtype)
    return _saturate_round(v, out_dtype)


# ------------------------------------------------------------------ npu_anti_quant


@impl("npu_anti_quant")
def npu_anti_quant(x, scale, *, offset=None, dst_dtype=None, src_dtype=None):
    """Dequantise: ``y = (x + offset) * scale`` (``offset`` optional, default 0).

    ``x`` int8; ``scale``/``offset`` 1-d with 1 or ``x.shape[-1]`` elements (broadcast
    along the last dim). ``dst_dtype``: None (float16), torch.float16 or torch.bfloat16.
    ``src_dtype``: None or torch.int8. int4 inputs (int32-packed) raise NotImplementedError.
    """
    op = "npu_anti_quant"
    if src_dtype is not None:
        _dtype_arg(op, "src_dtype", src_dtype, (torch.int8,))
    if x.dtype != torch.int8:
        unsupported(op, "x dtype %s (only int8)" % x.dtype)
    out = torch.float16 if dst_dtype is None else _dtype_arg(op, "dst_dtype", dst_dtype,
                                                               (torch.float16, torch.bfloat16))
    n = x.shape[-1] if x.dim() else 1
    for name, t in (("scale", scale), ("offset", offset)):
        if t is not None:
            check(t.dim() <= 1 and t.numel() in (1, n), op,
                  "%s must be 1-d with 1 or %d elements, got shape %s", (name, n, tuple(t.shape)))
    v = x.float()
    if offset is not None:
        v = v + offset.float().reshape(-1)
    return (v * scale.float().reshape(-1)).to(out)


# ------------------------------------------------------------------ dynamic quant


def _dynamic_common(op, input, smooth_scales, group_index, dst_type, quant_mode, dst_type_max):
    if group_index is not None:
        unsupported(op, "group_index")
    if quant_mode != "pertoken":
        unsupported(op, "quant_mode=%r (only 'pertoken')" % (quant_mode,))
    if dst_type is not None:
        _dtype_arg(op, "dst_type", dst_type, (torch.int8,))
    if dst_type_max != 0.0:
        unsupported(op, "dst_type_max=%r (only 0.0)" % (dst_type_max,))
    if input.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        unsupported(op, "input dtype %s" % input.dtype)
    check(input.dim() >= 1, op, "input must have at least 1 dim")
    x = input.float()
    if smooth_scales is not None:
        check(smooth_scales.dim() == 1 and smooth_scales.numel() == input.shape[-1], op,
              "smooth_scales must be 1-d of length %d, got shape %s", (input.shape[-1], tuple(smooth_scales.shape)))
        x = x * smooth_scales.float()
    return x


@impl("npu_dynamic_quant")
def npu_dynamic_quant(input, *, smooth_scales=None, group_index=None, dst_type=None,
                      quant_mode="pertoken", dst_type_max=0.0):
    """Per-token symmetric dynamic int8 quantisation over the last dim.

    ``x' = x * smooth_scales`` (optional, length H), ``scale = max|x'| / 127`` per row
    (shape ``input.shape[:-1]``, float32), ``y = clamp(round(x' / scale), -128, 127)``
    as int8 (an all-zero row gives scale 0 and y 0). Returns ``(y, scale)``.
    Only ``quant_mode='pertoken'``, ``dst_type`` None/torch.int8, ``dst_type_max=0.0``,
    no ``group_index``; anything else raises NotImplementedError.
    """
    x = _dynamic_common("npu_dynamic_quant", input, smooth_scales, group_index, dst_type,
                        quant_mode, dst_type_max)
    scale = x.abs().amax(-1) / 127.0
    safe = torch.where(scale == 0, torch.ones_like(scale), scale)
    y = _saturate_round(x / safe.unsqueeze(-1), torch.int8)
    return y, scale


@impl("npu_dynamic_quant_asymmetric")
def npu_dynamic_quant_asymmetric(input, *, smooth_scales=None, group_index=None, dst_type=None,
                                 quant_mode="pertoken", dst_type_max=0.0):
    """Per-token asymmetric dynamic int8 quantisation over the last dim.

    ``x' = x * smooth_scales`` (optional), per row ``scale = (max(x') - min(x')) / 255``,
    ``offset = 127 - max(x') / scale``, ``y = clamp(round(x' / scale + offset), -128, 127)``
    int8. ``scale`` and ``offset`` are float32 of shape ``input.shape[:-1]`` (a constant row
    gives scale 0; the emulator then defines offset 0 and y 0 for that row).
    Returns ``(y, scale, offset)``. Same argument restrictions as ``npu_dynamic_quant``.
    """
    x = _dynamic_common("npu_dynamic_quant_asymmetric", input, smooth_scales, group_index,
                        dst_type, quant_mode, dst_type_max)
    mx = x.amax(-1)
    mn = x.amin(-1)
    scale = (mx - mn) / 255.0
    zero = scale == 0
    safe = torch.where(zero, torch.ones_like(scale), scale)
    offset = torch.where(zero, torch.zeros_like(scale), 127.0 - mx / safe)
    v = x / safe.unsqueeze(-1) + offset.unsqueeze(-1)
    v = torch.where(zero.unsqueeze(-1), torch.zeros_like(v), v)
    y = _saturate_round(v, torch.int8)
    return y, scale, offset


# ------------------------------------------------------------------ npu_quant_matmul


def _unpack_scale(op, packed):
    """The fp19 float32 scale of an int64 ``scale`` packed by npu_trans_quant_param. A
    packed 9-bit offset is refused: how the kernel combines it with ``offset`` is not
    documented (pass the float ``offset`` argument instead)."""
    from torch_npu.op_plugin.quant.trans_quant_param import decode_packed_scale, _has_values
    scale, packed_offset = decode_packed_scale(packed)
    if _has_values(packed) and bool((packed_offset != 0).any()):
        unsupported(op, "an int64 scale carrying a packed offset (npu_trans_quant_param(scale, offset))")
    return scale.reshape(-1)


@impl("npu_quant_matmul")
def npu_quant_matmul(x1, x2, scale, *, offset=None, pertoken_scale=None, bias=None,
                     output_dtype=None, x1_dtype=None, x2_dtype=None, pertoken_scale_dtype=None,
                     scale_dtype=None, group_sizes=None, y_scale=None):
    """int8 x int8 matmul with int32 accumulation and dequantisation.

    ``acc = x1 @ x2`` (batch dims broadcast; x1 ``[..., m, k]``, x2 ``[..., k, n]``, both
    int8). ``scale`` float32/bfloat16 with 1 or n elements; ``pertoken_scale`` float32
    with m elements (per row of x1); ``bias`` length n.

    * int32 ``bias``: ``out = (acc + bias) * scale [* pertoken_scale]``;
      float ``bias`` (float32/float16/bfloat16): ``out = acc * scale [* pertoken_scale] + bias``.
    * ``output_dtype`` None/torch.int8: ``out = clamp(round((acc + bias) * scale + offset))``
      as int8 (``offset`` float32, 1 or n elements, default 0; no pertoken_scale, int32 bias).
    * torch.float16 / torch.bfloat16: the dequantised value cast to that dtype.

    Raises NotImplementedError for: output_dtype torch.int32 or anything else, non-int8 x1/x2 (int4/float8), any of x1_dtype,
    x2_dtype, pertoken_scale_dtype, scale_dtype, group_sizes, y_scale, and offset with a
    non-int8 output. An int64 ``scale`` made by npu_trans_quant_param(scale) is used as its
    fp19 float value (one that also packs an offset raises NotImplementedError).
    """
    op = "npu_quant_matmul"
    for name, v in (("x1_dtype", x1_dtype), ("x2_dtype", x2_dtype),
                    ("pertoken_scale_dtype", pertoken_scale_dtype), ("scale_dtype", scale_dtype),
                    ("group_sizes", group_sizes), ("y_scale", y_scale)):
        if v is not None:
            unsupported(op, name)
    out = torch.int8 if output_dtype is None else _dtype_arg(
        op, "output_dtype", output_dtype, (torch.int8, torch.float16, torch.bfloat16))
    if x1.dtype != torch.int8 or x2.dtype != torch.int8:
        unsupported(op, "x1/x2 dtypes %s/%s (only int8)" % (x1.dtype, x2.dtype))
    if scale.dtype == torch.int64:
        scale = _unpack_scale(op, scale)
    if scale.dtype not in (torch.float32, torch.bfloat16):
        unsupported(op, "scale dtype %s (only float32/bfloat16/int64 from npu_trans_quant_param)" % scale.dtype)
    check(x1.dim() >= 2 and x2.dim() >= 2, op, "x1 and x2 must be at least 2-d")
    check(x1.shape[-1] == x2.shape[-2], op, "x1 k=%d must equal x2 k=%d", (x1.shape[-1], x2.shape[-2]))
    m, n = x1.shape[-2], x2.shape[-1]
    check(scale.dim() == 1 and scale.numel() in (1, n), op,
          "scale must be 1-d with 1 or %d elements, got shape %s", (n, tuple(scale.shape)))
    if out != torch.int8 and offset is not None:
        unsupported(op, "offset with output_dtype=%s (offset is for int8 output only)" % out)
    if out == torch.int8 and pertoken_scale is not None:
        unsupported(op, "pertoken_scale with int8 output")
    acc = torch.matmul(x1.to(torch.int64), x2.to(torch.int64))
    int_bias = bias is not None and bias.dtype == torch.int32
    if bias is not None:
        check(bias.dim() >= 1 and bias.shape[-1] == n, op, "bias last dim must be %d", n)
        if not int_bias and bias.dtype not in (torch.float32, torch.float16, torch.bfloat16):
            unsupported(op, "bias dtype %s" % bias.dtype)
        if not int_bias and out == torch.int8:
            unsupported(op, "float bias with int8 output")
    if int_bias:
        acc = acc + bias.to(torch.int64)
    v = acc.float() * scale.float()
    if pertoken_scale is not None:
        check(pertoken_scale.dim() == 1 and pertoken_scale.numel() == m, op,
              "pertoken_scale must be 1-d with %d (m) elements", m)
        v = v * pertoken_scale.float().unsqueeze(-1)
    if bias is not None and not int_bias:
        v = v + bias.float()
    if out == torch.int8:
        if offset is not None:
            check(offset.dim() == 1 and offset.numel() in (1, n), op,
                  "offset must be 1-d with 1 or %d elements", n)
            v = v + offset.float()
        return _saturate_round(v, torch.int8)
    return v.to(out)


# ------------------------------------------------------------------ npu_weight_quant_batchmatmul


@impl("npu_weight_quant_batchmatmul")
def npu_weight_quant_batchmatmul(x, weight, antiquant_scale, antiquant_offset=None, quant_scale=None,
                                 quant_offset=None, bias=None, antiquant_group_size=0, inner_precise=0,
                                 weight_dtype=None):
    """``y = x @ ((weight + antiquant_offset) * antiquant_scale) + bias``.

    ``x`` float16/bfloat16 ``[..., m, k]``, ``weight`` int8 ``[k, n]``. ``antiquant_scale``
    (and ``antiquant_offset``, same shape, default 0): per-tensor (1 element), per-channel
    (``[n]`` or ``[1, n]``) or, with ``antiquant_group_size = g > 0``, per-group
    ``[ceil(k / g), n]`` (row ``i`` of weight uses group ``i // g``). Computed in float32,
    output in ``x.dtype``. ``inner_precise`` (0/1) is a precision hint and ignored.
    int32 ``weight``: int4 values packed 8 per int32 by npu_convert_weight_to_int4pack,
    ``(k, n / 8)`` or the transposed view ``(k / 8, n)`` of a packed ``(n, k / 8)``; unpacked
    to ``[k, n]`` by ``quant.int4pack.unpack_int4_weight``.
    ``quant_scale``/``quant_offset`` (int8 output), ``weight_dtype``, and other weight
    dtypes raise NotImplementedError.
    """
    op = "npu_weight_quant_batchmatmul"
    for name, v in (("quant_scale", quant_scale), ("quant_offset", quant_offset),
                    ("weight_dtype", weight_dtype)):
        if v is not None:
            unsupported(op, name)
    if inner_precise not in (0, 1):
        unsupported(op, "inner_precise=%r" % (inner_precise,))
    if weight.dtype == torch.int32:
        weight = unpack_int4_weight(weight, op)
    elif weight.dtype != torch.int8:
        unsupported(op, "weight dtype %s (only int8, or int32-packed int4)" % weight.dtype)
    if x.dtype not in (torch.float16, torch.bfloat16):
        unsupported(op, "x dtype %s (only float16/bfloat16)" % x.dtype)
    check(weight.dim() == 2, op, "weight must be 2-d [k, n]")
    k, n = weight.shape
    check(x.dim() >= 2 and x.shape[-1] == k, op, "x last dim must be k=%d", k)

    def expand(t, name):
        if antiquant_group_size > 0:
            g = antiquant_group_size
            ng = (k + g - 1) // g
            check(tuple(t.shape) == (ng, n), op,
                  "%s must have shape (%d, %d) for group size %d, got %s", (name, ng, n, g, tuple(t.shape)))
            return t.float().repeat_interleave(g, dim=0)[:k]
        check(antiquant_group_size == 0, op, "antiquant_group_size must be >= 0")
        check(t.numel() == 1 or tuple(t.shape) in ((n,), (1, n)), op,
              "%s must have 1 element or shape (%d,)/(1, %d), got %s", (name, n, n, tuple(t.shape)))
        return t.float().reshape(-1)

    w = weight.float()
    if antiquant_offset is not None:
        w = w + expand(antiquant_offset, "antiquant_offset")
    w = w * expand(antiquant_scale, "antiquant_scale")
    y = torch.matmul(x.float(), w)
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)


_QUANT_RANGE = {torch.qint8: (-128, 127), torch.quint8: (0, 255), torch.qint32: (-2 ** 31, 2 ** 31 - 1),
                torch.int8: (-128, 127), torch.uint8: (0, 255), torch.int32: (-2 ** 31, 2 ** 31 - 1)}


def _quantize_into(op, inputs, scales, zero_points, dtype, result):
    check(dtype in _QUANT_RANGE, op, "dtype must be qint8, quint8 or qint32, got %s", (dtype,))
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


def _dtype_or_default(op, argname, value, default):
    """torch.dtype of an int/torch.dtype dtype argument (``default`` when None)."""
    if value is None:
        return default
    dt = _decode_dtype(value)
    if dt is None:
        raise NotImplementedError("%s: %s=%s has no torch dtype on the CPU-emulated NPU"
                                  % (op, argname, _dtype_name(value)))
    return dt
