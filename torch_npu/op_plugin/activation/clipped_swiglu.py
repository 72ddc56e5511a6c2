"""npu_clipped_swiglu: the clamped SwiGLU variant of GPT-OSS (CANN ClippedSwiglu).

Documented computation: ``x`` is viewed as ``(pre, cut * after)`` around ``dim`` (``pre``
= product of the dims before ``dim``, ``after`` = product of those after it); with
``group_index`` only the first ``sum(group_index)`` rows are computed. The row is split
into ``A`` / ``B``: even / odd elements (``interleaved=True``) or first / second half;
``A = A.clamp(max=limit)``, ``B = B.clamp(-limit, limit)``,
``y = A * sigmoid(alpha * A) * (B + bias)``, reshaped to ``x``'s shape with ``dim`` halved.
Rows past ``sum(group_index)`` are not computed by the real kernel (the docs do not say what
it leaves there); the emulator returns zeros for them. Computed in float32 for
float16/bfloat16 inputs; autograd comes from the ATen composite.
"""
import torch

from torch_npu.op_plugin._common import acc, check
from torch_npu.op_plugin._registry import impl

__all__ = []


@impl("npu_clipped_swiglu")
def npu_clipped_swiglu(x, *, group_index=None, dim=-1, alpha=1.702, limit=7.0, bias=1.0, interleaved=True):
    """See the module doc."""
    op = "npu_clipped_swiglu"
    check(x.dim() > 0, op, "x must have at least 1 dim")
    check(-x.dim() <= dim < x.dim(), op, "dim %d out of range", dim)
    d = dim % x.dim()
    check(x.shape[d] % 2 == 0, op, "x.shape[dim] must be even, got %d", x.shape[d])
    pre = 1
    for s in x.shape[:d]:
        pre *= s
    rows = acc(x).reshape(pre, -1)
    if interleaved:
        a, b = rows[:, 0::2], rows[:, 1::2]
    else:
        h = rows.shape[1] // 2
        a, b = rows[:, :h], rows[:, h:]
    a = a.clamp(max=limit)
    b = b.clamp(-limit, limit)
    y = a * torch.sigmoid(alpha * a) * (b + bias)
    if group_index is not None:
        check(group_index.dim() == 1, op, "group_index must be 1-d")
        valid = torch.arange(pre, device=x.device) < group_index.sum()
        y = torch.where(valid[:, None], y, torch.zeros_like(y))
    out_shape = list(x.shape)
    out_shape[d] //= 2
    return y.reshape(out_shape).to(x.dtype)
