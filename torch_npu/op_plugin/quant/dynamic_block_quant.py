"""npu_dynamic_block_quant: per-block dynamic int8 quantisation.

The documented formula works with the reciprocal scale ``s = INT8_MAX / max|x|`` over a
block (``min_scale = 0`` makes the ``1 / min_scale`` bound infinite), ``y = rint(x * s)``; the
returned ``scale`` is the dequantisation factor ``max|x| / 127`` (the documented example:
values in [0, 1) give ``scale ~ max / 127`` and 127 at the maximum). Blocks are
``row_block_size x col_block_size`` over the last two dims; the only documented values are
1 x 128, ``min_scale=0``, ``round_mode='rint'``, ``dst_type=1`` (int8) — others raise
NotImplementedError. An all-zero block gives ``y = 0`` and ``scale = 0``.
"""
import torch
import torch.nn.functional as F

from torch_npu.op_plugin._common import check
from torch_npu.op_plugin._registry import impl

__all__ = []


@impl("npu_dynamic_block_quant")
def npu_dynamic_block_quant(x, *, min_scale=0.0, round_mode="rint", dst_type=1, row_block_size=1,
                            col_block_size=128, dst_type_max=0.0):
    """``(y int8, scale float32)``; ``scale`` has shape ``(..., ceil(M / 1), ceil(N / 128))``
    for an ``(..., M, N)`` input (2-d or 3-d). See the module doc."""
    op = "npu_dynamic_block_quant"
    for name, value, allowed in (("min_scale", min_scale, 0.0), ("round_mode", round_mode, "rint"),
                                 ("dst_type", dst_type, 1), ("row_block_size", row_block_size, 1),
                                 ("col_block_size", col_block_size, 128), ("dst_type_max", dst_type_max, 0.0)):
        if value != allowed:
            raise NotImplementedError("%s: %s=%r is not supported (only %r)" % (op, name, value, allowed))
    check(x.dtype in (torch.float16, torch.bfloat16), op, "x must be float16 or bfloat16, got %s", x.dtype)
    check(x.dim() in (2, 3), op, "x must be 2-d or 3-d, got %d-d", x.dim())
    n = x.shape[-1]
    blocks = -(-n // col_block_size)
    xf = x.float()
    padded = F.pad(xf, (0, blocks * col_block_size - n))          # zeros do not change max|x|
    amax = padded.abs().reshape(*x.shape[:-1], blocks, col_block_size).amax(-1)
    zero = amax == 0
    inv = torch.where(zero, torch.zeros_like(amax), 127.0 / torch.where(zero, torch.ones_like(amax), amax))
    inv_full = inv.repeat_interleave(col_block_size, dim=-1)[..., :n]
    y = torch.round(xf * inv_full).clamp(-128, 127).to(torch.int8)
    return y, amax / 127.0
