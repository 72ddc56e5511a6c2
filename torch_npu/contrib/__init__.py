"""torch_npu.contrib: extras outside the core API.

Kept light on purpose: importing ``torch_npu.contrib`` patches nothing. The migration
patch is opt-in, ``import torch_npu.contrib.transfer_to_npu`` (or ``TORCH_TRANSFER_TO_NPU=1``).
"""
__all__ = []
