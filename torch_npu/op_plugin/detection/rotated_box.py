"""Rotated boxes: npu_rotated_overlaps (intersection area), npu_rotated_iou and the rotated box coder
(npu_rotated_box_encode / npu_rotated_box_decode).

Layout, from the op-plugin adapter: ``self`` (B, N, 5) and ``query_boxes`` (B, K, 5) (the
adapter permutes them to the kernel's (B, 5, N)); output (B, N, K), ``out[b, n, k]`` for box
``self[b, n]`` against ``query_boxes[b, k]``. A box is ``x, y, w, h, angle`` (``trans=False``,
"xywht": centre, size) or ``x1, y1, x2, y2, angle`` (``trans=True``, "xyxyt": the corners of the
unrotated box); ``angle`` in degrees, counter-clockwise (established against the golden of
torch_npu's own test, seed 1234). The boxes are rotated about their centres and intersected
as convex polygons (Sutherland-Hodgman clipping) in float64 on the host; the result has the
input dtype. Values are read on the host, so both ops are registered opaque (one node under
torch.compile, running this host computation at run time); their fake kernels give the
(B, N, K) shape. No backward (the real ops have none).

* Rotated box coder: boxes are (B, 5, N) columns ``x1, y1, x2, y2, angle`` (degrees); the
  kernels turn them into centre form with width and height clamped to >= 1. Encode gives
  ``((gx - ax) / aw, (gy - ay) / ah, ln(gw / aw), ln(gh / ah), tan(gt) - tan(at))`` times
  ``weight``; decode divides the deltas by ``weight`` and inverts it (angle
  ``atan(tan(at) + dt)`` in degrees) back to corners. Computed in float32 for float16.
"""
import math

import torch

from torch_npu.op_plugin._common import acc, check, unsupported
from torch_npu.op_plugin._opaque_vjp import non_differentiable
from torch_npu.op_plugin._registry import impl, opaque

__all__ = []


def _corners(box, trans):
    """The four corners, counter-clockwise, of one box given as a list of 5 floats."""
    if trans:
        x1, y1, x2, y2, angle = box
        cx, cy, w, h = (x1 + x2) / 2, (y1 + y2) / 2, x2 - x1, y2 - y1
    else:
        cx, cy, w, h, angle = box
    c, s = math.cos(math.radians(angle)), math.sin(math.radians(angle))
    pts = []
    for dx, dy in ((-w / 2, -h / 2), (w / 2, -h / 2), (w / 2, h / 2), (-w / 2, h / 2)):
        pts.append((cx + dx * c - dy * s, cy + dx * s + dy * c))
    return pts, abs(w * h)


def _clip(subject, a, b):
    """The part of polygon ``subject`` left of (or on) the directed line a -> b."""
    def side(p):
        return (b[0] - a[0]) * (p[1] - a[1]) - (b[1] - a[1]) * (p[0] - a[0])
    out = []
    for i, cur in enumerate(subject):
        prev = subject[i - 1]
        sc, sp = side(cur), side(prev)
        if sc >= 0:
            if sp < 0:
                out.append(_cut(prev, cur, sp, sc))
            out.append(cur)
        elif sp >= 0:
            out.append(_cut(prev, cur, sp, sc))
    return out


def _cut(p, q, sp, sq):
    t = sp / (sp - sq)
    return (p[0] + t * (q[0] - p[0]), p[1] + t * (q[1] - p[1]))


def _area(poly):
    return abs(sum(poly[i - 1][0] * poly[i][1] - poly[i][0] * poly[i - 1][1] for i in range(len(poly)))) / 2


def intersection_area(box_a, box_b, trans):
    """Area of the intersection of two rotated boxes, and the two box areas."""
    pa, area_a = _corners(box_a, trans)
    pb, area_b = _corners(box_b, trans)
    poly = pa
    for i in range(4):
        if not poly:
            break
        poly = _clip(poly, pb[i], pb[(i + 1) % 4])
    inter = _area(poly) if len(poly) >= 3 else 0.0
    return inter, area_a, area_b


