"""npu_grid_assign_positive: the positive-sample steps of mmdet's GridAssigner.

The parameters are documented as the assigner's quantities (``overlaps`` (k, n) IoU of gts
and boxes, its max/argmax over gts (``max_overlaps``, ``argmax_overlaps``, per box) and over
boxes (``gt_max_overlaps``, ``gt_argmax_overlaps``, per gt)), and torch_npu's test golden
checks the first step:

1. ``out = self``; boxes with ``max_overlaps > pos_iou_thr`` and ``box_responsible_flags``
   get ``argmax_overlaps + 1``.
2. then, for each gt ``i < min(num_gts, k)`` in order with ``gt_max_overlaps[i] > min_pos_iou``
   (the documented "minimum IoU for a box to be positive"): with ``gt_max_assign_all`` every
   responsible box whose overlap with gt ``i`` equals ``gt_max_overlaps[i]`` gets ``i + 1``
   (the documented "assign all boxes with the same highest overlap"), otherwise only box
   ``gt_argmax_overlaps[i]`` if it is responsible. A later gt overwrites an earlier one.

Built from tensor ops only (no host reads), so it runs under Meta/FakeTensor too.
"""
import torch

from torch_npu.op_plugin._common import check
from torch_npu.op_plugin._registry import impl

__all__ = []


@impl("npu_grid_assign_positive")
def npu_grid_assign_positive(self, overlaps, box_responsible_flags, max_overlaps, argmax_overlaps,
                             gt_max_overlaps, gt_argmax_overlaps, num_gts, pos_iou_thr, min_pos_iou,
                             gt_max_assign_all):
    """Assigned gt index per box (1-based, ``self``'s value where nothing is assigned), (n,)."""
    op = "npu_grid_assign_positive"
    check(self.dim() == 1, op, "self must be 1-D (n,), got %s", (tuple(self.shape),))
    n = self.size(0)
    check(overlaps.dim() == 2 and overlaps.size(1) == n, op,
          "overlaps must be (k, %d), got %s", (n, tuple(overlaps.shape)))
    k = overlaps.size(0)
    for name, t, size in (("box_responsible_flags", box_responsible_flags, n), ("max_overlaps", max_overlaps, n),
                          ("argmax_overlaps", argmax_overlaps, n), ("gt_max_overlaps", gt_max_overlaps, k),
                          ("gt_argmax_overlaps", gt_argmax_overlaps, k)):
        check(t.dim() == 1 and t.size(0) == size, op, "%s must be (%d,), got %s", (name, size, tuple(t.shape)))
    responsible = box_responsible_flags.to(torch.bool)
    pos = (max_overlaps > pos_iou_thr) & responsible
    out = torch.where(pos, (argmax_overlaps + 1).to(self.dtype), self)
    box_index = torch.arange(n, device=self.device)
    for i in range(min(int(num_gts), k)):
        if gt_max_assign_all:
            hit = overlaps[i] == gt_max_overlaps[i]
        else:
            hit = box_index == gt_argmax_overlaps[i]
        hit = hit & responsible & (gt_max_overlaps[i] > min_pos_iou)
        out = torch.where(hit, torch.full_like(out, i + 1), out)
    return out
