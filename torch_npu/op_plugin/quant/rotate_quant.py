"""npu_rotate_quant: block rotation of the last dim, then per-token dynamic int8 quantisation.

Documented (torch_npu docs and op-plugin's test golden): ``x (m, n)`` float16/bfloat16,
``rotation (k, k)`` of the same dtype, ``n`` divisible by ``k``. Each row is cut into ``n / k``
blocks of ``k``; each block ``v`` becomes ``v @ rotation`` (float32 accumulation, result cast to
``x``'s dtype); the rotated tensor then goes through ``npu_dynamic_quant``: ``scale = max|row| /
127`` (float32, shape ``(m,)``), ``y = round(row / scale)`` int8. ``dst_dtype`` None or
torch.int8/torch.qint8.

Not emulated (NotImplementedError): ``dst_dtype`` quint4x2 (int4 packed in int32: nibble order
not documented with this op) and the float8/float4 MX outputs of the newer release (``alpha``
clipping, ``axis``, ``round_mode``, ``scale_alg``, ``dst_type_max``, ``transpose_y`` other than
their defaults).
"""
import torch

from torch_npu.op_plugin._common import check, unsupported
from torch_npu.op_plugin._registry import impl
from torch_npu.op_plugin.quant.quantize import _dtype_arg

__all__ = []


@impl("npu_rotate_quant")
def npu_rotate_quant(x, rotation, *, alpha=None, dst_dtype=None, axis=-1, round_mode="rint", scale_alg=0,
                     dst_type_max=0.0, transpose_y=False):
    """See the module doc."""
    op = "npu_rotate_quant"
    if dst_dtype is not None:
        _dtype_arg(op, "dst_dtype", dst_dtype, (torch.int8, torch.qint8))
    for name, value, default in (("alpha", alpha, None), ("axis", axis, -1), ("round_mode", round_mode, "rint"),
                                 ("scale_alg", scale_alg, 0), ("dst_type_max", dst_type_max, 0.0),
                                 ("transpose_y", transpose_y, False)):
        if value is not None and value != default:
            unsupported(op, "%s=%r" % (name, value))
    check(x.dtype in (torch.float16, torch.bfloat16) and rotation.dtype == x.dtype, op,
          "x and rotation must share a float16/bfloat16 dtype, got %s and %s", (x.dtype, rotation.dtype))
    check(x.dim() == 2 and rotation.dim() == 2 and rotation.shape[0] == rotation.shape[1], op,
          "x must be 2-d (m, n) and rotation square 2-d (k, k)")
    m, n = x.shape
    k = rotation.shape[0]
    check(n % k == 0, op, "n (%d) must be divisible by k (%d)", (n, k))
    rotated = torch.matmul(x.float().reshape(m * (n // k), k), rotation.float()).reshape(m, n).to(x.dtype)
    return torch.ops.npu.npu_dynamic_quant.default(rotated)
