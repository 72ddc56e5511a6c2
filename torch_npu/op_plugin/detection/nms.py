"""Non-maximum suppression: npu_nms_v4 (TensorFlow NonMaxSuppressionV4 semantics), npu_batch_nms
(batched multi-class), npu_nms_with_mask and npu_nms_rotated.

The number of kept boxes depends on the values, so the op is registered opaque: one node
under torch.compile, running the host NMS at run time; its fake kernel gives the
unpadded index output a data-dependent length (an unbacked size, 0 <= n <= min(N,
max_output_size)).

npu_batch_nms and npu_nms_with_mask: IoU of axis-aligned boxes as ``nms._pair_iou`` (no +1 on widths); a box is suppressed when
its IoU with an already kept box is ``> iou_threshold`` (the CANN NMSWithMask kernel tests
``inter > thr / (1 + thr) * (area_a + area_b)``, the same condition). Values are read on
the host (``tolist``), so both ops are registered opaque (one node under torch.compile,
running the host NMS at run time); their fake kernels give the fixed output shapes
(npu_batch_nms: T = max_total_size rows; npu_nms_with_mask: N rows).

* npu_nms_rotated: greedy NMS of rotated boxes by descending score (ties keep input order),
  suppressing IoU > iou_threshold; values are read on the host, so it is registered opaque
  (its fake kernel gives the kept count an unbacked size).
"""
import torch
from torch._subclasses.fake_tensor import is_fake

from torch_npu.op_plugin._common import check, unsupported
from torch_npu.op_plugin._opaque_vjp import non_differentiable
from torch_npu.op_plugin._registry import opaque
from torch_npu.op_plugin.detection.rotated_box import intersection_area

__all__ = []


def _pair_iou(boxes):
    """IoU of every pair of (N, 4) boxes; corners in either order (min/max taken per axis)."""
    lo = torch.minimum(boxes[:, :2], boxes[:, 2:])
    hi = torch.maximum(boxes[:, :2], boxes[:, 2:])
    area = (hi - lo).prod(-1)
    wh = (torch.minimum(hi[:, None], hi[None]) - torch.maximum(lo[:, None], lo[None])).clamp_min(0)
    inter = wh.prod(-1)
    union = area[:, None] + area[None] - inter
    return torch.where((area[:, None] > 0) & (area[None] > 0), inter / union, torch.zeros_like(inter))


def greedy_nms(boxes, scores, max_output, iou_threshold, score_threshold):
    """Indices kept by greedy NMS: candidates with ``score > score_threshold`` in descending
    score order (ties: lower index first); a candidate is dropped when its IoU with an already
    kept box is ``> iou_threshold``; at most ``max_output`` kept."""
    order = sorted((i for i, s in enumerate(scores.tolist()) if s > score_threshold),
                   key=lambda i: -scores[i].item())
    iou = _pair_iou(boxes.double()).tolist()
    kept = []
    for i in order:
        if len(kept) >= max_output:
            break
        if all(iou[i][k] <= iou_threshold for k in kept):
            kept.append(i)
    return kept


def _check_nms_v4(self, scores, max_output_size):
    op = "npu_nms_v4"
    check(self.dim() == 2 and self.size(1) == 4, op, "boxes must be (N, 4), got %s", (tuple(self.shape),))
    check(scores.dim() == 1 and scores.size(0) == self.size(0), op, "scores must be (N,)")
    max_out = int(max_output_size)
    check(max_out >= 0, op, "max_output_size must be >= 0, got %d", max_out)
    return max_out


def _nms_v4_fake(self, scores, max_output_size, iou_threshold, scores_threshold, pad_to_max_output_size=False):
    max_out = _check_nms_v4(self, scores, max_output_size)
    if pad_to_max_output_size:
        n = max_out
    elif not is_fake(self):  # plain meta tensors have no symbol for the kept count
        raise NotImplementedError("npu_nms_v4: the number of kept boxes depends on the values; meta tensors "
                                  "cannot hold it (FakeTensor tracing gives it a data-dependent size)")
    else:
        n = torch.library.get_ctx().new_dynamic_size(min=0, max=min(max_out, self.size(0)))
    return self.new_empty((n,), dtype=torch.int32), self.new_empty((), dtype=torch.int32)


@opaque("npu_nms_v4", fake=_nms_v4_fake)
def npu_nms_v4(self, scores, max_output_size, iou_threshold, scores_threshold, pad_to_max_output_size=False):
    """Greedy NMS of ``self`` (N, 4) boxes with ``scores`` (N,): see :func:`greedy_nms`
    (boxes with IoU ``> iou_threshold`` against a kept box are suppressed, scores
    ``<= scores_threshold`` never kept). Returns ``(selected_indices, valid_outputs)``:
    int32 indices in selection order (length ``valid_outputs``, or ``max_output_size`` padded
    with zeros when ``pad_to_max_output_size``) and the int32 0-D count."""
    max_out = _check_nms_v4(self, scores, max_output_size)
    kept = greedy_nms(self.detach().cpu(), scores.detach().cpu().double(), max_out,
                      float(iou_threshold), float(scores_threshold))
    n = max_out if pad_to_max_output_size else len(kept)
    idx = torch.zeros(n, dtype=torch.int32)
    idx[:len(kept)] = torch.tensor(kept, dtype=torch.int32)
    return idx.to(self.device), torch.tensor(len(kept), dtype=torch.int32).to(self.device)


non_differentiable("npu_nms_v4")


