"""npu_quant_matmul_reduce_sum: quantised batched matmul summed over the batch.

Documented formula: ``out = sum_b (x1[b] @ x2[b]) * x1_scale[b][:, None] * x2_scale[None, :]``
with int8 ``x1 (B, m, k)``, int8 ``x2 (B, k, n)``, float32 ``x1_scale (B, m)``, bfloat16
``x2_scale (n,)``; the output is bfloat16 ``(m, n)``. ``x2`` is NZ-formatted on hardware; the
emulator's data layout is always ND, so ``x2`` is read as ``(B, k, n)``. int32 products are
exact; the scaling and the sum run in float32.
"""
import torch

from torch_npu.op_plugin._common import check
from torch_npu.op_plugin._registry import impl

__all__ = []


@impl("npu_quant_matmul_reduce_sum")
def npu_quant_matmul_reduce_sum(x1, x2, *, x1_scale=None, x2_scale=None):
    """See the module doc."""
    op = "npu_quant_matmul_reduce_sum"
    check(x1_scale is not None and x2_scale is not None, op, "x1_scale and x2_scale are required")
    check(x1.dtype == torch.int8 and x2.dtype == torch.int8, op, "x1 and x2 must be int8")
    check(x1.dim() == 3 and x2.dim() == 3, op, "x1 (B, m, k) and x2 (B, k, n) must be 3-d")
    b, m, k = x1.shape
    check(x2.shape[0] == b and x2.shape[1] == k, op, "x2 must be (%d, %d, n), got %s", (b, k, tuple(x2.shape)))
    n = x2.shape[2]
    check(x1_scale.dtype == torch.float32 and tuple(x1_scale.shape) == (b, m), op,
          "x1_scale must be float32 of shape (%d, %d)", (b, m))
    check(x2_scale.dtype == torch.bfloat16 and tuple(x2_scale.shape) == (n,), op,
          "x2_scale must be bfloat16 of shape (%d,)", n)
    acc = torch.matmul(x1.to(torch.int64), x2.to(torch.int64)).float()        # exact int products
    y = acc * x1_scale.float()[:, :, None] * x2_scale.float()
    return y.sum(0).to(torch.bfloat16)
