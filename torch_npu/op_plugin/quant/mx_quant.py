"""Dynamic MX quantisation (OCP microscaling) to float8 and float4: npu_dynamic_mx_quant,
npu_dynamic_mx_quant_with_dual_axis, npu_rms_norm_dynamic_mx_quant,
npu_add_rms_norm_dynamic_mx_quant, npu_grouped_dynamic_mx_quant, npu_dynamic_block_mx_quant,
npu_swiglu_mx_quant, npu_swiglu_mx_quant_with_dual_axis, _npu_swiglu_backward_mx_quant_with_dual_axis
(each op's own rules are in the comment above it).

Semantics from the CANN ops-nn docs (aclnnDynamicMxQuant, DynamicMxQuantWithDualAxis,
aclnnRmsNormDynamicMxQuant, aclnnDynamicBlockMxQuant, aclnnSwigluMxQuant) and op-plugin /
ops-nn test goldens: the quantised axis is cut
into blocks of ``block_size`` elements (a short last block is padded with zeros); each block
gets one float8_e8m0 scale ``2 ** (b - 127)`` (``b`` the stored byte) and every element
``v * 2 ** (127 - b)`` is rounded at its own exponent (never below the format's smallest) to
the format's mantissa bits and clipped to the largest finite value (e4m3fn 448, e5m2 57344,
e2m1 6, e1m2 1.75). float8 rounds half to even ('rint' only); float4 takes 'rint', 'floor'
(toward -inf) or 'round' (half away from zero).

* ``scale_alg=0`` (OCP): ``b = floor(log2(max|v|)) + 127 - emax`` (emax 8 / 15 / 2 / 0),
  clamped below at 0.
* ``scale_alg=1`` (float8 only, "round the exponent up"): ``S = fp32(max(max|v|,
  max_low_bound) / Amax(dtype))``; ``b`` = S's biased exponent, plus one when S is normal,
  ``b < 254`` and its mantissa is non-zero, or when S is subnormal and its mantissa is above
  one half.
* A block holding inf/NaN gets the e8m0 NaN byte 255 and +0 elements (the golden: the NPU
  casts NaN to +0). A block whose byte is 0 (all zeros, or an amax below the e8m0 range)
  quantises to signed zeros, as the golden does.

Layouts: y keeps x's shape in the torch float8 dtype; float4 codes (sign bit 3, then the
magnitude's index among the format's 8 values) are packed two per uint8 along the last dim,
even element in the low nibble (the golden's packing of torch_npu's uint8 y), so the last dim
halves. Scales are uint8: blocks along the axis are padded to an even count with byte 0 and
stored in pairs, block ``k`` at index ``k // 2`` of the axis and ``k % 2`` of a new trailing
dim of size 2 (for a non-last axis, the docs' "interleave every two rows").

Not emulated (NotImplementedError naming the argument): hifloat8 and other destinations,
``scale_alg=2`` (float4 DynamicDtypeRange), ``dst_type_max`` other than 0.0 (only meaningful
with scale_alg 2), ``max_low_bound`` with ``scale_alg=0`` (the golden applies it to scale_alg
1 only).
"""
import math
from typing import NamedTuple, Optional

import torch
import torch.nn.functional as F

from torch_npu.op_plugin._common import check, unsupported
from torch_npu.op_plugin._registry import impl
from torch_npu.utils import _custom_dtype

__all__ = []

class MxFormat(NamedTuple):
    """An MX element format: ``emax`` (exponent of its largest normal), its largest finite
    value, mantissa bits, smallest private exponent, and the torch dtype of y (None for the
    float4 formats, which are stored two per uint8)."""
    name: str
    emax: int
    max: float
    mbits: int
    min_exp: int
    dtype: Optional[torch.dtype]


E4M3 = MxFormat("float8_e4m3fn", 8, 448.0, 3, -6, torch.float8_e4m3fn)
E5M2 = MxFormat("float8_e5m2", 15, 57344.0, 2, -14, torch.float8_e5m2)
E2M1 = MxFormat("float4_e2m1", 2, 6.0, 1, 0, None)
E1M2 = MxFormat("float4_e1m2", 0, 1.75, 2, 0, None)
# PyTorch ScalarType codes (an int schema slot receives torch dtypes as these) and torch_npu codes
_FORMAT_BY_CODE = {23: E5M2, 24: E4M3, 45: E2M1, _custom_dtype.CODES["float8_e5m2"]: E5M2,
                   _custom_dtype.CODES["float8_e4m3fn"]: E4M3, _custom_dtype.CODES["float4_e2m1fn_x2"]: E2M1,
                   _custom_dtype.CODES["float4_e1m2fn_x2"]: E1M2}
