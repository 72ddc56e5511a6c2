"""Matmul fused with a collective (MC2 ops): npu_mm_all_reduce_base, npu_mm_reduce_scatter_base,
npu_all_gather_base_mm.

On hardware the matmul and the HCCL collective run as one pipelined kernel; the result is the
matmul followed by the collective over the group named by ``hcom``. Here the two run one after
the other. With torch.distributed not initialised (or a one-rank group) the collective is the
identity, which is the single-rank result of the real op. With more ranks, ``hcom`` is resolved
to its process group (``_resolve_process_group``) and torch.distributed's collectives run on it
(hccl when available, any backend that supports the collective otherwise). Under Meta /
FakeTensor the single-rank result is traced as it is computed (the collective is the
identity); with a multi-rank group the collective needs real tensors: shape inference alone
(Meta, a plain FakeTensorMode) gets the output shapes, but while a graph is being built
(torch.compile, make_fx, torch.export) the call raises NotImplementedError (torch.compile
then graph-breaks and runs it eagerly) instead of leaving the exchange out of the graph. The
collectives are not differentiated through (autograd
sees the local matmul only), so backward is exact on one rank only.
Quantised variants (int8 inputs, dequant/pertoken scales, comm quantisation) raise
NotImplementedError.
"""
import torch
import torch.distributed as dist

from torch_npu.op_plugin._common import building_graph, check, symbolic, unsupported
from torch_npu.op_plugin._registry import impl

__all__ = []


def _exchange_runs(op, t):
    """Whether the multi-rank collective runs on ``t``: not on shape-only tensors (their shapes
    are the answer), and never silently dropped from a graph being built."""
    if not symbolic(t):
        return True
    if building_graph():
        raise NotImplementedError("%s: with a multi-rank hcom group the collective needs real tensors; the "
                                  "CPU-emulated NPU cannot record it in a graph (torch.compile runs this call "
                                  "eagerly after a graph break)" % op)
    return False


def _group(op, hcom):
    """The process group of ``hcom``, or None for single-rank semantics."""
    if not (dist.is_available() and dist.is_initialized()):
        return None
    from torch.distributed.distributed_c10d import _resolve_process_group
    try:
        group = _resolve_process_group(hcom)
    except Exception as exc:  # a name that is no group: say which
        raise RuntimeError("%s: hcom %r does not name a process group (%s)" % (op, hcom, exc)) from None
    return None if dist.get_world_size(group) == 1 else group


def _world(op, hcom, world_size):
    group = _group(op, hcom)
    actual = 1 if group is None else dist.get_world_size(group)
    check(world_size == actual, op, "world_size %d does not match the %d rank(s) of hcom %r",
          (world_size, actual, hcom))
    return group


def _check_float_mm(op, x1, x2):
    for name, t in (("x1", x1), ("x2", x2)):
        if not t.is_floating_point():
            unsupported(op, "%s of dtype %s (quantised matmul)" % (name, t.dtype))
    check(x1.dtype == x2.dtype, op, "x1 and x2 must have the same dtype, got %s and %s", (x1.dtype, x2.dtype))
    check(x2.dim() == 2, op, "x2 must be 2-D (k, n), got %s", (tuple(x2.shape),))
    check(x1.size(-1) == x2.size(0), op, "k of x1 %s and x2 %s differ", (tuple(x1.shape), tuple(x2.shape)))


def _antiquant(op, x2, scale, offset, group_size, dtype):
    """Dequantised weight ``(x2 + offset) * scale`` (per-tensor [1], per-channel [n]/[1, n],
    per-group [ceil(k / group_size), n])."""
    k, n = x2.shape
    w = x2.to(dtype)
    if group_size:
        groups = (k + group_size - 1) // group_size
        check(tuple(scale.shape) == (groups, n), op, "per-group antiquant_scale must be (%d, %d), got %s",
              (groups, n, tuple(scale.shape)))
        scale = scale.repeat_interleave(group_size, 0)[:k]
        offset = None if offset is None else offset.repeat_interleave(group_size, 0)[:k]
    else:
        check(scale.numel() in (1, n), op, "antiquant_scale must have 1 or n=%d elements, got %s",
              (n, tuple(scale.shape)))
        scale = scale.reshape(1, -1)
        offset = None if offset is None else offset.reshape(1, -1)
    if offset is not None:
        check(offset.numel() == scale.numel(), op, "antiquant_offset must have the shape of antiquant_scale")
        w = w + offset.to(dtype)
    return w * scale.to(dtype)


