"""Position-sensitive RoI pooling (R-FCN) on ``npu_ps_roi_pooling``.

``npu_ps_roi_pooling`` is not emulated yet, so ``forward`` raises its NotImplementedError.
"""
from torch import nn

import torch_npu

__all__ = []


class PSROIPool(nn.Module):
    """PS-RoI pooling; only ``pooled_height == pooled_width == group_size`` is supported."""

    def __init__(self, pooled_height=7, pooled_width=7, spatial_scale=1 / 16.0, group_size=7, output_dim=22):
        super().__init__()
        if not (pooled_height == pooled_width == group_size):
            raise ValueError("only pooled_height == pooled_width == group_size supported.")
        self.pooled_height = pooled_height
        self.pooled_width = pooled_width
        self.group_size = group_size
        self.spatial_scale = spatial_scale
        self.output_dim = output_dim

    def forward(self, features, rois):
        return torch_npu.npu_ps_roi_pooling(features, rois, self.spatial_scale, self.group_size, self.output_dim)

    def __repr__(self):
        return "%s(pooled_width=%s, pooled_height=%s, spatial_scale=%s, group_size=%s, output_dim=%s)" % (
            self.__class__.__name__, self.pooled_width, self.pooled_height, self.spatial_scale,
            self.group_size, self.output_dim)
