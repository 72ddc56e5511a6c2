"""``dropout_with_byte_mask``: dropout whose mask is one uint8 per element on hardware."""
import torch

from torch_npu.utils._error_code import ErrCode, ops_error

__all__ = ["dropout_with_byte_mask"]


def dropout_with_byte_mask(input1, p=0.5, training=True, inplace=False):
    """Zero each element with probability ``p`` and scale the others by ``1 / (1 - p)``.

    The byte mask is the hardware's storage of the keep mask; the distribution is the
    ordinary dropout's, so the emulator draws it with ``torch.nn.functional.dropout`` from
    the tensor's device generator. ``inplace=True`` is rejected, as in torch_npu.
    """
    if p < 0. or p > 1.:
        raise ValueError("dropout probability has to be between 0 and 1, but got {}".format(p)
                         + ops_error(ErrCode.VALUE))
    if inplace:
        raise ValueError("dropout probability has no-inplace computing." + ops_error(ErrCode.VALUE))
    return torch.nn.functional.dropout(input1, p, training)
