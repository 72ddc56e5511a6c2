import torch

import torch_npu

__all__ = []


def amp_definitely_not_available():
    return not (torch_npu.npu.is_available() or getattr(torch, "has_xla", False))
