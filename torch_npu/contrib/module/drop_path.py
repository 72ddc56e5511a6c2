"""Stochastic depth (timm's DropPath) with random tensors generated ahead of time.

As in torch_npu: a new (shape, device, dtype) is recorded and passed through unchanged;
``enable_droppath_ensemble(model)`` adds a pre-hook that draws one ``torch.rand((N, 1, ...))``
per recorded request before each forward, on a side stream; the next call consumes it:
``x / keep_prob * floor(keep_prob + rand)``. Eval mode and ``drop_prob == 0`` are identity.
"""
import torch
import torch.nn as nn

__all__ = ["NpuDropPath"]


def npu_drop_path(x, random_tensor, keep_prob: float = 0.):
    random_tensor = (random_tensor + keep_prob).floor_()
    return x.div(keep_prob) * random_tensor


class DropPathTask:
    def __init__(self, shape, device, dtype, ndim, drop_prob):
        self.shape = shape
        self.device = device
        self.dtype = dtype
        self.ndim = ndim
        self.drop_prob = drop_prob
        self.request_count = 0
        self.rand_queue = []


class NpuDropPath(nn.Module):
    task_dict = {}
    droppath_stream = None

    def __init__(self, drop_prob=None):
        super().__init__()
        self.drop_prob = drop_prob
        self.keep_prob = 1 - drop_prob

    def forward(self, x):
        if self.drop_prob == 0. or not self.training:
            return x
        if not isinstance(x, torch.Tensor):
            raise RuntimeError("input type error!")
        key = (tuple(x.shape), x.device, x.dtype, x.ndim)
        task = NpuDropPath.task_dict.get(key)
        if task is None:
            task = DropPathTask(tuple(x.shape), x.device, x.dtype, x.ndim, self.drop_prob)
            NpuDropPath.task_dict[key] = task
        if not task.rand_queue:
            task.request_count += 1
            return x
        return npu_drop_path(x, task.rand_queue.pop(0), self.keep_prob)

    @classmethod
    def enable_droppath_ensemble(cls, model):
        if cls.droppath_stream is None:
            cls.droppath_stream = torch.npu.Stream()

        def wait_for_random(module, inputs):
            torch.npu.current_stream().wait_stream(cls.droppath_stream)

        def generate_random(module, inputs):
            with torch.npu.stream(cls.droppath_stream), torch.no_grad():
                for task in cls.task_dict.values():
                    for _ in range(task.request_count - len(task.rand_queue)):
                        shape = (task.shape[0],) + (1,) * (task.ndim - 1)
                        task.rand_queue.append(torch.rand(shape, dtype=task.dtype, device=task.device))

        model.register_forward_pre_hook(wait_for_random)
        model.register_forward_pre_hook(generate_random)
