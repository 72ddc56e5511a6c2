"""Distributed-test helpers of torch_npu.testing."""
import functools
import os
import sys
import unittest
from typing import NamedTuple

import torch
import torch.distributed as dist

__all__ = ["TestSkip", "TEST_SKIPS", "skipIfUnsupportMultiNPU", "with_comms", "init_pg"]


class TestSkip(NamedTuple):
    exit_code: int
    message: str


TEST_SKIPS = {
    "multi-npu": TestSkip(75, "Need at least 2 NPU devices"),
    "hccl": TestSkip(76, "c10d not compiled with HCCL support"),
    "skipIfRocm": TestSkip(78, "Test skipped for ROCm"),
    "no_peer_access": TestSkip(79, "Test skipped because no NPU peer access"),
    "generic": TestSkip(86, "Test skipped at subprocess level, look at subprocess log for skip reason"),
}


def skipIfUnsupportMultiNPU(npu_number_needed):
    r"""Decorator: skip unless at least ``npu_number_needed`` NPUs are visible."""
    def decorator(func):
        @functools.wraps(func)
        def wrapper(*args, **kwargs):
            if torch.npu.device_count() < npu_number_needed:
                raise unittest.SkipTest(f"Need at least {npu_number_needed} NPU devices")
            return func(*args, **kwargs)
        return wrapper
    return decorator


def init_pg(backend: str = "hccl", world_size=1, rank=0, file_name="file://") -> None:
    r"""Initialise the default process group for a test rank (``file_name`` is an
    init-method URL; the default file store lives next to the test)."""
    if file_name == "file://":
        file_name = f"file://{os.path.abspath(sys.argv[0])}.pg_store"
    if backend == "hccl" and torch.npu.is_available():
        torch.npu.set_device(rank % torch.npu.device_count())
    dist.init_process_group(backend=backend, init_method=file_name, world_size=world_size, rank=rank)


def with_comms(func):
    r"""Method decorator for multi-process tests: init the process group of
    ``self.backend`` (default hccl) for ``self.rank``/``self.world_size`` and
    destroy it afterwards."""
    @functools.wraps(func)
    def wrapper(self, *args, **kwargs):
        backend = getattr(self, "backend", "hccl")
        file_name = getattr(self, "file_name", None)
        init_pg(backend, self.world_size, self.rank,
                f"file://{file_name}" if file_name else "file://")
        try:
            return func(self, *args, **kwargs)
        finally:
            dist.barrier()
            dist.destroy_process_group()
    return wrapper
