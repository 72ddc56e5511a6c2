"""``_npu_distribute_barrier``: a barrier across the ranks of a group: meta-only (its Meta kernel
returns the input shape, a real call raises NotImplementedError naming the op).
"""
import torch

from torch_npu.op_plugin._registry import meta

__all__ = []


@meta("_npu_distribute_barrier")
def _npu_distribute_barrier(x_ref, group, world_size, *, time_out=None, elastic_info=None):
    return torch.empty_like(x_ref)
