"""What torch_npu changes in torch.distributed at import.

- ``init_process_group()`` without a backend uses ``hccl`` for npu tensors
  (and Gloo for CPU tensors), as on a real Ascend install.
- ``torch.distributed`` gains ``is_hccl_available``, ``reinit_process_group``
  and ``ProcessGroupHCCL``.
- DDP's ``bf16_compress_hook`` casts on the bucket's device (upstream's
  hard-codes CUDA), and DDP accepts the bf16 hooks on npu models (upstream
  refuses them by name without CUDA+NCCL).
- FSDP's ``ShardedGradScaler`` is torch_npu's ``_ShardedGradScaler`` (npu by default).
- ``monitored_barrier`` works on an hccl group (upstream insists on a group
  named "gloo"): it runs on the group's Gloo engine.
"""
import functools

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from torch_npu._C._distributed_c10d import ProcessGroupHCCL
from .distributed_c10d import is_hccl_available, reinit_process_group

_applied = False


def _patch_init_process_group():
    original = c10d.init_process_group

    @functools.wraps(original)
    def init_process_group(backend=None, *args, **kwargs):
        if backend is None:
            backend = "cpu:gloo,npu:hccl"
        return original(backend, *args, **kwargs)

    c10d.init_process_group = init_process_group
    dist.init_process_group = init_process_group


def _bf16_compress_hook(process_group, bucket):
    group = process_group if process_group is not None else dist.group.WORLD
    world = group.size()
    buffer = bucket.buffer()
    compressed = buffer.to(torch.bfloat16).div_(world)
    fut = dist.all_reduce(compressed, group=group, async_op=True).get_future()

    def decompress(fut):
        buffer.copy_(fut.value()[0])
        return buffer

    return fut.then(decompress)


def _patch_ddp_hooks():
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    original = default_hooks.bf16_compress_hook

    @functools.wraps(original)
    def bf16_compress_hook(process_group, bucket):
        if bucket.buffer().device.type == "npu":
            return _bf16_compress_hook(process_group, bucket)
        return original(process_group, bucket)

    default_hooks.bf16_compress_hook = bf16_compress_hook


_BF16_HOOK_NAMES = ("bf16_compress_hook", "bf16_compress_wrapper_hook")


def _patch_ddp_hook_check():
    """DDP.register_comm_hook refuses the bf16 hooks by name unless CUDA+NCCL or
    XPU+XCCL are present; on an npu model they are fine (HCCL reduces bf16)."""
    from torch.nn.parallel import DistributedDataParallel
    original = DistributedDataParallel._check_comm_hook

    @functools.wraps(original)
    def _check_comm_hook(self, hook):
        name = getattr(hook, "__name__", "")
        if name in _BF16_HOOK_NAMES and getattr(self, "device_type", None) == "npu":
            # run the remaining checks (signature, annotations) on a renamed proxy
            @functools.wraps(hook)
            def proxy(*args, **kwargs):
                return hook(*args, **kwargs)
            proxy.__name__ = "npu_" + name
            return original(self, proxy)
        return original(self, hook)

    DistributedDataParallel._check_comm_hook = _check_comm_hook


def _patch_monitored_barrier():
    original = c10d.monitored_barrier

    @functools.wraps(original)
    def monitored_barrier(group=None, timeout=None, wait_all_ranks=False):
        pg = group or c10d._get_default_group()
        try:
            backend = pg._get_backend(torch.device("npu"))
        except RuntimeError:
            backend = None
        if isinstance(backend, ProcessGroupHCCL):
            if timeout is None:
                timeout = c10d._get_default_timeout(c10d.Backend.GLOO)
            return backend._gloo.monitored_barrier(timeout, wait_all_ranks=wait_all_ranks)
        return original(group, timeout, wait_all_ranks)

    c10d.monitored_barrier = monitored_barrier
    dist.monitored_barrier = monitored_barrier


_FSDP_SCALER = "torch.distributed.fsdp.sharded_grad_scaler"
_NPU_SCALER = "torch_npu.npu.amp.sharded_grad_scaler"
_scaler_patch_wanted = False


def _patch_sharded_grad_scaler():
    """FSDP's ShardedGradScaler becomes torch_npu's, whose default device is npu (as the real one),
    once FSDP is imported: importing it here would cost every ``import torch`` seconds."""
    global _scaler_patch_wanted
    _scaler_patch_wanted = True
    from torch_npu.utils._lazy import after_import
    after_import(_FSDP_SCALER, lambda module: _use_npu_sharded_grad_scaler())


def _use_npu_sharded_grad_scaler():
    """Apply the patch if it was asked for and both modules are ready. When torch_npu's
    module is the one importing FSDP, it is not ready yet: it calls this at its end."""
    import sys
    ours = sys.modules.get(_NPU_SCALER)
    if not _scaler_patch_wanted or (ours is not None and not hasattr(ours, "_ShardedGradScaler")):
        return
    from torch_npu.npu.amp.sharded_grad_scaler import _ShardedGradScaler
    sys.modules[_FSDP_SCALER].ShardedGradScaler = _ShardedGradScaler


def apply():
    global _applied
    if _applied:
        return
    _applied = True
    _patch_init_process_group()
    _patch_ddp_hooks()
    _patch_ddp_hook_check()
    _patch_monitored_barrier()
    _patch_sharded_grad_scaler()
    dist.is_hccl_available = is_hccl_available
    dist.reinit_process_group = reinit_process_group
    dist.ProcessGroupHCCL = ProcessGroupHCCL
    c10d.is_hccl_available = is_hccl_available
