"""Collective + matmul fusions on the hcom process group: AlltoAll + matmul (both orders),
npu_quant_mm_reduce_scatter and npu_all_gather_quant_mm (their non-MX paths).

From the torch_npu docs (``rankSize`` = ``world_size``, 2, 4, 8 or 16 ranks):

* ``npu_all_to_all_matmul`` (communicate first): ``x1 (BS, H)`` is cut into ``rankSize`` blocks of
  ``BS/rankSize`` rows, block ``r`` goes to rank ``r``; the received blocks ``commOut (rankSize,
  BS/rankSize, H)`` are laid side by side, ``permutedOut = commOut.permute(1, 0, 2).view(BS/rankSize,
  rankSize*H)``, and ``y = permutedOut @ x2 + bias`` with ``x2 (H*rankSize, N)``; the second output
  is ``permutedOut`` (``all2all_out_flag``) or None.
* ``npu_matmul_all_to_all`` (compute first): ``computeOut = x1 @ x2 + bias`` ``(BS, H2)``, its column
  block ``r`` (``H2/rankSize`` wide) goes to rank ``r``; ``y = AlltoAll(...).view(rankSize*BS,
  H2/rankSize)`` (the blocks received from ranks 0, 1, ... stacked).

float16 / bfloat16 (bias float16 / float32 respectively), matmul in float32, outputs in x1's dtype
(``computeOut`` is rounded to it before the exchange). ``all2all_axes`` may be None/[] or the single
documented value; ``comm_mode`` raises NotImplementedError.

* ``npu_quant_mm_reduce_scatter`` (2-64 ranks): ``y = ReduceScatter(x1 @ x2 + bias)`` for float16 /
  bfloat16 (y in their dtype), ``ReduceScatter((x1_scale * x2_scale) * (x1 @ x2) + bias)`` for int8
  with per-token ``x1_scale (m, 1)`` / per-channel ``x2_scale (1, n)`` float32 scales (``y_dtype``
  required); rank r keeps rows ``[r*m/ws, (r+1)*m/ws)``. Summed in float32, rounded once.
* ``npu_all_gather_quant_mm`` (2-64 ranks, float16/bfloat16): ``gather_out = AllGather(x1)`` (rank
  order), ``y = gather_out @ x2 + bias``; ``gather_out`` is an empty ``(0,)`` tensor without
  ``gather_output``.

For both: ``amax_output`` is documented as False only (the amax output is None); float8 /
hifloat8 / float4 / int4 inputs, int64 (packed) scales, ``quant_scale``, ``block_size``,
``group_sizes``, ``comm_turn`` and the ``*_dtype`` overrides raise NotImplementedError; ``comm_mode``
("aiv", "ai_cpu", "ccu") only picks the communication engine and is accepted.
Registered opaque (the exchange runs on real tensors; the fake kernel gives the shapes) and
non-differentiable (no backward is documented).

Meta-only (quantised all-to-all matmuls, not emulated; the Meta kernels give the documented
shapes and dtypes): npu_quant_matmul_all_to_all, npu_all_to_all_quant_matmul.
"""
import torch
import torch.distributed as dist

from torch_npu.op_plugin._common import check, new_empty, unsupported
from torch_npu.op_plugin._opaque_vjp import non_differentiable
from torch_npu.op_plugin._registry import meta, opaque_kernel
from torch_npu.op_plugin.comm.matmul_collectives import _world
from torch_npu.op_plugin.quant.quantize import _dtype_or_default

__all__ = []

_WORLD_SIZES = (2, 4, 8, 16)


def _check_inputs(op, x1, x2, world_size, bias, all2all_axes, allowed_axes, comm_mode, k_of_x2, n):
    if comm_mode is not None:
        unsupported(op, "comm_mode=%r" % (comm_mode,))
    check(world_size in _WORLD_SIZES, op, "world_size should be in %s, got %d", (list(_WORLD_SIZES), world_size))
    check(x1.dim() == 2 and x2.dim() == 2, op, "x1 and x2 must be 2-D, got %dD and %dD", (x1.dim(), x2.dim()))
    check(x1.dtype in (torch.float16, torch.bfloat16), op, "x1 must be float16 or bfloat16, got %s", x1.dtype)
    check(x2.dtype == x1.dtype, op, "x2 dtype %s must equal x1 dtype %s", (x2.dtype, x1.dtype))
    check(x2.shape[0] == k_of_x2, op, "x2 must have %d rows, got %d", (k_of_x2, x2.shape[0]))
    axes = list(all2all_axes) if all2all_axes is not None else []
    check(axes in ([], allowed_axes), op, "all2all_axes must be None/[] or %s, got %s", (allowed_axes, axes))
    if bias is not None:
        want = torch.float16 if x1.dtype == torch.float16 else torch.float32
        check(bias.dim() == 1 and bias.shape[0] == n, op, "bias must be 1-D with %d entries", n)
        check(bias.dtype == want, op, "bias must be %s for %s inputs, got %s", (want, x1.dtype, bias.dtype))


