"""Cross entropy against label-smoothed one-hot targets."""
import torch
import torch.nn as nn

import torch_npu

__all__ = []


class LabelSmoothingCrossEntropy(nn.Module):
    """Mean over the batch of ``-sum_c q_c log softmax(pred)_c`` with ``q`` the one-hot target
    smoothed to ``1 - smooth_factor`` on the label and ``smooth_factor / (num_classes - 1)``
    elsewhere. The loss is float32."""

    def __init__(self, num_classes=1000, smooth_factor=0.):
        super().__init__()
        self.on_value = 1.0 - smooth_factor
        self.off_value = 1.0 * smooth_factor / (num_classes - 1)

    def forward(self, pred, target):
        one_hot_label = torch_npu.npu_one_hot(target.int(), -1, pred.size(1), self.on_value, self.off_value)
        loss = torch_npu.npu_softmax_cross_entropy_with_logits(pred, one_hot_label)
        return torch.mean(loss, [0], keepdim=False, dtype=torch.float32)
