"""Worker: torch_npu.distributed's wrappers (fsdp.fully_shard + _ShardedGradScaler,
pipelining.pipeline, tensor.experimental.context_parallel) on 2 ranks of ``hccl``.
Saves each check's results; tests/test_distributed_api_rest.py compares them with
single-process references."""
import os
import sys
import traceback

import torch
import torch.distributed as dist
import torch.nn.functional as F

import torch_npu  # noqa: F401
from torch_npu.distributed.fsdp import fully_shard
from torch_npu.distributed.pipelining import pipeline
from torch_npu.distributed.tensor.experimental import context_parallel

OUT_DIR = sys.argv[1]
RANK = int(os.environ["RANK"])
WORLD = int(os.environ["WORLD_SIZE"])
NPU = torch.device("npu", RANK)
results = {}
CHECKS = []


def check(fn):
    CHECKS.append(fn)
    return fn


def mlp(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))


def batch(seed, n=8):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 8, generator=g), torch.randn(n, 4, generator=g)


@check
def sharded_grad_scaler():
    from torch.distributed.tensor import DTensor
    model = mlp(0).to(NPU)
    fully_shard(model)  # default mesh: 1-D npu mesh over both ranks
    scaler = torch_npu._ShardedGradScaler(init_scale=2.0 ** 10)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    out = {"mesh_device": model[0].weight.device_mesh.device_type,
           "is_dtensor": isinstance(model[0].weight, DTensor), "scales": [], "scaled_losses": [],
           "params": []}
    for step in range(3):
        x, y = batch(step)
        xs, ys = x.chunk(WORLD)[RANK].to(NPU), y.chunk(WORLD)[RANK].to(NPU)
        loss = F.mse_loss(model(xs), ys)
        scaled = scaler.scale(loss)
        out["scaled_losses"].append((scaled.item(), loss.item()))
        scaled.backward()
        if step == 1 and RANK == 0:  # an overflow on one rank only: every rank must skip
            model[0].weight.grad.to_local()[0, 0] = float("inf")
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
        out["scales"].append(scaler.get_scale())
        out["params"].append({n: p.full_tensor().cpu() for n, p in model.named_parameters()})
    return out


@check
def pipeline_gpipe():
    from torch.distributed.pipelining import ScheduleGPipe, SplitPoint
    model = mlp(1)
    x, y = batch(7)
    pipe = pipeline(model, (x.chunk(2)[0],), split_spec={"2": SplitPoint.BEGINNING})
    stage = pipe.build_stage(RANK, NPU)
    sched = ScheduleGPipe(stage, n_microbatches=2, loss_fn=F.mse_loss)
    losses = []
    if RANK == 0:
        sched.step(x.to(NPU))
    else:
        sched.step(target=y.to(NPU), losses=losses)
    mod = pipe.get_stage_module(RANK)
    return {"num_stages": pipe.num_stages, "losses": [loss.cpu() for loss in losses],
            "grads": {n: p.grad.cpu() for n, p in mod.named_parameters()},
            "param_device": str(next(mod.parameters()).device)}


@check
def context_parallel_causal():
    from torch.distributed.device_mesh import init_device_mesh
    from torch_npu.distributed.tensor.experimental._context_parallel import context_parallel_unshard
    mesh = init_device_mesh("npu", (WORLD,))
    g = torch.Generator().manual_seed(3)
    q, k, v, dout = (torch.randn(2, 2, 16, 8, generator=g).to(NPU) for _ in range(4))
    try:
        with context_parallel(mesh, buffers=[q, k, v, dout], buffer_seq_dims=[2, 2, 2, 2]):
            pass
    except NotImplementedError as e:
        return {"not_emulated": str(e), "seq_untouched": q.shape[2]}
    with context_parallel(mesh, buffers=[q, k, v, dout], buffer_seq_dims=[2, 2, 2, 2]):
        local_seq = q.shape[2]
        ql, kl, vl = (t.detach().requires_grad_() for t in (q, k, v))
        o = F.scaled_dot_product_attention(ql, kl, vl, is_causal=True)
        o.backward(dout)
        full = context_parallel_unshard(mesh, [o.detach(), ql.grad, kl.grad, vl.grad], [2, 2, 2, 2])
    return {"local_seq": local_seq, "out": full[0].cpu(), "dq": full[1].cpu(), "dk": full[2].cpu(),
            "dv": full[3].cpu(), "restored_seq": q.shape[2]}


torch.npu.set_device(NPU)
dist.init_process_group("hccl")
for fn in CHECKS:
    try:
        results[fn.__name__] = fn()
    except BaseException:  # noqa: BLE001
        results[fn.__name__] = {"error": traceback.format_exc()}
        print("FAILED", fn.__name__, traceback.format_exc()[-1500:], flush=True)
torch.save(results, os.path.join(OUT_DIR, f"rank{RANK}.pt"))
dist.destroy_process_group()
