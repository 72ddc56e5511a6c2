"""npu_hans_encode.out / npu_hans_decode.out (the HANS encoder / decoder): meta-only.

Not emulated: a real CPU / npu call raises NotImplementedError naming the op. The Meta kernels
return the given ``out`` tensors (the schema's in-place outputs), so FakeTensor / torch.compile
trace through them.
"""
from torch_npu.op_plugin._registry import meta

__all__ = []


@meta("npu_hans_encode.out")
def npu_hans_encode_out(input, statistic=False, reshuff=False, *, pdf, mantissa, fixed, var):
    return pdf, mantissa, fixed, var


@meta("npu_hans_decode.out")
def npu_hans_decode_out(mantissa, fixed, var, pdf, reshuff=False, *, out):
    return out
