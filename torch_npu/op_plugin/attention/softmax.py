"""Attention softmax ops.

* npu_masked_softmax_with_rel_pos_bias(x, atten_mask, bias, scale_value):
  softmax(scale_value * x + atten_mask + relative_pos_bias, -1), x (B*W, N, S1, S2) or
  (B, W, N, S1, S2), the additive mask per window W, the bias per head N.
* npu_attn_softmax_(x): x <- softmax(x, -1) in place.
  npu_attn_softmax_backward_(self, grad_output, values): self holds softmax(x); it becomes
  the gradient w.r.t. x of softmax(x) @ values: self <- self * (g - sum(g * self, -1)),
  g = grad_output @ values^T.

Low-precision inputs are computed in float32 and returned in their dtype (float64 stays
float64 for gradcheck).
"""
import torch

from torch_npu.op_plugin._common import acc, check
from torch_npu.op_plugin._registry import impl
from torch_npu.op_plugin.attention.nsa import _FLOATS

__all__ = []


def _as_5d(t, kind, op):
    """Mask (W, S1, S2) | (W, 1, S1, S2) | (1, W, 1, S1, S2) -> (1, W, 1, S1, S2);
    bias (N, S1, S2) | (1, N, S1, S2) | (1, 1, N, S1, S2) -> (1, 1, N, S1, S2)."""
    if kind == "mask":
        shapes = {3: lambda: t.unsqueeze(0).unsqueeze(2), 4: lambda: t.unsqueeze(0), 5: lambda: t}
    else:
        shapes = {3: lambda: t.unsqueeze(0).unsqueeze(0), 4: lambda: t.unsqueeze(0), 5: lambda: t}
    check(t.dim() in shapes, op, "%s must be 3-, 4- or 5-D, got %d-D", (kind, t.dim()))
    return shapes[t.dim()]()


@impl("npu_masked_softmax_with_rel_pos_bias")
def npu_masked_softmax_with_rel_pos_bias(x, atten_mask, relative_pos_bias, scale_value=1.0, inner_precision_mode=0):
    """softmax(scale_value * x + atten_mask + relative_pos_bias, -1) in x's shape and dtype.
    ``inner_precision_mode`` only selects the hardware's internal precision; the emulator always
    computes in float32 (float64 for float64 inputs)."""
    op = "npu_masked_softmax_with_rel_pos_bias"
    check(x.dim() in (4, 5), op, "x must be 4-D (B*W, N, S1, S2) or 5-D (B, W, N, S1, S2), got %d-D", x.dim())
    check(x.dtype in _FLOATS, op, "x dtype must be float32, float16 or bfloat16, got %s", x.dtype)
    n, s1, s2 = x.shape[-3], x.shape[-2], x.shape[-1]
    bias = _as_5d(relative_pos_bias, "bias", op)
    check(tuple(bias.shape) == (1, 1, n, s1, s2), op, "relative_pos_bias must hold (N=%d, S1=%d, S2=%d), got %s",
          (n, s1, s2, tuple(relative_pos_bias.shape)))
    if atten_mask is not None:
        mask = _as_5d(atten_mask, "mask", op)
        w = mask.shape[1]
        check(tuple(mask.shape) == (1, w, 1, s1, s2), op, "atten_mask must hold (W, S1=%d, S2=%d), got %s",
              (s1, s2, tuple(atten_mask.shape)))
    else:
        mask, w = None, (x.shape[1] if x.dim() == 5 else 1)
    if x.dim() == 5:
        check(x.shape[1] == w, op, "x W dim %d must equal atten_mask W %d", (x.shape[1], w))
        x5 = x
    else:
        check(x.shape[0] % w == 0, op, "x dim 0 (B*W = %d) must be a multiple of W = %d", (x.shape[0], w))
        x5 = x.reshape(x.shape[0] // w, w, n, s1, s2)
    y = acc(x5) * scale_value + acc(bias)
    if mask is not None:
        y = y + acc(mask)
    return torch.softmax(y, dim=-1).to(x.dtype).reshape(x.shape)


@impl("npu_attn_softmax_")
def npu_attn_softmax_(self):
    """self <- softmax(self, -1); returns self."""
    check(self.dtype in _FLOATS, "npu_attn_softmax_", "self must be a floating tensor, got %s", self.dtype)
    return self.copy_(torch.softmax(acc(self), dim=-1))


@impl("npu_attn_softmax_backward_")
def npu_attn_softmax_backward_(self, grad_output, values):
    """self (= softmax(x)) <- d/dx of softmax(x) @ values for ``grad_output``; returns self."""
    op = "npu_attn_softmax_backward_"
    check(self.dim() >= 2 and values.dim() == self.dim() and grad_output.dim() == self.dim(), op,
          "self, grad_output and values must have the same rank >= 2")
    check(values.shape[-2] == self.shape[-1], op, "values dim -2 (%d) must equal self dim -1 (%d)",
          (values.shape[-2], self.shape[-1]))
    check(grad_output.shape[-1] == values.shape[-1] and grad_output.shape[-2] == self.shape[-2], op,
          "grad_output must be [..., %d, %d], got %s", (self.shape[-2], values.shape[-1], tuple(grad_output.shape)))
    y = acc(self)
    g = torch.matmul(acc(grad_output), acc(values).transpose(-2, -1))
    return self.copy_(y * (g - (g * y).sum(-1, keepdim=True)))