@impl("npu_mm_all_reduce_base")
def npu_mm_all_reduce_base(x1, x2, hcom, *, reduce_op="sum", bias=None, antiquant_scale=None,
                           antiquant_offset=None, x3=None, dequant_scale=None, pertoken_scale=None,
                           comm_quant_scale_1=None, comm_quant_scale_2=None, antiquant_group_size=0,
                           comm_turn=0, group_sizes=None, y_dtype=None, x1_dtype=None, x2_dtype=None,
                           dequant_scale_dtype=None, pertoken_scale_dtype=None, comm_quant_mode=0,
                           comm_mode=None):
    """``out = AllReduce_sum(x1 @ x2 + bias + x3)`` over the ranks of ``hcom`` (the documented
    formula): ``x1`` (m, k) or (s, m, k), ``x2`` (k, n), ``bias`` (n,), ``x3`` the output's shape
    (added to each rank's partial result before the reduction).

    Weight-only (pseudo) quantisation: ``x2`` int8 with ``antiquant_scale`` (and optional
    ``antiquant_offset``) uses ``(x2 + offset) * scale`` (per-tensor, per-channel or per-group
    of ``antiquant_group_size`` rows). Only ``reduce_op='sum'`` and ``comm_turn=0`` exist, as on
    hardware. Full quantisation (int8 x1, dequant/pertoken scales) and comm quantisation raise
    NotImplementedError."""
    op = "npu_mm_all_reduce_base"
    check(reduce_op == "sum", op, "reduce_op must be 'sum', got %r", (reduce_op,))
    check(comm_turn == 0, op, "comm_turn must be 0, got %d", comm_turn)
    for name, v in (("dequant_scale", dequant_scale), ("pertoken_scale", pertoken_scale),
                    ("comm_quant_scale_1", comm_quant_scale_1), ("comm_quant_scale_2", comm_quant_scale_2),
                    ("group_sizes", group_sizes), ("y_dtype", y_dtype), ("x1_dtype", x1_dtype),
                    ("x2_dtype", x2_dtype)):
        if v is not None:
            unsupported(op, name)
    if comm_quant_mode:
        unsupported(op, "comm_quant_mode=%d" % comm_quant_mode)
    check(x1.dim() in (2, 3), op, "x1 must be 2-D or 3-D, got %s", (tuple(x1.shape),))
    if antiquant_scale is not None:
        check(x2.dtype == torch.int8, op, "antiquant_scale needs an int8 x2, got %s", x2.dtype)
        check(x3 is None, op, "x3 is not supported with weight-only quantisation")
        weight = _antiquant(op, x2, antiquant_scale, antiquant_offset, antiquant_group_size, x1.dtype)
    else:
        weight = x2
    _check_float_mm(op, x1, weight)
    out = torch.matmul(x1, weight)
    if bias is not None:
        check(bias.dim() == 1 and bias.numel() == weight.size(1), op, "bias must be (n,)")
        out = out + bias
    if x3 is not None:
        check(tuple(x3.shape) == tuple(out.shape), op, "x3 must have the output shape %s, got %s",
              (tuple(out.shape), tuple(x3.shape)))
        out = out + x3
    group = _group(op, hcom)
    if group is not None and _exchange_runs(op, out):
        out = out.contiguous()
        dist.all_reduce(out, op=dist.ReduceOp.SUM, group=group)
    return out


