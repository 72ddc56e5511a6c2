"""torch_npu's start-up: one explicit sequence in torch_npu/__init__.py; importing a
submodule patches nothing; heavy imports (FSDP) wait until they are used."""
import importlib

import torch
import torch.distributed as dist
from multiprocessing.reduction import ForkingPickler
from torch.nn.modules import batchnorm

import torch_npu
from _subproc import result, run_many


def _sentinel(*args, **kwargs):
    raise AssertionError("sentinel called")


def test_importing_submodules_patches_nothing():
    saved_load, saved_sbn = torch.load, batchnorm.sync_batch_norm
    saved_reducers = dict(ForkingPickler._extra_reducers)
    torch.load = batchnorm.sync_batch_norm = _sentinel
    ForkingPickler._extra_reducers.clear()
    try:
        for name in ("torch_npu.utils", "torch_npu.multiprocessing", "torch_npu.distributed"):
            importlib.reload(importlib.import_module(name))
        assert torch.load is _sentinel and batchnorm.sync_batch_norm is _sentinel
        assert torch.Tensor not in ForkingPickler._extra_reducers
        # the functions the start-up sequence calls are what patches
        torch_npu.utils._install_patches()
        torch_npu.multiprocessing.reductions._install()
        assert torch.load is torch_npu.utils.serialization.load
        assert isinstance(batchnorm.sync_batch_norm, torch_npu.utils.syncbatchnorm._SyncBatchNormDispatch)
        assert ForkingPickler._extra_reducers[torch.Tensor] is torch_npu.multiprocessing.reductions._reduce_tensor
    finally:
        torch.load, batchnorm.sync_batch_norm = saved_load, saved_sbn
        ForkingPickler._extra_reducers.clear()
        ForkingPickler._extra_reducers.update(saved_reducers)
    assert "hccl" in dist.Backend.backend_list


_FSDP_FIRST = r'''
import sys, torch
before = sorted(m for m in sys.modules if m.startswith("torch.distributed.fsdp"))
import torch_npu
after_import = sorted(m for m in sys.modules if m.startswith("torch.distributed.fsdp"))
from torch.distributed.fsdp import sharded_grad_scaler
emit({"before": before, "after_import": after_import,
      "patched": sharded_grad_scaler.ShardedGradScaler is torch_npu._ShardedGradScaler,
      "base": torch_npu._ShardedGradScaler.__mro__[1].__module__,
      "npu_default": torch_npu._ShardedGradScaler.__init__.__defaults__[0],
      "amp_attr": torch.npu.amp.sharded_grad_scaler._ShardedGradScaler is torch_npu._ShardedGradScaler})
'''

# torch_npu's class is touched first: its module is the one that imports FSDP.
_NPU_FIRST = _FSDP_FIRST.replace("from torch.distributed.fsdp import sharded_grad_scaler",
                                 "scaler = torch_npu._ShardedGradScaler\n"
                                 "from torch.distributed.fsdp import sharded_grad_scaler")


def test_fsdp_is_imported_only_when_used():
    runs = run_many({"fsdp_first": (_FSDP_FIRST, {"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}),
                     "npu_first": (_NPU_FIRST, {"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})})
    for name in runs:
        r = result(runs, name)
        assert r["before"] == [] and r["after_import"] == [], name
        assert r["patched"] and r["amp_attr"] and r["npu_default"] == "npu", (name, r)
        assert r["base"] == "torch.distributed.fsdp.sharded_grad_scaler", (name, r)
