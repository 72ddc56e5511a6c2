"""CUDA-style DDP training (launched with torchrun / torch_npu_run, 2 processes).

Prints `rank <r> loss <step> <value>` per step and `rank <r> weight_sum <value>` at the end.
"""
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

local_rank = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local_rank)  # expect: torch-cuda
dist.init_process_group(backend="nccl")  # expect: nccl
rank = dist.get_rank()
device = torch.device(f"cuda:{local_rank}")  # expect: device-string

torch.manual_seed(0)
model = nn.Linear(8, 1).to(device)
ddp = DDP(model, device_ids=[local_rank])
opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
g = torch.Generator().manual_seed(10 + rank)
for step in range(3):
    x = torch.randn(4, 8, generator=g).cuda()  # expect: cuda-call
    y = torch.randn(4, 1, generator=g).cuda()  # expect: cuda-call
    opt.zero_grad()
    loss = nn.functional.mse_loss(ddp(x), y)
    loss.backward()
    opt.step()
    print(f"rank {rank} loss {step} {loss.item():.10f}", flush=True)
total = torch.tensor([loss.item()], device=device)
dist.all_reduce(total)
print(f"rank {rank} weight_sum {sum(p.sum().item() for p in model.parameters()):.10f} "
      f"loss_sum {total.item():.10f}", flush=True)
dist.destroy_process_group()
