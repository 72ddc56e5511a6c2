"""mmdetection target helpers run as NPU ops: npu_yolo_boxes_encode, npu_anchor_response_flags.

Both are documented as custom mmdetection operators; their semantics are mmdetection's
``YOLOBBoxCoder.encode`` (eps = 1e-6) and ``AnchorGenerator.single_level_responsible_flags``:

* ``npu_yolo_boxes_encode(bboxes, gt_bboxes, stride)``: boxes ``(x1, y1, x2, y2)``; with
  centres ``c``, sizes ``w, h``: ``[clamp((cx_gt - cx) / stride + 0.5, eps, 1 - eps),
  (same for y), log(clamp(w_gt / w, min=eps)), log(clamp(h_gt / h, min=eps))]``.
  ``performance_mode`` only selects a faster, less precise kernel on hardware; the emulator
  always computes in float32.
* ``npu_anchor_response_flags(gt_bboxes, featmap_size, stride, num_base_anchors)``: a uint8
  flag per anchor (``feat_h * feat_w * num_base_anchors``), 1 for every anchor of the grid
  cell ``(floor(cy / stride_y), floor(cx / stride_x))`` that contains a ground-truth centre.
"""
import torch

from torch_npu.op_plugin._common import check
from torch_npu.op_plugin._registry import impl

__all__ = []

_EPS = 1e-6


def _centre_size(boxes):
    cx = (boxes[:, 0] + boxes[:, 2]) * 0.5
    cy = (boxes[:, 1] + boxes[:, 3]) * 0.5
    return cx, cy, boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]


@impl("npu_yolo_boxes_encode")
def npu_yolo_boxes_encode(self, gt_bboxes, stride, performance_mode=False):
    """Encoded YOLO targets ``(N, 4)`` in the input dtype (see the module doc)."""
    op = "npu_yolo_boxes_encode"
    check(self.dim() == 2 and self.shape[1] == 4, op, "anchor boxes must be (N, 4)")
    check(tuple(gt_bboxes.shape) == tuple(self.shape), op, "gt_bboxes must have the anchors' shape (N, 4)")
    check(stride.dim() == 1 and stride.shape[0] == self.shape[0], op, "stride must be 1-d of length N")
    check(self.dtype in (torch.float16, torch.float32) and gt_bboxes.dtype == self.dtype, op,
          "boxes must be float16 or float32 of one dtype")
    cx, cy, w, h = _centre_size(self.float())
    gx, gy, gw, gh = _centre_size(gt_bboxes.float())
    s = stride.float()
    out = torch.stack([((gx - cx) / s + 0.5).clamp(_EPS, 1 - _EPS),
                       ((gy - cy) / s + 0.5).clamp(_EPS, 1 - _EPS),
                       torch.log((gw / w).clamp(min=_EPS)),
                       torch.log((gh / h).clamp(min=_EPS))], dim=-1)
    return out.to(self.dtype)


@impl("npu_anchor_response_flags")
def npu_anchor_response_flags(self, featmap_size, stride, num_base_anchors):
    """uint8 flags of shape ``(feat_h * feat_w * num_base_anchors,)`` (see the module doc)."""
    op = "npu_anchor_response_flags"
    check(self.dim() == 2 and self.shape[1] == 4, op, "gt_bboxes must be (batch, 4)")
    feat_h, feat_w = featmap_size
    cx, cy, _, _ = _centre_size(self.float())
    gx = torch.floor(cx / stride[0]).long()
    gy = torch.floor(cy / stride[1]).long()
    grid = torch.zeros(feat_h * feat_w, dtype=torch.uint8, device=self.device)
    grid = grid.index_fill(0, gy * feat_w + gx, 1)
    return grid[:, None].expand(feat_h * feat_w, num_base_anchors).reshape(-1)
