"""AlltoAll + matmul fusions (non-quantised), on the hcom process group.

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
documented value; ``comm_mode`` raises NotImplementedError. Registered opaque (the exchange runs on
real tensors; the fake kernel gives the shapes) and non-differentiable (no backward is documented).
"""
import torch
import torch.distributed as dist

from torch_npu.op_plugin._common import check
from torch_npu.op_plugin._opaque_vjp import non_differentiable
from torch_npu.op_plugin._registry import opaque
from torch_npu.op_plugin.comm_matmul import _world

__all__ = []

_WORLD_SIZES = (2, 4, 8, 16)


def _check_inputs(op, x1, x2, world_size, bias, all2all_axes, allowed_axes, comm_mode, k_of_x2, n):
    if comm_mode is not None:
        raise NotImplementedError("%s: comm_mode=%r is not supported on the CPU-emulated NPU" % (op, comm_mode))
    check(world_size in _WORLD_SIZES, op, "world_size should be in %s, got %d" % (list(_WORLD_SIZES), world_size))
    check(x1.dim() == 2 and x2.dim() == 2, op, "x1 and x2 must be 2-D, got %dD and %dD" % (x1.dim(), x2.dim()))
    check(x1.dtype in (torch.float16, torch.bfloat16), op, "x1 must be float16 or bfloat16, got %s" % x1.dtype)
    check(x2.dtype == x1.dtype, op, "x2 dtype %s must equal x1 dtype %s" % (x2.dtype, x1.dtype))
    check(x2.shape[0] == k_of_x2, op, "x2 must have %d rows, got %d" % (k_of_x2, x2.shape[0]))
    axes = list(all2all_axes) if all2all_axes is not None else []
    check(axes in ([], allowed_axes), op, "all2all_axes must be None/[] or %s, got %s" % (allowed_axes, axes))
    if bias is not None:
        want = torch.float16 if x1.dtype == torch.float16 else torch.float32
        check(bias.dim() == 1 and bias.shape[0] == n, op, "bias must be 1-D with %d entries" % n)
        check(bias.dtype == want, op, "bias must be %s for %s inputs, got %s" % (want, x1.dtype, bias.dtype))


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
    check(bs % world_size == 0, op, "the first axis of x1 (%d) must be divisible by world_size" % bs)
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
    check(h2 % world_size == 0, op, "the second axis of x2 (%d) must be divisible by world_size" % h2)
    width = h2 // world_size
    if shapes_only:
        return x1.new_empty((world_size * bs, width))
    computed = _matmul(x1, x2, bias, x1.dtype)
    blocks = computed.reshape(bs, world_size, width).permute(1, 0, 2)
    return _exchange(op, blocks, hcom, world_size).reshape(world_size * bs, width)


def _all_to_all_matmul_fake(*args, **kwargs):
    return _all_to_all_matmul(True, *args, **kwargs)


@opaque("npu_all_to_all_matmul", fake=_all_to_all_matmul_fake)
def npu_all_to_all_matmul(*args, **kwargs):
    return _all_to_all_matmul(False, *args, **kwargs)


def _matmul_all_to_all_fake(*args, **kwargs):
    return _matmul_all_to_all(True, *args, **kwargs)


@opaque("npu_matmul_all_to_all", fake=_matmul_all_to_all_fake)
def npu_matmul_all_to_all(*args, **kwargs):
    return _matmul_all_to_all(False, *args, **kwargs)


non_differentiable("npu_all_to_all_matmul", "npu_matmul_all_to_all")