def _check_pair(op, boxes, query_boxes):
    """The checks that need no values; returns the (B, N, K) output shape."""
    check(boxes.dim() == 3 and query_boxes.dim() == 3, op,
          "boxes and query_boxes must be 3-D (B, N, 5) / (B, K, 5), got %s and %s",
          (tuple(boxes.shape), tuple(query_boxes.shape)))
    check(boxes.size(2) == 5 and query_boxes.size(2) == 5, op, "the last dimension must be 5 (box + angle)")
    check(boxes.size(0) == query_boxes.size(0), op, "batch sizes differ: %d and %d",
          (boxes.size(0), query_boxes.size(0)))
    return boxes.size(0), boxes.size(1), query_boxes.size(1)


def _pairwise(op, boxes, query_boxes, trans, value):
    b, n, k = _check_pair(op, boxes, query_boxes)
    out = torch.zeros(b, n, k, dtype=torch.float64)
    a_host = boxes.detach().cpu().double().tolist()
    q_host = query_boxes.detach().cpu().double().tolist()
    for bi in range(b):
        for ni in range(n):
            for ki in range(k):
                out[bi, ni, ki] = value(*intersection_area(a_host[bi][ni], q_host[bi][ki], trans))
    return out.to(dtype=boxes.dtype, device=boxes.device)


def _overlaps_fake(self, query_boxes, trans=False):
    return self.new_empty(_check_pair("npu_rotated_overlaps", self, query_boxes))


@opaque("npu_rotated_overlaps", fake=_overlaps_fake)
def npu_rotated_overlaps(self, query_boxes, trans=False):
    """Intersection area of every (box, query box) pair of each batch: (B, N, K)."""
    return _pairwise("npu_rotated_overlaps", self, query_boxes, trans, lambda inter, a, q: inter)


def _check_iou_modes(op, mode, is_cross):
    if mode != 0:
        unsupported(op, "mode=%r (only mode=0 'iou')" % (mode,))
    if not is_cross:
        unsupported(op, "is_cross=False")


def _iou_fake(self, query_boxes, trans=False, mode=0, is_cross=True, v_threshold=0.0, e_threshold=0.0):
    _check_iou_modes("npu_rotated_iou", mode, is_cross)
    return self.new_empty(_check_pair("npu_rotated_iou", self, query_boxes))


@opaque("npu_rotated_iou", fake=_iou_fake)
def npu_rotated_iou(self, query_boxes, trans=False, mode=0, is_cross=True, v_threshold=0.0, e_threshold=0.0):
    """IoU ``inter / (area_a + area_q - inter)`` of every (box, query box) pair: (B, N, K).

    ``v_threshold`` / ``e_threshold`` only relax the kernel's point-in-box and edge-crossing
    tests at the boundaries ("condition relaxation for intersection calculation"); exact
    clipping needs none, so they do not change the result here. ``mode=1`` (IoF: which
    area is the denominator is not documented for rotated boxes) and ``is_cross=False``
    (the one-to-one output layout is not documented) raise NotImplementedError."""
    op = "npu_rotated_iou"
    _check_iou_modes(op, mode, is_cross)

    def iou(inter, a, q):
        union = a + q - inter
        return inter / union if union > 0 else 0.0
    return _pairwise(op, self, query_boxes, trans, iou)


non_differentiable("npu_rotated_overlaps", "npu_rotated_iou")


# the coder kernels run float16 and float32 (float64 kept for gradcheck precision)
_CODER_DTYPES = (torch.float16, torch.float32, torch.float64)


def _check_coder(op, anchor, other, other_name, weight):
    check(anchor.dim() == 3 and anchor.size(1) == 5, op,
          "anchor_box must be (B, 5, N), got %s", (tuple(anchor.shape),))
    check(tuple(other.shape) == tuple(anchor.shape), op, "%s must have anchor_box's shape %s, got %s",
          (other_name, tuple(anchor.shape), tuple(other.shape)))
    check(anchor.dtype == other.dtype, op, "anchor_box and %s must have the same dtype, got %s and %s",
          (other_name, anchor.dtype, other.dtype))
    check(anchor.dtype in _CODER_DTYPES, op, "dtype must be float16 or float32, got %s", (anchor.dtype,))
    check(weight.numel() == 5, op, "weight must hold 5 values (x, y, w, h, angle), got %d", weight.numel())


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
