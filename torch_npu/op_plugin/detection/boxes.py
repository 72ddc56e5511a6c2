"""Detection / indexing ops: npu_iou, npu_ptiou, npu_giou, npu_bounding_box_encode,
npu_bounding_box_decode, npu_scatter_nd_update(_), scatter_update(_),
npu_sign_bits_pack/unpack, npu_group_norm_silu, npu_softmax_cross_entropy_with_logits,
npu_max.dim."""
import math

import torch

from torch_npu.op_plugin._common import acc, check, unsupported
from torch_npu.op_plugin._registry import impl

__all__ = []

_IOU_EPS = 0.01  # offset the Iou kernel adds to box widths/heights in the areas (torch_npu passes eps=0.01)


def _iou(op, bboxes, gtboxes, mode):
    check(bboxes.dim() == 2 and bboxes.size(-1) == 4, op, "bboxes must be (N, 4), got %s" % (tuple(bboxes.shape),))
    check(gtboxes.dim() == 2 and gtboxes.size(-1) == 4, op, "gtboxes must be (M, 4), got %s" % (tuple(gtboxes.shape),))
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
    check(self.dim() == 2 and self.size(0) == 4, op, "self must be (4, N), got %s" % (tuple(self.shape),))
    check(tuple(gtboxes.shape) == tuple(self.shape), op, "gtboxes must have the shape of self %s, got %s"
          % (tuple(self.shape), tuple(gtboxes.shape)))

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


def _centre_size(boxes):
    x1, y1, x2, y2 = boxes.unbind(-1)
    return (x1 + x2) * 0.5, (y1 + y2) * 0.5, x2 - x1 + 1.0, y2 - y1 + 1.0


@impl("npu_bounding_box_encode")
def npu_bounding_box_encode(anchor_box, ground_truth_box, means0, means1, means2, means3,
                            stds0, stds1, stds2, stds3):
    """Delta encoding of ``ground_truth_box`` against ``anchor_box`` (both (N, 4) ``x1, y1, x2, y2``).

    Sizes use the legacy ``+1`` convention (``w = x2 - x1 + 1``):
    ``dx = ((gx - px) / pw - means0) / stds0``, ``dy`` likewise,
    ``dw = (log(|gw / pw|) - means2) / stds2``, ``dh`` likewise. Returns (N, 4).
    """
    op = "npu_bounding_box_encode"
    check(anchor_box.dim() == 2 and anchor_box.size(-1) == 4, op, "anchor_box must be (N, 4)")
    check(tuple(ground_truth_box.shape) == tuple(anchor_box.shape), op, "ground_truth_box must match anchor_box")
    px, py, pw, ph = _centre_size(acc(anchor_box))
    gx, gy, gw, gh = _centre_size(acc(ground_truth_box).to(px.dtype))
    dx = ((gx - px) / pw - means0) / stds0
    dy = ((gy - py) / ph - means1) / stds1
    dw = (torch.log((gw / pw).abs()) - means2) / stds2
    dh = (torch.log((gh / ph).abs()) - means3) / stds3
    return torch.stack([dx, dy, dw, dh], -1).to(anchor_box.dtype)


@impl("npu_bounding_box_decode")
def npu_bounding_box_decode(rois, deltas, means0, means1, means2, means3,
                            stds0, stds1, stds2, stds3, max_shape, wh_ratio_clip):
    """Inverse of :func:`npu_bounding_box_encode` (legacy ``+1`` box convention).

    ``d = deltas * stds + means``; ``dw, dh`` are clamped to ``±|log(wh_ratio_clip)|``;
    ``gx = px + pw * dx``, ``gw = pw * exp(dw)`` (y likewise);
    ``x1 = gx - gw/2 + 0.5``, ``x2 = gx + gw/2 - 0.5``; then x is clamped to
    ``[0, max_shape[1] - 1]`` and y to ``[0, max_shape[0] - 1]`` (``max_shape = (h, w)``).
    """
    op = "npu_bounding_box_decode"
    check(rois.dim() == 2 and rois.size(-1) == 4, op, "rois must be (N, 4)")
    check(tuple(deltas.shape) == tuple(rois.shape), op, "deltas must match rois")
    if len(max_shape) != 2:
        unsupported(op, "max_shape=%r (must be (h, w))" % (list(max_shape),))
    px, py, pw, ph = _centre_size(acc(rois))
    d = acc(deltas).to(px.dtype)
    dx = d[:, 0] * stds0 + means0
    dy = d[:, 1] * stds1 + means1
    dw = d[:, 2] * stds2 + means2
    dh = d[:, 3] * stds3 + means3
    max_ratio = abs(math.log(wh_ratio_clip))
    dw = dw.clamp(-max_ratio, max_ratio)
    dh = dh.clamp(-max_ratio, max_ratio)
    gw = pw * torch.exp(dw)
    gh = ph * torch.exp(dh)
    gx = px + pw * dx
    gy = py + ph * dy
    h, w = max_shape
    x1 = (gx - gw * 0.5 + 0.5).clamp(0, w - 1)
    y1 = (gy - gh * 0.5 + 0.5).clamp(0, h - 1)
    x2 = (gx + gw * 0.5 - 0.5).clamp(0, w - 1)
    y2 = (gy + gh * 0.5 - 0.5).clamp(0, h - 1)
    return torch.stack([x1, y1, x2, y2], -1).to(rois.dtype)
