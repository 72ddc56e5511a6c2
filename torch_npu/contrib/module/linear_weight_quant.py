"""Weight-only quantised linear layer ``y = x @ dequant(W)^T + bias`` on ``npu_weight_quant_batchmatmul``."""
import torch
import torch.nn as nn
from torch import Tensor
from torch.nn.parameter import Parameter

import torch_npu

__all__ = ["LinearWeightQuant"]


class LinearWeightQuant(nn.Module):
    """``weight`` (out_features, in_features) int8 (or packed int4), dequantised as
    ``(W + antiquant_offset) * antiquant_scale`` (per channel, or per group of
    ``antiquant_group_size`` input features with 2-d (out, groups) scales); optional
    ``quant_scale``/``quant_offset`` requantise the output. Parameters are created empty."""

    def __init__(self, in_features, out_features, bias: bool = True, device=None, dtype=None,
                 antiquant_offset: bool = False, quant_scale: bool = False, quant_offset: bool = False,
                 antiquant_group_size: int = 0, inner_precise: int = 0, weight_dtype=None) -> None:
        super().__init__()
        self.weight = Parameter(torch.empty((out_features, in_features), device=device), False)
        self.antiquant_scale = Parameter(torch.empty(out_features, device=device), False)
        for name, wanted in (("antiquant_offset", antiquant_offset), ("quant_scale", quant_scale),
                             ("quant_offset", quant_offset), ("bias", bias)):
            if wanted:
                setattr(self, name, Parameter(torch.empty(out_features, device=device), False))
            else:
                self.register_parameter(name, None)
        self.antiquant_group_size = antiquant_group_size
        self.inner_precise = inner_precise
        self.weight_dtype = weight_dtype

    def forward(self, x: Tensor) -> Tensor:
        antiquant_scale = self.antiquant_scale
        antiquant_offset = self.antiquant_offset
        # Parameters are stored (out, ...) like the weight; the op takes (in, out) layouts.
        if antiquant_scale.dim() == 2:
            antiquant_scale = antiquant_scale.transpose(-1, -2)
        if antiquant_offset is not None and antiquant_offset.dim() == 2:
            antiquant_offset = antiquant_offset.transpose(-1, -2)
        return torch_npu.npu_weight_quant_batchmatmul(x, self.weight.transpose(-1, -2), antiquant_scale,
                                                      antiquant_offset, self.quant_scale, self.quant_offset,
                                                      self.bias, self.antiquant_group_size, self.inner_precise,
                                                      weight_dtype=self.weight_dtype)
