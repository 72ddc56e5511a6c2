"""Start an N-rank job of a worker script on this machine and collect its results.

Each rank is a fresh interpreter with RANK / WORLD_SIZE / LOCAL_RANK /
MASTER_ADDR / MASTER_PORT set (what torchrun would give it).  A worker writes
its results with ``torch.save`` to ``<out_dir>/rank<r>.pt``; ``launch`` returns
the list of those objects (CPU tensors), so the parent test can compare them
with a reference it computes itself.  Every job is bounded by ``timeout``: on
expiry all ranks are killed and the test fails with their output.
"""
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(rank, world, port, extra):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TORCH_NPU_EMU_", "HCCL_", "TORCHELASTIC_")) and k not in (
               "ASCEND_RT_VISIBLE_DEVICES", "TORCH_DISTRIBUTED_DEBUG", "PYTEST_CURRENT_TEST")}
    env.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(REPO)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])))
    env.update({k: str(v) for k, v in (extra or {}).items()})
    return env


def launch(worker, world, *args, timeout=120, env=None):
    """Run ``tests/dist_workers/<worker>`` on ``world`` ranks; return each rank's saved object."""
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="npu_dist_") as out_dir:
        procs = []
        for rank in range(world):
            log = open(Path(out_dir) / f"log{rank}.txt", "w+")
            cmd = [sys.executable, str(HERE / worker), out_dir, *map(str, args)]
            procs.append((subprocess.Popen(cmd, env=_env(rank, world, port, env), cwd=str(REPO),
                                           stdout=log, stderr=subprocess.STDOUT), log))
        deadline = time.monotonic() + timeout
        timed_out = False
        for proc, _ in procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                timed_out = True
                break
        if timed_out:
            for proc, _ in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        logs = []
        for rank, (proc, log) in enumerate(procs):
            log.seek(0)
            logs.append(f"--- rank {rank} (rc={proc.returncode}) ---\n{log.read()[-6000:]}")
            log.close()
        if os.environ.get("DIST_TEST_KEEP_GOING"):  # debugging: print the logs, return what was saved
            print("\n".join(logs))
            return [torch.load(Path(out_dir) / f"rank{r}.pt", weights_only=False) for r in range(world)]
        if timed_out or any(p.returncode != 0 for p, _ in procs):
            what = f"timed out after {timeout} s" if timed_out else "failed"
            raise AssertionError(f"{worker} on {world} ranks {what}:\n" + "\n".join(logs))
        return [torch.load(Path(out_dir) / f"rank{r}.pt", weights_only=False) for r in range(world)]
