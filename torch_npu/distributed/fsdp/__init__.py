"""``torch_npu.distributed.fsdp.fully_shard``: FSDP2 with an NPU mesh by default.

Upstream ``fully_shard`` builds its default mesh on ``torch._C._get_accelerator()``;
this wrapper names the NPU explicitly (a 1-D ``npu`` mesh over the default group)
so the result does not depend on which accelerator PyTorch detects."""
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard as _torch_fully_shard

__all__ = ["fully_shard"]


def _default_npu_mesh():
    if not dist.is_initialized():
        dist.init_process_group()
    return init_device_mesh("npu", (dist.get_world_size(),))


def fully_shard(*args, **kwargs):
    """``torch.distributed.fsdp.fully_shard(module, *, mesh=None, …)``; ``mesh=None`` means a
    1-D npu mesh over all ranks."""
    if kwargs.get("mesh") is None:
        kwargs["mesh"] = _default_npu_mesh()
    return _torch_fully_shard(*args, **kwargs)
