"""Dynamic MX quantisation to float8 (OCP microscaling): npu_dynamic_mx_quant and
npu_dynamic_mx_quant_with_dual_axis.

Semantics from the CANN ops-nn docs (aclnnDynamicMxQuant, DynamicMxQuantWithDualAxis):
the quantised axis is cut into blocks of ``block_size`` elements (a short last block is
padded with zeros); each block gets one float8_e8m0 scale ``2 ** (b - 127)`` (``b`` the stored
byte) and every element becomes ``cast(v * 2 ** (127 - b))``: round-half-to-even, saturated to
the float8 range (e4m3fn +-448, e5m2 +-57344).

* ``scale_alg=0`` (OCP): ``b = floor(log2(max|v|)) + 127 - emax`` with emax 8 (e4m3fn) / 15
  (e5m2), clamped below at 0.
* ``scale_alg=1`` (cuBLAS-style, "round the exponent up"): ``S = fp32(max|v| / Amax(dtype))``;
  ``b`` = S's biased exponent, plus one when S is normal, ``b < 254`` and its mantissa is
  non-zero, or when S is subnormal and its mantissa is above one half.
* A block holding inf/NaN gets the e8m0 NaN byte 255 and +0 elements (op-plugin's golden:
  the NPU casts NaN to +0). A block whose byte is 0 (scale 2**-127: all zeros, or an amax
  below the e8m0 range) quantises to signed zeros, as the golden does.

Scale layout (the docs' shape rule): blocks per axis are padded to an even count with byte 0
and stored in pairs: block ``k`` of the axis at index ``k // 2`` of that axis and ``k % 2`` of
a new trailing dim of size 2 (for a non-last axis this is the docs' "interleave every two
rows"). Scales are returned as uint8, y as the torch float8 dtype.

Not emulated (NotImplementedError naming the argument): float4 destinations (the nibble
order of two float4 values in a byte is not documented), hifloat8, ``dst_type_max`` other
than 0.0 (documented only for float4 with ``scale_alg=2``), ``max_low_bound`` with
``scale_alg=0`` (op-plugin's golden applies it to scale_alg 1 only: the scale is computed
from ``max(amax, max_low_bound)``).
"""
import torch
import torch.nn.functional as F

from torch_npu.op_plugin._common import check
from torch_npu.op_plugin._registry import impl
from torch_npu.utils import _custom_dtype

__all__ = []

# float8 destination -> (emax: exponent of the largest normal, largest finite value)
_FP8 = {torch.float8_e4m3fn: (8, 448.0), torch.float8_e5m2: (15, 57344.0)}
_FP8_BY_CODE = {23: torch.float8_e5m2, 24: torch.float8_e4m3fn,
                _custom_dtype.CODES["float8_e5m2"]: torch.float8_e5m2,
                _custom_dtype.CODES["float8_e4m3fn"]: torch.float8_e4m3fn}
_FP4_CODES = (_custom_dtype.CODES["float4_e2m1fn_x2"], _custom_dtype.CODES["float4_e1m2fn_x2"])
_X_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_E8M0_NAN = 255


def _unsupported(op, what):
    raise NotImplementedError("%s: %s is not supported by the CPU-emulated NPU" % (op, what))


def fp8_destination(op, argname, value):
    """The torch float8 dtype a ``dst_type`` argument names; float4/hifloat8 raise NotImplementedError."""
    if isinstance(value, torch.dtype):
        if value in _FP8:
            return value
        if value == torch.float4_e2m1fn_x2:
            _unsupported(op, "%s=%s (the float4 nibble order is not documented)" % (argname, value))
    else:
        code = int(value)
        if code in _FP8_BY_CODE:
            return _FP8_BY_CODE[code]
        if code in _FP4_CODES:
            _unsupported(op, "%s=%s (the float4 nibble order is not documented)"
                         % (argname, _custom_dtype.code_name(code)))
    _unsupported(op, "%s=%r (float8_e5m2 / float8_e4m3fn only)" % (argname, value))


def check_mx_args(op, round_mode, scale_alg, dst_type_max):
    """Validate the arguments shared by the float8 MX quantisers."""
    scale_alg = 0 if scale_alg is None else int(scale_alg)
    check(round_mode == "rint", op, "round_mode only supports 'rint' for float8 dst_type, got %r" % (round_mode,))
    if scale_alg == 2:
        _unsupported(op, "scale_alg=2 (float4_e2m1 only)")
    check(scale_alg in (0, 1), op, "scale_alg only supports 0 and 1 for float8 dst_type, got %d" % scale_alg)
    if dst_type_max not in (None, 0.0):
        _unsupported(op, "dst_type_max=%r (documented only for float4 with scale_alg=2)" % (dst_type_max,))
    return scale_alg


