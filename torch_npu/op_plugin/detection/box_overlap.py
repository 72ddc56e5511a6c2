"""Distance-aware box overlaps: npu_diou, npu_ciou (boxes stored column-wise, (4, n)) and their
backward ops.

* ``npu_diou_backward(grad, bboxes, gtboxes, trans, is_cross, mode)`` and
  ``npu_giou_backward(...)`` (in ``detection/iou.py``): the vector-Jacobian product of npu_diou / npu_giou (the
  ``DIoUGrad`` / ``GIoUGrad`` kernels): ``dbboxes = sum_k grad_k * d overlap_k / d bboxes``,
  likewise ``dgtboxes``. op-plugin squeezes the leading 1 of the gradient (``[1, N]`` aligned
  overlaps); any gradient holding one value per overlap is accepted. It computes in float32 for
  float16 inputs and returns float16 if either box tensor is float16 (else the boxes' dtype).
  npu_giou_backward only exists for ``trans=True, is_cross=False, mode=0`` (op-plugin's check,
  same message); npu_diou_backward accepts what npu_diou accepts (``mode=0``, aligned or cross).
* _npu_ciou: (overlap, atan_sub) with ``atan_sub = atan(w_gt / h_gt) - atan(w / h)`` and
  the npu_ciou overlap; its gradient (CIoUGrad) treats ``alpha = v / (1 - iou + v)`` as a
  constant, so alpha is detached here. npu_ciou_backward is that vector-Jacobian product,
  with ``v`` taken from the given atan_sub, for the documented trans=True, is_cross=False,
  mode=0 case.
"""
import math

import torch

from torch_npu.op_plugin._common import acc, check, unsupported
from torch_npu.op_plugin._registry import impl
from torch_npu.op_plugin.detection.rotated_box import _CODER_DTYPES

__all__ = []


def _corners(t, trans):
    t = acc(t)
    if trans:  # x, y (centre), w, h
        return t[0] - t[2] / 2, t[1] - t[3] / 2, t[0] + t[2] / 2, t[1] + t[3] / 2
    return t[0], t[1], t[2], t[3]


def _terms(op, boxes, gtboxes, trans, is_cross, mode):
    """IoU, squared centre distance over squared enclosing diagonal, and the two boxes'
    (w, h), broadcast to (1, N) (aligned) or (M, N) (cross: row m is gtboxes[:, m])."""
    if mode != 0:
        unsupported(op, "mode=%r (only mode=0 'iou')" % (mode,))
    check(boxes.dim() == 2 and boxes.size(0) == 4, op, "self must be (4, N), got %s", (tuple(boxes.shape),))
    check(gtboxes.dim() == 2 and gtboxes.size(0) == 4, op, "gtboxes must be (4, M), got %s", (tuple(gtboxes.shape),))
    if not is_cross:
        check(gtboxes.size(1) == boxes.size(1), op, "gtboxes must have the N=%d boxes of self, got %d",
              (boxes.size(1), gtboxes.size(1)))
    ax1, ay1, ax2, ay2 = (c.unsqueeze(0) for c in _corners(boxes, trans))          # (1, N)
    bx1, by1, bx2, by2 = (c.to(ax1.dtype).unsqueeze(1 if is_cross else 0)       # (M, 1) or (1, N)
                          for c in _corners(gtboxes, trans))
    aw, ah, bw, bh = ax2 - ax1, ay2 - ay1, bx2 - bx1, by2 - by1
    inter = ((torch.minimum(ax2, bx2) - torch.maximum(ax1, bx1)).clamp_min(0)
             * (torch.minimum(ay2, by2) - torch.maximum(ay1, by1)).clamp_min(0))
    union = aw * ah + bw * bh - inter
    iou = inter / union
    cw = torch.maximum(ax2, bx2) - torch.minimum(ax1, bx1)
    ch = torch.maximum(ay2, by2) - torch.minimum(ay1, by1)
    rho2 = ((ax1 + ax2 - bx1 - bx2) ** 2 + (ay1 + ay2 - by1 - by2) ** 2) / 4
    return iou, rho2 / (cw ** 2 + ch ** 2), (aw, ah, bw, bh)


