"""Clean exit of a process that still has hccl groups.

A group whose script never called ``destroy_process_group()``, or one kept
alive by a DDP module after it, still runs Gloo's worker and transport
threads when the interpreter exits. Those threads must be stopped while Python
is whole (see ``ProcessGroupHCCL::shutdown``), so at exit every hccl backend
of every group c10d knows is shut down. User ``atexit`` handlers registered
after ``import torch_npu`` run before this one and can still communicate.
"""
import atexit

import torch
import torch.distributed as dist

from torch_npu._C._distributed_c10d import ProcessGroupHCCL

__all__ = []


def _hccl_backends():
    from torch.distributed.distributed_c10d import _world
    found = []
    for pg in list(_world.pg_map):
        try:
            backend = pg._get_backend(torch.device("npu"))
        except (RuntimeError, ValueError):   # a group without an npu backend (gloo only)
            continue
        if isinstance(backend, ProcessGroupHCCL) and all(backend is not b for b in found):
            found.append(backend)
    return found


def shutdown_hccl_groups():
    """Shut down the hccl backend of every live c10d group (joins its Gloo threads).

    The groups stay registered; a collective on them afterwards raises
    "Backend hccl (this process group was shut down ...) does not support <op>".
    """
    if not dist.is_available():
        return
    for backend in _hccl_backends():
        backend.shutdown()


def _at_exit():
    try:
        shutdown_hccl_groups()
    except Exception as e:  # never turn an exit into a failure, but say so
        import sys
        sys.stderr.write(f"[torch_npu] hccl shutdown at exit failed: {type(e).__name__}: {e}\n")


atexit.register(_at_exit)
