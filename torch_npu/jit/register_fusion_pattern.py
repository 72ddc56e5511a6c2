"""``optimize``: every torch_npu TorchScript fusion pass, applied in place to a scripted/traced module's graph."""
from torch_npu.jit.fusion_pass.fast_gelu import fast_gelu_pass

__all__ = ["optimize"]


def optimize(jit_mod):
    """Apply torch_npu's fusion passes to ``jit_mod.graph`` (its ``forward``; call it on a frozen or
    inlined module to reach submodules). Today: GELU -> ``npu::fast_gelu``."""
    fast_gelu_pass(jit_mod)
