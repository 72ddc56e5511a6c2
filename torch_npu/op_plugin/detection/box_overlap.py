"""Distance-aware box overlaps: npu_diou, npu_ciou (boxes stored column-wise, (4, n))."""
import math

import torch

from torch_npu.op_plugin._common import acc, check, unsupported
from torch_npu.op_plugin._registry import impl

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
    check(boxes.dim() == 2 and boxes.size(0) == 4, op, "self must be (4, N), got %s" % (tuple(boxes.shape),))
    check(gtboxes.dim() == 2 and gtboxes.size(0) == 4, op, "gtboxes must be (4, M), got %s" % (tuple(gtboxes.shape),))
    if not is_cross:
        check(gtboxes.size(1) == boxes.size(1), op, "gtboxes must have the N=%d boxes of self, got %d"
              % (boxes.size(1), gtboxes.size(1)))
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
