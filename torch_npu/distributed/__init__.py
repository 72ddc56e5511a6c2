"""torch_npu.distributed: the ``hccl`` backend (ProcessGroupHCCL on Gloo) and torch_npu's
distributed extras. ``import torch_npu`` registers the backend and patches
torch.distributed as the real torch_npu does (its start-up sequence calls
``_install``); importing this module alone changes nothing."""
import torch.distributed as _dist

from . import _backend
from ._patches import apply as _apply_patches
from .distributed_c10d import (all_gather_into_tensor_uneven, all_to_all_vc, is_hccl_available,
                               reduce_scatter_tensor_uneven, reinit_process_group)

__all__ = ["is_hccl_available", "reinit_process_group", "reduce_scatter_tensor_uneven",
           "all_gather_into_tensor_uneven", "all_to_all_vc"]


def is_available():
    return _dist.is_available()


def _install():
    """Register the ``hccl`` backend and patch torch.distributed (idempotent)."""
    if _dist.is_available():
        _backend.register()
        _apply_patches()
        from . import _shutdown  # noqa: F401  (stops hccl groups' Gloo threads at exit)
