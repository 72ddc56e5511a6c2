"""Processes that used hccl exit cleanly, every time.

A rank used to hang at exit now and then, or abort with "terminate called
without an active exception": Gloo's threads outlived the interpreter's
finalization (ProcessGroupHCCL::shutdown explains why that breaks). Now
``destroy_process_group()`` and, for groups still alive at exit, an atexit
hook stop them while Python is whole.

``TORCH_NPU_EXIT_STRESS=N`` (default 2) sets how many consecutive 2-rank
``torch_npu_run`` DDP jobs (CUDA-style script under transfer_to_npu) the
stress test runs; each must exit 0 in time and leave no process behind.
"""
import os
import signal
import subprocess
import time

import pytest

from _subproc import REPO, make_env, run_json
from test_distributed_launch import free_port, launcher

JOB_TIMEOUT_S = 240
STRESS_RUNS = int(os.environ.get("TORCH_NPU_EXIT_STRESS", "2"))
WORKERS = REPO / "tests" / "dist_workers"

_THREADS = r'''
import os, torch, torch_npu, torch.distributed as dist
from torch_npu.distributed._shutdown import shutdown_hccl_groups

def gloo_threads():
    names = [open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task")]
    return sorted(n for n in names if "gloo" in n)

dist.init_process_group("hccl", init_method="tcp://127.0.0.1:0", rank=0, world_size=1)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 2).npu())
model(torch.ones(1, 2).npu()).sum().backward()
t = torch.ones(2).npu()
dist.all_reduce(t)
before = gloo_threads()
if MODE == "destroy":
    dist.destroy_process_group()          # DDP still holds the group
else:
    shutdown_hccl_groups()                # what the atexit hook does
after = gloo_threads()
pg = model.process_group
err = catch(lambda: pg.allreduce([t]).wait())
emit({"before": before, "after": after, "err": err})
'''


@pytest.mark.parametrize("mode", ["destroy", "atexit_hook"])
def test_shutdown_stops_the_gloo_threads(mode):
    out = run_json(f"MODE = {mode!r}\n" + _THREADS, timeout=240)
    assert out["before"] and all("gloo" in n for n in out["before"])   # worker + transport threads ran
    assert out["after"] == []
    assert out["err"] is not None and "this process group was shut down" in out["err"][1], out["err"]


def _children(pid):
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return {int(c) for c in f.read().split()}
    except OSError:
        return set()


def _alive_workers(pids):
    """The pids that still run one of this test's worker scripts (a reused pid would run something else)."""
    alive = set()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if str(WORKERS).encode() in f.read():
                    alive.add(pid)
        except OSError:
            pass
    return alive


def _kill(pids):
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _run_job(script, args, log_path):
    """One 2-rank job: (returncode or None if killed, output, seconds, worker pids left behind)."""
    with open(log_path, "w") as log:
        # The launcher starts its workers in sessions of their own: they are
        # found as its children while it runs, and checked after it exits.
        proc = subprocess.Popen([launcher(), "--nproc-per-node=2", f"--master-port={free_port()}",
                                 str(WORKERS / script), *args], cwd=str(REPO), env=make_env(), stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        start = time.monotonic()
        workers = set()
        while proc.poll() is None and time.monotonic() - start < JOB_TIMEOUT_S:
            workers |= _children(proc.pid)
            time.sleep(0.1)
        rc = proc.poll()
        if rc is None:
            _kill(_alive_workers(workers | _children(proc.pid)))
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    seconds = time.monotonic() - start
    deadline = time.monotonic() + 10
    while _alive_workers(workers) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = _alive_workers(workers)
    _kill(left)
    with open(log_path) as f:
        return rc, f.read(), seconds, sorted(left)


def test_consecutive_ddp_jobs_all_exit_cleanly(tmp_path):
    failures = []
    for i in range(STRESS_RUNS):
        mode = "keep" if i % 2 == 0 else "destroy"
        rc, out, seconds, leftover = _run_job("exit_ddp.py", [mode], tmp_path / f"job{i}.log")
        ok = (rc == 0 and not leftover and "terminate called" not in out
              and all(f"rank {r} done" in out for r in (0, 1)))
        if not ok:
            state = "hung (killed after %d s)" % JOB_TIMEOUT_S if rc is None else f"rc={rc}"
            failures.append(f"job {i} ({mode}): {state}, processes left: {leftover}, {seconds:.0f} s\n"
                            f"{out[-3000:]}")
    assert not failures, f"{len(failures)} of {STRESS_RUNS} jobs did not exit cleanly:\n" + "\n".join(failures)


def test_rank_leaving_with_a_collective_in_flight_exits_after_it(tmp_path):
    # Rank 1 exits with an async all_reduce pending (its future has a Python
    # callback); rank 0 joins it 3 s later. The exit hook's shutdown waits for
    # the collective with the GIL free, so the callback runs and both exit 0.
    rc, out, seconds, leftover = _run_job("exit_pending.py", ["3"], tmp_path / "job.log")
    assert rc == 0 and not leftover and "terminate called" not in out, out[-3000:]
    assert "rank 0 done 16.0" in out and "rank 1 leaves with a collective in flight" in out, out[-3000:]
