"""Quantised conv2d + dequant ``(conv(x_q, W_q) + bias) * scale`` on ``npu_quant_conv2d``.

``npu_quant_conv2d`` is not emulated yet: ``forward`` raises its NotImplementedError.
"""
from typing import Union

import torch
import torch.nn as nn
from torch import Tensor
from torch.nn.modules.utils import _pair
from torch.nn.parameter import Parameter

import torch_npu

__all__ = ["QuantConv2d"]


class QuantConv2d(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, kernel_size: Union[int, tuple[int, int]],
                 output_dtype: int, stride: Union[int, tuple[int, int]] = 1,
                 padding: Union[int, tuple[int, int]] = 0, dilation: Union[int, tuple[int, int]] = 1,
                 groups: int = 1, bias: bool = True, offset: bool = False, offset_x: int = 0,
                 round_mode: str = 'rint', input_dtype: int = None, weight_dtype: int = None,
                 device=None, dtype=None) -> None:
        super().__init__()
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.kernel_size = _pair(kernel_size)
        self.stride = _pair(stride)
        self.padding = _pair(padding)
        self.dilation = _pair(dilation)
        self.groups = groups
        self.offset_x = offset_x
        self.round_mode = round_mode
        self.output_dtype = output_dtype
        self.input_dtype = input_dtype
        self.weight_dtype = weight_dtype
        self.weight = Parameter(torch.empty((out_channels, in_channels, *self.kernel_size), dtype=torch.int8,
                                            device=device), False)
        self.scale = Parameter(torch.empty(out_channels, dtype=torch.int64, device=device), False)
        if bias:
            self.bias = Parameter(torch.empty(out_channels, dtype=torch.int32, device=device), False)
        else:
            self.register_parameter('bias', None)
        if offset:
            self.offset = Parameter(torch.empty(out_channels, dtype=torch.float32, device=device), False)
        else:
            self.register_parameter('offset', None)

    def forward(self, quant_conv2d_input: Tensor) -> Tensor:
        scale = self.scale
        if scale.dtype == torch.float32:
            scale = torch_npu.npu_trans_quant_param(scale)
        return torch_npu.npu_quant_conv2d(quant_conv2d_input, self.weight, scale, self.stride, self.padding,
                                          self.dilation, self.groups, self.offset_x, self.round_mode,
                                          self.output_dtype, self.bias, self.offset,
                                          input_dtype=self.input_dtype, weight_dtype=self.weight_dtype)
