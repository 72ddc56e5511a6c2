"""torch_npu.distributed (the HCCL backend arrives with the distributed layer)."""
__all__ = []