def _exchange(op, blocks, hcom, world_size):
    """All-to-all of equal blocks: block r of ``blocks (world, ...)`` goes to rank r; returns the
    blocks received from ranks 0 .. world-1, stacked."""
    group = _world(op, hcom, world_size)
    blocks = blocks.contiguous()
    out = torch.empty_like(blocks, memory_format=torch.contiguous_format)
    dist.all_to_all_single(out, blocks, group=group)
    return out


def _matmul(x, w, bias, dtype):
    y = torch.matmul(x.float(), w.float())
    if bias is not None:
        y = y + bias.float()
    return y.to(dtype)


def _all_to_all_matmul(shapes_only, x1, x2, hcom, world_size, bias=None, all2all_axes=None, all2all_out_flag=True,
                       comm_mode=None):
    op = "npu_all_to_all_matmul"
    bs, h = x1.shape if x1.dim() == 2 else (0, 0)
    _check_inputs(op, x1, x2, world_size, bias, all2all_axes, [-2, -1], comm_mode, h * world_size,
                  x2.shape[-1])
    check(bs % world_size == 0, op, "the first axis of x1 (%d) must be divisible by world_size", bs)
    rows = bs // world_size
    if shapes_only:
        permuted = x1.new_empty((rows, h * world_size))
        return x1.new_empty((rows, x2.shape[1])), permuted if all2all_out_flag else None
    received = _exchange(op, x1.reshape(world_size, rows, h), hcom, world_size)
    permuted = received.permute(1, 0, 2).reshape(rows, world_size * h)
    y = _matmul(permuted, x2, bias, x1.dtype)
    return y, permuted if all2all_out_flag else None


def _matmul_all_to_all(shapes_only, x1, x2, hcom, world_size, bias=None, all2all_axes=None, comm_mode=None):
    op = "npu_matmul_all_to_all"
    _check_inputs(op, x1, x2, world_size, bias, all2all_axes, [-1, -2], comm_mode, x1.shape[-1], x2.shape[-1])
    bs, h2 = x1.shape[0], x2.shape[1]
    check(h2 % world_size == 0, op, "the second axis of x2 (%d) must be divisible by world_size", h2)
    width = h2 // world_size
    if shapes_only:
        return x1.new_empty((world_size * bs, width))
    computed = _matmul(x1, x2, bias, x1.dtype)
    blocks = computed.reshape(bs, world_size, width).permute(1, 0, 2)
    return _exchange(op, blocks, hcom, world_size).reshape(world_size * bs, width)


npu_all_to_all_matmul = opaque_kernel("npu_all_to_all_matmul", _all_to_all_matmul)
npu_matmul_all_to_all = opaque_kernel("npu_matmul_all_to_all", _matmul_all_to_all)


_SCATTER_WORLDS = (2, 4, 8, 16, 32, 64)
_COMM_MODES = (None, "aiv", "ai_cpu", "ccu")


def _check_mc2_options(op, world_size, quant_scale, block_size, comm_turn, group_sizes, amax_output, comm_mode,
                       dtype_overrides):
    check(world_size in _SCATTER_WORLDS, op, "world_size should be in %s, got %d", (list(_SCATTER_WORLDS), world_size))
    check(comm_mode in _COMM_MODES, op, "comm_mode must be one of %s, got %r", (list(_COMM_MODES), comm_mode))
    rejected = [name for name, value in dtype_overrides if value is not None]
    if quant_scale is not None:
        rejected.append("quant_scale")
    if block_size != 0:
        rejected.append("block_size=%d" % block_size)
    if comm_turn != 0:
        rejected.append("comm_turn=%d" % comm_turn)
    if group_sizes is not None and any(group_sizes):
        rejected.append("group_sizes=%s" % list(group_sizes))
    if amax_output:
        rejected.append("amax_output=True (documented as False only)")
    if rejected:
        unsupported(op, ", ".join(rejected))


def _y_dtype(op, x1, y_dtype):
    if x1.dtype in (torch.float16, torch.bfloat16):
        dt = _dtype_or_default(op, "y_dtype", y_dtype, x1.dtype)
        check(dt == x1.dtype, op, "when input is float16 or bfloat16, y_dtype must equal it, got %s", dt)
        return dt
    check(y_dtype is not None, op, "y_dtype is required when x1 is %s", x1.dtype)
    dt = _dtype_or_default(op, "y_dtype", y_dtype, None)
    check(dt in (torch.float16, torch.bfloat16, torch.float32), op, "y_dtype must be float16, bfloat16 or float32")
    return dt


