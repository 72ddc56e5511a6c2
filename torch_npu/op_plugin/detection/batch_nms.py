"""More non-maximum suppression: npu_batch_nms (batched multi-class), npu_nms_with_mask.

IoU of axis-aligned boxes as ``nms._pair_iou`` (no +1 on widths); a box is suppressed when
its IoU with an already kept box is ``> iou_threshold`` (the CANN NMSWithMask kernel tests
``inter > thr / (1 + thr) * (area_a + area_b)``, the same condition). Values are read on
the host (``tolist``), so both ops are registered opaque (one node under torch.compile,
running the host NMS at run time); their fake kernels give the fixed output shapes
(npu_batch_nms: T = max_total_size rows; npu_nms_with_mask: N rows)."""
import torch

from torch_npu.op_plugin._common import check, unsupported
from torch_npu.op_plugin._opaque_vjp import non_differentiable
from torch_npu.op_plugin._registry import opaque
from torch_npu.op_plugin.detection.nms import greedy_nms, _pair_iou

__all__ = []


def _check_batch_nms(self, scores, max_size_per_class, max_total_size, change_coordinate_frame, transpose_box):
    """The checks that need no values; returns (b, n, q, c, total, per_class)."""
    op = "npu_batch_nms"
    if change_coordinate_frame:
        unsupported(op, "change_coordinate_frame=True")
    if transpose_box:
        unsupported(op, "transpose_box=True")
    check(self.dim() == 4 and self.size(3) == 4, op, "boxes must be (B, N, q, 4), got %s" % (tuple(self.shape),))
    check(scores.dim() == 3 and scores.shape[:2] == self.shape[:2], op,
          "scores must be (B, N, C) matching boxes %s, got %s" % (tuple(self.shape), tuple(scores.shape)))
    b, n, q, _ = self.shape
    c = scores.size(2)
    check(q in (1, c), op, "boxes q must be 1 or num_classes=%d, got %d" % (c, q))
    total = int(max_total_size)
    per_class = int(max_size_per_class)
    check(total >= 0 and per_class >= 0, op, "max sizes must be >= 0")
    return b, n, q, c, total, per_class


def _batch_nms_fake(self, scores, score_threshold, iou_threshold, max_size_per_class, max_total_size,
                    change_coordinate_frame=False, transpose_box=False):
    b, _, _, _, total, _ = _check_batch_nms(self, scores, max_size_per_class, max_total_size,
                                            change_coordinate_frame, transpose_box)
    return (self.new_empty((b, total, 4)), self.new_empty((b, total)), self.new_empty((b, total)),
            self.new_empty((b,), dtype=torch.int32))


@opaque("npu_batch_nms", fake=_batch_nms_fake)
def npu_batch_nms(self, scores, score_threshold, iou_threshold, max_size_per_class, max_total_size,
                  change_coordinate_frame=False, transpose_box=False):
    """Batched multi-class NMS. ``self`` boxes (B, N, q, 4) with q = 1 (shared by all
    classes) or q = C; ``scores`` (B, N, C). Per image and class: boxes with
    ``score > score_threshold``, greedy NMS (suppress IoU ``> iou_threshold``), at most
    ``max_size_per_class`` kept; then all kept boxes of the image sorted by score
    (descending; ties: lower class, then selection order) and the first ``max_total_size``
    written. Returns ``(nmsed_boxes (B, T, 4), nmsed_scores (B, T), nmsed_classes (B, T),
    nmsed_num (B,) int32)`` with T = ``max_total_size``, rows past ``nmsed_num`` zero, in the
    dtype of ``self``. ``change_coordinate_frame`` and ``transpose_box`` must be False
    (their exact semantics are not documented)."""
    b, n, q, c, total, per_class = _check_batch_nms(self, scores, max_size_per_class, max_total_size,
                                                    change_coordinate_frame, transpose_box)
    out_boxes = torch.zeros(b, total, 4, dtype=self.dtype)
    out_scores = torch.zeros(b, total, dtype=self.dtype)
    out_classes = torch.zeros(b, total, dtype=self.dtype)
    out_num = torch.zeros(b, dtype=torch.int32)
    boxes_h = self.detach().cpu().double()
    scores_h = scores.detach().cpu().double()
    for bi in range(b):
        cand = []  # (-score, class, rank, box index)
        for ci in range(c):
            cls_boxes = boxes_h[bi, :, 0 if q == 1 else ci]
            kept = greedy_nms(cls_boxes, scores_h[bi, :, ci], per_class, float(iou_threshold),
                              float(score_threshold))
            cand.extend((-scores_h[bi, i, ci].item(), ci, r, i) for r, i in enumerate(kept))
        cand.sort()
        cand = cand[:total]
        for j, (neg, ci, _, i) in enumerate(cand):
            out_boxes[bi, j] = self[bi, i, 0 if q == 1 else ci].detach().cpu()
            out_scores[bi, j] = scores[bi, i, ci].detach().cpu().to(self.dtype)
            out_classes[bi, j] = ci
        out_num[bi] = len(cand)
    dev = self.device
    return out_boxes.to(dev), out_scores.to(dev), out_classes.to(dev), out_num.to(dev)


def _check_nms_with_mask(input):
    check(input.dim() == 2 and input.size(1) >= 5, "npu_nms_with_mask",
          "input must be (N, 5) or (N, 8) proposals, got %s" % (tuple(input.shape),))


def _nms_with_mask_fake(input, iou_threshold):
    _check_nms_with_mask(input)
    n = input.size(0)
    return (input.new_empty((n, 5)), input.new_empty((n,), dtype=torch.int32),
            input.new_empty((n,), dtype=torch.uint8))


@opaque("npu_nms_with_mask", fake=_nms_with_mask_fake)
def npu_nms_with_mask(input, iou_threshold):
    """NMS over proposals in their given order (the caller sorts them by score, as the CANN
    kernel expects): ``input`` (N, 5+) rows ``x1, y1, x2, y2, score`` (the kernel's 8-column
    layout is accepted; columns past 5 are ignored). Proposal i is kept when its IoU with
    every previously kept proposal is ``<= iou_threshold``. Returns ``(selected_boxes (N, 5)
    = input[:, :5], selected_idx (N,) int32 = 0..N-1, selected_mask (N,) uint8, 1 = kept)``."""
    _check_nms_with_mask(input)
    n = input.size(0)
    boxes = input[:, :5].clone()
    idx = torch.arange(n, dtype=torch.int32, device=input.device)
    iou = _pair_iou(input[:, :4].detach().cpu().double()).tolist()
    thr = float(iou_threshold)
    kept = []
    mask = [0] * n
    for i in range(n):
        if all(iou[i][k] <= thr for k in kept):
            kept.append(i)
            mask[i] = 1
    return boxes, idx, torch.tensor(mask, dtype=torch.uint8).to(input.device)


non_differentiable("npu_batch_nms", "npu_nms_with_mask")
