"""torch_npu.contrib.module: nn.Module building blocks built on torch_npu custom ops."""
from .channel_shuffle import ChannelShuffle
from .prefetcher import Prefetcher
from .crossentropy import LabelSmoothingCrossEntropy
from .roi_align import ROIAlign
from .deform_conv import ModulatedDeformConv
from .ps_roi_pooling import PSROIPool
from .ensemble_dropout import NpuFairseqDropout, NpuCachedDropout
from .multihead_attention import MultiheadAttention
from .drop_path import NpuDropPath
from .focus import Focus
from .linear_a8w8_quant import LinearA8W8Quant
from .linear_quant import LinearQuant
from .linear_weight_quant import LinearWeightQuant
from .npu_modules import DropoutWithByteMask
from .quant_conv2d import QuantConv2d

__all__ = [
    "ChannelShuffle",
    "Prefetcher",
    "LabelSmoothingCrossEntropy",
    "ROIAlign",
    "ModulatedDeformConv",
    "PSROIPool",
    "NpuFairseqDropout",
    "NpuCachedDropout",
    "MultiheadAttention",
    "NpuDropPath",
    "Focus",
    "LinearA8W8Quant",
    "LinearQuant",
    "LinearWeightQuant",
    "DropoutWithByteMask",
    "QuantConv2d",
]