_SAME_POINT_EPS = 1e-5   # parameters this close: the same box, IoU 1 (as the reference treats equal corners)


_EMPTY_AREA_EPS = 1e-14  # a box with area below this overlaps nothing


def _check_nms_rotated(self, scores, max_output_size, mode):
    op = "npu_nms_rotated"
    check(self.dim() == 2 and self.size(1) == 5, op, "dets must be (num_boxes, 5), got %s", (tuple(self.shape),))
    check(scores.dim() == 1 and scores.size(0) == self.size(0), op, "scores must be (num_boxes,) = (%d,), got %s",
          (self.size(0), tuple(scores.shape)))
    check(self.is_floating_point() and scores.is_floating_point(), op, "dets and scores must be floating point")
    check(mode in (0, 1), op, "mode must be 0 (x, y, w, h, angle) or 1 (x1, y1, x2, y2, angle), got %r", (mode,))
    check(max_output_size >= -1, op, "max_output_size must be -1 (no limit) or >= 0, got %d", max_output_size)


def _xywha(row, mode):
    """Centre form of one box; mode 1 (corners) also negates the angle, as the reference does."""
    if mode == 0:
        return list(row)
    x1, y1, x2, y2, angle = row
    return [(x1 + x2) / 2, (y1 + y2) / 2, x2 - x1, y2 - y1, -angle]


def _rotated_iou(a, b):
    area_a, area_b = a[2] * a[3], b[2] * b[3]
    if area_a < _EMPTY_AREA_EPS or area_b < _EMPTY_AREA_EPS:
        return 0.0
    if all(abs(p - q) <= _SAME_POINT_EPS for p, q in zip(a, b)):
        return 1.0
    inter = intersection_area(a, b, False)[0]
    return inter / (area_a + area_b - inter)


def _nms_rotated_fake(self, scores, iou_threshold, scores_threshold=0, max_output_size=-1, mode=0):
    _check_nms_rotated(self, scores, max_output_size, mode)
    if not is_fake(self):  # plain meta tensors have no symbol for the kept count
        raise NotImplementedError("npu_nms_rotated: the number of kept boxes depends on the values; meta "
                                  "tensors cannot hold it (FakeTensor tracing gives it a data-dependent size)")
    n = self.size(0) if max_output_size < 0 else min(self.size(0), max_output_size)
    kept = torch.library.get_ctx().new_dynamic_size(min=0, max=n)
    return self.new_empty((kept,), dtype=torch.int32), self.new_empty((1,), dtype=torch.int32)


@opaque("npu_nms_rotated", fake=_nms_rotated_fake)
def npu_nms_rotated(self, scores, iou_threshold, scores_threshold=0, max_output_size=-1, mode=0):
    """Greedy NMS of rotated boxes ``self`` (N, 5) with ``scores`` (N,): boxes in descending score
    order (ties: lower index first), each kept when its rotated IoU with every kept box is
    ``<= iou_threshold``; scores at or below ``scores_threshold`` are never kept (a score equal
    to it raises NotImplementedError: which side the kernel puts it on is not documented); at
    most ``max_output_size`` kept (-1: no limit). ``mode=0`` boxes are ``x, y, w, h, angle``,
    ``mode=1`` ``x1, y1, x2, y2, angle`` (angle negated, as the documented replacement does).
    Computed on float32 values. Returns ``(selected_index (M,) int32, selected_num (1,) int32)``."""
    op = "npu_nms_rotated"
    _check_nms_rotated(self, scores, max_output_size, mode)
    boxes = self.detach().to(torch.float32).cpu().double().tolist()
    score = scores.detach().to(torch.float32).cpu().double().tolist()
    thr = float(torch.tensor(scores_threshold, dtype=torch.float32))
    if any(s == thr for s in score):
        unsupported(op, "a score equal to scores_threshold (whether it is kept is not documented)")
    boxes = [_xywha(b, mode) for b in boxes]
    iou_thr = float(torch.tensor(iou_threshold, dtype=torch.float32))
    limit = len(boxes) if max_output_size < 0 else max_output_size
    kept = []
    for i in sorted(range(len(boxes)), key=lambda j: -score[j]):  # stable: ties keep input order
        if len(kept) >= limit:
            break
        if score[i] > thr and all(_rotated_iou(boxes[i], boxes[k]) <= iou_thr for k in kept):
            kept.append(i)
    index = torch.tensor(kept, dtype=torch.int32).to(self.device)
    return index, torch.tensor([len(kept)], dtype=torch.int32).to(self.device)


non_differentiable("npu_nms_rotated")


def _check_batch_nms(self, scores, max_size_per_class, max_total_size, change_coordinate_frame, transpose_box):
    """The checks that need no values; returns (b, n, q, c, total, per_class)."""
    op = "npu_batch_nms"
    if change_coordinate_frame:
        unsupported(op, "change_coordinate_frame=True")
    if transpose_box:
        unsupported(op, "transpose_box=True")
    check(self.dim() == 4 and self.size(3) == 4, op, "boxes must be (B, N, q, 4), got %s", (tuple(self.shape),))
    check(scores.dim() == 3 and scores.shape[:2] == self.shape[:2], op,
          "scores must be (B, N, C) matching boxes %s, got %s", (tuple(self.shape), tuple(scores.shape)))
    b, n, q, _ = self.shape
    c = scores.size(2)
    check(q in (1, c), op, "boxes q must be 1 or num_classes=%d, got %d", (c, q))
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
          "input must be (N, 5) or (N, 8) proposals, got %s", (tuple(input.shape),))


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
