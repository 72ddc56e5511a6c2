"""``_npu_silent_check`` (+ ``_v2``, ``_v3``): the silent-data-corruption checks of torch_npu's
training step: meta-only.

Not emulated: a real CPU / npu call raises NotImplementedError naming the op. The Meta kernels give
the output shapes and dtypes from op-plugin's own output-size code (read, not copied), so
FakeTensor / torch.compile trace through them; in-place ops give back the mutated argument itself.
"""
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
