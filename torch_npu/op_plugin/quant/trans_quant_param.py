"""npu_trans_quant_param: the packed int64 quantisation parameter of the matmul fixpipe.

Layout (aclnnTransQuantParamV2/V3 documentation):

* bits 0-31: the float32 ``scale`` with its low 13 bits cleared (the "fp19" value the
  hardware uses), ``round_mode=0`` truncates, ``round_mode=1`` first rounds the float32 to
  the nearest fp19 value;
* bit 46: always 1;
* bits 37-45 (only when ``offset`` is given): ``clamp(round(offset), -256, 255)`` as a 9-bit
  two's complement integer.

``decode_packed_scale`` reads such a tensor back (used by the matmul ops that accept an
int64 ``scale``).
"""
import torch

from torch_npu.op_plugin._common import check
from torch_npu.op_plugin._registry import impl

__all__ = []

_LOW13 = 0x1FFF
_HALF13 = 0x1000
_FLAG = 1 << 46


def _has_values(t):
    """True when ``t`` holds real data (not a meta / FakeTensor placeholder)."""
    return t.device.type != "meta" and not isinstance(t, torch._subclasses.FakeTensor)


def _float_bits(t):
    """The IEEE bit pattern of a float32 tensor as non-negative int64 (0 .. 2**32-1)."""
    return t.contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF


def _bits_to_float(bits):
    """Inverse of ``_float_bits`` for int64 values in 0 .. 2**32-1."""
    signed = torch.where(bits >= 2 ** 31, bits - 2 ** 32, bits)
    return signed.to(torch.int32).view(torch.float32)


@impl("npu_trans_quant_param")
def npu_trans_quant_param(scale, offset=None, round_mode=0):
    """Pack a float32 ``scale`` (and optional float32 ``offset``) into int64 (see module doc).

    Shapes: 1-d ``scale`` -> 1-d output of ``max(len(scale), len(offset))`` elements (a
    1-element operand is broadcast); 2-d ``scale`` -> output of ``scale``'s shape (``offset``
    must then have the same shape). ``round_mode``: 0 truncation, 1 round to nearest fp19.
    Exact halfway cases of the round-to-nearest steps (fp19 rounding with ``round_mode=1``,
    ``offset`` exactly at ``k + 0.5``) are not documented and raise NotImplementedError.
    """
    op = "npu_trans_quant_param"
    round_mode = 0 if round_mode is None else round_mode
    if round_mode not in (0, 1):
        raise NotImplementedError("%s: round_mode=%r is not supported (0 or 1)" % (op, round_mode))
    check(scale.dtype == torch.float32, op, "scale must be float32, got %s", scale.dtype)
    check(scale.dim() in (1, 2), op, "scale must be 1-d or 2-d, got %d-d", scale.dim())
    values = scale
    if offset is not None:
        check(offset.dtype == torch.float32, op, "offset must be float32, got %s", offset.dtype)
        check(offset.dim() in (1, 2), op, "offset must be 1-d or 2-d")
        if scale.dim() == 2:
            check(tuple(offset.shape) == tuple(scale.shape), op,
                  "a 2-d scale needs an offset of the same shape, got %s and %s",
                  (tuple(scale.shape), tuple(offset.shape)))
        else:
            ns, no = scale.numel(), offset.numel()
            check(offset.dim() == 1 and (ns == no or ns == 1 or no == 1), op,
                  "1-d scale (%d) and offset (%d) must have equal lengths or one of length 1", (ns, no))
            n = max(ns, no)
            values = scale.expand(n)
            offset = offset.expand(n)
    bits = _float_bits(values)
    if round_mode == 1:
        if _has_values(bits) and bool(((bits & _LOW13) == _HALF13).any()):
            raise NotImplementedError("%s: round_mode=1 on a value exactly halfway between two fp19 "
                                      "values (tie rule not documented)" % op)
        # Adding half an fp19 ulp to the magnitude bits rounds to nearest (a carry moves
        # into the exponent correctly); the sign bit is untouched for finite values.
        bits = bits + _HALF13
    out = (bits & 0xFFFFE000) | _FLAG
    if offset is not None:
        if _has_values(offset) and bool((torch.frac(offset).abs() == 0.5).any()):
            raise NotImplementedError("%s: offset exactly halfway between integers (tie rule "
                                      "not documented)" % op)
        off = torch.round(offset).clamp(-256, 255).to(torch.int64)
        out = (out & 0x4000FFFFFFFF) | ((off & 0x1FF) << 37)
    return out


def decode_packed_scale(packed):
    """``(scale float32, offset int64)`` stored in an int64 tensor made by npu_trans_quant_param."""
    scale = _bits_to_float(packed & 0xFFFFFFFF)
    off9 = (packed >> 37) & 0x1FF
    offset = torch.where(off9 >= 256, off9 - 512, off9)
    return scale, offset
