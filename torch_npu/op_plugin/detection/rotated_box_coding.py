"""More detection ops: npu_rotated_box_encode / npu_rotated_box_decode, _npu_ciou /
npu_ciou_backward, npu_nms_rotated, npu_sub_sample.

Semantics come from the CANN kernels these ops launch (RotatedBoxEncode, RotatedBoxDecode,
CIoU, CIoUGrad, RotatedNMS), from torch_npu's goldens and from the CPU reference that the
npu_nms_rotated documentation names as its replacement; docs/ops-detection-more-r9.md lists
the formulas and what is not emulated.

* Rotated box coder: boxes are (B, 5, N) columns ``x1, y1, x2, y2, angle`` (degrees); the
  kernels turn them into centre form with width and height clamped to >= 1. Encode gives
  ``((gx - ax) / aw, (gy - ay) / ah, ln(gw / aw), ln(gh / ah), tan(gt) - tan(at))`` times
  ``weight``; decode divides the deltas by ``weight`` and inverts it (angle
  ``atan(tan(at) + dt)`` in degrees) back to corners. Computed in float32 for float16.
* _npu_ciou: (overlap, atan_sub) with ``atan_sub = atan(w_gt / h_gt) - atan(w / h)`` and
  the npu_ciou overlap; its gradient (CIoUGrad) treats ``alpha = v / (1 - iou + v)`` as a
  constant, so alpha is detached here. npu_ciou_backward is that vector-Jacobian product,
  with ``v`` taken from the given atan_sub, for the documented trans=True, is_cross=False,
  mode=0 case.
* npu_nms_rotated: greedy NMS of rotated boxes by descending score (ties keep input order),
  suppressing IoU > iou_threshold; values are read on the host, so it is registered opaque
  (its fake kernel gives the kept count an unbacked size).
* npu_sub_sample: random balanced sample of RPN / RoI labels (CANN SubSample), kept labels
  unchanged, the rest set to -1.
"""
import math

import torch
from torch._subclasses.fake_tensor import is_fake

from torch_npu.op_plugin._common import acc, check, unsupported
from torch_npu.op_plugin._opaque_vjp import non_differentiable
from torch_npu.op_plugin._registry import impl, opaque
from torch_npu.op_plugin.detection.box_overlap import _terms as _ciou_terms_base
from torch_npu.op_plugin.detection.overlap_backward import _overlap_vjp
from torch_npu.op_plugin.detection.rotated_box import intersection_area

__all__ = []

# the coder kernels run float16 and float32 (float64 kept for gradcheck precision)
_CODER_DTYPES = (torch.float16, torch.float32, torch.float64)


# ----------------------------------------------------------------- rotated box coder

def _check_coder(op, anchor, other, other_name, weight):
    check(anchor.dim() == 3 and anchor.size(1) == 5, op,
          "anchor_box must be (B, 5, N), got %s" % (tuple(anchor.shape),))
    check(tuple(other.shape) == tuple(anchor.shape), op, "%s must have anchor_box's shape %s, got %s"
          % (other_name, tuple(anchor.shape), tuple(other.shape)))
    check(anchor.dtype == other.dtype, op, "anchor_box and %s must have the same dtype, got %s and %s"
          % (other_name, anchor.dtype, other.dtype))
    check(anchor.dtype in _CODER_DTYPES, op, "dtype must be float16 or float32, got %s" % (anchor.dtype,))
    check(weight.numel() == 5, op, "weight must hold 5 values (x, y, w, h, angle), got %d" % weight.numel())


def _centre_form(box):
    """(cx, cy, w, h, angle) rows of a (B, 5, N) corner box; w and h clamped to >= 1 as the
    kernels do."""
    w = (box[:, 2] - box[:, 0]).clamp_min(1.0)
    h = (box[:, 3] - box[:, 1]).clamp_min(1.0)
    return box[:, 0] + w / 2, box[:, 1] + h / 2, w, h, box[:, 4]


