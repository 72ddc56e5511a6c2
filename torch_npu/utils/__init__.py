"""torch_npu.utils: helpers shared by the package (grown by later layers)."""
__all__ = []
