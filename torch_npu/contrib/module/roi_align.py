"""RoIAlign module (detectron2's ROIAlign signature) on ``npu_roi_align``."""
from torch import nn
from torch.nn.modules.utils import _pair

import torch_npu

__all__ = []


class ROIAlign(nn.Module):
    """RoIAlign of NCHW ``input_tensor`` over ``rois`` (K, 5) ``[batch_index, x1, y1, x2, y2]``.

    ``aligned=True`` shifts the scaled box by -0.5 pixel (``roi_end_mode=3``), ``False`` is the
    legacy Detectron convention (``roi_end_mode=0``). The input is computed in float32.
    Gradients flow to ``input_tensor`` through the emulated op's autograd (on hardware a
    dedicated ``npu_roi_alignbk`` kernel computes the same gradient).
    """

    def __init__(self, output_size, spatial_scale, sampling_ratio, aligned=True):
        super().__init__()
        self.output_size = output_size
        self.spatial_scale = spatial_scale
        self.sampling_ratio = sampling_ratio
        self.aligned = aligned

    def forward(self, input_tensor, rois):
        if rois.dim() != 2 or rois.size(1) != 5:
            raise ValueError("Expected rois.dim() == 2 and rois.size(1) == 5")
        pooled_h, pooled_w = _pair(self.output_size)
        roi_end_mode = 3 if self.aligned else 0
        return torch_npu.npu_roi_align(input_tensor.float(), rois, self.spatial_scale, pooled_h, pooled_w,
                                       self.sampling_ratio, roi_end_mode)

    def __repr__(self):
        return "%s(output_size=%s, spatial_scale=%s, sampling_ratio=%s, aligned=%s)" % (
            self.__class__.__name__, self.output_size, self.spatial_scale, self.sampling_ratio, self.aligned)
