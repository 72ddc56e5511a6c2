"""torch_npu.contrib: extras outside the core API.

Kept light on purpose: importing ``torch_npu.contrib`` patches nothing. The migration
patch is opt-in, ``import torch_npu.contrib.transfer_to_npu`` (or ``TORCH_TRANSFER_TO_NPU=1``).
"""
import importlib

__all__ = [
    # from function
    "npu_multiclass_nms", "npu_batched_multiclass_nms", "npu_single_level_responsible_flags",
    "npu_fast_condition_index_put", "npu_bbox_coder_encode_yolo", "npu_bbox_coder_encode_xyxy2xywh",
    "npu_bbox_coder_decode_xywh2xyxy", "fuse_add_softmax_dropout", "roll", "matmul_transpose",
    "npu_fused_attention_with_layernorm", "npu_fused_attention",
    # from module
    "ChannelShuffle", "Prefetcher", "LabelSmoothingCrossEntropy", "ROIAlign", "ModulatedDeformConv", "PSROIPool",
    "NpuFairseqDropout", "NpuCachedDropout", "MultiheadAttention", "NpuDropPath", "Focus", "LinearA8W8Quant",
    "LinearQuant", "LinearWeightQuant",
]

_FUNCTION_NAMES = frozenset(__all__[:12])
_SUBPACKAGES = frozenset(("function", "module"))


def __getattr__(name):
    # Lazy: the function/module packages are imported on first use, so `import torch_npu.contrib`
    # (and transfer_to_npu) stays cheap.
    if name in _SUBPACKAGES:
        return importlib.import_module("torch_npu.contrib." + name)
    if name in __all__:
        package = "function" if name in _FUNCTION_NAMES else "module"
        value = getattr(importlib.import_module("torch_npu.contrib." + package), name)
        globals()[name] = value
        return value
    raise AttributeError("module 'torch_npu.contrib' has no attribute %r" % name)


def __dir__():
    return sorted(set(globals()) | set(__all__) | _SUBPACKAGES)
