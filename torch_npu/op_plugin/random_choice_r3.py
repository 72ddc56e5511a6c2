"""npu_random_choice_with_mask: the indices of the non-zero elements of a bool tensor, shuffled."""
import torch

from torch_npu.op_plugin._common import check
from torch_npu.op_plugin._registry import impl
from torch_npu.op_plugin.comm_matmul import _symbolic

__all__ = []

_MASK63 = (1 << 63) - 1


@impl("npu_random_choice_with_mask")
def npu_random_choice_with_mask(x, count=256, seed=0, seed2=0):
    """Shuffles the coordinates of the True elements of bool ``x`` (rank 1-5).

    Returns ``(y, mask)``: ``y`` int32 (count, x.dim()), row i the coordinates of the i-th
    chosen element; ``mask`` bool (count,), True for the rows that hold an element. With more
    True elements than ``count`` a random ``count`` of them are returned; with fewer, the
    rows past them are zeros with mask False. ``count=0`` returns every True element
    (shuffled). ``seed``/``seed2`` both 0: drawn from the npu generator of the device
    (``torch.npu.manual_seed``); otherwise a fixed permutation for that seed pair. The
    permutation is not the NPU kernel's (only the distribution is emulated)."""
    op = "npu_random_choice_with_mask"
    check(x.dtype == torch.bool, op, "x must be a bool tensor, got %s" % x.dtype)
    check(1 <= x.dim() <= 5, op, "x must have rank 1 to 5, got %d" % x.dim())
    check(count >= 0, op, "count must be >= 0, got %d" % count)
    if _symbolic(x):
        if count == 0:
            raise NotImplementedError("%s: count=0 returns as many rows as True elements; no meta kernel" % op)
        return (torch.zeros(count, x.dim(), dtype=torch.int32, device=x.device),
                torch.zeros(count, dtype=torch.bool, device=x.device))
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
