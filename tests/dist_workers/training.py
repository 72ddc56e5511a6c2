"""Worker: training stacks on the ``hccl`` backend, 2 ranks.

DDP (plain, ``Join`` with uneven inputs, fp16 / bf16 compress hooks), FSDP2
``fully_shard`` (fp32, bf16 mixed precision, with ShardedGradScaler), and a
``torch.distributed.checkpoint`` save/load round trip. Each check saves the
losses and final full parameters; tests/test_distributed_training.py
compares them with single-process full-batch references (dist_workers/models.py).
"""
import os
import sys
import traceback
from datetime import timedelta

sys.path.insert(0, os.path.dirname(__file__))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks  # noqa: E402
from torch.distributed.algorithms.join import Join  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

import torch_npu  # noqa: E402,F401
from models import batch, full_params, loss_fn, make_model, shard  # noqa: E402

OUT_DIR = sys.argv[1]
RANK = int(os.environ["RANK"])
WORLD = int(os.environ["WORLD_SIZE"])
NPU = torch.device("npu", RANK)
STEPS = 3
results = {}


def check(fn):
    print("check", fn.__name__, flush=True)
    try:
        results[fn.__name__] = fn()
    except BaseException:  # noqa: BLE001
        results[fn.__name__] = {"error": traceback.format_exc()}
        print("FAILED", fn.__name__, str(sys.exc_info()[1])[:800], flush=True)
    return fn


def train(model, steps=STEPS, batches=None, scaler=None, autocast_dtype=None):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for step in (range(steps) if batches is None else batches):
        x, y = batch(step)
        x, y = shard(x, RANK, WORLD).to(NPU), shard(y, RANK, WORLD).to(NPU)
        opt.zero_grad()
        with torch.autocast("npu", dtype=autocast_dtype, enabled=autocast_dtype is not None):
            loss = loss_fn(model(x).float(), y)
        if scaler is None:
            loss.backward()
            opt.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        losses.append(loss.item())
    return losses


torch.npu.set_device(RANK)
dist.init_process_group("hccl", timeout=timedelta(seconds=float(os.environ.get("DIST_TEST_TIMEOUT", "60"))))


@check
def ddp():
    model = DDP(make_model().to(NPU), device_ids=[RANK])
    losses = train(model)
    return {"losses": losses, "params": full_params(model), "device": str(next(model.parameters()).device)}


@check
def ddp_join():
    model = DDP(make_model().to(NPU), device_ids=[RANK])
    mine = range(3) if RANK == 0 else range(2)  # uneven: rank 1 runs out first
    with Join([model]):
        losses = train(model, batches=mine)
    return {"losses": losses, "params": full_params(model)}


@check
def ddp_fp16_hook():
    model = DDP(make_model().to(NPU), device_ids=[RANK])
    model.register_comm_hook(None, default_hooks.fp16_compress_hook)
    return {"losses": train(model), "params": full_params(model)}


@check
def ddp_bf16_hook():
    model = DDP(make_model().to(NPU), device_ids=[RANK])
    model.register_comm_hook(None, default_hooks.bf16_compress_hook)
    return {"losses": train(model), "params": full_params(model)}


def fsdp_model(seed=0, mp=None):
    mesh = init_device_mesh("npu", (WORLD,))
    model = make_model(seed).to(NPU)
    kwargs = {"mesh": mesh} if mp is None else {"mesh": mesh, "mp_policy": mp}
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, **kwargs)
    fully_shard(model, **kwargs)
    return model


@check
def fsdp2():
    model = fsdp_model()
    local = model[0].weight.to_local()
    return {"losses": train(model), "params": full_params(model), "local_shape": list(local.shape),
            "local_device": str(local.device), "placements": str(model[0].weight.placements)}


@check
def fsdp2_bf16():
    model = fsdp_model(mp=MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32))
    seen = []
    model[0].register_forward_pre_hook(lambda mod, args: seen.append(str(mod.weight.dtype)))
    losses = train(model)
    return {"losses": losses, "params": full_params(model), "forward_dtype": seen[0],
            "stored_dtype": str(model[0].weight.dtype)}


@check
def fsdp2_sharded_grad_scaler():
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler
    model = fsdp_model()
    scaler = ShardedGradScaler(device="npu", init_scale=2.0 ** 10)
    losses = train(model, scaler=scaler, autocast_dtype=torch.float16)
    return {"losses": losses, "params": full_params(model), "scale": scaler.get_scale(),
            "torch_npu_has_ShardedGradScaler": hasattr(torch_npu, "_ShardedGradScaler")}


@check
def checkpoint_round_trip():
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    model = fsdp_model()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    x, y = batch(0)
    loss_fn(model(shard(x, RANK, WORLD).to(NPU)), shard(y, RANK, WORLD).to(NPU)).backward()
    opt.step()
    msd, osd = get_state_dict(model, opt)
    path = os.path.join(OUT_DIR, "dcp")
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=path)
    before = full_params(model)
    fresh = fsdp_model(seed=1)
    fresh_opt = torch.optim.Adam(fresh.parameters(), lr=0.01)
    # one step so the optimizer has state of the right structure to load into
    loss_fn(fresh(shard(x, RANK, WORLD).to(NPU)), shard(y, RANK, WORLD).to(NPU)).backward()
    fresh_opt.step()
    differs = any(not torch.equal(before[k], v) for k, v in full_params(fresh).items())
    msd2, osd2 = get_state_dict(fresh, fresh_opt)
    dcp.load({"model": msd2, "optim": osd2}, checkpoint_id=path)
    set_state_dict(fresh, fresh_opt, model_state_dict=msd2, optim_state_dict=osd2)
    after = full_params(fresh)
    exp_avg = {k: v["exp_avg"].full_tensor().cpu() for k, v in fresh_opt.state_dict()["state"].items()}
    ref_avg = {k: v["exp_avg"].full_tensor().cpu() for k, v in opt.state_dict()["state"].items()}
    # training on from the restored state equals training on from the saved one
    x1, y1 = batch(1)
    for m, o in ((model, opt), (fresh, fresh_opt)):
        o.zero_grad()
        loss_fn(m(shard(x1, RANK, WORLD).to(NPU)), shard(y1, RANK, WORLD).to(NPU)).backward()
        o.step()
    return {"before": before, "after": after, "differed_before_load": differs, "exp_avg": exp_avg,
            "ref_exp_avg": ref_avg, "next_saved": full_params(model), "next_restored": full_params(fresh),
            "files": sorted(os.listdir(path))}


torch.save(results, os.path.join(OUT_DIR, f"rank{RANK}.pt"))
dist.barrier()
dist.destroy_process_group()
