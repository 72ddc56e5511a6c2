"""A rank that exits with a collective still in flight, its future carrying a
Python callback: rank 1 issues an async all_reduce and leaves the script at
once; rank 0 joins the collective only ``sys.argv[1]`` seconds later. Gloo's
worker thread on rank 1 therefore completes the collective (and runs the
callback, which needs the GIL) while rank 1 is exiting."""
import os
import sys
import time

import torch
import torch_npu  # noqa: F401
import torch.distributed as dist

delay = float(sys.argv[1])
torch.npu.set_device(int(os.environ["LOCAL_RANK"]))
dist.init_process_group("hccl")
rank = dist.get_rank()
t = torch.ones(4).npu()
dist.all_reduce(t)                          # the group works
if rank == 0:
    time.sleep(delay)
    dist.all_reduce(t)
    print(f"rank 0 done {t.sum().item():.1f}", flush=True)
else:
    done = []
    fut = dist.all_reduce(t, async_op=True).get_future().then(lambda f: done.append(f.value()[0].sum().item()))
    print("rank 1 leaves with a collective in flight", flush=True)
