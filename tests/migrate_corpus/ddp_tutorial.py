"""The PyTorch DDP tutorial style: mp.spawn of 2 processes, backend nccl on GPUs (gloo on the
CPU), DistributedDataParallel(device_ids=[rank]); rank 0 prints the losses."""
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def setup(rank, world_size):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = os.environ.get("CORPUS_MASTER_PORT", "29517")
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend, rank=rank, world_size=world_size)


def demo_basic(rank, world_size):
    setup(rank, world_size)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, 10), nn.ReLU(), nn.Linear(10, 5))
    if torch.cuda.is_available():
        torch.cuda.set_device(rank)
        device = torch.device("cuda", rank)
        ddp_model = DDP(model.to(device), device_ids=[rank])
    else:
        ddp_model = DDP(model)
        device = torch.device("cpu")
    if rank == 0:
        print("device", torch.empty(0, device=device).device.type, flush=True)
    loss_fn = nn.MSELoss()
    optimizer = torch.optim.SGD(ddp_model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(rank)
    for _ in range(3):
        optimizer.zero_grad()
        outputs = ddp_model(torch.randn(20, 10, generator=g).to(device))
        loss = loss_fn(outputs, torch.randn(20, 5, generator=g).to(device))
        loss.backward()
        optimizer.step()
        reduced = loss.detach().clone()
        dist.all_reduce(reduced)
        if rank == 0:
            print("loss", reduced.item(), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(demo_basic, args=(2,), nprocs=2, join=True)
