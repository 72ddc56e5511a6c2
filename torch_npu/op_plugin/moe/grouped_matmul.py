"""npu_grouped_matmul (+ .List): per-group matmuls ``y_i = x_i @ weight_i + bias_i`` (float path).

``x`` is split into groups by ``group_list`` (cumulative ends or per-group counts) or given as a
list; ``split_item`` picks one output per group or one concatenated tensor. Computed in float32
for float16/bfloat16, outputs in the dtype of x. Quantisation / activation inputs,
``act_type != 0``, ``output_dtype`` and ``group_type`` 2 raise NotImplementedError.
"""
import torch

from torch_npu.op_plugin._common import acc, check, unsupported
from torch_npu.op_plugin._registry import impl

__all__ = []


_GMM_QUANT_ARGS = ("scale", "offset", "antiquant_scale", "antiquant_offset", "per_token_scale",
                   "activation_input", "activation_quant_scale", "activation_quant_offset",
                   "x_dtype", "weight_dtype", "scale_dtype", "per_token_scale_dtype")


def _group_sizes(op, group_list, group_list_type, m):
    if group_list_type not in (None, 0, 1):
        unsupported(op, "group_list_type=%s (only 0 cumulative, 1 counts)" % group_list_type)
    if isinstance(group_list, torch.Tensor):
        vals = [int(v) for v in group_list.reshape(-1).tolist()]
    else:
        vals = [int(v) for v in group_list]
    if group_list_type in (None, 0):
        sizes = [b - a for a, b in zip([0] + vals[:-1], vals)]
    else:
        sizes = vals
    check(all(s >= 0 for s in sizes), op, "group_list gives negative group sizes %s", sizes)
    if sum(sizes) != m:
        unsupported(op, "group_list covering %d of the %d rows of x (must cover all)" % (sum(sizes), m))
    return sizes


def _grouped_matmul(op, x, weight, bias, group_list, split_item, group_type, group_list_type, act_type,
                    output_dtype, extras):
    for name, value in extras.items():
        if value is not None:
            unsupported(op, "%s (quantization/activation inputs must be None)" % name)
    if act_type not in (None, 0):
        unsupported(op, "act_type=%s (only 0)" % act_type)
    if output_dtype is not None:
        unsupported(op, "output_dtype=%s (only None: the dtype of x)" % output_dtype)
    if split_item not in (None, 0, 1, 2, 3):
        unsupported(op, "split_item=%s" % split_item)
    if group_type not in (None, -1, 0):
        unsupported(op, "group_type=%s (only -1/None no split, 0 split M)" % group_type)
    x = list(x)
    weight = list(weight)
    check(len(x) >= 1 and len(weight) >= 1, op, "x and weight must be non-empty lists")
    if len(weight) == 1 and weight[0].dim() == 3:
        weight = list(weight[0].unbind(0))
    if bias is not None:
        bias = list(bias)
        if len(bias) == 1 and bias[0].dim() == 2 and len(weight) > 1:
            bias = list(bias[0].unbind(0))
        check(len(bias) == len(weight), op, "bias list length %d != weight groups %d", (len(bias), len(weight)))
    g = len(weight)
    if group_list is not None and group_type != -1:
        check(len(x) == 1, op, "group_list needs a single x tensor")
        xs = x[0]
        check(xs.dim() == 2, op, "x split by group_list must be 2D")
        sizes = _group_sizes(op, group_list, group_list_type, xs.shape[0])
        check(len(sizes) == g, op, "group_list has %d groups, weight has %d", (len(sizes), g))
        x = list(torch.split(xs, sizes, dim=0))
    else:
        if group_list is not None:
            unsupported(op, "group_list with group_type=-1")
        if len(x) == 1 and g > 1:
            unsupported(op, "a single x with %d weights and no group_list" % g)
        check(len(x) == g, op, "x has %d tensors, weight has %d", (len(x), g))
    outs = []
    for i in range(g):
        xi, wi = x[i], weight[i]
        check(wi.dim() == 2, op, "weight[%d] must be 2D [K, N]", i)
        check(xi.shape[-1] == wi.shape[0], op, "x[%d] K=%d != weight[%d] K=%d", (i, xi.shape[-1], i, wi.shape[0]))
        y = torch.matmul(acc(xi), acc(wi).to(acc(xi).dtype))
        if bias is not None:
            y = y + acc(bias[i]).to(y.dtype)
        outs.append(y.to(xi.dtype))
    if split_item in (2, 3):
        check(all(o.dim() == 2 for o in outs), op, "split_item 2/3 needs 2D outputs")
        return [torch.cat(outs, 0)]
    return outs


@impl("npu_grouped_matmul")
def npu_grouped_matmul(x, weight, *, bias=None, scale=None, offset=None, antiquant_scale=None,
                       antiquant_offset=None, per_token_scale=None, group_list=None, activation_input=None,
                       activation_quant_scale=None, activation_quant_offset=None, split_item=0, group_type=None,
                       group_list_type=0, act_type=0, tuning_config=None, output_dtype=None, x_dtype=None,
                       weight_dtype=None, scale_dtype=None, per_token_scale_dtype=None):
    """Grouped matmul (float path): ``y_i = x_i @ weight_i + bias_i`` per group.

    ``weight`` is a list of [K, N] tensors (or one [G, K, N]); ``bias`` a matching list of
    [N] (or one [G, N]). With a single 2D ``x`` and ``group_list`` (``group_type`` 0 or
    None), ``x`` is split along dim 0: ``group_list_type`` 0 = cumulative ends,
    1 = per-group counts; the groups must cover all rows. ``split_item`` 0/1 returns one
    output per group, 2/3 one tensor concatenated along dim 0. Computed in float32 for
    float16/bfloat16, outputs in the dtype of x. Quantization / activation inputs,
    ``act_type != 0``, ``output_dtype``, ``group_type`` 2 are not supported.
    """
    extras = dict(scale=scale, offset=offset, antiquant_scale=antiquant_scale, antiquant_offset=antiquant_offset,
                  per_token_scale=per_token_scale, activation_input=activation_input,
                  activation_quant_scale=activation_quant_scale, activation_quant_offset=activation_quant_offset,
                  x_dtype=x_dtype, weight_dtype=weight_dtype, scale_dtype=scale_dtype,
                  per_token_scale_dtype=per_token_scale_dtype)
    return _grouped_matmul("npu_grouped_matmul", x, weight, bias, group_list, split_item, group_type,
                           group_list_type, act_type, output_dtype, extras)


@impl("npu_grouped_matmul.List")
def npu_grouped_matmul_list(x, weight, *, bias=None, scale=None, offset=None, antiquant_scale=None,
                            antiquant_offset=None, per_token_scale=None, group_list=None, activation_input=None,
                            activation_quant_scale=None, activation_quant_offset=None, split_item=0,
                            group_type=None, group_list_type=0, act_type=0, output_dtype=None):
    """:func:`npu_grouped_matmul` with ``group_list`` given as an int list."""
    extras = dict(scale=scale, offset=offset, antiquant_scale=antiquant_scale, antiquant_offset=antiquant_offset,
                  per_token_scale=per_token_scale, activation_input=activation_input,
                  activation_quant_scale=activation_quant_scale, activation_quant_offset=activation_quant_offset)
    return _grouped_matmul("npu_grouped_matmul", x, weight, bias, group_list, split_item, group_type,
                           group_list_type, act_type, output_dtype, extras)
