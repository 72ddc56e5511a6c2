"""npu_interleave_rope(x, cos, sin): rotary position embedding on interleaved channel pairs.

x [B, N, S, D]: the D axis is de-interleaved (x.view(.., D/2, 2).transpose(-1, -2)), then RoPE
with rotate_half: out = q * cos + rotate_half(q) * sin, rotate_half(q) = cat(-q[D/2:], q[:D/2]).
Low-precision inputs are computed in float32 and returned in their dtype (float64 stays
float64 for gradcheck).
"""
import torch

from torch_npu.op_plugin._common import acc, check
from torch_npu.op_plugin._registry import impl

__all__ = []


@impl("npu_interleave_rope")
def npu_interleave_rope(x, cos, sin):
    """RoPE on the de-interleaved D axis of ``x`` [B, N, S, D]; cos/sin [B, 1, S or 1, D]."""
    op = "npu_interleave_rope"
    check(x.dim() == 4, op, "x must be 4-D [B, N, S, D], got %d-D", x.dim())
    check(cos.dim() == 4 and sin.dim() == 4, op, "cos and sin must be 4-D [B, 1, S, D]")
    check(tuple(cos.shape) == tuple(sin.shape), op, "sin shape %s must equal cos shape %s",
          (tuple(sin.shape), tuple(cos.shape)))
    check(cos.dtype == x.dtype and sin.dtype == x.dtype, op, "cos/sin dtype must equal x dtype %s", x.dtype)
    b, _, s, d = x.shape
    check(d % 2 == 0, op, "D must be even, got %d", d)
    check(cos.shape[0] == b and cos.shape[1] == 1 and cos.shape[2] in (1, s) and cos.shape[3] == d, op,
          "cos/sin must be [B=%d, 1, S=%d or 1, D=%d], got %s", (b, s, d, tuple(cos.shape)))
    q = acc(x)
    q = q.reshape(*q.shape[:-1], d // 2, 2).transpose(-1, -2).reshape(q.shape)
    half = d // 2
    rotated = torch.cat((-q[..., half:], q[..., :half]), dim=-1)
    return (q * acc(cos) + rotated * acc(sin)).to(x.dtype)
