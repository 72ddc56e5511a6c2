"""Dropout whose masks are generated ahead of time, between forward passes (fairseq models).

As in torch_npu: the first time a (shape, dtype, device, p) is seen, and whenever no
pre-generated mask is queued, ``forward`` returns its input unchanged and records the
request; ``enable_dropout_ensemble(model)`` adds a forward hook to ``model`` that fills the
queues with ``npu_dropout_gen_mask`` masks after each forward, consumed by the next one.
A list ``[shape, dtype, device]`` instead of a tensor asks for the mask itself.
"""
import torch

import torch_npu
from torch_npu.utils._error_code import ErrCode, ops_error

__all__ = ["NpuCachedDropout", "NpuFairseqDropout"]


class DropOutTask:
    def __init__(self, shape, dtype, device, p):
        self.shape = shape
        self.dtype = dtype
        self.device = device
        self.p = p
        self.request_count = 0
        self.mask_queue = []


class NpuCachedDropout(torch.nn.Dropout):
    task_dict = {}
    dropout_stream = None

    def __init__(self, p, module_name=None):
        super().__init__(p)
        self.module_name = module_name

    def forward(self, x):
        if isinstance(x, torch.Tensor):
            shape, dtype, device = x.shape, x.dtype, x.device
            apply_mask, result = True, x
        elif isinstance(x, list):
            shape, dtype, device = x
            apply_mask, result = False, None
        else:
            raise RuntimeError("input type error!" + ops_error(ErrCode.TYPE))
        if self.p == 0:
            return result
        key = (tuple(shape), dtype, device, self.p)
        task = NpuCachedDropout.task_dict.get(key)
        if task is None:
            task = DropOutTask(tuple(shape), dtype, device, self.p)
            NpuCachedDropout.task_dict[key] = task
        if not task.mask_queue:
            task.request_count += 1
            return result
        mask, _ = task.mask_queue.pop(0)
        if apply_mask:
            return torch_npu.npu_dropout_do_mask(x, mask, self.p)[0]
        return mask

    @classmethod
    def enable_dropout_ensemble(cls, model):
        if cls.dropout_stream is None:
            cls.dropout_stream = torch.npu.Stream()

        def wait_for_masks(module, inputs):
            torch.npu.current_stream().wait_stream(cls.dropout_stream)

        def generate_masks(module, inputs, outputs):
            for task in cls.task_dict.values():
                for _ in range(task.request_count - len(task.mask_queue)):
                    mask = torch_npu.npu_dropout_gen_mask(list(task.shape), p=task.p, dtype=task.dtype,
                                                          device=task.device)
                    task.mask_queue.append((mask, None))

        model.register_forward_pre_hook(wait_for_masks)
        model.register_forward_hook(generate_masks)


NpuFairseqDropout = NpuCachedDropout
