"""``aten::_fused_sdp_choice`` on fake npu tensors.

Fake tensors have no memory, but the npu kernel of this op answers by asking
the CPU on zero-copy aliases, which fails under FakeTensorMode. The choice
depends only on metadata, so on fake npu tensors it is asked of the CPU on
empty CPU tensors with the same metadata (outside the fake mode).
"""
import torch
from torch._subclasses.fake_impls import register_op_impl
from torch._subclasses.fake_tensor import unset_fake_temporarily

_op = torch.ops.aten._fused_sdp_choice.default


def _cpu_like(t):
    if not isinstance(t, torch.Tensor):
        return t
    out = torch.empty_strided([int(s) for s in t.size()], [int(s) for s in t.stride()], dtype=t.dtype)
    return out.requires_grad_(t.requires_grad)


@register_op_impl(_op)
def _npu_fused_sdp_choice(fake_mode, func, *args, **kwargs):
    tensors = [a for a in list(args) + list(kwargs.values()) if isinstance(a, torch.Tensor)]
    if not any(t.device.type == "npu" for t in tensors):
        return NotImplemented
    with unset_fake_temporarily():
        return func(*[_cpu_like(a) for a in args], **{k: _cpu_like(v) for k, v in kwargs.items()})
