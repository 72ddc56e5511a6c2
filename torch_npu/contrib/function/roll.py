"""``torch.roll`` over the two spatial dims of an NHWC tensor as one index_select (Swin)."""
import torch

from torch_npu.utils._error_code import ErrCode, ops_error

__all__ = ["roll"]


class _RollByIndex(torch.autograd.Function):
    """Forward gathers the rolled positions; backward gathers with the inverse permutation."""

    @staticmethod
    def forward(ctx, x, forward_index, backward_index):
        n, h, w, c = x.shape
        ctx.backward_index = backward_index
        return x.reshape(n, h * w, c).index_select(1, forward_index).reshape(n, h, w, c)

    @staticmethod
    def backward(ctx, grad):
        n, h, w, c = grad.shape
        grad_input = grad.reshape(n, h * w, c).index_select(1, ctx.backward_index).reshape(n, h, w, c)
        return grad_input, None, None


def _roll_indices(h, w, shifts, dims, device):
    positions = torch.arange(h * w).reshape(h, w)
    # dims are the (H, W) dims of NHWC, i.e. (1, 2); on the (H, W) grid they are (0, 1).
    grid_dims = tuple(d - 1 if d > 0 else d + 2 for d in dims)
    forward_index = torch.roll(positions, shifts=tuple(shifts), dims=grid_dims).reshape(-1)
    backward_index = torch.argsort(forward_index)
    return forward_index.to(device), backward_index.to(device)


class _NpuRoll:
    """Callable ``roll(x, shifts, dims)``: x is (N, H, W, C), two shifts over dims (1, 2).

    The index pair of each (H, W, shifts, dims, device) is computed once and cached.
    """

    def __init__(self):
        self.index_cache = {}

    def __call__(self, x, shifts, dims):
        if x.dim() != 4:
            raise ValueError("Expected x.dim() == 4" + ops_error(ErrCode.VALUE))
        if len(shifts) != 2:
            raise ValueError("Expected len(shifts) == 2" + ops_error(ErrCode.VALUE))
        if len(dims) != 2:
            raise ValueError("Expected len(dims) == 2" + ops_error(ErrCode.VALUE))
        if sorted(d % 4 for d in dims) != [1, 2]:
            raise ValueError("Expected dims to be the H and W dims (1, 2) of an NHWC tensor"
                             + ops_error(ErrCode.VALUE))
        _, h, w, _ = x.shape
        key = (h, w, tuple(shifts), tuple(d % 4 for d in dims), str(x.device))
        if key not in self.index_cache:
            self.index_cache[key] = _roll_indices(h, w, shifts, [d % 4 for d in dims], x.device)
        forward_index, backward_index = self.index_cache[key]
        return _RollByIndex.apply(x, forward_index, backward_index)


roll = _NpuRoll()
