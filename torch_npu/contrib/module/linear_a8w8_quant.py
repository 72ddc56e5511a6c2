"""int8 x int8 quantised linear layer (the A8W8 case of :class:`LinearQuant`)."""
from torch_npu.contrib.module.linear_quant import LinearQuant

__all__ = ["LinearA8W8Quant"]


class LinearA8W8Quant(LinearQuant):
    """Same parameters and computation as :class:`LinearQuant`, for int8 inputs and weights."""
