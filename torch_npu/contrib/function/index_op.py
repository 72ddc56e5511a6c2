"""``x[condition] = value`` written as a where (no boolean index_put)."""
import torch

__all__ = ['npu_fast_condition_index_put']


def npu_fast_condition_index_put(x, condition, value):
    """A new tensor equal to ``x`` with ``value`` wherever ``condition`` (bool) is true."""
    if condition.dtype != torch.bool:
        raise TypeError("npu_fast_condition_index_put: condition must be a bool tensor, got %s"
                        % condition.dtype)
    fill = torch.full_like(x, value)
    return torch.where(condition, fill, x)
