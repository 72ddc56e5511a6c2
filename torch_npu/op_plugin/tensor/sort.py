"""npu_sort_v2(.out): values of ``self`` sorted along ``dim`` (no indices), as
``torch.sort(...).values`` (semantics from the op-plugin test golden).
"""
import torch

from torch_npu.op_plugin._registry import impl

__all__ = []


@impl("npu_sort_v2")
def npu_sort_v2(self, dim=-1, descending=False):
    """The values of ``self`` sorted along ``dim`` (``torch.sort(...).values``)."""
    return torch.sort(self, dim, descending).values


@impl("npu_sort_v2.out")
def npu_sort_v2_out(self, dim=-1, descending=False, *, out):
    """:func:`npu_sort_v2` written into ``out``."""
    result = torch.sort(self, dim, descending).values
    out.resize_(result.shape)
    return out.copy_(result)
