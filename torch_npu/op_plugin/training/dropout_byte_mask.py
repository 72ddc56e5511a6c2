"""dropout_with_byte_mask (non-public ``torch.ops.npu`` op behind
``torch_npu.contrib.function.dropout_with_byte_mask``).

Dropout: each element is zeroed with probability ``p`` and the others are scaled by
``1 / (1 - p)`` when ``train``; identity otherwise. On hardware the keep mask is stored as
one byte per element; that storage is invisible in the result, whose distribution is the
ordinary dropout's, so the emulator draws it with ``torch.nn.functional.dropout`` from the
tensor's device generator (masks are not bit-identical to hardware). Differentiable (the
gradient is the same mask and scale).
"""
import torch

from torch_npu.op_plugin._common import check
from torch_npu.op_plugin._registry import impl

__all__ = []


@impl("dropout_with_byte_mask")
def dropout_with_byte_mask(self, p, train):
    """Dropout (zero with probability ``p``, scale the rest by ``1 / (1 - p)``) when ``train``;
    mask drawn from the device generator (not bit-identical to hardware)."""
    check(0.0 <= p <= 1.0, "dropout_with_byte_mask", "p must be in [0, 1], got %r" % (p,))
    return torch.nn.functional.dropout(self, p, train)
