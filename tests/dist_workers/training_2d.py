"""Worker: 2-D parallel training on 4 ranks, ``init_device_mesh("npu", (2, 2))``.

Tensor parallel (column-wise then row-wise Linear) over the "tp" dimension
and FSDP2 ``fully_shard`` over "dp". Saves per-rank losses and the full
parameters for tests/test_distributed_training.py, which compares them with
a single-process full-batch reference.
"""
import os
import sys
import traceback
from datetime import timedelta

sys.path.insert(0, os.path.dirname(__file__))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.fsdp import fully_shard  # noqa: E402
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module  # noqa: E402

import torch_npu  # noqa: E402,F401
from models import batch, loss_fn, make_model, shard  # noqa: E402

OUT_DIR = sys.argv[1]
RANK = int(os.environ["RANK"])
NPU = torch.device("npu", RANK)
results = {}

torch.npu.set_device(RANK)
dist.init_process_group("hccl", timeout=timedelta(seconds=float(os.environ.get("DIST_TEST_TIMEOUT", "60"))))
try:
    mesh = init_device_mesh("npu", (2, 2), mesh_dim_names=("dp", "tp"))
    dp_rank = mesh["dp"].get_local_rank()
    model = make_model().to(NPU)
    parallelize_module(model, mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for step in range(3):
        x, y = batch(step)
        x, y = shard(x, dp_rank, 2).to(NPU), shard(y, dp_rank, 2).to(NPU)
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    params = {n: p.full_tensor().detach().cpu() for n, p in model.named_parameters()}
    results["train"] = {"losses": losses, "params": params, "dp_rank": dp_rank,
                        "placements": {n: str(p.placements) for n, p in model.named_parameters()},
                        "local_device": str(model[0].weight.to_local().device)}
except BaseException:  # noqa: BLE001
    results["train"] = {"error": traceback.format_exc()}
    print("FAILED", traceback.format_exc()[-1500:], flush=True)

torch.save(results, os.path.join(OUT_DIR, f"rank{RANK}.pt"))
dist.barrier()
dist.destroy_process_group()