def _scale_bytes(amax, dst, scale_alg, max_low_bound=0.0):
    """(e8m0 byte as int32, float32 reciprocal factor, finite mask) per block from the block's
    max|v| (float32). ``max_low_bound`` (scale_alg 1) raises the amax the scale is computed
    from, never the zero test (op-plugin's golden)."""
    emax, dtype_max = _FP8[dst]
    finite = torch.isfinite(amax)
    safe = torch.where(finite, amax, torch.zeros_like(amax))
    if scale_alg == 0:
        # biased float32 exponent = floor(log2(amax)) + 127 for a normal amax, 0 for zero/subnormal
        biased = (safe.view(torch.int32) >> 23) & 0xFF
        byte = (biased - emax).clamp(min=0)
        live = byte > 0
    else:
        s = safe.clamp(min=max_low_bound) / dtype_max   # float32 division, as documented
        bits = s.view(torch.int32)
        e = (bits >> 23) & 0xFF
        m = bits & 0x7FFFFF
        up = ((e > 0) & (e < 254) & (m > 0)) | ((e == 0) & (m > 0x400000))
        byte = torch.where(safe == 0, torch.zeros_like(e), e + up.to(e.dtype))
    # byte 0 (2**-127, the e8m0 minimum) quantises the block to (signed) zeros, as op-plugin's
    # golden does; a non-finite block gets the NaN byte and +0 elements (the NPU casts NaN to +0)
    recip = torch.exp2((127 - byte).to(torch.float32))
    recip = torch.where(byte > 0, recip, torch.zeros_like(recip))
    byte = torch.where(finite, byte, torch.full_like(byte, _E8M0_NAN))
    return byte, recip, finite


