"""``torch.npu.aclnn``: switches of the aclnn operator library.

``allow_hf32`` is the convolution HF32 switch (same state as
``torch.npu.conv.allow_hf32``, default True); ``flags(allow_hf32=…)`` sets it
for a ``with`` block, like ``torch.backends.cudnn.flags``.
"""
import sys
from contextlib import contextmanager

from torch.backends import ContextProp, PropModule, __allow_nonbracketed_mutation

from .backends import version

__all__ = ["version", "allow_hf32"]


def _get_allow_conv_hf32() -> bool:
    import torch_npu.npu
    return torch_npu.npu.conv.allow_hf32


def _set_allow_conv_hf32(enabled: bool):
    import torch_npu.npu
    torch_npu.npu.conv.allow_hf32 = enabled


def set_flags(_allow_hf32=None):
    orig_flags = (_get_allow_conv_hf32(),)
    if _allow_hf32 is not None:
        _set_allow_conv_hf32(_allow_hf32)
    return orig_flags


@contextmanager
def flags(allow_hf32=True):
    with __allow_nonbracketed_mutation():
        orig_flags = set_flags(allow_hf32)
    try:
        yield
    finally:
        with __allow_nonbracketed_mutation():
            set_flags(*orig_flags)


class _AclnnModule(PropModule):
    allow_hf32 = ContextProp(_get_allow_conv_hf32, _set_allow_conv_hf32)


sys.modules[__name__] = _AclnnModule(sys.modules[__name__], __name__)
allow_hf32: bool
