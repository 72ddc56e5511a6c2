"""Multi-class NMS in mmdetection's calling convention, on ``npu_batch_nms``."""
import torch

import torch_npu

__all__ = ["npu_multiclass_nms", "npu_batched_multiclass_nms"]


def npu_multiclass_nms(multi_bboxes, multi_scores, score_thr=0.05, nms_thr=0.45, max_num=50,
                       score_factors=None):
    """NMS of one image. ``multi_bboxes`` (n, #class, 4) or (n, 4); ``multi_scores`` (n, #class+1),
    the last column (background) ignored; ``score_factors`` (n,) multiplies the scores.

    Returns ``(dets (max_num, 5), labels (max_num,))``: rows ``[x1, y1, x2, y2, score]``
    sorted by score, zero-padded past the kept boxes. Computed in float16, as on hardware.
    """
    num_classes = multi_scores.size(1) - 1
    num_boxes = multi_scores.size(0)
    scores = multi_scores[:, :-1]
    if score_factors is not None:
        scores = scores * score_factors[:, None]
    boxes = multi_bboxes.reshape(1, num_boxes, multi_bboxes.numel() // 4 // num_boxes, 4)
    scores = scores.reshape(1, num_boxes, num_classes)
    nmsed_boxes, nmsed_scores, nmsed_classes, _ = torch_npu.npu_batch_nms(
        boxes.half(), scores.half(), score_thr, nms_thr, max_num, max_num)
    nmsed_boxes = nmsed_boxes.reshape(nmsed_boxes.shape[1:])
    nmsed_scores = nmsed_scores.reshape(nmsed_scores.shape[1])
    nmsed_classes = nmsed_classes.reshape(nmsed_classes.shape[1])
    return torch.cat([nmsed_boxes, nmsed_scores[:, None]], -1), nmsed_classes


def npu_batched_multiclass_nms(multi_bboxes, multi_scores, score_thr=0.05, nms_thr=0.45, max_num=50,
                               score_factors=None):
    """Batched :func:`npu_multiclass_nms`: ``multi_bboxes`` (bs, n, #class, 4) or (bs, n, 4),
    ``multi_scores`` (bs, n, #class+1). Returns ``(dets (bs, max_num, 5), labels (bs, max_num))``."""
    num_classes = multi_scores.size(2) - 1
    num_boxes = multi_scores.size(1)
    batch_size = multi_scores.size(0)
    scores = multi_scores[..., :-1]
    if score_factors is not None:
        scores = scores * score_factors[..., None]
    boxes = multi_bboxes.reshape(batch_size, num_boxes, multi_bboxes.numel() // 4 // num_boxes // batch_size, 4)
    scores = scores.reshape(batch_size, num_boxes, num_classes)
    nmsed_boxes, nmsed_scores, nmsed_classes, _ = torch_npu.npu_batch_nms(
        boxes.half(), scores.half(), score_thr, nms_thr, max_num, max_num)
    return torch.cat([nmsed_boxes, nmsed_scores[..., None]], -1), nmsed_classes
