"""``_ShardedGradScaler``: FSDP's ShardedGradScaler with the NPU as its default device.

PyTorch's ``ShardedGradScaler`` defaults to ``device="cuda"``; its scaling,
unscaling (``_amp_foreach_non_finite_check_and_unscale_`` on npu tensors) and the
all_reduce of the found-inf flags over the process group already run on npu
tensors and the ``hccl`` backend, so only the default changes."""
import torch.distributed as dist
from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

__all__ = []


class _ShardedGradScaler(ShardedGradScaler):
    def __init__(self, device: str = "npu", init_scale: float = 2.0 ** 16, backoff_factor: float = 0.5,
                 growth_factor: float = 2.0, growth_interval: int = 2000, enabled: bool = True,
                 process_group=dist.group.WORLD) -> None:
        super().__init__(device, init_scale=init_scale, backoff_factor=backoff_factor,
                         growth_factor=growth_factor, growth_interval=growth_interval, enabled=enabled,
                         process_group=process_group)


# This module imported FSDP above, before _ShardedGradScaler existed, so the
# patch torch_npu's start-up asked for (distributed/_patches.py) waits for it.
from torch_npu.distributed import _patches  # noqa: E402

_patches._use_npu_sharded_grad_scaler()
