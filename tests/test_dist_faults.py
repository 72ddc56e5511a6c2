"""Distributed faults over hccl: collective mismatch and a killed rank end in errors, never in a hang.

Needs the ``hccl`` backend.  The ranks are started directly (RANK /
WORLD_SIZE / MASTER_ADDR / MASTER_PORT, no elastic agent), so that what is
tested is the survivors' own behaviour: torchrun's agent would otherwise
kill them as soon as one worker dies.

``TORCH_NPU_FAULTS_LONG=1`` lets the 4-rank job train for minutes before the
kill (CI: a few seconds).
"""
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time

import pytest

from _subproc import REPO, make_env

LONG = os.environ.get("TORCH_NPU_FAULTS_LONG", "0") == "1"
PG_TIMEOUT_S = 15

_COMMON = r'''
import json, os, sys, time
from datetime import timedelta
import torch, torch.distributed as dist
import torch_npu
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
OUT = sys.argv[1]
torch.npu.set_device(rank % torch.npu.device_count())
dist.init_process_group("hccl", timeout=timedelta(seconds=int(os.environ["PG_TIMEOUT_S"])))
def report(**kw):
    with open(os.path.join(OUT, f"rank{rank}.json"), "w") as f:
        json.dump(dict(kw, rank=rank, at=time.monotonic()), f)
'''

_MISMATCH = _COMMON + r'''
n = 4 if rank == 0 else 8          # rank 1 disagrees about the tensor size
try:
    t = torch.ones(n, device="npu")
    dist.all_reduce(t)
    report(raised=None)
except Exception as e:
    report(raised=type(e).__name__, message=str(e)[:2000])
os._exit(0)
'''

_TRAIN = _COMMON + r'''
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch_npu.utils import save_async
from torch_npu.utils._save_async import _wait_for_pending_saves
MAX_STEPS, CKPT = int(sys.argv[2]), sys.argv[3]
torch.manual_seed(0)
model = DDP(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1)).npu())
opt = torch.optim.SGD(model.parameters(), lr=1e-2)
start = 0
if os.path.exists(CKPT):
    ck = torch.load(CKPT, map_location=f"npu:{torch.npu.current_device()}", weights_only=True)
    model.module.load_state_dict(ck["model"]); opt.load_state_dict(ck["opt"]); start = ck["step"]
with open(os.path.join(OUT, f"rank{rank}.start.json"), "w") as f:
    json.dump({"pid": os.getpid(), "start": start}, f)
step = start
try:
    for step in range(start, MAX_STEPS):
        g = torch.Generator().manual_seed(step * world + rank)
        x, y = torch.randn(16, 32, generator=g).npu(), torch.randn(16, 1, generator=g).npu()
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad(); loss.backward(); opt.step()
        if rank == 0 and (step + 1) % 5 == 0:
            save_async({"model": model.module.state_dict(), "opt": opt.state_dict(), "step": step + 1}, CKPT)
            _wait_for_pending_saves()
        time.sleep(0.01)
    report(raised=None, finished=True, step=MAX_STEPS)
    os._exit(0)
except Exception as e:
    report(raised=type(e).__name__, message=str(e)[:2000], step=step)
    os._exit(1)
'''


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_ranks(tmp_path, code, world, args):
    script = tmp_path / "rank.py"
    script.write_text(code)
    port = free_port()
    procs = []
    for rank in range(world):
        env = make_env(RANK=rank, WORLD_SIZE=world, LOCAL_RANK=rank, MASTER_ADDR="127.0.0.1", MASTER_PORT=port,
                       PG_TIMEOUT_S=PG_TIMEOUT_S)
        procs.append(subprocess.Popen([sys.executable, str(script), *map(str, args)], cwd=str(REPO), env=env,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
    return procs


def wait_all(procs, deadline_s):
    """Wait for every process; kill what is left at the deadline. Returns the names of the hung ones."""
    end = time.monotonic() + deadline_s
    hung = []
    for rank, proc in enumerate(procs):
        try:
            proc.wait(timeout=max(0.1, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            hung.append(rank)
            proc.kill()
            proc.wait()
    return hung


def read(out, rank, suffix=""):
    path = out / f"rank{rank}{suffix}.json"
    return json.loads(path.read_text()) if path.exists() else None


def test_collective_mismatch_raises_on_every_rank_within_the_timeout(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    t0 = time.monotonic()
    procs = start_ranks(tmp_path, _MISMATCH, 2, [out])
    hung = wait_all(procs, deadline_s=PG_TIMEOUT_S + 60)
    assert hung == [], "ranks hung on a mismatched collective"
    for rank in range(2):
        r = read(out, rank)
        assert r is not None, procs[rank].stderr.read()[-3000:]
        assert r["raised"] == "DistBackendError", r
        assert "mismatched collectives" in r["message"], r["message"]
        assert r["at"] - t0 < PG_TIMEOUT_S + 45


def test_killed_rank_survivors_raise_and_next_launch_resumes(tmp_path):
    out, out2 = tmp_path / "out", tmp_path / "out2"
    out.mkdir(), out2.mkdir()
    ckpt = tmp_path / "ckpt.pt"
    rng = random.Random(11)
    world, max_steps = 4, (100000 if LONG else 2000)
    procs = start_ranks(tmp_path, _TRAIN, world, [out, max_steps, ckpt])
    try:
        t_end = time.monotonic() + 120
        while not ckpt.exists() and time.monotonic() < t_end:
            time.sleep(0.1)
        assert ckpt.exists(), "no checkpoint was written"
        time.sleep(rng.uniform(30, 180) if LONG else rng.uniform(0.5, 3.0))
        victim = rng.randrange(world)
        kill_at = time.monotonic()
        os.kill(procs[victim].pid, signal.SIGKILL)
        hung = wait_all(procs, deadline_s=PG_TIMEOUT_S + 60)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert hung == [], f"ranks {hung} hung after rank {victim} was killed"
    for rank in range(world):
        if rank == victim:
            continue
        r = read(out, rank)
        assert r is not None and r["raised"] is not None, f"survivor {rank} did not raise"
        assert r["at"] - kill_at < PG_TIMEOUT_S + 30, f"survivor {rank} took {r['at'] - kill_at:.1f} s"
    saved_step = torch_load_step(ckpt)
    assert saved_step >= 5 and saved_step % 5 == 0
    # The next launch resumes from the last checkpoint and finishes.
    procs = start_ranks(tmp_path, _TRAIN, world, [out2, saved_step + 20, ckpt])
    hung = wait_all(procs, deadline_s=180)
    assert hung == []
    for rank in range(world):
        assert read(out2, rank, ".start")["start"] == saved_step
        r = read(out2, rank)
        assert r is not None and r.get("finished") is True, procs[rank].stderr.read()[-3000:]
    assert torch_load_step(ckpt) == saved_step + 20


def torch_load_step(path):
    import torch
    import torch_npu  # noqa: F401
    return int(torch.load(path, map_location="cpu", weights_only=True)["step"])
