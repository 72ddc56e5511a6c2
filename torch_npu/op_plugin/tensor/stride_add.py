"""npu_stride_add(self, other, offset1, offset2, c1_len): the sum of the channel slices
``self[:, offset1:]`` and ``other[:, offset2:]`` of two 5-D (NC1HWC0) tensors, each zero-padded
along dim 1 to ``16 * c1_len`` channels (semantics from the op-plugin test golden).
"""
import torch

from torch_npu.op_plugin._common import check
from torch_npu.op_plugin._registry import impl

__all__ = []


@impl("npu_stride_add")
def npu_stride_add(self, other, offset1, offset2, c1_len):
    """Adds the channel slices ``self[:, offset1:]`` and ``other[:, offset2:]`` of two 5-D
    (NC1HWC0) tensors, each zero-padded along dim 1 to ``16 * c1_len`` channels (the op-plugin
    golden)."""
    op = "npu_stride_add"
    check(self.dim() == 5 and other.dim() == 5, op, "self and other must be 5-D (NC1HWC0)")
    width = 16 * int(c1_len)
    a = self[:, int(offset1):]
    b = other[:, int(offset2):]
    check(a.shape[1] <= width and b.shape[1] <= width, op,
          "the sliced channels (%d, %d) must not exceed 16 * c1_len = %d", (a.shape[1], b.shape[1], width))

    def pad(t):
        zeros = t.new_zeros([t.shape[0], width - t.shape[1]] + list(t.shape[2:]))
        return torch.cat([t, zeros], 1)
    return pad(a) + pad(b)
