"""``torch_npu.jit``: TorchScript graph rewrites to torch_npu's fused ops (``optimize``)."""
from torch_npu.jit.register_fusion_pattern import optimize

__all__ = ["optimize"]
