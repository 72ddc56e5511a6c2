"""Mish / SiLU (Swish) modules on the npu activation ops (deprecated: use torch.nn.Mish / SiLU)."""
import warnings

import torch.nn as nn

import torch_npu

__all__ = []


class Mish(nn.Module):
    """``x * tanh(softplus(x))``."""

    def __init__(self):
        super().__init__()
        warnings.warn("torch_npu.contrib.module.Mish is deprecated. Please use torch.nn.Mish for replacement.",
                      FutureWarning)

    def forward(self, x):
        return torch_npu.npu_mish(x)


class SiLU(nn.Module):
    """``x * sigmoid(x)``."""

    def __init__(self):
        super().__init__()
        warnings.warn("torch_npu.contrib.module.SiLU is deprecated. Please use torch.nn.SiLU for replacement.",
                      FutureWarning)

    def forward(self, x):
        return torch_npu.npu_silu(x)


Swish = SiLU