@impl("npu_diou")
def npu_diou(self, gtboxes, trans=False, is_cross=False, mode=0):
    """Distance-IoU ``diou = iou - rho^2 / c^2``: ``rho`` the distance between the box centres,
    ``c`` the diagonal of the smallest box enclosing both. Boxes are columns of (4, n) tensors:
    ``x1, y1, x2, y2``, or ``x, y, w, h`` (centre, size) with ``trans=True``. Output (1, N) for
    ``is_cross=False`` (box n against gtbox n), (M, N) for ``is_cross=True`` (every gtbox m
    against every box n). Only ``mode=0`` (IoU) exists here. Differentiable."""
    iou, dist, _ = _terms("npu_diou", self, gtboxes, trans, is_cross, mode)
    return (iou - dist).to(self.dtype)


@impl("npu_ciou")
def npu_ciou(self, gtboxes, trans=False, is_cross=True, mode=0, atan_sub_flag=False):
    """Complete-IoU ``ciou = diou - alpha * v`` with the aspect-ratio term
    ``v = 4 / pi^2 * (atan(w_gt / h_gt) - atan(w / h))^2`` and ``alpha = v / (1 - iou + v)``
    (layouts and output shapes as :func:`npu_diou`). ``atan_sub_flag`` only chooses what the
    hardware saves for its backward; the value is the same. Differentiable; as the hardware
    backward (CIoUGrad) does, the gradient holds ``alpha`` constant (only ``v`` and the DIoU
    terms are differentiated)."""
    iou, dist, (aw, ah, bw, bh) = _terms("npu_ciou", self, gtboxes, trans, is_cross, mode)
    v = (4 / math.pi ** 2) * (torch.atan(bw / bh) - torch.atan(aw / ah)) ** 2
    alpha = (v / (1 - iou + v)).detach()
    return (iou - dist - alpha * v).to(self.dtype)


def _box_grad_dtype(bboxes, gtboxes):
    return torch.float16 if torch.float16 in (bboxes.dtype, gtboxes.dtype) else bboxes.dtype


def _overlap_vjp(op, forward, grad, bboxes, gtboxes, *args):
    """(d bboxes, d gtboxes) of ``sum(grad * forward(bboxes, gtboxes, *args))`` in the compute
    precision (float32 for float16/bfloat16 boxes, float64 kept for gradcheck)."""
    compute = torch.float64 if bboxes.dtype == torch.float64 else torch.float32
    with torch.enable_grad():
        b = bboxes.detach().to(compute).requires_grad_(True)
        g = gtboxes.detach().to(compute).requires_grad_(True)
        overlap = forward(b, g, *args)
        check(grad.numel() == overlap.numel(), op, "grad must hold one value per overlap (%d), got shape %s",
              (overlap.numel(), tuple(grad.shape)))
        db, dg = torch.autograd.grad(overlap, (b, g), grad.detach().to(overlap.dtype).reshape(overlap.shape))
    out = _box_grad_dtype(bboxes, gtboxes)
    return db.to(out), dg.to(out)


@impl("npu_diou_backward")
def npu_diou_backward(grad, bboxes, gtboxes, trans=False, is_cross=False, mode=0):
    """Gradient of npu_diou with respect to both box tensors (see the module docstring)."""
    return _overlap_vjp("npu_diou_backward", npu_diou, grad, bboxes, gtboxes, trans, is_cross, mode)


def _check_ciou_dtypes(op, *boxes):
    for t in boxes:
        check(t.dtype in _CODER_DTYPES, op, "boxes must be float16 or float32, got %s", (t.dtype,))


def _ciou_parts(op, boxes, gtboxes, trans, is_cross, mode):
    """(iou - rho^2 / c^2, iou, atan_sub) broadcast to (M, N) or (1, N), in compute precision."""
    iou, dist, (aw, ah, bw, bh) = _terms(op, boxes, gtboxes, trans, is_cross, mode)
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
    check(atan_sub.numel() == bboxes.size(-1), op, "atan_sub must hold one value per box (%d), got shape %s",
          (bboxes.size(-1), tuple(atan_sub.shape)))

    def overlap(b, g):
        diou, iou, formula = _ciou_parts(op, b, g, trans, is_cross, mode)
        given = atan_sub.detach().to(formula.dtype).reshape(formula.shape)
        value_given = given + (formula - formula.detach())  # value of atan_sub, gradient of the formula
        return diou - _penalty((4 / math.pi ** 2) * value_given ** 2, iou)

    return _overlap_vjp(op, overlap, grad, bboxes, gtboxes)
