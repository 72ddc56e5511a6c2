"""Shared argument checks of the box helpers (float/half boxes, (N, 4) pairs)."""
import torch

from torch_npu.utils._error_code import ErrCode, ops_error

__all__ = []


def as_float_box(box):
    # The box ops take float32 or float16; anything else (int coordinates) becomes float32.
    if box.dtype not in (torch.float32, torch.float16):
        return box.float()
    return box


def check_pair(boxes, others, other_name):
    if boxes.size(0) != others.size(0):
        raise ValueError("Expected bboxes.size(0) == %s.size(0)" % other_name + ops_error(ErrCode.VALUE))
    if not (boxes.size(-1) == others.size(-1) == 4):
        raise ValueError("Expected bboxes.size(-1) == %s.size(-1) == 4" % other_name + ops_error(ErrCode.VALUE))