def _weights(weight, like):
    return weight.to(device=like.device, dtype=like.dtype).reshape(1, 5, 1)


@impl("npu_rotated_box_encode")
def npu_rotated_box_encode(self, gt_bboxes, weight):
    """Deltas (B, 5, N) of ``gt_bboxes`` relative to the anchors ``self`` (see the module
    docstring); ``weight`` scales the five deltas."""
    op = "npu_rotated_box_encode"
    _check_coder(op, self, gt_bboxes, "gt_bboxes", weight)
    ax, ay, aw, ah, at = _centre_form(acc(self))
    gx, gy, gw, gh, gt = _centre_form(acc(gt_bboxes))
    deltas = torch.stack([(gx - ax) / aw, (gy - ay) / ah, torch.log(gw / aw), torch.log(gh / ah),
                          torch.tan(torch.deg2rad(gt)) - torch.tan(torch.deg2rad(at))], dim=1)
    return (deltas * _weights(weight, deltas)).to(self.dtype)


@impl("npu_rotated_box_decode")
def npu_rotated_box_decode(self, deltas, weight):
    """Boxes (B, 5, N) ``x1, y1, x2, y2, angle`` from the anchors ``self`` and ``deltas``
    (inverse of npu_rotated_box_encode; ``deltas`` are divided by ``weight`` first)."""
    op = "npu_rotated_box_decode"
    _check_coder(op, self, deltas, "deltas", weight)
    ax, ay, aw, ah, at = _centre_form(acc(self))
    d = acc(deltas)
    d = d / _weights(weight, d)
    cx, cy = ax + d[:, 0] * aw, ay + d[:, 1] * ah
    w, h = aw * torch.exp(d[:, 2]), ah * torch.exp(d[:, 3])
    angle = torch.rad2deg(torch.atan(torch.tan(torch.deg2rad(at)) + d[:, 4]))
    return torch.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2, angle], dim=1).to(self.dtype)


# ----------------------------------------------------------------- CIoU forward / backward

def _check_ciou_dtypes(op, *boxes):
    for t in boxes:
        check(t.dtype in _CODER_DTYPES, op, "boxes must be float16 or float32, got %s" % (t.dtype,))


def _ciou_parts(op, boxes, gtboxes, trans, is_cross, mode):
    """(iou - rho^2 / c^2, iou, atan_sub) broadcast to (M, N) or (1, N), in compute precision."""
    iou, dist, (aw, ah, bw, bh) = _ciou_terms_base(op, boxes, gtboxes, trans, is_cross, mode)
    atan_sub = torch.atan(bw / bh) - torch.atan(aw / ah)
    return iou - dist, iou, atan_sub.expand_as(iou)


def _penalty(v, iou):
    # CIoUGrad differentiates through v only: alpha is a constant of the backward
    return (v / (1 - iou + v)).detach() * v


@impl("_npu_ciou")
def _npu_ciou(self, gtboxes, trans=False, is_cross=True, mode=0, atan_sub_flag=False):
    """``(overlap, atan_sub)``: the CIoU ``iou - rho^2/c^2 - alpha * v`` of npu_ciou (boxes are
    columns of (4, n) tensors; (M, N) for is_cross, (1, N) otherwise) and
    ``atan_sub = atan(w_gt / h_gt) - atan(w / h)``, ``v = 4 / pi^2 * atan_sub^2``. float16
    boxes are computed in float32: the overlap is returned in float16 if either box tensor
    is float16, atan_sub in float32 (op-plugin's casts). atan_sub is always filled here
    (with ``atan_sub_flag=False`` the kernel leaves it unwritten)."""
    op = "_npu_ciou"
    _check_ciou_dtypes(op, self, gtboxes)
    diou, iou, atan_sub = _ciou_parts(op, self, gtboxes, trans, is_cross, mode)
    overlap = diou - _penalty((4 / math.pi ** 2) * atan_sub ** 2, iou)
    compute = torch.float32 if self.dtype == torch.float16 else self.dtype
    overlap_dtype = torch.float16 if torch.float16 in (self.dtype, gtboxes.dtype) else compute
    return overlap.to(overlap_dtype), atan_sub.to(compute)


