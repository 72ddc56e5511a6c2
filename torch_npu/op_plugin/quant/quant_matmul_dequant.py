"""npu_quant_matmul_dequant: quantise float16 activations to int8, int8 matmul, dequantise.

Semantics from op-plugin's test golden (``TestQuantMatmulDequant``, Ascend310P; the
shapes/dtypes from its adapter). ``x`` float16 ``[M, K]``, ``quantized_weight`` int8 ``[N, K]``,
``weight_scale`` float32 ``[N]``; result float16 ``[M, N]``:

* ``quant_mode='pertoken'`` (dynamic): per row ``t = max|x| / 127``,
  ``xq = round(x * (1 / t))`` int8, ``y = (xq @ W^T) * weight_scale * t``.
* ``quant_mode='pertensor'`` (static): ``x_scale`` float32 ``[1]`` given,
  ``xq = round(x * smooth_scale * (1 / x_scale))`` int8 (``smooth_scale`` ``[K]`` optional),
  ``y = (xq @ W^T) * weight_scale * x_scale``.

``round`` is half to even, saturated to int8; the integer products are summed exactly (float64
accumulation of int8 products) and the dequantisation runs in float32. A row of zeros gets
t = 0 and a zero result. ``bias``, ``x_offset``, and ``smooth_scale`` in the pertoken mode are
not in the golden and raise NotImplementedError naming them.

npu_quant_grouped_matmul_dequant (golden ``TestQuantGroupedMatmulDequant``): the same per row,
with ``quantized_weight`` int8 ``[G, N, K]``, ``weight_scale`` float32 ``[G, N]`` and
``group_list`` the cumulative row ends (row ``r`` belongs to group ``g`` with
``group_list[g-1] <= r < group_list[g]``), so row ``r`` uses ``W[g]`` and ``weight_scale[g]``.
Rows past the last end are not written by the kernel (undefined on the NPU); here they are 0.
The group of each row is found with ``searchsorted`` (no host read); every group's product is
formed and the row's own one selected.
"""
import torch

from torch_npu.op_plugin._common import check, unsupported
from torch_npu.op_plugin._registry import impl

__all__ = []


def _int8(v):
    return torch.round(v).clamp(-128, 127)


def _checks(op, x, quantized_weight, weight_scale, w_dims):
    """The adapter's argument checks (op-plugin QuantMatmulDequant / QuantGroupedMatmulDequant)."""
    check(x.dim() == 2, op, "the x dim support only 2")
    check(x.dtype == torch.float16, op, "the x dtype support only float16")
    check(quantized_weight.dim() == w_dims, op, "the quantized_weight dim support only %d", w_dims)
    check(quantized_weight.dtype == torch.int8, op, "the quantized_weight dtype support only int8")
    check(weight_scale.dim() == w_dims - 1, op, "the weight_scale dim support only %d", (w_dims - 1))
    check(weight_scale.dtype == torch.float32, op, "the weight_scale dtype support only float")
    check(x.shape[1] == quantized_weight.shape[-1], op, "x shape[1] not equal to quantized_weight shape[-1]")
    check(tuple(weight_scale.shape) == tuple(quantized_weight.shape[:-1]), op,
          "weight_scale shape must equal quantized_weight shape[:-1]")


def _quantize_rows(op, x, bias, x_scale, x_offset, smooth_scale, quant_mode):
    """``(xq [M, K] float holding int8 values, t [M, 1] or [1, 1] dequantisation factor)``."""
    mode = 'pertoken' if quant_mode is None else quant_mode
    for name, value in (("bias", bias), ("x_offset", x_offset)):
        if value is not None:
            raise NotImplementedError("%s: %s is not supported by the CPU-emulated NPU (not in the golden)"
                                      % (op, name))
    xf = x.float()
    if mode == 'pertoken':
        if x_scale is not None or smooth_scale is not None:
            raise NotImplementedError("%s: x_scale/smooth_scale with quant_mode='pertoken' is not supported by the "
                                      "CPU-emulated NPU (not in the golden)" % op)
        t = xf.abs().amax(dim=1, keepdim=True) / 127.0
        inv = torch.where(t > 0, 1.0 / t, torch.zeros_like(t))
    elif mode == 'pertensor':
        check(x_scale is not None, op, "x_scale is required when quant_mode is 'pertensor'")
        check(x_scale.numel() == 1 and x_scale.dtype == torch.float32, op, "x_scale must be float32 [1]")
        if smooth_scale is not None:
            check(tuple(smooth_scale.shape) == (x.shape[1],), op,
                  "smooth_scale must be [%d], got %s", (x.shape[1], tuple(smooth_scale.shape)))
            xf = xf * smooth_scale.float()
        t = x_scale.float().reshape(1, 1)
        inv = 1.0 / t
    else:
        unsupported(op, "quant_mode=%r" % (quant_mode,))
    return _int8(xf * inv), t


@impl("npu_quant_matmul_dequant")
def npu_quant_matmul_dequant(x, quantized_weight, weight_scale, *, bias=None, x_scale=None, x_offset=None,
                             smooth_scale=None, quant_mode='pertoken'):
    """float16 ``[M, N]``. See the module doc."""
    op = "npu_quant_matmul_dequant"
    _checks(op, x, quantized_weight, weight_scale, 2)
    xq, t = _quantize_rows(op, x, bias, x_scale, x_offset, smooth_scale, quant_mode)
    acc = (xq.double() @ quantized_weight.double().t()).float()
    return (acc * weight_scale * t).to(torch.float16)


@impl("npu_quant_grouped_matmul_dequant")
def npu_quant_grouped_matmul_dequant(x, quantized_weight, weight_scale, group_list, *, bias=None, x_scale=None,
                                     x_offset=None, smooth_scale=None, quant_mode='pertoken'):
    """float16 ``[M, N]``; row r uses its group's weight and scale. See the module doc."""
    op = "npu_quant_grouped_matmul_dequant"
    _checks(op, x, quantized_weight, weight_scale, 3)
    g = quantized_weight.shape[0]
    check(group_list.dim() == 1 and group_list.shape[0] == g, op,
          "group_list must be 1-D of length %d (the weight's groups), got %s", (g, tuple(group_list.shape)))
    check(group_list.dtype in (torch.int32, torch.int64), op, "group_list must be int64, got %s", group_list.dtype)
    xq, t = _quantize_rows(op, x, bias, x_scale, x_offset, smooth_scale, quant_mode)
    m = x.shape[0]
    rows = torch.arange(m, device=x.device, dtype=group_list.dtype)
    gid = torch.searchsorted(group_list.contiguous(), rows, right=True)
    inside = (gid < g).unsqueeze(1)
    gid = gid.clamp(max=g - 1)
    every = torch.einsum("mk,gnk->gmn", xq.double(), quantized_weight.double()).float()   # [G, M, N]
    acc = every[gid, torch.arange(m, device=x.device)]
    y = acc * weight_scale.index_select(0, gid) * t
    return torch.where(inside, y, torch.zeros_like(y)).to(torch.float16)
