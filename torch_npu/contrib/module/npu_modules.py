"""``DropoutWithByteMask`` module over :func:`torch_npu.contrib.function.dropout_with_byte_mask`."""
from torch.nn import Module

from torch_npu.contrib.function import npu_functional
from torch_npu.utils._error_code import ErrCode, ops_error

__all__ = ["DropoutWithByteMask"]


class DropoutWithByteMask(Module):
    def __init__(self, p=0.5, inplace=False, max_seed=2 ** 10 - 1):
        super().__init__()
        if p < 0 or p > 1:
            raise ValueError("dropout probability has to be between 0 and 1, but got {}".format(p)
                             + ops_error(ErrCode.VALUE))
        self.p = p
        self.inplace = inplace

    def forward(self, input1):
        return npu_functional.dropout_with_byte_mask(input1, self.p, self.training, self.inplace)
