"""Meta kernels (output shapes and dtypes only) for the quantisation ops whose computation is not
emulated yet: npu_dynamic_dual_level_mx_quant, npu_grouped_dynamic_block_quant,
npu_kronecker_quant, npu_swiglu_group_quant, npu_ifmr and npu_weight_quant_preprocess.

Each function has the op's schema signature and returns empty outputs with the shapes and
dtypes op-plugin's adapter (``op_plugin/ops/opapi/*``) and meta registrations allocate, so
FakeTensor tracing and ``torch.compile`` see through the op while a real CPU/npu call still
raises ``NotImplementedError`` naming it.

dtype arguments: an ``int`` schema slot receives either a PyTorch ScalarType code
(``torch.int8`` -> 1, ``torch.float8_e4m3fn`` -> 24, ...) or a torch_npu ``_cd.DType`` code
(``torch_npu.float8_e5m2`` -> 291, ``torch_npu.float4_e2m1fn_x2`` -> 296, ...). As on the
device, float4 results are stored two per byte in uint8 (last dim halved), int4 /
quint4x2 results eight per int32 (last dim / 8), hifloat8 in uint8, and float8_e8m0 MX
scales in uint8. A value the adapters do not map raises ``NotImplementedError`` naming it.
"""
import torch

from torch_npu.op_plugin._common import unsupported
from torch_npu.op_plugin._registry import meta
from torch_npu.op_plugin.quant.quantize import _decode_dtype
from torch_npu.utils import _custom_dtype

__all__ = []

_SCALAR_TYPE_CODES = {
    0: torch.uint8, 1: torch.int8, 2: torch.int16, 3: torch.int32, 4: torch.int64, 5: torch.float16,
    6: torch.float32, 7: torch.float64, 11: torch.bool, 15: torch.bfloat16, 23: torch.float8_e5m2,
    24: torch.float8_e4m3fn,
}
_QUINT4X2 = 16
_FP4_CODES = (_custom_dtype.CODES["float4_e2m1fn_x2"], _custom_dtype.CODES["float4_e1m2fn_x2"])
_INT4_CODE = _custom_dtype.CODES["int4"]
_BYTE_CODES = (_custom_dtype.CODES["hifloat8"], _custom_dtype.CODES["float8_e8m0fnu"])


def _fail(cond, op, message):
    torch._check(cond, lambda: "%s: %s" % (op, message))


def _code(value):
    """The int code of a dtype argument given as an int or a torch.dtype."""
    if isinstance(value, torch.dtype):
        inverse = {v: k for k, v in _SCALAR_TYPE_CODES.items()}
        if value == torch.quint4x2:
            return _QUINT4X2
        if value not in inverse:
            return None
        return inverse[value]
    return int(value)


def _storage(op, argname, value):
    """``(storage dtype, elements per stored element)`` of a dtype argument's result."""
    code = _code(value)
    if code in _FP4_CODES:
        return torch.uint8, 2
    if code in (_QUINT4X2, _INT4_CODE):
        return torch.int32, 8
    if code in _BYTE_CODES:
        return torch.uint8, 1
    dt = None if code is None else _decode_dtype(code)
    if dt is None:
        unsupported(op, "%s=%r" % (argname, value))
    return dt, 1


def _packed(op, shape, per, dim=-1):
    """``shape`` with ``dim`` divided by the packing factor ``per`` (which must divide it)."""
    shape = list(shape)
    if per > 1:
        _fail(shape[dim] % per == 0, op, "the last dim (%d) must be divisible by %d for a packed "
              "(float4 / int4) result" % (shape[dim], per))
        shape[dim] //= per
    return shape


def _new(ref, shape, dtype):
    return ref.new_empty(list(shape), dtype=dtype)


