"""Meta kernels (output shapes and dtypes only) for the quantised matmul variants that are not
emulated (npu_add_quant_gmm(_), npu_add_quant_matmul(_), npu_dual_level_quant_matmul,
npu_matmul_compress_dequant): FakeTensor / torch.compile can trace through them, a real CPU/npu call
still raises NotImplementedError naming the op.

Shapes and dtypes follow the ops' torch_npu documentation and op-plugin's own output-size code
(read, not copied): see docs/ops-quant.md for the per-op rules. Integer dtype arguments
(``y_dtype``, ``output_dtype``, ...) take a ``torch.dtype``, its ScalarType code or a torch_npu
``_cd.DType`` code; one with no torch dtype (hifloat8, float4 ...) raises NotImplementedError
naming the argument. Outputs the real op leaves undefined are returned as None.
"""
import torch

from torch_npu.op_plugin._common import check, new_empty
from torch_npu.op_plugin._registry import meta
from torch_npu.op_plugin.quant.quantize import _dtype_or_default

__all__ = []


# ----------------------------------------------------------------- in-place accumulate matmuls

@meta("npu_add_quant_gmm")
def npu_add_quant_gmm(self, x1, x2, x2_scale, group_list, *, x1_scale=None, group_list_type=0, group_sizes=None,
                      x1_dtype=None, x2_dtype=None, x1_scale_dtype=None, x2_scale_dtype=None):
    check(group_sizes is None, "npu_add_quant_gmm", "group_sizes is not supported currently")
    return torch.empty_like(self)


@meta("npu_add_quant_gmm_")
def npu_add_quant_gmm_(self, x1, x2, x2_scale, group_list, *, x1_scale=None, group_list_type=0, group_sizes=None,
                       x1_dtype=None, x2_dtype=None, x1_scale_dtype=None, x2_scale_dtype=None):
    check(group_sizes is None, "npu_add_quant_gmm_", "group_sizes is not supported currently")
    return self


@meta("npu_add_quant_matmul")
def npu_add_quant_matmul(self, x1, x2, x2_scale, *, x1_scale=None, group_sizes=None, x1_dtype=None, x2_dtype=None,
                         x1_scale_dtype=None, x2_scale_dtype=None):
    return torch.empty_like(self)


@meta("npu_add_quant_matmul_")
def npu_add_quant_matmul_(self, x1, x2, x2_scale, *, x1_scale=None, group_sizes=None, x1_dtype=None, x2_dtype=None,
                          x1_scale_dtype=None, x2_scale_dtype=None):
    return self


# ----------------------------------------------------------------- quantised matmuls

@meta("npu_dual_level_quant_matmul")
def npu_dual_level_quant_matmul(x1, x2, x1_level0_scale, x2_level0_scale, x1_level1_scale, x2_level1_scale, *,
                                bias=None, output_dtype=15):
    op = "npu_dual_level_quant_matmul"
    check(x1.dim() == 2 and x2.dim() == 2, op, "x1 and x2 must be 2-D, got %dD and %dD", (x1.dim(), x2.dim()))
    # both hold two float4 values per byte along K: x1 (m, k/2), x2 (n, k/2)
    check(x1.shape[1] == x2.shape[1], op, "the k of x1 and x2 should be equal, got %d and %d",
           (x1.shape[1] * 2, x2.shape[1] * 2))
    return new_empty((x1.shape[0], x2.shape[0]), _dtype_or_default(op, "output_dtype", output_dtype, torch.bfloat16), x1)


@meta("npu_matmul_compress_dequant")
def npu_matmul_compress_dequant(x1, x2, compress_index, bias, scale, *, offsetW=None, offsetX=None):
    op = "npu_matmul_compress_dequant"
    check(offsetW is None, op, "offsetW currently only supports None")
    check(offsetX in (None, 0), op, "offsetX currently only supports 0, got %r", (offsetX,))
    check(x1.dim() == 2 and scale.dim() == 2 and bias.dim() == 2, op, "x1, scale and bias must be 2-D")
    return new_empty((x1.shape[0], bias.shape[1]), torch.float16, x1)


# ----------------------------------------------------------------- communication + matmul


# ----------------------------------------------------------------- MoE routing


# ----------------------------------------------------------------- MoE distribute (expert parallel)
