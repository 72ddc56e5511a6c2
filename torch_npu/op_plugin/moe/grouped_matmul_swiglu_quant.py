"""npu_grouped_matmul_swiglu_quant / _v2: grouped int8 matmul, dequant, SwiGLU, per-token int8 quant.

The A8W8 scenario of the torch_npu docs, per group ``i`` (its token rows from ``group_list``):

    C_i = (X_i @ W_i) * x_scale_i * w_scale_i          (int32 products, float32 dequant)
    C_act, gate = C_i[:, :N/2], C_i[:, N/2:]            (split along N)
    S_i = Swish(C_act) * gate,  Swish(x) = x / (1 + exp(-x))
    Q_scale_i = max|S_i| / 127 (per row),  Q_i = round(S_i / Q_scale_i)   (int8)

``x (M, K)`` int8, ``weight (E, K, N)`` int8 -- or the 5-D FRACTAL_NZ storage view ``(E, N/32, K/16,
16, 32)`` the docs build with ``npu_format_cast(weight, 29).view(...)``; private formats keep the ND
layout on the CPU-emulated NPU, so that view holds the ND data and is read back as ``(E, K, N)`` --
``weight_scale (E, N)`` float32/float16/bfloat16, ``x_scale (M,)`` float32, ``group_list (E,)``
int64 cumulative ends (``_v2``: ``group_list_type`` 0) or counts (1). Rows past the last group are
left undefined by the real op and are zero here. v1 also returns the reserved ``output_offset``
(a 0-d float32 tensor). Group membership is computed with tensor comparisons (no host read).

Not emulated (NotImplementedError): A8W4 / A4W4 (int4 or int32-packed weights, int64 weight
scales, ``bias``/``weight_assist_matrix``, ``smooth_scale``), ``offset``, ``dequant_mode`` /
``quant_mode`` / ``quant_dtype`` / ``dequant_dtype`` other than the defaults, the ``*_dtype`` overrides.
"""
import torch

from torch_npu.op_plugin._common import check, unsupported
from torch_npu.op_plugin._registry import impl

__all__ = []

_INT8_MAX = 127.0


def _nd_weight(op, weight):
    """(E, K, N) view of an int8 weight given as ND (E, K, N) or as the NZ storage view."""
    if weight.dtype != torch.int8:
        unsupported(op, "%s weight (A8W4/A4W4; only int8 A8W8)" % weight.dtype)
    if weight.dim() == 3:
        return weight
    check(weight.dim() == 5, op, "weight must be (E, K, N) or the FRACTAL_NZ view (E, N/32, K/16, 16, 32)")
    e, n_blocks, k_blocks, k_inner, n_inner = weight.shape
    return weight.reshape(e, k_blocks * k_inner, n_blocks * n_inner)


def _swiglu_quant(op, x, weight, weight_scale, x_scale, group_list, counts):
    check(x.dim() == 2 and x.dtype == torch.int8, op, "x must be 2-D int8 (M, K)")
    w = _nd_weight(op, weight)
    e, k, n = w.shape
    m = x.shape[0]
    check(x.shape[1] == k, op, "x has K=%d, weight has K=%d", (x.shape[1], k))
    check(n % 2 == 0, op, "N=%d must be even (SwiGLU halves it)", n)
    if weight_scale.dtype == torch.int64:
        unsupported(op, "int64 weight_scale (A8W4 per-channel)")
    check(weight_scale.dtype in (torch.float32, torch.float16, torch.bfloat16), op,
          "weight_scale must be float32, float16 or bfloat16, got %s", weight_scale.dtype)
    check(tuple(weight_scale.shape) == (e, n), op, "weight_scale must be (E, N) = (%d, %d)", (e, n))
    check(x_scale.dim() == 1 and x_scale.shape[0] == m and x_scale.dtype == torch.float32, op,
          "x_scale must be float32 (M=%d,)", m)
    check(group_list.dim() == 1 and group_list.shape[0] == e, op, "group_list must be 1-D with E=%d entries", e)
    sizes = group_list.long()
    ends = torch.cumsum(sizes, 0) if counts else sizes
    rows = torch.arange(m, device=x.device)
    expert = torch.searchsorted(ends.contiguous(), rows, right=True)        # E for rows past the last group
    valid = expert < e
    xf = x.double()
    products = torch.zeros(m, n, dtype=torch.float32, device=x.device)
    for i in range(e):
        part = torch.matmul(xf, w[i].double()).float() * weight_scale[i].float()
        products = torch.where((expert == i).unsqueeze(1), part, products)
    c = products * x_scale.unsqueeze(1)
    act, gate = c[:, :n // 2], c[:, n // 2:]
    s = act * torch.sigmoid(act) * gate
    q_scale = s.abs().amax(-1) / _INT8_MAX
    q = torch.round(s / q_scale.unsqueeze(1))
    keep = valid.unsqueeze(1) & (q_scale.unsqueeze(1) > 0)
    q = torch.where(keep, q, torch.zeros_like(q)).to(torch.int8)
    return q, torch.where(valid, q_scale, torch.zeros_like(q_scale))


@impl("npu_grouped_matmul_swiglu_quant")
def npu_grouped_matmul_swiglu_quant(x, weight, group_list, weight_scale, x_scale, *, bias=None, offset=None):
    op = "npu_grouped_matmul_swiglu_quant"
    if bias is not None:
        unsupported(op, "bias (the A8W4 weight assist matrix)")
    if offset is not None:
        unsupported(op, "offset (reserved)")
    q, q_scale = _swiglu_quant(op, x, weight, weight_scale, x_scale, group_list, counts=False)
    return q, q_scale, x_scale.new_zeros(())


@impl("npu_grouped_matmul_swiglu_quant_v2")
def npu_grouped_matmul_swiglu_quant_v2(x, weight, weight_scale, x_scale, group_list, *, smooth_scale=None,
                                       weight_assist_matrix=None, bias=None, dequant_mode=0, dequant_dtype=6,
                                       quant_mode=0, quant_dtype=1, group_list_type=0, tuning_config=None,
                                       x_dtype=None, weight_dtype=None, weight_scale_dtype=None,
                                       x_scale_dtype=None):
    op = "npu_grouped_matmul_swiglu_quant_v2"
    for name, value in (("smooth_scale", smooth_scale), ("weight_assist_matrix", weight_assist_matrix),
                        ("bias", bias), ("x_dtype", x_dtype), ("weight_dtype", weight_dtype),
                        ("weight_scale_dtype", weight_scale_dtype), ("x_scale_dtype", x_scale_dtype)):
        if value is not None:
            unsupported(op, name)
    # defaults: per-token x per-channel dequant to float32, per-token int8 quant (0 / the ScalarType codes)
    for name, value, allowed in (("dequant_mode", dequant_mode, (None, 0)), ("dequant_dtype", dequant_dtype, (None, 0, 6)),
                                 ("quant_mode", quant_mode, (None, 0)), ("quant_dtype", quant_dtype, (None, 0, 1))):
        if value not in allowed:
            unsupported(op, "%s=%r" % (name, value))
    check(group_list_type in (None, 0, 1), op, "group_list_type must be 0 (cumsum) or 1 (count)")
    check(len(weight) == 1 and len(weight_scale) == 1, op, "weight and weight_scale must be lists of one tensor")
    return _swiglu_quant(op, x, weight[0], weight_scale[0], x_scale, group_list, counts=group_list_type == 1)