@impl("npu_mm_reduce_scatter_base")
def npu_mm_reduce_scatter_base(self, x2, hcom, world_size, *, reduce_op="sum", bias=None, x1_scale=None,
                               x2_scale=None, comm_turn=0, output_dtype=None, comm_mode=None):
    """``out = reduce_scatter_sum(x1 @ x2 + bias)`` over the ``world_size`` ranks of ``hcom``:
    ``x1`` (m, k), ``x2`` (k, n); the (m, n) products are summed over ranks and rank r keeps
    rows ``[r * m / world_size, (r + 1) * m / world_size)``, so the output is
    (m / world_size, n). Quantised inputs (``x1_scale``/``x2_scale``) raise NotImplementedError."""
    op = "npu_mm_reduce_scatter_base"
    x1 = self
    check(reduce_op == "sum", op, "reduce_op must be 'sum', got %r", (reduce_op,))
    check(comm_turn == 0, op, "comm_turn must be 0, got %d", comm_turn)
    for name, v in (("x1_scale", x1_scale), ("x2_scale", x2_scale), ("output_dtype", output_dtype)):
        if v is not None:
            unsupported(op, name)
    check(x1.dim() == 2, op, "x1 must be 2-D (m, k), got %s", (tuple(x1.shape),))
    _check_float_mm(op, x1, x2)
    check(world_size >= 1 and x1.size(0) % world_size == 0, op,
          "m=%d must be divisible by world_size=%d", (x1.size(0), world_size))
    group = _world(op, hcom, world_size)
    out = torch.matmul(x1, x2)
    if bias is not None:
        check(bias.dim() == 1 and bias.numel() == x2.size(1), op, "bias must be (n,)")
        out = out + bias
    if group is None:
        return out
    rows = x1.size(0) // world_size
    result = out.new_empty((rows, out.size(1)))
    if _exchange_runs(op, out):
        dist.reduce_scatter_tensor(result, out.contiguous(), op=dist.ReduceOp.SUM, group=group)
    return result


@impl("npu_all_gather_base_mm")
def npu_all_gather_base_mm(self, x2, hcom, world_size, *, bias=None, x1_scale=None, x2_scale=None,
                           gather_index=0, gather_output=True, comm_turn=0, output_dtype=None,
                           comm_mode=None):
    """``gather_out = all_gather(x1)`` along dim 0 over the ``world_size`` ranks of ``hcom``
    (rank order), ``output = gather_out @ x2 + bias``: ``x1`` (m, k), ``x2`` (k, n), output
    (m * world_size, n). Returns ``(output, gather_out)``; ``gather_out`` is an empty tensor when
    ``gather_output=False``. Only ``gather_index=0`` and ``comm_turn=0`` exist, as on hardware.
    Quantised inputs (``x1_scale``/``x2_scale``) raise NotImplementedError."""
    op = "npu_all_gather_base_mm"
    x1 = self
    check(gather_index == 0, op, "gather_index must be 0, got %d", gather_index)
    check(comm_turn == 0, op, "comm_turn must be 0, got %d", comm_turn)
    for name, v in (("x1_scale", x1_scale), ("x2_scale", x2_scale), ("output_dtype", output_dtype)):
        if v is not None:
            unsupported(op, name)
    check(x1.dim() == 2, op, "x1 must be 2-D (m, k), got %s", (tuple(x1.shape),))
    _check_float_mm(op, x1, x2)
    group = _world(op, hcom, world_size)
    if group is None:
        gathered = x1
    else:
        gathered = x1.new_empty((x1.size(0) * world_size, x1.size(1)))
        if _exchange_runs(op, x1):
            dist.all_gather_into_tensor(gathered, x1.contiguous(), group=group)
    out = torch.matmul(gathered, x2)
    if bias is not None:
        check(bias.dim() == 1 and bias.numel() == x2.size(1), op, "bias must be (n,)")
        out = out + bias
    gather_out = gathered.clone() if gather_output else x1.new_empty((0,))
    return out, gather_out
