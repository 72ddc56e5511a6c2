"""Box coder of Faster R-CNN: npu_bounding_box_encode (the deltas ``((gx - ax) / aw, (gy - ay) / ah,
ln(gw / aw), ln(gh / ah))``, normalised by ``means`` / ``stds``) and npu_bounding_box_decode (its
inverse, clipped to ``max_shape``, with the ``wh_ratio_clip`` limit on the size deltas).
"""
import math

import torch

from torch_npu.op_plugin._common import acc, check, unsupported
from torch_npu.op_plugin._registry import impl

__all__ = []


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
