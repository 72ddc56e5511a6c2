"""Worker: nn.SyncBatchNorm on npu over hccl; each rank takes half of a batch."""
import os
import sys

import torch
import torch.distributed as dist
import torch_npu  # noqa: F401

rank = int(os.environ["RANK"])
torch.npu.set_device(rank)
dist.init_process_group("hccl")
torch.manual_seed(0)
x = torch.randn(8, 3, 5, 5)
bn = torch.nn.SyncBatchNorm(3, momentum=0.3)
with torch.no_grad():
    bn.weight.copy_(torch.tensor([1.5, 0.5, 2.0]))
    bn.bias.copy_(torch.tensor([0.1, -0.2, 0.3]))
bn = bn.npu()
part = x[rank * 4:(rank + 1) * 4].npu().requires_grad_()
y = bn(part)
(y * torch.arange(1.0, 6.0, device="npu")).sum().backward()
out = {"y": y.detach().cpu(), "dx": part.grad.cpu(), "dw": bn.weight.grad.cpu(), "db": bn.bias.grad.cpu(),
       "rm": bn.running_mean.cpu(), "rv": bn.running_var.cpu()}
torch.save(out, os.path.join(sys.argv[1], f"rank{rank}.pt"))
dist.destroy_process_group()
