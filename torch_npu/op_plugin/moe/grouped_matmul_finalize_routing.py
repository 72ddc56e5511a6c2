"""npu_grouped_matmul_finalize_routing: int8 grouped matmul whose rows are combined back per token.

Documented A8W8 scenario (torch_npu docs; the real op's test golden), rows ``r`` of ``x`` in
group ``g`` (consecutive groups of ``group_list`` rows, counts for ``group_list_type=1``,
cumulative ends for 0; rows past the last group are not used)::

    mm_r = float(x[r] @ w[g]) * scale[g] * pertoken_scale[r]      (int32 accumulation)
    y[row_index[r]] += logit[r] * mm_r
    y[shared_input_offset : shared_input_offset + len(shared_input)] += shared_input_weight * shared_input

``y`` is float32 ``(output_bs or m, n)``. ``w`` is ``(e, k, n)`` int8: the FRACTAL_NZ format the
hardware wants is only a metadata tag here (npu_format_cast keeps the logical shape). Without
``logit`` the rows are added unweighted; without ``scale``/``pertoken_scale`` that factor is 1.
The A8W4 (int32-packed int4 ``w``, ``bias``, ``offset``) and Ascend 950 mx/fp8 scenarios, and a
missing ``row_index``, raise NotImplementedError. ``group_list`` is read on the host (the split
needs the counts), so the op is registered opaque: one node under torch.compile running this
kernel, the fake kernel giving the ``(output_bs or m, n)`` float32 shape.
"""
import torch

from torch_npu.op_plugin._common import check, unsupported
from torch_npu.op_plugin._opaque_vjp import non_differentiable
from torch_npu.op_plugin._registry import opaque

__all__ = []

_OP = "npu_grouped_matmul_finalize_routing"


def _counts(group_list, group_list_type):
    """Rows per group, read on the host (the split needs them)."""
    values = [int(v) for v in group_list.tolist()]
    if group_list_type == 0:
        return [b - a for a, b in zip([0] + values[:-1], values)]
    return values


def _check_args(x, w, group_list, bias, offset, row_index, dtype, output_bs, group_list_type, x_dtype, w_dtype,
                scale_dtype, pertoken_scale_dtype):
    """The checks that need no values; returns the output shape (output_bs or m, n)."""
    check(group_list_type in (0, 1, None), _OP, "only support group_list_type's value 0 or 1.")
    check(x.dim() == 2 and w.dim() == 3, _OP, "x dim is 2 weight dim is 3")
    check(dtype in (None, torch.float32), _OP, "The dtype should be float")
    if x.dtype != torch.int8 or w.dtype != torch.int8:
        unsupported(_OP, "x %s / w %s (only the int8 A8W8 scenario)" % (x.dtype, w.dtype))
    for name, value in (("bias", bias), ("offset", offset), ("x_dtype", x_dtype), ("w_dtype", w_dtype),
                        ("scale_dtype", scale_dtype), ("pertoken_scale_dtype", pertoken_scale_dtype)):
        if value is not None:
            unsupported(_OP, "%s (A8W4 / mx scenarios)" % name)
    if row_index is None:
        unsupported(_OP, "row_index=None (the combine index is undocumented then)")
    m, k = x.shape
    e, wk, n = w.shape
    check(wk == k, _OP, "k of x %d and w %d differ", (k, wk))
    check(group_list.dim() == 1 and group_list.numel() == e, _OP, "group_list must be (e,) with e=%d", e)
    return output_bs or m, n


def _finalize_routing_fake(x, w, group_list, *, scale=None, bias=None, offset=None, pertoken_scale=None,
                           shared_input=None, logit=None, row_index=None, dtype=None, shared_input_weight=1.0,
                           shared_input_offset=0, output_bs=0, group_list_type=1, tuning_config=None, x_dtype=None,
                           w_dtype=None, scale_dtype=None, pertoken_scale_dtype=None):
    shape = _check_args(x, w, group_list, bias, offset, row_index, dtype, output_bs, group_list_type, x_dtype,
                        w_dtype, scale_dtype, pertoken_scale_dtype)
    return x.new_empty(shape, dtype=torch.float32)


@opaque("npu_grouped_matmul_finalize_routing", fake=_finalize_routing_fake)
def npu_grouped_matmul_finalize_routing(x, w, group_list, *, scale=None, bias=None, offset=None,
                                        pertoken_scale=None, shared_input=None, logit=None,
                                        row_index=None, dtype=None, shared_input_weight=1.0,
                                        shared_input_offset=0, output_bs=0, group_list_type=1,
                                        tuning_config=None, x_dtype=None, w_dtype=None,
                                        scale_dtype=None, pertoken_scale_dtype=None):
    """See the module doc."""
    out_rows, n = _check_args(x, w, group_list, bias, offset, row_index, dtype, output_bs, group_list_type,
                              x_dtype, w_dtype, scale_dtype, pertoken_scale_dtype)
    m = x.shape[0]
    e = w.shape[0]
    counts = _counts(group_list, 1 if group_list_type is None else group_list_type)
    used = sum(counts)
    check(min(counts) >= 0 and used <= m, _OP, "group_list must give non-negative sizes summing to <= m=%d", m)
    # int8 products summed exactly (int32 on hardware; float64 holds these sums exactly)
    parts = torch.split(x[:used].double(), counts)
    mm = torch.cat([part @ w[g].double() for g, part in enumerate(parts)]).float()
    groups = torch.repeat_interleave(torch.arange(e, device=x.device),
                                     torch.tensor(counts, device=x.device))
    if scale is not None:
        check(tuple(scale.shape) in ((e, n), (e, 1, n)), _OP, "scale must be (e, n), got %s", (tuple(scale.shape),))
        check(scale.is_floating_point(), _OP, "an int64 scale is the A8W4 scenario")
        mm = mm * scale.reshape(e, n).float()[groups]
    if pertoken_scale is not None:
        mm = mm * pertoken_scale.reshape(-1)[:used].float().unsqueeze(1)
    if logit is not None:
        mm = mm * logit.reshape(-1)[:used].float().unsqueeze(1)
    y = torch.zeros((out_rows, n), dtype=torch.float32, device=x.device)
    y = y.index_add(0, row_index.reshape(-1)[:used].long(), mm)
    if shared_input is not None:
        s = shared_input.shape[0]
        check(shared_input_offset + s <= out_rows, _OP, "shared_input_offset + shared_input rows exceed the output rows")
        shared = shared_input.float() * shared_input_weight
        y = y + torch.nn.functional.pad(shared, (0, 0, shared_input_offset, out_rows - shared_input_offset - s))
    return y


non_differentiable("npu_grouped_matmul_finalize_routing")