@impl("npu_ciou_backward")
def npu_ciou_backward(grad, bboxes, gtboxes, atan_sub, trans=False, is_cross=True, mode=0):
    """``(dbboxes, dgtboxes)``: the vector-Jacobian product of _npu_ciou's overlap (alpha held
    constant, ``v`` from the given ``atan_sub``; the gradient of atan_sub itself is that of
    ``atan(w_gt / h_gt) - atan(w / h)``). Only the documented case exists: ``trans=True``,
    ``is_cross=False``, ``mode=0``; ``grad`` holds one value per box (op-plugin squeezes the
    leading 1 of a (1, N) gradient). Outputs are float16 if either box tensor is."""
    op = "npu_ciou_backward"
    if not trans:
        unsupported(op, "trans=False (the CIoU backward reads x, y, w, h boxes: trans=True only)")
    if is_cross:
        unsupported(op, "is_cross=True (the CIoU backward is documented for is_cross=False only)")
    if mode != 0:
        unsupported(op, "mode=%r (the CIoU backward is documented for mode=0 'iou' only)" % (mode,))
    check(atan_sub is not None, op, "atan_sub (the second output of _npu_ciou) is required")
    _check_ciou_dtypes(op, bboxes, gtboxes)
    check(atan_sub.numel() == bboxes.size(-1), op, "atan_sub must hold one value per box (%d), got shape %s"
          % (bboxes.size(-1), tuple(atan_sub.shape)))

    def overlap(b, g):
        diou, iou, formula = _ciou_parts(op, b, g, trans, is_cross, mode)
        given = atan_sub.detach().to(formula.dtype).reshape(formula.shape)
        value_given = given + (formula - formula.detach())  # value of atan_sub, gradient of the formula
        return diou - _penalty((4 / math.pi ** 2) * value_given ** 2, iou)

    return _overlap_vjp(op, overlap, grad, bboxes, gtboxes)


# ----------------------------------------------------------------- rotated NMS

_SAME_POINT_EPS = 1e-5   # parameters this close: the same box, IoU 1 (as the reference treats equal corners)
_EMPTY_AREA_EPS = 1e-14  # a box with area below this overlaps nothing


def _check_nms_rotated(self, scores, max_output_size, mode):
    op = "npu_nms_rotated"
    check(self.dim() == 2 and self.size(1) == 5, op, "dets must be (num_boxes, 5), got %s" % (tuple(self.shape),))
    check(scores.dim() == 1 and scores.size(0) == self.size(0), op, "scores must be (num_boxes,) = (%d,), got %s"
          % (self.size(0), tuple(scores.shape)))
    check(self.is_floating_point() and scores.is_floating_point(), op, "dets and scores must be floating point")
    check(mode in (0, 1), op, "mode must be 0 (x, y, w, h, angle) or 1 (x1, y1, x2, y2, angle), got %r" % (mode,))
    check(max_output_size >= -1, op, "max_output_size must be -1 (no limit) or >= 0, got %d" % max_output_size)


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


# ----------------------------------------------------------------- RPN / RoI label sub-sampling

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
    check(self.dim() == 1, op, "labels must be 1-D (N,), got %s" % (tuple(self.shape),))
    check(self.dtype == torch.int32, op, "labels must be int32, got %s" % (self.dtype,))
    check(0.0 <= positive_fraction <= 1.0, op, "positive_fraction must be in [0, 1], got %r" % (positive_fraction,))
    check(per_images >= 0, op, "per_images must be >= 0, got %d" % per_images)
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
