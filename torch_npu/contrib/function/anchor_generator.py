"""Responsible-anchor flags of one feature-map level (mmdetection's anchor generator)."""
import torch

import torch_npu

__all__ = []


def box_dtype_check(box):
    """``box`` as float32 unless it already is float32/float16."""
    if box.dtype not in (torch.float32, torch.float16):
        return box.float()
    return box


def npu_single_level_responsible_flags(featmap_size, gt_bboxes, stride, num_base_anchors):
    """uint8 flags (featmap_h * featmap_w * num_base_anchors,): 1 for the anchors of the cells
    that contain a ground-truth box centre."""
    gt_bboxes = box_dtype_check(gt_bboxes)
    return torch_npu.npu_anchor_response_flags(gt_bboxes, list(featmap_size), list(stride), num_base_anchors)
