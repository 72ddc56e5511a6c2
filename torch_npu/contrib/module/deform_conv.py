"""Modulated deformable convolution (DCNv2, mmcv's ModulatedDeformConv2dPack) on
``npu_deformable_conv2d`` (forward) and ``npu_deformable_conv2dbk`` (backward).

mmcv's offset interleaves (dy, dx) per kernel tap; the npu op wants all dx, then all dy, then the
mask (see torch_npu/op_plugin/conv/deformable_conv2d.py), hence the ``sort_index_for_npu_*`` permutations.
As in torch_npu the op's kernel_size is passed as [weight.shape[3], weight.shape[2]], so only square
kernels are accepted (the op rejects a kernel_size that differs from the weight's [kh, kw]).
"""
import math

import torch
from torch import nn
from torch.nn.modules.utils import _pair

import torch_npu

__all__ = ["ModulatedDeformConv2dFunction", "ModulatedDeformConv"]


class ModulatedDeformConv2dFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, input_tensor, offset_ori, mask, weight, bias=None, with_bias=False, stride=1, padding=0,
                dilation=1, groups=1, deformable_groups=1, sort_index_for_npu_fp=None, sort_index_for_npu_bp=None):
        # The npu kernel takes the offsets x-first, then the mask, in one tensor.
        offset = offset_ori.index_select(1, sort_index_for_npu_fp) if sort_index_for_npu_fp is not None \
            else offset_ori
        offset_all = torch.cat([offset, mask], dim=1)
        ctx.conv_args = dict(
            kernel_size=[weight.shape[3], weight.shape[2]], stride=[1, 1, stride, stride],
            padding=[padding, padding, padding, padding], dilation=[1, 1, dilation, dilation],
            groups=groups, deformable_groups=deformable_groups, modulated=True)
        ctx.with_bias = with_bias
        ctx.sort_index_for_npu_bp = sort_index_for_npu_bp
        output, offset_out = torch_npu.npu_deformable_conv2d(
            input_tensor, weight, offset_all, bias if with_bias else None, **ctx.conv_args)
        ctx.save_for_backward(input_tensor, weight, offset_out, offset_all)
        return output

    @staticmethod
    def backward(ctx, grad_output):
        input_tensor, weight, offset_out, offset_all = ctx.saved_tensors
        grad_input, grad_weight, grad_offset_all, grad_bias = torch_npu.npu_deformable_conv2dbk(
            input_tensor, grad_output, offset_out, weight, offset_all, **ctx.conv_args)
        split = grad_offset_all.shape[1] * 2 // 3
        # Back to mmcv's interleaved (dy, dx) order; the mask gradient is the last third.
        grad_offset = grad_offset_all.index_select(1, ctx.sort_index_for_npu_bp) \
            if ctx.sort_index_for_npu_bp is not None else grad_offset_all[:, :split]
        grad_mask = grad_offset_all[:, split:]
        return (grad_input, grad_offset, grad_mask, grad_weight, grad_bias if ctx.with_bias else None,
                None, None, None, None, None, None, None, None)


class ModulatedDeformConv(nn.Module):
    """DCNv2 layer. ``pack=True``: offsets and mask come from an internal ``conv_offset``
    (zero-initialised, mask = sigmoid); ``pack=False``: ``forward`` takes ``(x, offset, mask)``."""

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1, groups=1,
                 deformable_groups=1, bias=True, pack=True):
        super().__init__()
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.kernel_size = _pair(kernel_size)
        self.stride = stride
        self.padding = padding
        self.dilation = dilation
        self.groups = groups
        self.deformable_groups = deformable_groups
        self.with_bias = bias
        self.pack = pack
        self.weight = nn.Parameter(torch.empty(out_channels, in_channels // groups, *self.kernel_size))
        if bias:
            self.bias = nn.Parameter(torch.empty(out_channels))
        else:
            self.bias = torch.zeros(out_channels)
        if pack:
            self.conv_offset = nn.Conv2d(in_channels, deformable_groups * 3 * self.kernel_size[0] * self.kernel_size[1],
                                         kernel_size=self.kernel_size, stride=_pair(stride), padding=_pair(padding),
                                         bias=True)
        self.split_num = deformable_groups * 2 * self.kernel_size[0] * self.kernel_size[1]
        order = list(range(self.split_num))
        forward_order = order[1::2] + order[::2]
        self.sort_index_for_npu_fp = torch.tensor(forward_order, dtype=torch.int32)
        self.sort_index_for_npu_bp = torch.argsort(self.sort_index_for_npu_fp).int()
        self.init_param()

    def init_param(self):
        """Weights U(-1/sqrt(n), 1/sqrt(n)) with n = in_channels * kh * kw; bias and conv_offset zero."""
        n = self.in_channels * self.kernel_size[0] * self.kernel_size[1]
        stdv = 1. / math.sqrt(n)
        self.weight.data.uniform_(-stdv, stdv)
        if self.bias is not None:
            self.bias.data.zero_()
        if self.pack:
            self.conv_offset.weight.data.zero_()
            self.conv_offset.bias.data.zero_()

    def forward(self, x):
        if self.pack:
            out = self.conv_offset(x)
            offset = out[:, :self.split_num, ...]
            mask = torch.sigmoid(out[:, self.split_num:, ...])
        else:
            x, offset, mask = x
        return ModulatedDeformConv2dFunction.apply(
            x, offset, mask, self.weight, self.bias.to(x.device), self.with_bias, self.stride, self.padding,
            self.dilation, self.groups, self.deformable_groups, self.sort_index_for_npu_fp.to(x.device),
            self.sort_index_for_npu_bp.to(x.device))


DCNv2 = ModulatedDeformConv