_FORMAT_BY_DTYPE = {torch.float8_e5m2: E5M2, torch.float8_e4m3fn: E4M3, torch.float4_e2m1fn_x2: E2M1}
# float4 magnitudes in code order: the 3-bit magnitude code of a value is its index here
_FP4_MAGNITUDES = {"float4_e2m1": (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0),
                   "float4_e1m2": (0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75)}
_X_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_E8M0_NAN = 255


def mx_destination(op, argname, value):
    """The MxFormat a ``dst_type`` argument names (float8_e5m2/e4m3fn, float4_e2m1/e1m2)."""
    if isinstance(value, torch.dtype):
        fmt = _FORMAT_BY_DTYPE.get(value)
    else:
        fmt = _FORMAT_BY_CODE.get(int(value))
    if fmt is None:
        unsupported(op, "%s=%r (float8_e5m2, float8_e4m3fn, float4_e2m1fn_x2, float4_e1m2fn_x2 only)"
                     % (argname, value))
    return fmt


def check_mx_args(op, fmt, round_mode, scale_alg, dst_type_max):
    """Validate the arguments shared by the MX quantisers (the aclnn docs' rules); returns scale_alg."""
    scale_alg = 0 if scale_alg is None else int(scale_alg)
    if fmt.dtype is not None:
        check(round_mode == "rint", op, "round_mode only supports 'rint' for float8 dst_type, got %r", (round_mode,))
        check(scale_alg in (0, 1), op, "scale_alg only supports 0 and 1 for float8 dst_type, got %d", scale_alg)
    else:
        check(round_mode in ("rint", "floor", "round"), op,
              "round_mode only supports 'rint', 'floor' and 'round' for float4 dst_type, got %r", (round_mode,))
        if scale_alg == 2:
            unsupported(op, "scale_alg=2 (the DynamicDtypeRange scale of float4)")
        check(scale_alg == 0, op, "scale_alg only supports 0 for float4 dst_type, got %d", scale_alg)
    if dst_type_max not in (None, 0.0):
        unsupported(op, "dst_type_max=%r (documented only for float4 with scale_alg=2)" % (dst_type_max,))
    return scale_alg


def _scale_bytes(amax, fmt, scale_alg, max_low_bound=0.0):
    """(e8m0 byte as int32, float32 reciprocal factor, finite mask) per block from the block's
    max|v| (float32). ``max_low_bound`` (scale_alg 1) raises the amax the scale is computed
    from, never the zero test (op-plugin's golden)."""
    finite = torch.isfinite(amax)
    safe = torch.where(finite, amax, torch.zeros_like(amax))
    if scale_alg == 0:
        # biased float32 exponent = floor(log2(amax)) + 127 for a normal amax, 0 for zero/subnormal
        biased = (safe.view(torch.int32) >> 23) & 0xFF
        byte = (biased - fmt.emax).clamp(min=0)
    else:
        s = safe.clamp(min=max_low_bound) / fmt.max     # float32 division, as documented
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


def _round(q, round_mode):
    if round_mode == "rint":
        return torch.round(q)                            # half to even
    if round_mode == "floor":
        return torch.floor(q)
    return torch.sign(q) * torch.floor(q.abs() + 0.5)    # 'round': half away from zero


def _fp4_codes(r, fmt, round_mode):
    """4-bit codes (sign << 3 | magnitude code) of float32 values already divided by the scale:
    rounded at the value's own exponent (at least ``min_exp``) to ``mbits`` mantissa bits, then
    clipped to the largest finite value (op-plugin's golden)."""
    a = r.abs()
    p = (((a.view(torch.int32) >> 23) & 0xFF) - 127).clamp(min=fmt.min_exp).to(torch.float32)
    step = torch.exp2(p - fmt.mbits)
    v = (_round(r / step, round_mode) * step).clamp(-fmt.max, fmt.max)
    table = torch.tensor(_FP4_MAGNITUDES[fmt.name][1:], dtype=torch.float32, device=r.device)
    magnitude = (v.abs().unsqueeze(-1) >= table).sum(-1)
    return (torch.signbit(v).to(torch.int64) * 8 + magnitude).to(torch.uint8)