def mx_quantize(x, axis, dst, scale_alg, block=32, max_low_bound=0.0):
    """MX-quantise ``x`` along ``axis``: ``(y in dst, scale bytes uint8 in the paired layout)``."""
    axis = axis % x.dim()
    moved = x.movedim(axis, -1).float()
    n = moved.shape[-1]
    blocks = -(-n // block)
    pairs = (blocks + 1) // 2
    padded = F.pad(moved, (0, blocks * block - n)).reshape(*moved.shape[:-1], blocks, block)
    amax = padded.abs().amax(-1)
    byte, recip, finite = _scale_bytes(amax, dst, scale_alg, max_low_bound)
    _, dtype_max = _FP8[dst]
    scaled = torch.where(finite.unsqueeze(-1), padded * recip.unsqueeze(-1), torch.zeros_like(padded))
    scaled = scaled.reshape(*moved.shape[:-1], blocks * block)[..., :n]
    y = scaled.clamp(-dtype_max, dtype_max).to(dst).movedim(-1, axis)
    byte = F.pad(byte, (0, 2 * pairs - blocks)).to(torch.uint8)
    scale = byte.reshape(*moved.shape[:-1], pairs, 2).movedim(-2, axis)
    return y.contiguous(), scale.contiguous()


def check_x(op, x, lo, hi):
    check(x.dtype in _X_DTYPES, op, "x dtype must be float16, bfloat16 or float32, got %s" % x.dtype)
    check(lo <= x.dim() <= hi, op, "x must be %d-D to %d-D, got %d-D" % (lo, hi, x.dim()))


@impl("npu_dynamic_mx_quant")
def npu_dynamic_mx_quant(input, *, axis=-1, round_mode="rint", dst_type=296, block_size=32, scale_alg=0,
                         dst_type_max=0.0, max_low_bound=0.0):
    """``(y, mxscale)``: MX quantisation of ``input`` along ``axis`` in blocks of ``block_size``."""
    op = "npu_dynamic_mx_quant"
    check_x(op, input, 1, 7)
    n = input.dim()
    check(-n <= axis < n, op, "Parameter axis is out of input dimension range [%d, %d]" % (-n, n - 1))
    check(block_size % 32 == 0 and 0 < block_size <= 1024, op,
          "Parameter block_size must be divisible by 32 and no greater than 1024, greater than 0")
    check(input.dtype != torch.float32 or block_size == 32, op, "float32 x only supports block_size=32")
    dst = fp8_destination(op, "dst_type", dst_type)
    alg = check_mx_args(op, round_mode, scale_alg, dst_type_max)
    low = 0.0 if max_low_bound is None else float(max_low_bound)
    if low != 0.0 and alg != 1:
        _unsupported(op, "max_low_bound=%r with scale_alg=%d (documented for scale_alg=1 only)" % (low, alg))
    return mx_quantize(input, axis, dst, alg, block_size, max_low_bound=low)


@impl("npu_dynamic_mx_quant_with_dual_axis")
def npu_dynamic_mx_quant_with_dual_axis(input, *, round_mode="rint", dst_type=296, scale_alg=0, dst_type_max=0.0):
    """``(y1, mxscale1, y2, mxscale2)``: MX quantisation along the last axis and the second-to-last."""
    op = "npu_dynamic_mx_quant_with_dual_axis"
    check(input.dtype in (torch.float16, torch.bfloat16), op,
          "x dtype must be float16 or bfloat16, got %s" % input.dtype)
    check(2 <= input.dim() <= 8, op, "x must be at least 2-D, got %d-D" % input.dim())
    dst = fp8_destination(op, "dst_type", dst_type)
    alg = check_mx_args(op, round_mode, scale_alg, dst_type_max)
    y1, s1 = mx_quantize(input, -1, dst, alg)
    y2, s2 = mx_quantize(input, -2, dst, alg)
    return y1, s1, y2, s2


# ------------------------------------------------------------------ RmsNorm + MX quantisation
#
# ops-nn's AddRmsNormDynamicMxQuant golden: x = x1 + x2 in float32 (x output cast to x1's
# dtype); rstd = rsqrt(mean(x^2) + eps) in float32; normed = x * rstd * gamma (+ beta) in
# float32, cast to x's dtype (the kernel stores the norm in x's dtype before quantising),
# then MX-quantised along the last axis in blocks of 32. rstd is a real output only when the
# inputs require grad (op-plugin's adapter passes outputRstd = requires_grad), else a [0]
# tensor.


def _check_norm_args(op, x, gamma, beta):
    check(x.dtype in (torch.float16, torch.bfloat16), op, "x dtype must be float16 or bfloat16, got %s" % x.dtype)
    check(1 <= x.dim() <= 7, op, "The x should be in 1~7D, got %d-D" % x.dim())
    check(gamma.dim() == 1 and gamma.shape[0] == x.shape[-1], op,
          "gamma must be 1-D with the last dim of x (%d), got %s" % (x.shape[-1], tuple(gamma.shape)))
    check(gamma.dtype in (x.dtype, torch.float32), op,
          "gamma dtype must be x's dtype or float32, got %s" % gamma.dtype)
    if beta is not None:
        check(beta.shape == gamma.shape and beta.dtype == gamma.dtype, op,
              "beta must have gamma's shape and dtype, got %s %s" % (tuple(beta.shape), beta.dtype))


def _rms_norm_mx(op, xf, out_dtype, gamma, beta, epsilon, scale_alg, round_mode, dst_type, want_rstd):
    dst = fp8_destination(op, "dst_type", dst_type)
    alg = check_mx_args(op, round_mode, scale_alg, 0.0)
    rstd = torch.rsqrt((xf * xf).mean(-1, keepdim=True) + epsilon)
    normed = xf * rstd * gamma.float()
    if beta is not None:
        normed = normed + beta.float()
    y, mxscale = mx_quantize(normed.to(out_dtype), -1, dst, alg)
    rstd_out = rstd if want_rstd else xf.new_empty([0])
    return y, mxscale, rstd_out


@impl("npu_rms_norm_dynamic_mx_quant")
def npu_rms_norm_dynamic_mx_quant(x, gamma, *, beta=None, epsilon=1e-06, scale_alg=0, round_mode="rint",
                                  dst_type=296):
    """``(y, mxscale, rstd)``: MX quantisation of RmsNorm(x) * gamma (+ beta) along the last dim."""
    op = "npu_rms_norm_dynamic_mx_quant"
    _check_norm_args(op, x, gamma, beta)
    return _rms_norm_mx(op, x.float(), x.dtype, gamma, beta, epsilon, scale_alg, round_mode, dst_type,
                        x.requires_grad)


@impl("npu_add_rms_norm_dynamic_mx_quant")
def npu_add_rms_norm_dynamic_mx_quant(x1, x2, gamma, *, beta=None, epsilon=1e-06, scale_alg=0, round_mode="rint",
                                      dst_type=296):
    """``(y, x, mxscale, rstd)`` with ``x = x1 + x2``: MX quantisation of RmsNorm(x) * gamma (+ beta)."""
    op = "npu_add_rms_norm_dynamic_mx_quant"
    check(x1.shape == x2.shape, op, "The shape of x1 and x2 must be the same")
    check(x1.dtype == x2.dtype, op, "The dtype of x1 and x2 must be the same, got %s and %s" % (x1.dtype, x2.dtype))
    check(x1.requires_grad == x2.requires_grad, op, "The requires_grad of x1 and x2 must be consistent")
    _check_norm_args(op, x1, gamma, beta)
    xf = x1.float() + x2.float()
    y, mxscale, rstd = _rms_norm_mx(op, xf, x1.dtype, gamma, beta, epsilon, scale_alg, round_mode, dst_type,
                                    x1.requires_grad and x2.requires_grad)
    return y, xf.to(x1.dtype), mxscale, rstd
