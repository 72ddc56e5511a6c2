"""Axis-aligned IoU ops: npu_iou, npu_ptiou, npu_giou and npu_giou_backward.

npu_giou_backward is the vector-Jacobian product of npu_giou (the ``GIoUGrad`` kernel):
``dbboxes = sum_k grad_k * d giou_k / d bboxes``, likewise ``dgtboxes``; it exists only for
``trans=True, is_cross=False, mode=0`` (op-plugin's check, same message).
"""

import torch

from torch_npu.op_plugin._common import acc, check, unsupported
from torch_npu.op_plugin._registry import impl
from torch_npu.op_plugin.detection.box_overlap import _overlap_vjp

__all__ = []

_IOU_EPS = 0.01  # offset the Iou kernel adds to box widths/heights in the areas (torch_npu passes eps=0.01)


def _iou(op, bboxes, gtboxes, mode):
    check(bboxes.dim() == 2 and bboxes.size(-1) == 4, op, "bboxes must be (N, 4), got %s", (tuple(bboxes.shape),))
    check(gtboxes.dim() == 2 and gtboxes.size(-1) == 4, op, "gtboxes must be (M, 4), got %s", (tuple(gtboxes.shape),))
    if mode not in (0, 1):
        unsupported(op, "mode=%r (only 0 'iou' and 1 'iof')" % (mode,))
    b = acc(bboxes)[None, :, :]   # (1, N, 4)
    g = acc(gtboxes).to(b.dtype)[:, None, :]  # (M, 1, 4)
    iw = (torch.minimum(b[..., 2], g[..., 2]) - torch.maximum(b[..., 0], g[..., 0])).clamp_min(0)
    ih = (torch.minimum(b[..., 3], g[..., 3]) - torch.maximum(b[..., 1], g[..., 1])).clamp_min(0)
    inter = iw * ih
    area_b = (b[..., 2] - b[..., 0] + _IOU_EPS) * (b[..., 3] - b[..., 1] + _IOU_EPS)
    area_g = (g[..., 2] - g[..., 0] + _IOU_EPS) * (g[..., 3] - g[..., 1] + _IOU_EPS)
    denom = area_b + area_g - inter if mode == 0 else area_g.expand_as(inter)
    return (inter / denom).to(bboxes.dtype)


@impl("npu_iou")
def npu_iou(bboxes, gtboxes, mode=0):
    """IoU (mode 0) or IoF (mode 1) of every (gtbox, bbox) pair, boxes ``[x1, y1, x2, y2]``.

    ``bboxes`` is (N, 4), ``gtboxes`` (M, 4); the result is (M, N) with
    ``out[m, n] = inter / union`` (IoU) or ``inter / area(gtboxes[m])`` (IoF), where
    box areas use the kernel's 0.01 offset (``(x2 - x1 + 0.01) * (y2 - y1 + 0.01)``) and the
    intersection (no offset) has its width/height clamped at 0. Computed in float32 for float16 inputs.
    """
    return _iou("npu_iou", bboxes, gtboxes, mode)


@impl("npu_ptiou")
def npu_ptiou(bboxes, gtboxes, mode=0):
    """Deprecated alias of :func:`npu_iou` (same layout and formula)."""
    return _iou("npu_ptiou", bboxes, gtboxes, mode)


@impl("npu_giou")
def npu_giou(self, gtboxes, trans=False, is_cross=False, mode=0):
    """Aligned GIoU of boxes stored column-wise: ``self`` and ``gtboxes`` are (4, N).

    ``trans=False``: rows are ``x1, y1, x2, y2``; ``trans=True``: ``x, y, w, h``
    (centre and size). ``giou = iou - (C - U) / C`` with ``C`` the smallest
    enclosing box area and ``U`` the union. Result is (N, 1). Only the documented
    ``is_cross=False, mode=0`` is emulated; others raise NotImplementedError.
    """
    op = "npu_giou"
    if is_cross:
        unsupported(op, "is_cross=True")
    if mode != 0:
        unsupported(op, "mode=%r (only mode=0 'iou')" % (mode,))
    check(self.dim() == 2 and self.size(0) == 4, op, "self must be (4, N), got %s", (tuple(self.shape),))
    check(tuple(gtboxes.shape) == tuple(self.shape), op, "gtboxes must have the shape of self %s, got %s",
          (tuple(self.shape), tuple(gtboxes.shape)))

    def corners(t):
        t = acc(t)
        if trans:
            return t[0] - t[2] / 2, t[1] - t[3] / 2, t[0] + t[2] / 2, t[1] + t[3] / 2
        return t[0], t[1], t[2], t[3]

    ax1, ay1, ax2, ay2 = corners(self)
    bx1, by1, bx2, by2 = corners(gtboxes)
    iw = (torch.minimum(ax2, bx2) - torch.maximum(ax1, bx1)).clamp_min(0)
    ih = (torch.minimum(ay2, by2) - torch.maximum(ay1, by1)).clamp_min(0)
    inter = iw * ih
    union = (ax2 - ax1) * (ay2 - ay1) + (bx2 - bx1) * (by2 - by1) - inter
    enclose = (torch.maximum(ax2, bx2) - torch.minimum(ax1, bx1)) * (torch.maximum(ay2, by2) - torch.minimum(ay1, by1))
    giou = inter / union - (enclose - union) / enclose
    return giou.unsqueeze(-1).to(self.dtype)


@impl("npu_giou_backward")
def npu_giou_backward(grad, bboxes, gtboxes, trans=False, is_cross=False, mode=0):
    """Gradient of npu_giou with respect to both box tensors (see the module docstring)."""
    check(trans and not is_cross and mode == 0, "npu_giou_backward",
          "giou backward only support trans==True, is_cross==False, mode==0('iou') current version "
          "if you need to back propagation, please ensure your parameter is correct!")
    return _overlap_vjp("npu_giou_backward", npu_giou, grad, bboxes, gtboxes, trans, is_cross, mode)