def pack_fp4(codes):
    """Two float4 codes per byte along the last dim: even element in the low nibble, odd in the
    high nibble (op-plugin's golden for the uint8 y of torch_npu)."""
    pairs = codes.reshape(*codes.shape[:-1], codes.shape[-1] // 2, 2)
    return pairs[..., 0] | (pairs[..., 1] << 4)


def encode_elements(scaled, fmt, round_mode):
    """Scaled values -> y: the float8 dtype (saturated), or float4 codes packed in uint8."""
    if fmt.dtype is not None:
        return scaled.clamp(-fmt.max, fmt.max).to(fmt.dtype)
    return pack_fp4(_fp4_codes(scaled, fmt, round_mode))


def mx_quantize(x, axis, fmt, scale_alg, block=32, max_low_bound=0.0, round_mode="rint"):
    """MX-quantise ``x`` along ``axis``: ``(y, scale bytes uint8 in the paired layout)``; y in
    fmt.dtype, or packed float4 codes in uint8 (last dim halved)."""
    axis = axis % x.dim()
    moved = x.detach().movedim(axis, -1).float()      # no backward: the quantisers have none
    n = moved.shape[-1]
    blocks = -(-n // block)
    pairs = (blocks + 1) // 2
    padded = F.pad(moved, (0, blocks * block - n)).reshape(*moved.shape[:-1], blocks, block)
    amax = padded.abs().amax(-1)
    byte, recip, finite = _scale_bytes(amax, fmt, scale_alg, max_low_bound)
    scaled = torch.where(finite.unsqueeze(-1), padded * recip.unsqueeze(-1), torch.zeros_like(padded))
    scaled = scaled.reshape(*moved.shape[:-1], blocks * block)[..., :n]
    y = encode_elements(scaled.movedim(-1, axis), fmt, round_mode)
    byte = F.pad(byte, (0, 2 * pairs - blocks)).to(torch.uint8)
    scale = byte.reshape(*moved.shape[:-1], pairs, 2).movedim(-2, axis)
    return y.contiguous(), scale.contiguous()


def check_fp4_last_dim(op, fmt, x):
    check(fmt.dtype is not None or x.shape[-1] % 2 == 0, op,
          "the last dim of x (%d) must be divisible by 2 for a float4 dst_type", x.shape[-1])


def check_x(op, x, lo, hi):
    check(x.dtype in _X_DTYPES, op, "x dtype must be float16, bfloat16 or float32, got %s", x.dtype)
    check(lo <= x.dim() <= hi, op, "x must be %d-D to %d-D, got %d-D", (lo, hi, x.dim()))


@impl("npu_dynamic_mx_quant")
def npu_dynamic_mx_quant(input, *, axis=-1, round_mode="rint", dst_type=296, block_size=32, scale_alg=0,
                         dst_type_max=0.0, max_low_bound=0.0):
    """``(y, mxscale)``: MX quantisation of ``input`` along ``axis`` in blocks of ``block_size``."""
    op = "npu_dynamic_mx_quant"
    check_x(op, input, 1, 7)
    # axis is range-checked by the registry before this kernel runs (op_plugin/_registry.py)
    check(block_size % 32 == 0 and 0 < block_size <= 1024, op,
          "Parameter block_size must be divisible by 32 and no greater than 1024, greater than 0")
    check(input.dtype != torch.float32 or block_size == 32, op, "float32 x only supports block_size=32")
    fmt = mx_destination(op, "dst_type", dst_type)
    check_fp4_last_dim(op, fmt, input)
    alg = check_mx_args(op, fmt, round_mode, scale_alg, dst_type_max)
    low = 0.0 if max_low_bound is None else float(max_low_bound)
    if low != 0.0 and alg != 1:
        unsupported(op, "max_low_bound=%r with scale_alg=%d (documented for scale_alg=1 only)" % (low, alg))
    return mx_quantize(input, axis, fmt, alg, block_size, max_low_bound=low, round_mode=round_mode)


@impl("npu_dynamic_mx_quant_with_dual_axis")
def npu_dynamic_mx_quant_with_dual_axis(input, *, round_mode="rint", dst_type=296, scale_alg=0, dst_type_max=0.0):
    """``(y1, mxscale1, y2, mxscale2)``: MX quantisation along the last axis and the second-to-last."""
    op = "npu_dynamic_mx_quant_with_dual_axis"
    check(input.dtype in (torch.float16, torch.bfloat16), op,
          "x dtype must be float16 or bfloat16, got %s", input.dtype)
    check(2 <= input.dim() <= 8, op, "x must be at least 2-D, got %d-D", input.dim())
    fmt = mx_destination(op, "dst_type", dst_type)
    check_fp4_last_dim(op, fmt, input)
    alg = check_mx_args(op, fmt, round_mode, scale_alg, dst_type_max)
    y1, s1 = mx_quantize(input, -1, fmt, alg, round_mode=round_mode)
    y2, s2 = mx_quantize(input, -2, fmt, alg, round_mode=round_mode)
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
    check(x.dtype in (torch.float16, torch.bfloat16), op, "x dtype must be float16 or bfloat16, got %s", x.dtype)
    check(1 <= x.dim() <= 7, op, "The x should be in 1~7D, got %d-D", x.dim())
    check(gamma.dim() == 1 and gamma.shape[0] == x.shape[-1], op,
          "gamma must be 1-D with the last dim of x (%d), got %s", (x.shape[-1], tuple(gamma.shape)))
    check(gamma.dtype in (x.dtype, torch.float32), op,
          "gamma dtype must be x's dtype or float32, got %s", gamma.dtype)
    if beta is not None:
        check(beta.shape == gamma.shape and beta.dtype == gamma.dtype, op,
              "beta must have gamma's shape and dtype, got %s %s", (tuple(beta.shape), beta.dtype))


def _rms_norm_mx(op, xf, out_dtype, gamma, beta, epsilon, scale_alg, round_mode, dst_type, want_rstd):
    fmt = mx_destination(op, "dst_type", dst_type)
    check(fmt.dtype is not None or xf.shape[-1] % 2 == 0, op,
          "the last dim of x (%d) must be divisible by 2 for a float4 dst_type", xf.shape[-1])
    alg = check_mx_args(op, fmt, round_mode, scale_alg, 0.0)
    rstd = torch.rsqrt((xf * xf).mean(-1, keepdim=True) + epsilon)
    normed = xf * rstd * gamma.float()
    if beta is not None:
        normed = normed + beta.float()
    y, mxscale = mx_quantize(normed.to(out_dtype), -1, fmt, alg, round_mode=round_mode)
    rstd_out = rstd if want_rstd else xf.new_empty([0])
    return y, mxscale, rstd_out


@impl("npu_rms_norm_dynamic_mx_quant")
def npu_rms_norm_dynamic_mx_quant(x, gamma, *, beta=None, epsilon=1e-06, scale_alg=0, round_mode="rint",
                                  dst_type=296):
    """``(y, mxscale, rstd)``: MX quantisation of RmsNorm(x) * gamma (+ beta) along the last dim."""
    op = "npu_rms_norm_dynamic_mx_quant"
    _check_norm_args(op, x, gamma, beta)
    return _rms_norm_mx(op, x.detach().float(), x.dtype, gamma, beta, epsilon, scale_alg, round_mode, dst_type,
                        x.requires_grad)


@impl("npu_add_rms_norm_dynamic_mx_quant")
def npu_add_rms_norm_dynamic_mx_quant(x1, x2, gamma, *, beta=None, epsilon=1e-06, scale_alg=0, round_mode="rint",
                                      dst_type=296):
    """``(y, x, mxscale, rstd)`` with ``x = x1 + x2``: MX quantisation of RmsNorm(x) * gamma (+ beta)."""
    op = "npu_add_rms_norm_dynamic_mx_quant"
    check(x1.shape == x2.shape, op, "The shape of x1 and x2 must be the same")
    check(x1.dtype == x2.dtype, op, "The dtype of x1 and x2 must be the same, got %s and %s", (x1.dtype, x2.dtype))
    check(x1.requires_grad == x2.requires_grad, op, "The requires_grad of x1 and x2 must be consistent")
    _check_norm_args(op, x1, gamma, beta)
    xf = x1.detach().float() + x2.detach().float()
    y, mxscale, rstd = _rms_norm_mx(op, xf, x1.dtype, gamma, beta, epsilon, scale_alg, round_mode, dst_type,
                                    x1.requires_grad and x2.requires_grad)
    return y, xf.to(x1.dtype), mxscale, rstd


# ------------------------------------------------------------------ grouped MX quantisation (rows)
#
# op-plugin's grouped_dynamic_mx_quant golden: x [M, N] is split along rows by group_index
# (cumulative group ends, the last equal to M); each group is padded to a multiple of 32 rows
# and MX-quantised along the rows in blocks of 32 (one scale per block and column). The scales
# of group g start at block row (end[g-1] // 64 + g) * 2 (end[-1] = 0); after a group's blocks
# comes one byte-0 row when their count is odd, then byte-127 (scale 1) rows up to the next
# group's start. The M // 64 + G block-row pairs are stored as [M // 64 + G, N, 2].


def grouped_rows_mx(x, group_index, fmt, scale_alg):
    """MX quantisation of x [M, N] along the rows per group of rows, in the grouped scale layout
    above: ``(y in fmt.dtype, mxscale [M // 64 + G, N, 2] uint8)``."""
    m, n = x.shape
    groups = group_index.shape[0]
    pair_rows = m // 64 + groups
    ends = group_index.to(torch.int64)
    starts = torch.cat([ends.new_zeros(1), ends[:-1]])
    first_block = (starts // 64 + torch.arange(groups, device=x.device)) * 2     # block row of each group's start
    rows = torch.arange(m, device=x.device)
    gid = torch.searchsorted(ends, rows, right=True).clamp(max=groups - 1)
    block_row = first_block[gid] + (rows - starts[gid]) // 32                      # [M]
    xf = x.detach().float()
    finite = torch.isfinite(xf)
    total = pair_rows * 2
    index = block_row.unsqueeze(1).expand(m, n)
    amax = xf.new_zeros(total, n).scatter_reduce(0, index, torch.where(finite, xf.abs(), torch.zeros_like(xf)),
                                                 "amax", include_self=True)
    bad = xf.new_zeros(total, n).scatter_add(0, index, (~finite).float()) > 0
    used = xf.new_zeros(total).scatter_add(0, block_row, torch.ones_like(xf[:, 0])) > 0
    byte, recip, ok = _scale_bytes(torch.where(bad, torch.full_like(amax, float("inf")), amax), fmt, scale_alg)
    # rows no block lands in: the even-count pad after a group's last block (byte 0), else 127
    lane = torch.arange(total, device=x.device)
    pad_row = (lane % 2 == 1) & ~used & torch.cat([used.new_zeros(1), used[:-1]])
    filler = torch.where(pad_row, torch.zeros_like(byte[:, 0]), torch.full_like(byte[:, 0], 127))
    byte = torch.where(used.unsqueeze(1), byte, filler.unsqueeze(1))
    scaled = torch.where(ok[block_row], xf * recip[block_row], torch.zeros_like(xf))
    y = scaled.clamp(-fmt.max, fmt.max).to(fmt.dtype)
    mxscale = byte.to(torch.uint8).reshape(pair_rows, 2, n).transpose(1, 2)
    return y, mxscale.contiguous()


@impl("npu_grouped_dynamic_mx_quant")
def npu_grouped_dynamic_mx_quant(x, group_index, *, round_mode="rint", dst_type=23, blocksize=32, scale_alg=0,
                                 dst_type_max=0.0):
    """``(y, mxscale)``: MX quantisation of x [M, N] along the rows, per group of rows."""
    op = "npu_grouped_dynamic_mx_quant"
    check(x.dim() == 2, op, "Input x must be 2-dimensional, got dimNum %d", x.dim())
    check(group_index.dim() == 1, op, "Input group_index must be 1-dimensional, got dimNum %d", group_index.dim())
    check(x.dtype in (torch.float16, torch.bfloat16), op, "x dtype must be float16 or bfloat16, got %s", x.dtype)
    check(group_index.dtype in (torch.int32, torch.int64), op,
          "group_index dtype must be int32 or int64, got %s", group_index.dtype)
    check(blocksize == 32, op, "Parameter blocksize only supports 32, got %d", blocksize)
    fmt = mx_destination(op, "dst_type", dst_type)
    check(fmt.dtype is not None, op,
          "Parameter dst_type only supports torch.float8_e5m2(23), torch.float8_e4m3fn(24), got %r", (dst_type,))
    alg = check_mx_args(op, fmt, round_mode, scale_alg, dst_type_max)
    return grouped_rows_mx(x, group_index, fmt, alg)


# ------------------------------------------------------------------ 32 x 32 block MX quantisation
#
# aclnnDynamicBlockMxQuant: one scale per 32 x 32 block of the last two dims (edge blocks hold
# only the existing elements), every element divided by its block's scale. The scale is given
# twice: scale1 broadcast along the rows (the last-axis layout: [..., M, ceil(ceil(N/32)/2), 2])
# and scale2 along the columns (the second-to-last-axis layout: [..., ceil(ceil(M/32)/2), N, 2]),
# both padded to an even block count with byte 0.


@impl("npu_dynamic_block_mx_quant")
def npu_dynamic_block_mx_quant(input, *, round_mode="rint", dst_type=296, scale_alg=0, dst_type_max=0.0):
    """``(y, scale1, scale2)``: MX quantisation with one scale per 32 x 32 block of the last two dims."""
    op = "npu_dynamic_block_mx_quant"
    check(input.dtype in (torch.float16, torch.bfloat16), op,
          "x dtype must be float16 or bfloat16, got %s", input.dtype)
    check(2 <= input.dim() <= 3, op, "x must be 2-D or 3-D, got %d-D", input.dim())
    fmt = mx_destination(op, "dst_type", dst_type)
    check_fp4_last_dim(op, fmt, input)
    alg = 0 if scale_alg is None else int(scale_alg)
    if alg == 2 and fmt.dtype is None:
        unsupported(op, "scale_alg=2 (the DynamicDtypeRange scale of float4)")
    check(alg == 0, op, "scale_alg only supports 0 (and 2 for float4_e2m1), got %d", alg)
    check_mx_args(op, fmt, round_mode, alg, dst_type_max)
    m, n = input.shape[-2:]
    mb, nb = -(-m // 32), -(-n // 32)
    lead = input.shape[:-2]
    padded = F.pad(input.detach().float(), (0, nb * 32 - n, 0, mb * 32 - m)).reshape(*lead, mb, 32, nb, 32)
    amax = padded.abs().amax(dim=(-3, -1))                                  # [..., mb, nb]
    byte, recip, finite = _scale_bytes(amax, fmt, alg)
    scaled = torch.where(finite[..., :, None, :, None], padded * recip[..., :, None, :, None],
                         torch.zeros_like(padded))
    scaled = scaled.reshape(*lead, mb * 32, nb * 32)[..., :m, :n]
    y = encode_elements(scaled, fmt, round_mode)
    byte = byte.to(torch.uint8)
    rows = byte.repeat_interleave(32, dim=-2)[..., :m, :]                   # [..., m, nb]
    scale1 = F.pad(rows, (0, nb % 2)).reshape(*lead, m, (nb + 1) // 2, 2)
    cols = byte.repeat_interleave(32, dim=-1)[..., :n]                      # [..., mb, n]
    scale2 = F.pad(cols, (0, 0, 0, mb % 2)).reshape(*lead, (mb + 1) // 2, 2, n).transpose(-1, -2)
    return y.contiguous(), scale1.contiguous(), scale2.contiguous()


# ------------------------------------------------------------------ SwiGLU + MX quantisation
#
# aclnnSwigluMxQuant and ops-nn's swiglu_mx_quant golden: the SwiGLU variant is computed in
# float32 along activate_dim and cast to x's dtype, then MX-quantised along ``axis`` in blocks
# of 32 (the same quantiser as npu_dynamic_mx_quant). op-plugin's adapter accepts modes 0 and 1
# (the kernel's modes 2/3 are not reachable from torch_npu).
#   mode 0: A, B = halves; activate_left: silu(A) * B, else silu(B) * A
#   mode 1: glu = even elements, linear = odd elements;
#           glu.clamp(max=L) * sigmoid(alpha * glu) * (linear.clamp(-L, L) + bias)


def _swiglu_variant(xf, dim, mode, activate_left, clamp_limit, glu_alpha, glu_bias):
    if mode == 0:
        first, second = xf.chunk(2, dim)
        glu, linear = (first, second) if activate_left else (second, first)
        return glu * torch.sigmoid(glu) * linear
    glu, linear = xf.unflatten(dim, (-1, 2)).unbind(dim + 1)
    glu = glu.clamp(max=clamp_limit)
    return glu * torch.sigmoid(glu_alpha * glu) * (linear.clamp(-clamp_limit, clamp_limit) + glu_bias)


@impl("npu_swiglu_mx_quant")
def npu_swiglu_mx_quant(x, *, group_index=None, activate_dim=-1, activate_left=False, swiglu_mode=0,
                        clamp_limit=7.0, glu_alpha=1.702, glu_bias=1.0, group_mode=0, axis=-1, dst_type=296,
                        round_mode="rint", scale_alg=0, max_dtype_value=0):
    """``(y, mxscale)``: MX quantisation (blocks of 32 along ``axis``) of a SwiGLU variant of x."""
    op = "npu_swiglu_mx_quant"
    n = x.dim()
    check(x.dtype in (torch.float16, torch.bfloat16), op, "x dtype must be float16 or bfloat16, got %s", x.dtype)
    check(2 <= n <= 7, op, "x dim should be 2 to 7, got %d", n)
    check(activate_dim in (-1, -2, n - 2, n - 1), op, "activate_dim should be in [-1, -2, x.dim()-2, x.dim()-1]")
    check(axis in (-1, -2, n - 2, n - 1), op, "axis should be in [-1, -2, x.dim()-2, x.dim()-1]")
    check(swiglu_mode in (0, 1), op, "swiglu_mode only support 0 or 1, but got %r", (swiglu_mode,))
    check(math.isfinite(clamp_limit) and clamp_limit > 0.0, op, "clamp_limit should be positive finite")
    act, qdim = activate_dim % n, axis % n
    check(x.shape[act] % 2 == 0, op, "the activate_dim of x (%d) must be even", x.shape[act])
    if swiglu_mode == 1 and act != n - 1:
        unsupported(op, "swiglu_mode=1 with activate_dim=%d (the even/odd split of a non-last dim)" % activate_dim)
    if group_index is not None and (act != n - 1 or qdim != n - 1):
        unsupported(op, "group_index with activate_dim=%d, axis=%d (the grouped scale layout of a non-last "
                         "dim is not documented)" % (activate_dim, axis))
    check(group_mode in (0, 1), op, "group_mode only support 0(count) or 1(cumsum), got %r", (group_mode,))
    fmt = mx_destination(op, "dst_type", dst_type)
    alg = check_mx_args(op, fmt, round_mode, scale_alg, max_dtype_value)
    out = _swiglu_variant(x.float(), act, swiglu_mode, activate_left, clamp_limit, glu_alpha, glu_bias)
    check_fp4_last_dim(op, fmt, out)
    # with group_index along the last dim only the grouped rows are defined on the device (the
    # rest is left unwritten); here every row is quantised
    return mx_quantize(out.to(x.dtype), qdim, fmt, alg, round_mode=round_mode)


# ------------------------------------------------------------------ SwiGLU + dual-axis MX quantisation
#
# aclnnSwigluMxQuantWithDualAxis: x [M, 2N]; SwiGLU (activate_left: silu(left) * right, else
# silu(right) * left) in float32, stored in x's dtype (the kernel's SwiGLU buffer has x's
# dtype), then MX-quantised along -1 (y1, mxscale1: every row, blocks of 32) and along -2 per
# group of rows (y2, mxscale2: the npu_grouped_dynamic_mx_quant layout, [M // 64 + G, N, 2]).
# The doc allows float8_e4m3fn with scale_alg 1 only and requires group_index (cumulative row
# ends, the last = M). Scale rows between groups that no block writes are not specified by the
# doc; they get the grouped golden's filler (0 after an odd block count, else 127).


@impl("npu_swiglu_mx_quant_with_dual_axis")
def npu_swiglu_mx_quant_with_dual_axis(x, *, group_index=None, activate_left=True, round_mode="rint", scale_alg=1,
                                       dst_type=24, dst_type_max=0):
    """``(y1, mxscale1, y2, mxscale2)``: SwiGLU(x) MX-quantised along -1 and, per group of rows, along -2."""
    op = "npu_swiglu_mx_quant_with_dual_axis"
    check(x.dim() >= 2, op, "The input x should be at least 2D")
    check(x.shape[-1] % 2 == 0, op, "The last dim of input must be divisible by 2")
    check(x.dim() == 2, op, "x must be 2-D [M, 2N], got %d-D", x.dim())
    check(x.dtype in (torch.float16, torch.bfloat16), op, "x dtype must be float16 or bfloat16, got %s", x.dtype)
    if group_index is None:
        unsupported(op, "group_index=None (the doc requires it; op-plugin's adapter and the kernel doc disagree "
                         "on the scale2 rows without it)")
    check(group_index.dim() == 1 and group_index.dtype == torch.int64, op,
          "group_index must be a 1-D int64 tensor, got %d-D %s", (group_index.dim(), group_index.dtype))
    fmt = mx_destination(op, "dst_type", dst_type)
    alg = 0 if scale_alg is None else int(scale_alg)
    if fmt is not E4M3 or alg != 1:
        unsupported(op, "dst_type=%r with scale_alg=%d (the doc allows float8_e4m3fn with scale_alg=1 only)"
                     % (dst_type, alg))
    check_mx_args(op, fmt, round_mode, alg, dst_type_max)
    left, right = x.detach().float().chunk(2, -1)
    glu, linear = (left, right) if activate_left else (right, left)
    out = (glu * torch.sigmoid(glu) * linear).to(x.dtype)
    y1, s1 = mx_quantize(out, -1, fmt, alg)
    y2, s2 = grouped_rows_mx(out, group_index, fmt, alg)
    return y1, s1, y2, s2


# ------------------------------------------------------------------ SwiGLU backward + dual-axis MX quantisation
#
# The input gradient of SwiGLU (activated half A, other half B, dy the output gradient):
# dA = dy * B * sigmoid(A) * (1 + A * (1 - sigmoid(A))), dB = dy * silu(A), laid out as x
# (A = left half when activate_left). It is computed in float32, stored in x's dtype (as the
# forward kernel stores its SwiGLU; the backward's intermediate precision is not documented:
# it only moves values that sit on a rounding tie), then MX-quantised as the forward: along -1,
# and along -2 per group of rows with group_index (else ceil(M / 64) scale rows, op-plugin's
# test). op-plugin's test case (x = y_grad = 1, groups [2, 4]) is reproduced exactly.


@impl("_npu_swiglu_backward_mx_quant_with_dual_axis")
def _npu_swiglu_backward_mx_quant_with_dual_axis(x, y_grad, *, group_index=None, activate_left=True,
                                                 round_mode="rint", scale_alg=1, dst_type=24, dst_type_max=0):
    """``(y1, mxscale1, y2, mxscale2)``: the SwiGLU input gradient MX-quantised along -1 and -2."""
    op = "_npu_swiglu_backward_mx_quant_with_dual_axis"
    check(x.dim() >= 2, op, "The input x should be at least 2D")
    check(x.dim() == 2, op, "x must be 2-D [M, 2N], got %d-D", x.dim())
    check(x.shape[-1] % 2 == 0, op, "The last dim of input must be divisible by 2")
    check(list(y_grad.shape) == [x.shape[0], x.shape[1] // 2], op,
          "y_grad %s must be x %s with the last dim halved", (tuple(y_grad.shape), tuple(x.shape)))
    check(x.dtype in (torch.float16, torch.bfloat16) and y_grad.dtype == x.dtype, op,
          "x and y_grad must be float16 or bfloat16 of the same dtype, got %s and %s", (x.dtype, y_grad.dtype))
    fmt = mx_destination(op, "dst_type", dst_type)
    alg = 0 if scale_alg is None else int(scale_alg)
    if fmt is not E4M3 or alg != 1:
        unsupported(op, "dst_type=%r with scale_alg=%d (only float8_e4m3fn with scale_alg=1 is documented)"
                     % (dst_type, alg))
    check_mx_args(op, fmt, round_mode, alg, dst_type_max)
    left, right = x.detach().float().chunk(2, -1)
    act, other = (left, right) if activate_left else (right, left)
    dy = y_grad.detach().float()
    sig = torch.sigmoid(act)
    d_act = dy * other * sig * (1 + act * (1 - sig))
    d_other = dy * act * sig
    grad = torch.cat([d_act, d_other] if activate_left else [d_other, d_act], -1).to(x.dtype)
    y1, s1 = mx_quantize(grad, -1, fmt, alg)
    if group_index is None:
        y2, s2 = mx_quantize(grad, -2, fmt, alg)
    else:
        check(group_index.dim() == 1 and group_index.dtype == torch.int64, op,
              "group_index must be a 1-D int64 tensor, got %d-D %s", (group_index.dim(), group_index.dtype))
        y2, s2 = grouped_rows_mx(grad, group_index, fmt, alg)
    return y1, s1, y2, s2
