"""Deterministic algorithms for one region of forward *and* backward.

``y = enable_deterministic_with_backward(x)`` turns deterministic algorithms
on from here in forward; in backward, the gradient flowing back through
``y`` turns them off again (the region ends there in reverse order).
``disable_deterministic_with_backward`` is the matching end marker.
"""
import torch
from torch import Tensor

__all__ = ["enable_deterministic_with_backward", "disable_deterministic_with_backward"]


class _DeterministicBegin(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor):
        torch.use_deterministic_algorithms(True)
        return tensor.view_as(tensor)

    @staticmethod
    def backward(ctx, grad):
        # Backward leaves the region at its start.
        torch.use_deterministic_algorithms(False)
        return grad


class _DeterministicEnd(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor):
        torch.use_deterministic_algorithms(False)
        return tensor.view_as(tensor)

    @staticmethod
    def backward(ctx, grad):
        # Backward enters the region at its end.
        torch.use_deterministic_algorithms(True)
        return grad


def enable_deterministic_with_backward(tensor: Tensor):
    return _DeterministicBegin.apply(tensor)


def disable_deterministic_with_backward(tensor: Tensor):
    return _DeterministicEnd.apply(tensor)
