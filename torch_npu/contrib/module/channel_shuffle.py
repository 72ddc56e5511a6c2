"""ShuffleNetV2's channel shuffle of two branches, as index_selects instead of transpose+chunk."""
import torch
import torch.nn as nn

__all__ = []


def _interleave_order(in_channels, groups):
    # Output channel j takes input channel (j % groups) * group_len + j // groups.
    group_len = in_channels // groups
    return torch.arange(in_channels).reshape(groups, group_len).t().reshape(-1)


class ChannelShuffle(nn.Module):
    """Shuffle the channels of ``cat([x1, x2], 1)`` with ``groups`` groups.

    ``split_shuffle=True`` returns the two halves of the shuffled tensor (ShuffleNetV2's
    ``chunk(2)``), else the whole shuffled tensor. The hand-written backward (training mode)
    de-interleaves the gradient with stride-2 index_selects, so it is exact for groups=2
    (the only case torch_npu implements).
    """

    def __init__(self, in_channels, groups=2, split_shuffle=True):
        super().__init__()
        self.split_shuffle = split_shuffle
        self.group_len = in_channels // groups
        self.out_channels = _interleave_order(in_channels, groups)
        if split_shuffle:
            self.fp_index1 = self.out_channels[:self.group_len]
            self.fp_index2 = self.out_channels[self.group_len:]
        else:
            self.fp_index = self.out_channels
        self.bp_index1 = torch.arange(0, in_channels, 2)
        self.bp_index2 = torch.arange(1, in_channels, 2)
        self.checked = False

    def check_self(self, x):
        """Move the index tensors to ``x``'s device (once)."""
        if self.bp_index1.device == x.device:
            self.checked = True
            return
        device = x.device
        if self.split_shuffle:
            self.fp_index1 = self.fp_index1.to(device)
            self.fp_index2 = self.fp_index2.to(device)
        else:
            self.fp_index = self.fp_index.to(device)
        self.bp_index1 = self.bp_index1.to(device)
        self.bp_index2 = self.bp_index2.to(device)
        self.checked = True

    def forward(self, x1, x2):
        if not self.checked:
            self.check_self(x1)
        if self.split_shuffle:
            if self.training:
                return IndexSelectHalfImplementation.apply(x1, x2, self.fp_index1, self.fp_index2,
                                                           self.bp_index1, self.bp_index2)
            return indexselect_half_implementation_forward(x1, x2, self.fp_index1, self.fp_index2)
        if self.training:
            return IndexSelectFullImplementation.apply(x1, x2, self.fp_index, self.bp_index1, self.bp_index2)
        return indexselect_full_implementation_forward(x1, x2, self.fp_index)


def indexselect_full_implementation_forward(x1, x2, fp_index):
    return torch.cat([x1, x2], dim=1).index_select(1, fp_index)


def indexselect_half_implementation_forward(x1, x2, fp_index1, fp_index2):
    x = torch.cat([x1, x2], dim=1)
    return x.index_select(1, fp_index1), x.index_select(1, fp_index2)


class IndexSelectFullImplementation(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x1, x2, fp_index, bp_index1, bp_index2):
        ctx.bp_index1, ctx.bp_index2 = bp_index1, bp_index2
        return torch.cat([x1, x2], dim=1).index_select(1, fp_index)

    @staticmethod
    def backward(ctx, grad_output):
        return (grad_output.index_select(1, ctx.bp_index1), grad_output.index_select(1, ctx.bp_index2),
                None, None, None)


class IndexSelectHalfImplementation(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x1, x2, fp_index1, fp_index2, bp_index1, bp_index2):
        ctx.bp_index1, ctx.bp_index2 = bp_index1, bp_index2
        x = torch.cat([x1, x2], dim=1)
        return x.index_select(1, fp_index1), x.index_select(1, fp_index2)

    @staticmethod
    def backward(ctx, grad_output1, grad_output2):
        grad_output = torch.cat([grad_output1, grad_output2], 1)
        return (grad_output.index_select(1, ctx.bp_index1), grad_output.index_select(1, ctx.bp_index2),
                None, None, None, None)
