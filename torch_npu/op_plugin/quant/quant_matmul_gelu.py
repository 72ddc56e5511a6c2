"""npu_quant_matmul_gelu: A8W8 quantised matmul, dequantisation and GELU, fused.

Documented formula (torch_npu docs): ``acc = x1 @ x2`` (int32 accumulation, batch dims
broadcast), then

* int32 ``bias``: ``q = (acc + bias) * x2_scale * x1_scale``
* float ``bias`` (float32/float16/bfloat16): ``q = acc * x2_scale * x1_scale + bias``
* no bias: ``q = acc * x2_scale * x1_scale``

``x1_scale`` (m,) per token (row of x1), ``x2_scale`` (n,) per channel or (1,) per tensor;
``out = gelu(q)`` with ``approximate="gelu_erf"`` (exact) or ``"gelu_tanh"``. Output dtype:
bfloat16 when ``bias`` or ``x2_scale`` is bfloat16, else float16. Dequantisation and GELU
run in float32, as the vector units do. A4W4 (int32-packed or int4 inputs) raises
NotImplementedError: the nibble order of the packing is not documented with this op.
"""
import torch

from torch_npu.op_plugin._common import check, unsupported
from torch_npu.op_plugin._registry import impl

__all__ = []

_APPROX = {"gelu_erf": "none", "gelu_tanh": "tanh"}


@impl("npu_quant_matmul_gelu")
def npu_quant_matmul_gelu(x1, x2, x1_scale, x2_scale, *, bias=None, approximate="gelu_erf"):
    """A8W8 ``gelu((x1 @ x2 [+ int32 bias]) * x2_scale * x1_scale [+ float bias])``; float16
    output, bfloat16 when ``x2_scale`` or ``bias`` is bfloat16; A4W4 raises."""
    op = "npu_quant_matmul_gelu"
    if x1.dtype != torch.int8 or x2.dtype != torch.int8:
        unsupported(op, "x1/x2 dtypes %s/%s (only int8, A8W8)" % (x1.dtype, x2.dtype))
    approximate = "gelu_erf" if approximate is None else approximate
    check(approximate in _APPROX, op, "approximate must be 'gelu_erf' or 'gelu_tanh', got %r", (approximate,))
    check(2 <= x1.dim() <= 6 and 2 <= x2.dim() <= 6, op, "x1 and x2 must have 2 to 6 dimensions")
    check(x1.shape[-1] == x2.shape[-2], op, "x1 k=%d must equal x2 k=%d", (x1.shape[-1], x2.shape[-2]))
    m, n = x1.shape[-2], x2.shape[-1]
    check(x1_scale.dtype == torch.float32 and x1_scale.dim() == 1 and x1_scale.numel() == m, op,
          "x1_scale must be float32 (%d,), got %s %s", (m, x1_scale.dtype, tuple(x1_scale.shape)))
    check(x2_scale.dtype in (torch.float32, torch.bfloat16), op, "x2_scale must be float32 or bfloat16")
    check(x2_scale.dim() == 1 and x2_scale.numel() in (1, n), op,
          "x2_scale must be (%d,) or (1,), got %s", (n, tuple(x2_scale.shape)))
    out_dtype = torch.bfloat16 if (x2_scale.dtype == torch.bfloat16
                                   or (bias is not None and bias.dtype == torch.bfloat16)) else torch.float16
    acc = torch.matmul(x1.to(torch.int64), x2.to(torch.int64))
    int_bias = bias is not None and bias.dtype == torch.int32
    if bias is not None:
        check(bias.dtype in (torch.int32, torch.float32, torch.float16, torch.bfloat16), op,
              "bias dtype must be int32/float32/float16/bfloat16, got %s", bias.dtype)
        check(bias.shape[-1] == n and bias.dim() in (1, 3), op,
              "bias must be (%d,) or (batch, 1, %d), got %s", (n, n, tuple(bias.shape)))
    if int_bias:
        acc = acc + bias.to(torch.int64)
    q = acc.to(torch.float32) * x2_scale.float() * x1_scale.unsqueeze(-1)
    if bias is not None and not int_bias:
        q = q + bias.float()
    return torch.nn.functional.gelu(q, approximate=_APPROX[approximate]).to(out_dtype)
