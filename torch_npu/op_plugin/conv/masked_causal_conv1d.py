"""npu_masked_causal_conv1d: depthwise causal 1-D convolution over the sequence, output masked.

Documented formula, input [S, B, H], weight [W, H] (W = 3), mask [B, S] bool (True = valid):

    output[s, b, h] = sum_{k=0}^{W-1} weight[k, h] * input[s - (W-1-k), b, h]   (index < 0 reads 0)
    output[s, b, :] = 0 where mask[b, s] is False

Computed in float32 (float64 stays float64, for gradcheck), returned in the input dtype.
Autograd flows through the ATen composition. npu_masked_causal_conv1d_backward (the op the real
backward calls) returns the gradients of input and weight for a grad_output (the formula is in
its docstring).
"""
import torch

from torch_npu.op_plugin._common import acc, check
from torch_npu.op_plugin._registry import impl

__all__ = []


@impl("npu_masked_causal_conv1d")
def npu_masked_causal_conv1d(input, weight, *, mask=None):
    """Causal depthwise conv of ``input`` [S, B, H] with ``weight`` [3, H]; rows with
    ``mask[b, s]`` False are zero. Returns [S, B, H] in the input dtype."""
    op = "npu_masked_causal_conv1d"
    check(input.dim() == 3, op, "input must be 3-D [S, B, H], got %d-D", input.dim())
    check(weight.dim() == 2 and weight.shape[0] == 3 and weight.shape[1] == input.shape[2], op,
          "weight must be [W=3, H=%d], got %s", (input.shape[2], tuple(weight.shape)))
    check(weight.dtype == input.dtype, op, "weight dtype %s must match input dtype %s", (weight.dtype, input.dtype))
    s, b = input.shape[0], input.shape[1]
    if mask is not None:
        check(mask.dtype == torch.bool and tuple(mask.shape) == (b, s), op,
              "mask must be bool [B=%d, S=%d], got %s %s", (b, s, mask.dtype, tuple(mask.shape)))
    width = weight.shape[0]
    x, w = acc(input), acc(weight)
    padded = torch.nn.functional.pad(x, (0, 0, 0, 0, width - 1, 0))  # W-1 zeros before s = 0
    out = padded[0:s] * w[0]
    for k in range(1, width):
        out = out + padded[k:k + s] * w[k]
    if mask is not None:
        out = out.masked_fill(~mask.t().unsqueeze(-1), 0)
    return out.to(input.dtype)


@impl("npu_masked_causal_conv1d_backward")
def npu_masked_causal_conv1d_backward(grad_output, input, weight, *, mask=None):
    """Gradients (grad_input [S, B, H] in input's dtype, grad_weight [W, H] in weight's dtype) of
    output[s] = sum_k weight[k] * input[s - (W-1-k)] (zeros before s = 0), rows with mask False zero."""
    op = "npu_masked_causal_conv1d_backward"
    check(input.dim() == 3, op, "input must be 3-D [S, B, H], got %d-D", input.dim())
    check(weight.dim() == 2 and weight.shape[0] == 3 and weight.shape[1] == input.shape[2], op,
          "weight must be [W=3, H=%d], got %s", (input.shape[2], tuple(weight.shape)))
    check(tuple(grad_output.shape) == tuple(input.shape), op, "grad_output shape %s must equal input shape %s",
          (tuple(grad_output.shape), tuple(input.shape)))
    s, b = input.shape[0], input.shape[1]
    g = acc(grad_output)
    if mask is not None:
        check(mask.dtype == torch.bool and tuple(mask.shape) == (b, s), op,
              "mask must be bool [B=%d, S=%d], got %s %s", (b, s, mask.dtype, tuple(mask.shape)))
        g = g.masked_fill(~mask.t().unsqueeze(-1), 0)
    width = weight.shape[0]
    x, w = acc(input), acc(weight)
    padded = torch.nn.functional.pad(x, (0, 0, 0, 0, width - 1, 0))
    grad_w = torch.stack([(g * padded[k:k + s]).sum((0, 1)) for k in range(width)])
    # input row t feeds output row t + (W-1-k) through weight[k]
    g_padded = torch.nn.functional.pad(g, (0, 0, 0, 0, 0, width - 1))
    grad_x = g_padded[width - 1:width - 1 + s] * w[0]
    for k in range(1, width):
        grad_x = grad_x + g_padded[width - 1 - k:width - 1 - k + s] * w[k]
    return grad_x.to(input.dtype), grad_w.to(weight.dtype)
