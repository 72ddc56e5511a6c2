"""SyncBatchNorm on npu: torch.nn.SyncBatchNorm's autograd function for npu tensors.

PyTorch's own function relies on CUDA-only kernels (``batch_norm_stats``,
``batch_norm_gather_stats_with_counts``, ...); this one computes the same
statistics with ordinary ops and one all_reduce each way (forward: per-channel
sum, sum of squares and count; backward: sum of dy and of dy * (x - mean)).
As upstream, grad_weight / grad_bias stay local (DDP reduces them).
torch_npu installs it under torch.nn.SyncBatchNorm for npu inputs.
"""
import torch
import torch.distributed as dist
from torch.autograd.function import Function

__all__ = []


def _channel_dims(x):
    return [0] + list(range(2, x.dim()))


def _per_channel(t, x):
    return t.view([1, -1] + [1] * (x.dim() - 2))


class SyncBatchNorm(Function):
    @staticmethod
    def forward(self, input_tensor, weight, bias, running_mean, running_var, eps, momentum, process_group,
                world_size):
        if not input_tensor.is_contiguous(memory_format=torch.channels_last):
            input_tensor = input_tensor.contiguous()
        x = input_tensor.float()
        channels = x.shape[1]
        dims = _channel_dims(x)
        count = x.numel() // channels if channels else 0
        stats = torch.cat([x.sum(dims), (x * x).sum(dims),
                           torch.tensor([float(count)], device=x.device)])
        dist.all_reduce(stats, group=process_group)
        total = stats[-1]
        if total.item() <= 1:
            raise ValueError(f"Expected more than 1 value per channel when training, got input size "
                             f"{list(input_tensor.shape)}")
        mean = stats[:channels] / total
        var = (stats[channels:2 * channels] / total - mean * mean).clamp_min(0)
        invstd = torch.rsqrt(var + eps)
        if running_mean is not None:
            running_mean.mul_(1 - momentum).add_(mean.to(running_mean.dtype), alpha=momentum)
        if running_var is not None:
            unbiased = var * total / (total - 1)
            running_var.mul_(1 - momentum).add_(unbiased.to(running_var.dtype), alpha=momentum)
        out = (x - _per_channel(mean, x)) * _per_channel(invstd, x)
        if weight is not None:
            out = out * _per_channel(weight.float(), x)
        if bias is not None:
            out = out + _per_channel(bias.float(), x)
        self.save_for_backward(input_tensor, weight, mean, invstd, total)
        self.process_group = process_group
        return out.to(input_tensor.dtype)

    @staticmethod
    def backward(self, grad_output):
        input_tensor, weight, mean, invstd, total = self.saved_tensors
        x = input_tensor.float()
        dy = grad_output.contiguous().float()
        dims = _channel_dims(x)
        channels = x.shape[1]
        xmu = x - _per_channel(mean, x)
        sum_dy = dy.sum(dims)
        sum_dy_xmu = (dy * xmu).sum(dims)
        grad_weight = (sum_dy_xmu * invstd).to(weight.dtype) if weight is not None and \
            self.needs_input_grad[1] else None
        grad_bias = sum_dy.to(weight.dtype) if weight is not None and self.needs_input_grad[2] else None
        grad_input = None
        if self.needs_input_grad[0]:
            both = torch.cat([sum_dy, sum_dy_xmu])
            dist.all_reduce(both, group=self.process_group)
            mean_dy = both[:channels] / total
            mean_dy_xmu = both[channels:] / total
            scale = invstd if weight is None else invstd * weight.float()
            grad_input = (dy - _per_channel(mean_dy, x)
                          - xmu * _per_channel(invstd * invstd * mean_dy_xmu, x)) * _per_channel(scale, x)
            grad_input = grad_input.to(input_tensor.dtype)
        return grad_input, grad_weight, grad_bias, None, None, None, None, None, None


class _SyncBatchNormDispatch:
    """What torch.nn.SyncBatchNorm calls: ours for npu inputs, PyTorch's otherwise."""

    def __init__(self, original):
        self.original = original

    def apply(self, input_tensor, *args):
        if input_tensor.device.type == "npu":
            return SyncBatchNorm.apply(input_tensor, *args)
        return self.original.apply(input_tensor, *args)


def _install():
    from torch.nn.modules import batchnorm
    if not isinstance(batchnorm.sync_batch_norm, _SyncBatchNormDispatch):
        batchnorm.sync_batch_norm = _SyncBatchNormDispatch(batchnorm.sync_batch_norm)
