"""Exact resume with 2 ranks over hccl, and HCCL_DETERMINISTIC run-to-run identity.

Needs the ``hccl`` backend (torch_npu.distributed).  The launcher is
``torch_npu_run`` (``python -m torch_npu.distributed.run``, torchrun's CLI).
The recipe is docs/resume.md, section "Several ranks": rank 0 saves the model,
optimizer, scheduler and scaler; every rank saves its own RNG states and its
sampler position; the resumed job must have the same world size.
"""
import json
import socket
import subprocess
import sys

import pytest

from _subproc import REPO, make_env

WORKER = r'''
import hashlib, itertools, json, os, random, sys
from datetime import timedelta
import numpy as np
import torch, torch.nn as nn, torch.distributed as dist
import torch_npu
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset
from torch_npu.utils import save_async
from torch_npu.utils._save_async import _wait_for_pending_saves

AMP, TOTAL, STOP, CKDIR, MODE, OUT = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5], \
    sys.argv[6]
rank, world, local = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_RANK"])
torch.npu.set_device(local)
dist.init_process_group("hccl", timeout=timedelta(seconds=60))
BATCH = 4
data = torch.randn(64, 16, generator=torch.Generator().manual_seed(1))
target = torch.randint(0, 4, (64,), generator=torch.Generator().manual_seed(2))
sampler = DistributedSampler(TensorDataset(data, target), num_replicas=world, rank=rank, shuffle=True, seed=5)
# Its own generator: each iter(loader) draws a base seed, which must not come from the global CPU RNG.
loader = DataLoader(TensorDataset(data, target), batch_size=BATCH, sampler=sampler,
                    generator=torch.Generator().manual_seed(7))
per_epoch = len(loader)
torch.manual_seed(0)                                  # identical initial weights on every rank
model = DDP(nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Dropout(0.3), nn.Linear(32, 4)).npu(),
            device_ids=[local])
torch.npu.manual_seed(1000 + rank); torch.manual_seed(2000 + rank)  # per-rank dropout and noise streams
random.seed(rank); np.random.seed(rank)
opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=TOTAL)
dtype = torch.bfloat16 if AMP == "bf16" else torch.float16
scaler = torch.npu.amp.GradScaler(init_scale=2.0 ** 14, growth_interval=2) if AMP == "fp16" else None
step = 0
if MODE == "resume":
    shared = torch.load(os.path.join(CKDIR, "shared.pt"), map_location=f"npu:{local}", weights_only=True)
    if shared["world_size"] != world:
        raise RuntimeError(f"checkpoint {CKDIR} was written by {shared['world_size']} ranks; this job has {world}. "
                           f"Resume with the same number of ranks.")
    own = torch.load(os.path.join(CKDIR, f"rank{rank}.pt"), weights_only=False)
    model.module.load_state_dict(shared["model"]); opt.load_state_dict(shared["opt"])
    sched.load_state_dict(shared["sched"])
    if scaler is not None:
        scaler.load_state_dict(shared["scaler"])
    torch.set_rng_state(own["cpu_rng"]); torch.npu.set_rng_state_all(own["npu_rng"])
    random.setstate(own["py_rng"]); np.random.set_state(own["np_rng"])
    step = shared["step"]
losses = []
while step < TOTAL:
    sampler.set_epoch(step // per_epoch)              # the permutation depends on (seed, epoch) only
    for x, y in itertools.islice(iter(loader), step % per_epoch, None):
        x = x + 0.01 * torch.randn_like(x) + float(np.random.uniform(-0.01, 0.01))
        if random.random() < 0.5:
            x = -x
        x, y = x.npu(), y.npu()
        with torch.autocast("npu", dtype=dtype):
            loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        if scaler is not None:
            scaler.scale(loss).backward(); scaler.step(opt); scaler.update()
        else:
            loss.backward(); opt.step()
        sched.step()
        step += 1
        losses.append(float(loss).hex())
        if MODE == "full" and step == STOP:
            if rank == 0:
                save_async({"model": model.module.state_dict(), "opt": opt.state_dict(), "sched": sched.state_dict(),
                            "scaler": scaler.state_dict() if scaler is not None else None, "step": step,
                            "world_size": world}, os.path.join(CKDIR, "shared.pt"))
            save_async({"cpu_rng": torch.get_rng_state(), "npu_rng": torch.npu.get_rng_state_all(),
                        "py_rng": random.getstate(), "np_rng": np.random.get_state()},
                       os.path.join(CKDIR, f"rank{rank}.pt"))
            _wait_for_pending_saves()
            dist.barrier()
        if step == TOTAL:
            break
weights = {k: hashlib.sha256(v.cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()).hexdigest()
           for k, v in model.module.state_dict().items()}
with open(os.path.join(OUT, f"rank{rank}.json"), "w") as f:
    json.dump({"losses": losses, "weights": weights}, f)
dist.destroy_process_group()
'''

