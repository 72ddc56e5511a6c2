"""IoU family (deprecated in torch_npu 2.13: kept here, not exported by ``torch_npu.contrib``).

Thin wrappers of the npu IoU ops with torch_npu's argument conventions.
"""

import torch_npu
from torch_npu.contrib.function._box_checks import as_float_box
from torch_npu.utils._error_code import ErrCode, ops_error

__all__ = []


def npu_iou(boxes1, boxes2, mode="ptiou", is_normalized=False, normalized_scale=100.):
    """IoU of every pair of xyxy boxes1 (N, 4) x boxes2 (M, 4) -> (N, M).

    Both modes give the IoU of :func:`torch_npu.npu_iou` (``ptiou`` is its deprecated alias).
    Normalised coordinates are first scaled by ``normalized_scale``.
    """
    if mode not in ("iou", "ptiou"):
        raise ValueError("Expected mode in [iou, ptiou]" + ops_error(ErrCode.VALUE))
    boxes1, boxes2 = as_float_box(boxes1), as_float_box(boxes2)
    if is_normalized:
        boxes1 = boxes1 * normalized_scale
        boxes2 = boxes2 * normalized_scale
    # The ops take (bboxes, gtboxes) and return (gt, bboxes); passing (boxes2, boxes1) gives (N, M).
    if mode == "iou":
        return torch_npu.npu_iou(boxes2, boxes1)
    return torch_npu.npu_ptiou(boxes2, boxes1)


npu_ptiou = npu_iou


def npu_giou(boxes1, boxes2, is_permuted=True):
    """Aligned GIoU of xywh boxes (n, 4) -> (n, 1); differentiable."""
    if boxes1.shape != boxes2.shape:
        raise ValueError("Expected boxes1.shape == boxes2.shape" + ops_error(ErrCode.VALUE))
    boxes1, boxes2 = as_float_box(boxes1), as_float_box(boxes2)
    if is_permuted:
        boxes1 = boxes1.permute(1, 0)
        boxes2 = boxes2.permute(1, 0)
    return torch_npu.npu_giou(boxes1, boxes2, trans=True, is_cross=False)


def npu_diou(boxes1, boxes2, trans=True, is_cross=False, mode=0):
    """DIoU of (4, n) boxes -> (1, n): iou - centre_distance^2 / enclosing_diagonal^2."""
    return torch_npu.npu_diou(boxes1, boxes2, trans, is_cross, mode)


def npu_ciou(boxes1, boxes2, trans=True, is_cross=False, mode=0):
    """CIoU of (4, n) boxes -> (1, n): DIoU minus the aspect-ratio penalty alpha * v."""
    return torch_npu.npu_ciou(boxes1, boxes2, trans, is_cross, mode, True)


