"""Worker: a DDP step and an FSDP2 (``fully_shard``) step on the ``hccl`` backend under the
NPU stream sanitizer (``TORCH_NPU_SANITIZER=1`` in the environment), 2 ranks.

Each check starts the sanitizer afresh and saves what it found (races raised, missing
record_stream calls reported at frees), how many launches and streams it saw, and the
losses and final parameters (tests/test_stream_sanitizer.py compares them with the
single-process reference of dist_workers/models.py).
"""
import os
import sys
import traceback
from datetime import timedelta

sys.path.insert(0, os.path.dirname(__file__))

import torch  # noqa: E402
import torch.cuda._sanitizer as csan  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.fsdp import fully_shard  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

import torch_npu  # noqa: E402,F401
from torch_npu.npu import _sanitizer  # noqa: E402
from models import batch, full_params, loss_fn, make_model, shard  # noqa: E402

OUT_DIR = sys.argv[1]
RANK = int(os.environ["RANK"])
WORLD = int(os.environ["WORLD_SIZE"])
NPU = torch.device("npu", RANK)
STEPS = 3
results = {}


def sanitized(fn):
    """Run ``fn(model)`` with a fresh sanitizer; record its findings next to the result."""
    san = _sanitizer.npu_sanitizer
    san.disable()
    san.enable()
    handler = san.event_handler
    out = {"enabled": san.enabled}
    try:
        out.update(fn())
        out["raised"] = []
    except csan.CUDASanitizerErrors as e:
        out["raised"] = [str(err) for err in e.errors]
    except BaseException:  # noqa: BLE001
        out["error"] = traceback.format_exc()
    torch.npu.synchronize()
    out["record_stream_errors"] = [str(e) for e in handler.record_stream_errors]
    out["launches"] = handler.seq_num
    out["streams"] = len(handler.syncs.current_sync_states)
    results[fn.__name__] = out
    print("check", fn.__name__, "raised", len(out.get("raised", [])), "record_stream",
          len(out["record_stream_errors"]), flush=True)
    return fn


def train(model):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for step in range(STEPS):
        x, y = batch(step)
        x, y = shard(x, RANK, WORLD).to(NPU), shard(y, RANK, WORLD).to(NPU)
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return {"losses": losses, "params": full_params(model)}


torch.npu.set_device(RANK)
dist.init_process_group("hccl", timeout=timedelta(seconds=float(os.environ.get("DIST_TEST_TIMEOUT", "60"))))


@sanitized
def ddp():
    return train(DDP(make_model().to(NPU), device_ids=[RANK]))


@sanitized
def fsdp2():
    mesh = init_device_mesh("npu", (WORLD,))
    model = make_model().to(NPU)
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return train(model)


_sanitizer.npu_sanitizer.disable()
torch.save(results, os.path.join(OUT_DIR, f"rank{RANK}.pt"))
dist.barrier()
dist.destroy_process_group()
