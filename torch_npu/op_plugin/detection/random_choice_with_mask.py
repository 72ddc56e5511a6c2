"""npu_random_choice_with_mask: the indices of the non-zero elements of a bool tensor, shuffled.

Registered opaque: which elements are chosen depends on the values (and on the generator),
so under torch.compile the op stays one graph node running this kernel; its fake kernel
gives ``count`` rows, or a data-dependent number of rows (an unbacked size) for ``count=0``."""
import torch
from torch._subclasses.fake_tensor import is_fake

from torch_npu.op_plugin._common import check
from torch_npu.op_plugin._opaque_vjp import non_differentiable
from torch_npu.op_plugin._registry import opaque

__all__ = []

_MASK63 = (1 << 63) - 1


def _check_args(x, count):
    op = "npu_random_choice_with_mask"
    check(x.dtype == torch.bool, op, "x must be a bool tensor, got %s", x.dtype)
    check(1 <= x.dim() <= 5, op, "x must have rank 1 to 5, got %d", x.dim())
    check(count >= 0, op, "count must be >= 0, got %d", count)


def _random_choice_fake(x, count=256, seed=0, seed2=0):
    _check_args(x, count)
    rows = count
    if count == 0:
        if not is_fake(x):  # plain meta tensors have no symbol for the True count
            raise NotImplementedError("npu_random_choice_with_mask: count=0 returns as many rows as True "
                                      "elements; meta tensors cannot hold that size")
        rows = torch.library.get_ctx().new_dynamic_size(min=0, max=x.numel())
    return x.new_empty((rows, x.dim()), dtype=torch.int32), x.new_empty((rows,), dtype=torch.bool)


@opaque("npu_random_choice_with_mask", fake=_random_choice_fake)
def npu_random_choice_with_mask(x, count=256, seed=0, seed2=0):
    """Shuffles the coordinates of the True elements of bool ``x`` (rank 1-5).

    Returns ``(y, mask)``: ``y`` int32 (count, x.dim()), row i the coordinates of the i-th
    chosen element; ``mask`` bool (count,), True for the rows that hold an element. With more
    True elements than ``count`` a random ``count`` of them are returned; with fewer, the
    rows past them are zeros with mask False. ``count=0`` returns every True element
    (shuffled). ``seed``/``seed2`` both 0: drawn from the npu generator of the device
    (``torch.npu.manual_seed``); otherwise a fixed permutation for that seed pair. The
    permutation is not the NPU kernel's (only the distribution is emulated)."""
    _check_args(x, count)
    coords = torch.nonzero(x.detach().cpu())
    nnz = coords.size(0)
    if seed == 0 and seed2 == 0:
        perm = torch.randperm(nnz, device=x.device).cpu()
    else:
        gen = torch.Generator().manual_seed(((seed & 0xFFFFFFFF) << 32 | (seed2 & 0xFFFFFFFF)) & _MASK63)
        perm = torch.randperm(nnz, generator=gen)
    rows = nnz if count == 0 else count
    take = min(rows, nnz)
    y = torch.zeros(rows, x.dim(), dtype=torch.int32)
    y[:take] = coords[perm[:take]].to(torch.int32)
    mask = torch.zeros(rows, dtype=torch.bool)
    mask[:take] = True
    return y.to(x.device), mask.to(x.device)


non_differentiable("npu_random_choice_with_mask")
