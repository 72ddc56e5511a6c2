"""CUDA-style DDP job under transfer_to_npu for the clean-exit tests.

argv[1]: "destroy" (calls dist.destroy_process_group()) or "keep" (leaves the
group to interpreter exit, as many training scripts do). Each rank prints
``rank <r> done <loss>`` and then simply returns from the script: its exit
status and the time it takes to exit are what the test measures.
"""
import os
import sys

import torch
import torch_npu  # noqa: F401
from torch_npu.contrib import transfer_to_npu  # noqa: F401
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

local_rank = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local_rank)
dist.init_process_group(backend="nccl")
rank = dist.get_rank()
model = nn.Linear(8, 2).cuda()
ddp = DDP(model, device_ids=[local_rank])
opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
g = torch.Generator().manual_seed(rank)
for _ in range(3):
    x = torch.randn(4, 8, generator=g).cuda()
    loss = ddp(x).square().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
total = torch.tensor([loss.item()]).cuda()
dist.all_reduce(total)
torch.cuda.synchronize()
print(f"rank {rank} done {total.item():.6f}", flush=True)
if sys.argv[1:] == ["destroy"]:
    dist.destroy_process_group()