TOTAL = 20


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(script, nproc, args, env=None):
    cmd = [sys.executable, "-m", "torch_npu.distributed.run", f"--nproc_per_node={nproc}",
           "--master_addr=127.0.0.1", f"--master_port={free_port()}", str(script), *map(str, args)]
    return subprocess.Popen(cmd, cwd=str(REPO), env=make_env(**(env or {})), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def launch_all(jobs, timeout=240):
    """{name: (script, nproc, args, env)} run at once with torch_npu_run; {name: (returncode, output)}."""
    procs = {name: _start(*job) for name, job in jobs.items()}
    out = {}
    for name, proc in procs.items():
        try:
            log, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            log, _ = proc.communicate()
            log += "\n[launcher killed: timed out]"
        out[name] = (proc.returncode, log)
    return out


def read_ranks(out, nproc):
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(nproc)]


CASES = {"bf16": 11, "fp16": 13}   # amp mode -> checkpoint step (in the second epoch)
DET = {"HCCL_DETERMINISTIC": "1", "OMP_NUM_THREADS": "2"}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("multirank")
    script = tmp / "worker.py"
    script.write_text(WORKER)
    d = {name: tmp / name for name in ("ck_bf16", "ck_fp16", "ck_b", "full_bf16", "full_fp16", "full_b",
                                      "res_bf16", "res_fp16", "res_world1")}
    for path in d.values():
        path.mkdir()
    first = launch_all({
        "full_bf16": (script, 2, ["bf16", TOTAL, CASES["bf16"], d["ck_bf16"], "full", d["full_bf16"]], DET),
        "full_fp16": (script, 2, ["fp16", TOTAL, CASES["fp16"], d["ck_fp16"], "full", d["full_fp16"]], DET),
        "full_b": (script, 2, ["bf16", TOTAL, CASES["bf16"], d["ck_b"], "full", d["full_b"]], DET)})
    second = launch_all({
        "res_bf16": (script, 2, ["bf16", TOTAL, CASES["bf16"], d["ck_bf16"], "resume", d["res_bf16"]], DET),
        "res_fp16": (script, 2, ["fp16", TOTAL, CASES["fp16"], d["ck_fp16"], "resume", d["res_fp16"]], DET),
        "res_world1": (script, 1, ["bf16", TOTAL, CASES["bf16"], d["ck_b"], "resume", d["res_world1"]], DET)})
    return {**first, **second}, d


@pytest.mark.parametrize("amp", sorted(CASES))
def test_two_rank_resume_is_bitwise_identical(runs, amp):
    logs, d = runs
    for name in (f"full_{amp}", f"res_{amp}"):
        assert logs[name][0] == 0, logs[name][1][-4000:]
    full, resumed = read_ranks(d[f"full_{amp}"], 2), read_ranks(d[f"res_{amp}"], 2)
    stop = CASES[amp]
    for r in range(2):
        assert resumed[r]["losses"] == full[r]["losses"][stop:], f"rank {r}"
        assert resumed[r]["weights"] == full[r]["weights"], f"rank {r}"
    assert full[0]["weights"] == full[1]["weights"]      # DDP keeps the replicas identical
    assert full[0]["losses"] != full[1]["losses"]        # ranks saw different data


def test_resume_with_another_world_size_fails_fast(runs):
    logs, d = runs
    rc, log = logs["res_world1"]
    assert rc != 0 and "[launcher killed" not in log
    assert (f"checkpoint {d['ck_b']} was written by 2 ranks; this job has 1. Resume with the same number of "
            f"ranks.") in log


def test_hccl_deterministic_runs_are_identical(runs):
    logs, d = runs
    assert logs["full_b"][0] == 0, logs["full_b"][1][-4000:]
    assert read_ranks(d["full_bf16"], 2) == read_ranks(d["full_b"], 2)
