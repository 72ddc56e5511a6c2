"""Box regression encode/decode (mmdetection's coders) on the npu box ops."""
import torch

import torch_npu
from torch_npu.contrib.function._box_checks import as_float_box, check_pair

__all__ = ['npu_bbox_coder_encode_yolo',
           'npu_bbox_coder_decode_xywh2xyxy',
           'npu_bbox_coder_encode_xyxy2xywh']


def npu_bbox_coder_encode_yolo(bboxes, gt_bboxes, stride):
    """YOLO deltas turning ``bboxes`` (N, 4) into ``gt_bboxes`` (N, 4); ``stride`` (N,) int."""
    check_pair(bboxes, gt_bboxes, "gt_bboxes")
    bboxes, gt_bboxes = as_float_box(bboxes), as_float_box(gt_bboxes)
    if stride.dtype != torch.int32:
        stride = stride.int()
    return torch_npu.npu_yolo_boxes_encode(bboxes, gt_bboxes, stride, performance_mode=False)


def npu_bbox_coder_encode_xyxy2xywh(bboxes, gt_bboxes, means=None, stds=None,
                                    is_normalized=False, normalized_scale=10000.):
    """Deltas (dx, dy, dw, dh) from xyxy ``bboxes`` to xyxy ``gt_bboxes``, normalised by means/stds.

    Normalised coordinates are scaled back by ``normalized_scale`` first (the op works on
    ordinary pixel coordinates).
    """
    means = [0., 0., 0., 0.] if means is None else means
    stds = [1., 1., 1., 1.] if stds is None else stds
    check_pair(bboxes, gt_bboxes, "gt_bboxes")
    bboxes, gt_bboxes = as_float_box(bboxes), as_float_box(gt_bboxes)
    if is_normalized:
        bboxes = bboxes * normalized_scale
        gt_bboxes = gt_bboxes * normalized_scale
    return torch_npu.npu_bounding_box_encode(bboxes, gt_bboxes, *means[:4], *stds[:4])


def npu_bbox_coder_decode_xywh2xyxy(bboxes, pred_bboxes, means=None, stds=None, max_shape=None,
                                    wh_ratio_clip=16 / 1000):
    """Apply deltas ``pred_bboxes`` to xyxy ``bboxes``; boxes clipped to ``max_shape`` (H, W)."""
    means = [0., 0., 0., 0.] if means is None else means
    stds = [1., 1., 1., 1.] if stds is None else stds
    max_shape = [9999, 9999] if max_shape is None else max_shape
    check_pair(bboxes, pred_bboxes, "pred_bboxes")
    bboxes, pred_bboxes = as_float_box(bboxes), as_float_box(pred_bboxes)
    return torch_npu.npu_bounding_box_decode(bboxes, pred_bboxes, *means[:4], *stds[:4],
                                             list(max_shape), wh_ratio_clip)
