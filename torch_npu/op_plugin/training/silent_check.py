"""silent"""
import torch
from torch_npu.op_plugin._registry import meta

__all__ = []


@meta("_npu_silent_check")
def _npu_silent_check(input_grad, val, pre_val, min_val, max_val, val_counter, c_min_steps, c_thresh_l1, c_coeff_l1,
                      c_thresh_l2, c_coeff_l2):
    """The detection result, shaped and typed like ``val_counter``."""
    return torch.empty_like(val_counter)


@meta("_npu_silent_check_v2")
def _npu_silent_check_v2(val, input_grad, sfda, step, c_min_steps, c_thresh_l1, c_coeff_l1, c_thresh_l2, c_coeff_l2,
                         npu_asd_detect):
    """The detection result: int32 of ``step``'s shape."""
    return step.new_empty(tuple(step.shape), dtype=torch.int32)


@meta("_npu_silent_check_v3")
def _npu_silent_check_v3(val, input_grad, step, max, avg, c_thresh_l1, c_thresh_l2, betal, npu_asd_detect):
    """The detection result: int32 of ``step``'s shape."""
    return step.new_empty(tuple(step.shape), dtype=torch.int32)