def _quant_mm_reduce_scatter(shapes_only, self, x2, hcom, world_size, *, reduce_op='sum', bias=None, x1_scale=None,
                             x2_scale=None, quant_scale=None, block_size=0, comm_turn=0, group_sizes=None,
                             amax_output=False, y_dtype=None, x1_dtype=None, x2_dtype=None, x1_scale_dtype=None,
                             x2_scale_dtype=None, comm_mode=None):
    op = "npu_quant_mm_reduce_scatter"
    x1 = self
    _check_mc2_options(op, world_size, quant_scale, block_size, comm_turn, group_sizes, amax_output, comm_mode,
                       (("x1_dtype", x1_dtype), ("x2_dtype", x2_dtype), ("x1_scale_dtype", x1_scale_dtype),
                        ("x2_scale_dtype", x2_scale_dtype)))
    check(reduce_op == "sum", op, "reduce_op must be 'sum', got %r", (reduce_op,))
    check(x1.dim() == 2 and x2.dim() == 2, op, "x1 and x2 must be 2-D")
    check(x1.shape[1] == x2.shape[0], op, "the K axes of x1 (%d) and x2 (%d) must be equal", (x1.shape[1], x2.shape[0]))
    m, n = x1.shape[0], x2.shape[1]
    check(m % world_size == 0, op, "the M axis of x1 (%d) must be divisible by world_size", m)
    check(x2.dtype == x1.dtype, op, "x1 and x2 must have the same dtype, got %s and %s", (x1.dtype, x2.dtype))
    out_dtype = _y_dtype(op, x1, y_dtype)
    if x1.dtype in (torch.float16, torch.bfloat16):
        check(x1_scale is None and x2_scale is None, op, "x1_scale / x2_scale must be None for %s inputs", x1.dtype)
        if bias is not None:
            check(bias.dtype in (x1.dtype, torch.float32), op, "bias must be %s or float32", x1.dtype)
    elif x1.dtype == torch.int8:
        for name, scale, shape in (("x1_scale", x1_scale, (m, 1)), ("x2_scale", x2_scale, (1, n))):
            if scale is not None:
                if scale.dtype == torch.int64:
                    raise NotImplementedError("%s: int64 (packed) %s is not supported on the CPU-emulated NPU"
                                              % (op, name))
                check(scale.dtype == torch.float32 and tuple(scale.shape) == shape, op,
                      "%s must be float32 %s", (name, shape))
    else:
        raise NotImplementedError("%s: %s inputs are not supported on the CPU-emulated NPU" % (op, x1.dtype))
    if bias is not None:
        check(bias.dim() == 1 and bias.shape[0] == n, op, "bias must be 1-D with %d entries", n)
    if shapes_only:
        return x1.new_empty((m // world_size, n), dtype=out_dtype), None
    if x1.dtype == torch.int8:
        local = torch.matmul(x1.double(), x2.double())            # exact integer products
        for scale in (x1_scale, x2_scale):
            if scale is not None:
                local = local * scale.double()
        local = local.float()
    else:
        local = torch.matmul(x1.float(), x2.float())
    if bias is not None:
        local = local + bias.float()
    group = _world(op, hcom, world_size)
    out = local.new_empty((m // world_size, n))
    dist.reduce_scatter_tensor(out, local.contiguous(), op=dist.ReduceOp.SUM, group=group)
    return out.to(out_dtype), None


def _all_gather_quant_mm(shapes_only, self, x2, hcom, world_size, *, bias=None, x1_scale=None, x2_scale=None,
                         quant_scale=None, block_size=0, gather_index=0, gather_output=True, comm_turn=0,
                         group_sizes=None, amax_output=False, y_dtype=None, x1_dtype=None, x2_dtype=None,
                         x1_scale_dtype=None, x2_scale_dtype=None, comm_mode=None):
    op = "npu_all_gather_quant_mm"
    x1 = self
    _check_mc2_options(op, world_size, quant_scale, block_size, comm_turn, group_sizes, amax_output, comm_mode,
                       (("x1_dtype", x1_dtype), ("x2_dtype", x2_dtype), ("x1_scale_dtype", x1_scale_dtype),
                        ("x2_scale_dtype", x2_scale_dtype)))
    check(gather_index == 0, op, "gather_index must be 0 (gather x1), got %d", gather_index)
    check(x1.dim() == 2 and x2.dim() == 2, op, "x1 and x2 must be 2-D")
    check(x1.shape[1] == x2.shape[0], op, "the K axes of x1 (%d) and x2 (%d) must be equal", (x1.shape[1], x2.shape[0]))
    if x1.dtype not in (torch.float16, torch.bfloat16):
        raise NotImplementedError("%s: %s inputs (quantised scenarios) are not supported on the CPU-emulated NPU"
                                  % (op, x1.dtype))
    check(x2.dtype == x1.dtype, op, "x1 and x2 must have the same dtype, got %s and %s", (x1.dtype, x2.dtype))
    check(x1_scale is None and x2_scale is None, op, "x1_scale / x2_scale must be None for %s inputs", x1.dtype)
    out_dtype = _y_dtype(op, x1, y_dtype)
    m, k = x1.shape
    n = x2.shape[1]
    if bias is not None:
        check(bias.dim() == 1 and bias.shape[0] == n and bias.dtype == x1.dtype, op,
              "bias must be 1-D %s with %d entries", (x1.dtype, n))
    if shapes_only:
        gather_out = x1.new_empty((m * world_size, k)) if gather_output else x1.new_empty((0,))
        return x1.new_empty((m * world_size, n), dtype=out_dtype), gather_out, None
    group = _world(op, hcom, world_size)
    gathered = x1.new_empty((m * world_size, k))
    dist.all_gather_into_tensor(gathered, x1.contiguous(), group=group)
    y = _matmul(gathered, x2, bias, out_dtype)
    return y, gathered if gather_output else x1.new_empty((0,)), None


npu_quant_mm_reduce_scatter = opaque_kernel("npu_quant_mm_reduce_scatter", _quant_mm_reduce_scatter)
npu_all_gather_quant_mm = opaque_kernel("npu_all_gather_quant_mm", _all_gather_quant_mm)


non_differentiable("npu_all_to_all_matmul", "npu_matmul_all_to_all", "npu_quant_mm_reduce_scatter",
                   "npu_all_gather_quant_mm")


def _check_world(op, world_size, allowed):
    check(world_size in allowed, op, "world_size should be in %s, but the actual value is %d",
           (list(allowed), world_size))


@meta("npu_quant_matmul_all_to_all")
def npu_quant_matmul_all_to_all(x1, x2, hcom, world_size, bias=None, x1_scale=None, x2_scale=None,
                                common_scale=None, x1_offset=None, x2_offset=None, x1_quant_mode=None,
                                x2_quant_mode=None, common_quant_mode=None, group_sizes=None, all2all_axes=None,
                                comm_quant_dtype=None, x1_dtype=None, x2_dtype=None, x1_scale_dtype=None,
                                x2_scale_dtype=None, output_scale_dtype=None, comm_scale_dtype=None, y_dtype=None,
                                comm_mode=None):
    op = "npu_quant_matmul_all_to_all"
    _check_world(op, world_size, (2, 4, 8, 16))
    check(x1.dim() == 2 and x2.dim() == 2, op, "x1 and x2 must be 2-D")
    return new_empty((x1.shape[0] * world_size, x2.shape[1] // world_size),
                  _dtype_or_default(op, "y_dtype", y_dtype, torch.float32), x1)


@meta("npu_all_to_all_quant_matmul")
def npu_all_to_all_quant_matmul(x1, x2, hcom, world_size, *, all2all_out_flag=True, bias=None, x1_scale=None,
                                x2_scale=None, common_scale=None, x1_offset=None, x2_offset=None, x1_quant_mode=None,
                                x2_quant_mode=None, common_quant_mode=None, group_sizes=None, all2all_axes=None,
                                comm_quant_dtype=None, x1_quant_dtype=None, x1_dtype=None, x2_dtype=None,
                                x1_scale_dtype=None, x2_scale_dtype=None, output_scale_dtype=None,
                                comm_scale_dtype=None, y_dtype=None, comm_mode=None):
    op = "npu_all_to_all_quant_matmul"
    _check_world(op, world_size, (2, 4, 8, 16))
    check(x1.dim() == 2 and x2.dim() == 2, op, "x1 and x2 must be 2-D")
    check(x1.shape[0] % world_size == 0, op, "the x1 first axis should be divisible by world_size")
    rows = x1.shape[0] // world_size
    out = new_empty((rows, x2.shape[1]), _dtype_or_default(op, "y_dtype", y_dtype, torch.float32), x1)
    comm = new_empty((rows, x1.shape[1] * world_size), x1.dtype, x1) if all2all_out_flag else None
    return out, comm
