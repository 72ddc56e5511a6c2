"""npu_quant_conv2d (non-public ``torch.ops.npu`` op behind ``torch_npu.contrib.module.QuantConv2d``).

int8 convolution with int32 accumulation, then dequantisation, as op-plugin's test golden
(``conv2d(int32(x), int32(w))`` times a per-output-channel scale, cast to float16) and the
QuantConv2d docs (int32 ``bias`` added to the accumulator; ``offset_x`` is "the actual value
filled in padding"):

    out[b, c] = float16((conv(pad(x, offset_x), w)[b, c] + bias[c]) * scale[c])

``scale`` float32 (n,), or int64 from ``npu_trans_quant_param(scale)`` (its fp19 value is
used; a packed offset raises). ``output_dtype`` float16 is the only documented output. The
convolution runs in float64 (exact for int8 data), the dequantisation in float32. Reserved parameters must
keep their defaults: ``offset`` None, ``round_mode`` 'rint'; ``input_dtype`` / ``weight_dtype``
(HiFloat8 and other non-int8 inputs) raise NotImplementedError.
"""
import torch

from torch_npu.op_plugin._common import check, unsupported
from torch_npu.op_plugin._registry import impl
from torch_npu.op_plugin.quant.quantize import _dtype_arg, _unpack_scale

__all__ = []


def _pair(v, name, op):
    v = [int(x) for x in v] if isinstance(v, (list, tuple)) else [int(v)]
    check(len(v) in (1, 2), op, "%s must have 1 or 2 values, got %r", (name, v))
    return v * 2 if len(v) == 1 else v


@impl("npu_quant_conv2d")
def npu_quant_conv2d(input, weight, scale, strides=1, pads=0, dilations=1, groups=1, offset_x=0,
                     round_mode="rint", output_dtype=None, bias=None, offset=None, input_dtype=None,
                     weight_dtype=None):
    """int8 conv2d (padding filled with ``offset_x``), ``(acc + int32 bias) * scale`` per output
    channel, float16; ``scale`` float32 or npu_trans_quant_param int64."""
    op = "npu_quant_conv2d"
    for name, v in (("offset", offset), ("input_dtype", input_dtype), ("weight_dtype", weight_dtype)):
        if v is not None:
            unsupported(op, name)
    if round_mode != "rint":
        unsupported(op, "round_mode=%r (reserved, 'rint')" % (round_mode,))
    if output_dtype is None:
        unsupported(op, "output_dtype=None (the documented output is torch.float16)")
    _dtype_arg(op, "output_dtype", output_dtype, (torch.float16,))
    if input.dtype != torch.int8 or weight.dtype != torch.int8:
        unsupported(op, "input/weight dtypes %s/%s (only int8)" % (input.dtype, weight.dtype))
    check(input.dim() == 4 and weight.dim() == 4, op, "input and weight must be 4-D NCHW")
    cout = weight.size(0)
    if scale.dtype == torch.int64:
        scale = _unpack_scale(op, scale)
    check(scale.dtype == torch.float32 and scale.numel() == cout, op,
          "scale must be float32 or int64 with %d (out_channels) elements", cout)
    stride, pad, dilation = _pair(strides, "strides", op), _pair(pads, "pads", op), _pair(dilations, "dilations", op)
    x = torch.nn.functional.pad(input.to(torch.float64), (pad[1], pad[1], pad[0], pad[0]), value=float(offset_x))
    acc = torch.nn.functional.conv2d(x, weight.to(torch.float64), None, stride, 0, dilation, groups)
    if bias is not None:
        check(bias.dtype == torch.int32 and bias.numel() == cout, op, "bias must be int32 with %d elements", cout)
        acc = acc + bias.to(torch.float64).view(1, cout, 1, 1)
    # float32 dequantisation, as the golden (int32 accumulator times float32 scale)
    return (acc.to(torch.float32) * scale.view(1, cout, 1, 1)).to(torch.float16)