def _mx_scale_shape(shape, axis, block=32):
    """MX scale layout: the quantised axis becomes ceil(ceil(n / block) / 2) and a trailing 2."""
    shape = list(shape) + [2]
    blocks = -(-shape[axis] // block)
    shape[axis] = (blocks + 1) // 2
    return shape


# ------------------------------------------------------------------ quantising norms


# ------------------------------------------------------------------ quantisation


@meta("npu_dynamic_dual_level_mx_quant")
def npu_dynamic_dual_level_mx_quant_meta(input, *, smooth_scale=None, round_mode="rint"):
    """``(y, level0_scale, level1_scale)``: float4_e2m1 y packed in uint8; level0_scale float32
    with the last dim ceil(n / 512); level1_scale the MX layout of blocks of 32."""
    op = "npu_dynamic_dual_level_mx_quant"
    _fail(input.dim() >= 1, op, "input must have at least 1 dimension")
    level0 = list(input.shape)
    level0[-1] = -(-level0[-1] // 512)
    return (_new(input, _packed(op, input.shape, 2), torch.uint8), _new(input, level0, torch.float32),
            _new(input, _mx_scale_shape(input.shape, input.dim() - 1), torch.uint8))


@meta("npu_grouped_dynamic_block_quant")
def npu_grouped_dynamic_block_quant_meta(x, group_list, *, min_scale=0.0, round_mode="rint", dst_type=291,
                                         row_block_size=1, col_block_size=128, group_list_type=0, dst_type_max=0.0):
    """``(y, scale)``: y has x's shape in ``dst_type``; scale float32 with the row dim
    ``rows // row_block_size + G`` and the column dim ``ceil(cols / col_block_size)``."""
    op = "npu_grouped_dynamic_block_quant"
    _fail(row_block_size != 0, op, "row_block_size cannot be zero.")
    _fail(group_list.dim() == 1, op, "group_list must be 1D tensor, got dim = %d" % group_list.dim())
    _fail(x.dim() in (2, 3), op, "x must be 2 or 3 dimensional.")
    if group_list_type != 0:
        unsupported(op, "group_list_type=%r (only 0 is documented)" % (group_list_type,))
    dt, _ = _storage(op, "dst_type", dst_type)
    scale = list(x.shape)
    scale[-2] = scale[-2] // row_block_size + group_list.shape[0]
    scale[-1] = -(-scale[-1] // col_block_size)
    return _new(x, x.shape, dt), _new(x, scale, torch.float32)


@meta("npu_kronecker_quant")
def npu_kronecker_quant_meta(x, kronecker_p1, kronecker_p2, clip_ratio=None, dst_dtype=None, dst_type_max=None):
    """``(out, quant_scale)`` of x ``[K, M, N]``: int32 (eight int4 per int32, last dim / 8) and
    float32 ``[K]``; for float4_e2m1 out is ``[K, M * N // 2]`` uint8 and the scale
    ``[K, ceil(M * N / 64), 2]`` uint8."""
    op = "npu_kronecker_quant"
    code = 3 if dst_dtype is None else _code(dst_dtype)
    if code == _FP4_CODES[0]:
        _fail(x.dim() == 3, op, "the dim num of input x must be 3")
        mn = x.shape[-1] * x.shape[-2]
        return _new(x, [x.shape[0], mn // 2], torch.uint8), _new(x, [x.shape[0], -(-mn // 64), 2], torch.uint8)
    if code != 3:
        unsupported(op, "dst_dtype=%r (int32 or torch_npu.float4_e2m1fn_x2)" % (dst_dtype,))
    _fail(x.shape[-1] % 8 == 0, op, "last dim of input x must be divisible by 8")
    return _new(x, _packed(op, x.shape, 8), torch.int32), _new(x, [x.shape[0]], torch.float32)


# ------------------------------------------------------------------ SwiGLU + quantisation


def _half_dim(shape, dim):
    shape = list(shape)
    shape[dim] //= 2
    return shape


@meta("npu_swiglu_group_quant")
def npu_swiglu_group_quant_meta(x, *, weight=None, group_index=None, scale=None, dst_type=291, quant_mode=0,
                                block_size=0, round_scale=False, clamp_limit=-1.0, dst_type_max=15.0,
                                output_origin=False):
    """``(y, y_scale, y_origin)`` for the hifloat8 modes 2 and 3: y uint8 (hifloat8) with the
    last dim halved; y_scale [0] (mode 2) or float32 per group (mode 3); y_origin the
    un-quantised SwiGLU output when ``output_origin``, else [0]."""
    op = "npu_swiglu_group_quant"
    _fail(x.shape[-1] % 2 == 0, op, "x last dim size should be even")
    if quant_mode not in (2, 3):
        unsupported(op, "quant_mode=%r (the adapter allocates y only for modes 2 and 3)" % (quant_mode,))
    half = _half_dim(x.shape, -1)
    if quant_mode == 2:
        y_scale = _new(x, [0], torch.float32)
    else:
        y_scale = _new(x, list(group_index.shape) if group_index is not None else [1], torch.float32)
    y_origin = _new(x, half if output_origin else [0], x.dtype)
    return _new(x, half, torch.uint8), y_scale, y_origin


# ------------------------------------------------------------------ calibration / preprocessing


@meta("npu_ifmr")
def npu_ifmr_meta(data, data_min, data_max, cumsum, min_percentile, max_percentile, search_start, search_end,
                  search_step, with_offset):
    """``(scale, offset)``: both have data_min's shape and dtype."""
    return _new(data_min, data_min.shape, data_min.dtype), _new(data_min, data_min.shape, data_min.dtype)


@meta("npu_weight_quant_preprocess")
def npu_weight_quant_preprocess_meta(weight, weight_scale, x_dtype, weight_dtype, weight_scale_dtype,
                                     weight_offset=None, bias=None, x_scale_dtype=None, k_group_size=0):
    """``(weight, weight_scale, weight_offset, bias)`` re-laid out for the MX A8W4 matmuls (the
    only documented data flow: x float8_e4m3fn, weight float4_e2m1, both scales float8_e8m0;
    2-D weight with 3-D scale, or 3-D grouped weight with 4-D scale). Views keep the input
    shapes and dtypes; offset/bias are undefined (None) when not given."""
    op = "npu_weight_quant_preprocess"
    e4m3 = (_custom_dtype.CODES["float8_e4m3fn"], 24)
    e8m0 = _custom_dtype.CODES["float8_e8m0fnu"]
    flow = (_code(x_dtype) in e4m3 and _code(weight_dtype) == _FP4_CODES[0] and x_scale_dtype is not None
            and _code(x_scale_dtype) == e8m0 and _code(weight_scale_dtype) == e8m0)
    if not flow or weight.dim() not in (2, 3):
        unsupported(op, "this data flow (x_dtype=%r, weight_dtype=%r, weight_scale_dtype=%r, x_scale_dtype=%r, "
                         "weight %d-D)" % (x_dtype, weight_dtype, weight_scale_dtype, x_scale_dtype, weight.dim()))
    _fail(weight_scale.dim() == weight.dim() + 1, op, "Input weight scale tensor should be %dD, but got %d"
          % (weight.dim() + 1, weight_scale.dim()))
    offset = None if weight_offset is None else _new(weight_offset, weight_offset.shape, weight_offset.dtype)
    out_bias = None if bias is None else _new(bias, bias.shape, bias.dtype)
    return (_new(weight, weight.shape, weight.dtype), _new(weight_scale, weight_scale.shape, weight_scale.dtype),
            offset, out_bias)
