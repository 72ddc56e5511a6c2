"""npu_sub_sample: random balanced sample of RPN / RoI labels (CANN SubSample), kept labels
  unchanged, the rest set to -1.
Semantics from the CANN SubSample kernel and torch_npu's golden.
"""
import torch

from torch_npu.op_plugin._common import check
from torch_npu.op_plugin._registry import impl

__all__ = []


@impl("npu_sub_sample")
def npu_sub_sample(self, per_images, positive_fraction):
    """Random balanced sample of a 1-D int32 label vector (CANN SubSample, "compatible with the
    PyTorch SubSample" of Mask R-CNN): labels >= 1 are positives, 0 negatives, the rest ignored.
    ``min(#positives, int(per_images * positive_fraction))`` positives and
    ``min(#negatives, per_images - positives taken)`` negatives are drawn uniformly without
    replacement; they keep their label, every other element becomes -1. The draw uses torch's
    generator of the tensor's device (the hardware's random stream is not reproduced); no host
    reads, so FakeTensor / torch.compile trace it as random ATen ops."""
    op = "npu_sub_sample"
    check(self.dim() == 1, op, "labels must be 1-D (N,), got %s", (tuple(self.shape),))
    check(self.dtype == torch.int32, op, "labels must be int32, got %s", (self.dtype,))
    check(0.0 <= positive_fraction <= 1.0, op, "positive_fraction must be in [0, 1], got %r", (positive_fraction,))
    check(per_images >= 0, op, "per_images must be >= 0, got %d", per_images)
    # the kernel receives positive_fraction as a float32 attribute
    pos_quota = int(per_images * float(torch.tensor(positive_fraction, dtype=torch.float32)))
    positive, negative = self >= 1, self == 0
    num_pos = positive.sum().clamp(max=pos_quota)
    num_neg = negative.sum().clamp(max=per_images - num_pos)
    # a uniform random order; each element's rank among its own class in that order
    order = torch.argsort(torch.rand(self.shape, device=self.device))
    rank = torch.empty_like(order)
    chosen = torch.zeros_like(positive)
    for members, quota in ((positive, num_pos), (negative, num_neg)):
        in_order = members[order].to(torch.int64)
        rank = rank.scatter(0, order, torch.cumsum(in_order, 0) - 1)
        chosen = chosen | (members & (rank < quota))
    return torch.where(chosen, self, torch.full_like(self, -1))
