"""Exact GELU (``aten::gelu(x, approximate='none')``) -> ``npu::fast_gelu`` in a TorchScript graph."""
import torch

__all__ = ["fast_gelu_pass"]

_GELU_NONE = """
graph(%x):
    %mode = prim::Constant[value='none']()
    %y = aten::gelu(%x, %mode)
    return (%y)
"""

_FAST_GELU = """
graph(%x):
    %y = npu::fast_gelu(%x)
    return (%y)
"""


def fast_gelu_pass(jit_mod):
    """Rewrite, in place, every exact GELU of ``jit_mod``'s graph into torch_npu's fast GELU (an
    approximation: results change by up to about 1e-3 relative, as on hardware)."""
    torch._C._jit_pass_custom_pattern_based_rewrite_graph(_GELU_NONE, _FAST_GELU, jit_mod.graph)
