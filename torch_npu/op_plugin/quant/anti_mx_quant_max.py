"""float8 conversions: npu_anti_mx_quant (MX dequantisation) and npu_quant_max (scaled cast
to float8 plus the absolute maximum).

* npu_anti_mx_quant (torch_npu doc): ``y = x * 2 ** (sf - 127)`` with one float8_e8m0 scale
  ``sf`` per block of 32 elements along the last axis (the only documented axis); mxscale has
  the layout ``[..., ceil(ceil(n / 32) / 2), 2]`` (block ``k`` -> ``[..., k // 2, k % 2]``), stored
  as uint8 or float8_e8m0fnu; raw 255 is NaN. ``dst_type`` 5/6/15 (or the torch dtypes)
  gives float16/float32/bfloat16. float8 sources only: the float4 sources (two per uint8)
  need a nibble order the doc does not give, so ``src_type`` 296/297 raise
  NotImplementedError.
* npu_quant_max (op-plugin's test golden): ``y = cast(x / scale)`` to float8_e5m2 (291, the
  default) or float8_e4m3fn (292), ``amax = max|x|`` of shape [1] in x's dtype. With
  ``group_list`` (cumulative row ends along dim 0) group ``g`` uses ``scale[g]`` and gets its
  own ``amax[g]`` (0 for an empty group); rows past the last end are 0 and not counted. The
  cast is PyTorch's round-to-nearest-even float8 conversion, as in the golden (values beyond
  the float8 range follow it: e4m3fn saturates to +-448, e5m2 overflows to inf). hifloat8 (290) and round modes
  other than 'rint' raise NotImplementedError.
"""
import torch

from torch_npu.op_plugin._common import check, unsupported
from torch_npu.op_plugin._registry import impl
from torch_npu.op_plugin.quant.transpose_quant_matmul import _e8m0_values

__all__ = []

_MX_BLOCK = 32
_FLOAT8_BY_CODE = {291: torch.float8_e5m2, 23: torch.float8_e5m2, 292: torch.float8_e4m3fn,
                   24: torch.float8_e4m3fn}
_DEQUANT_DST = {5: torch.float16, 6: torch.float32, 15: torch.bfloat16}


def _float8(op, argname, value):
    if isinstance(value, torch.dtype) and value in _FLOAT8_BY_CODE.values():
        return value
    if not isinstance(value, torch.dtype) and int(value) in _FLOAT8_BY_CODE:
        return _FLOAT8_BY_CODE[int(value)]
    unsupported(op, "%s=%r (float8_e5m2 / float8_e4m3fn only)" % (argname, value))


@impl("npu_anti_mx_quant")
def npu_anti_mx_quant(x, mxscale, *, axis=-1, dst_type=15, src_type=292):
    """``x * 2 ** (mxscale - 127)`` per block of 32 along the last axis, in ``dst_type``."""
    op = "npu_anti_mx_quant"
    axis = -1 if axis is None else axis
    src = _float8(op, "src_type", 292 if src_type is None else src_type)
    dst_type = 15 if dst_type is None else dst_type
    dst = dst_type if isinstance(dst_type, torch.dtype) else _DEQUANT_DST.get(int(dst_type))
    if dst not in _DEQUANT_DST.values():
        unsupported(op, "dst_type=%r (float16 / float32 / bfloat16)" % (dst_type,))
    check(1 <= x.dim() <= 7, op, "X dimNum should be between 1 and 7, got %d", x.dim())
    check(axis in (-1, x.dim() - 1), op, "only the last axis is supported, got axis=%d", axis)
    check(x.dtype == src, op, "For float8, x dtype must be same as src_type, please check (x %s, src_type %s)",
          (x.dtype, src))
    n = x.shape[-1]
    pairs = (-(-n // _MX_BLOCK) + 1) // 2
    check(mxscale.dim() == x.dim() + 1 and tuple(mxscale.shape) == tuple(x.shape[:-1]) + (pairs, 2), op,
          "mxscale must have shape %s, got %s", (tuple(x.shape[:-1]) + (pairs, 2), tuple(mxscale.shape)))
    check(mxscale.dtype in (torch.uint8, torch.float8_e8m0fnu), op,
          "mxscale must be float8_e8m0fnu (stored as uint8), got %s", mxscale.dtype)
    factor = _e8m0_values(mxscale).reshape(*x.shape[:-1], 2 * pairs)
    factor = factor.repeat_interleave(_MX_BLOCK, dim=-1)[..., :n]
    return (x.float() * factor).to(dst)


@impl("npu_quant_max")
def npu_quant_max(x, scale, *, round_mode="rint", dst_dtype=291, group_list=None):
    """``(cast(x / scale), max|x|)`` (per group of rows with ``group_list``). See the module doc."""
    op = "npu_quant_max"
    if dst_dtype == 290:
        unsupported(op, "dst_dtype=torch_npu.hifloat8 (its encoding is not emulated)")
    dst = _float8(op, "dst_dtype", dst_dtype)
    if round_mode != "rint":
        unsupported(op, "round_mode=%r (only 'rint' for float8)" % (round_mode,))
    check(x.dtype in (torch.float16, torch.bfloat16, torch.float32), op,
          "x must be float16, bfloat16 or float32, got %s", x.dtype)
    xf = x.float()
    if group_list is None:
        check(scale.numel() == 1, op, "scale must hold one value, got shape %s", (tuple(scale.shape),))
        return (xf / scale.float().reshape(())).to(dst), xf.abs().amax().reshape(1).to(x.dtype)
    check(group_list.dim() == 1 and scale.dim() == 1 and scale.shape[0] == group_list.shape[0], op,
          "group_list and scale must be 1-D of the same length, got %s and %s",
          (tuple(group_list.shape), tuple(scale.shape)))
    groups = group_list.shape[0]
    rows = torch.arange(x.shape[0], device=x.device, dtype=group_list.dtype)
    gid = torch.searchsorted(group_list.contiguous(), rows, right=True)
    inside = gid < groups                                    # rows before the last group end
    gid = gid.clamp(max=groups - 1)
    lead = (-1,) + (1,) * (x.dim() - 1)
    row_scale = scale.float().index_select(0, gid).reshape(lead)
    y = torch.where(inside.reshape(lead), xf / row_scale, torch.zeros_like(xf))
    row_max = torch.where(inside, xf.abs().reshape(x.shape[0], -1).amax(-1), torch.zeros(x.shape[0], device=x.device))
    amax = torch.zeros(groups, device=x.device).scatter_reduce(0, gid, row_max, "amax", include_self=True)
    return y.to(dst), amax.to(x.dtype)
