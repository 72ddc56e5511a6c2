"""hccl faults end in a clear error within a stated time, never in a hang.

Every rank is a fresh interpreter started with RANK / WORLD_SIZE /
MASTER_ADDR / MASTER_PORT and ``TORCHELASTIC_USE_AGENT_STORE=True`` against a
TCPStore hosted by this test process: exactly how ``torch_npu_run`` /
torchrun workers find their store (the agent hosts it), minus the agent that
would kill the group as soon as one worker fails. So what is timed is the
ranks' own behaviour.

All fault groups start at once (each process mostly waits on ``import
torch``) and report what each step raised and how long it took; the tests
below assert on those reports. Time bounds are stated against the timeouts
the ranks were given (HCCL_CONNECT_TIMEOUT, HCCL_EXEC_TIMEOUT); without the
checks, the same faults wait for the 30-minute default or abort the process.

(A killed rank during DDP training and a size mismatch are also covered,
from the training side, by test_dist_faults.py.)
"""
import json
import re
import signal
import socket
import subprocess
import sys
import time
from datetime import timedelta

import pytest

from _subproc import REPO, make_env

CONNECT_S = 4      # HCCL_CONNECT_TIMEOUT given to the init-timeout groups
EXEC_S = 3         # HCCL_EXEC_TIMEOUT given to the hang groups
SLACK_S = 8        # scheduling slack on a loaded 2-core machine
DEADLINE_S = 240   # the whole batch, imports of ~19 interpreters included (a hang guard, not a bound)

_WORKER = r'''
import json, os, signal, sys, time
signal.alarm(int(os.environ["WORKER_ALARM_S"]))  # never outlive the test
from datetime import timedelta
import torch, torch.distributed as dist
import torch_npu

scenario, out = sys.argv[1], sys.argv[2]
rank = int(os.environ["RANK"])
events = []

def save():
    with open(out + ".tmp", "w") as f:
        json.dump(events, f)
    os.replace(out + ".tmp", out)

def attempt(step, fn):
    t0, start = time.monotonic(), time.time()
    try:
        value = fn()
        events.append(dict(step=step, ok=True, s=time.monotonic() - t0, start=start, end=time.time(), value=value))
        return True
    except Exception as e:
        events.append(dict(step=step, ok=False, s=time.monotonic() - t0, start=start, end=time.time(),
                           error=type(e).__name__, message=str(e)[:2000]))
        return False

def allreduce_value(n=8, dtype=torch.float32):
    x = torch.full((n,), float(rank + 1), dtype=dtype, device="npu")
    dist.all_reduce(x)
    return x.tolist()

if scenario == "gloo":  # this rank picked the wrong backend
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    time.sleep(600)

if not attempt("init", lambda: dist.init_process_group("hccl")):
    save(); sys.exit(0)

if scenario == "hang":
    attempt("allreduce", allreduce_value)
    if rank == 1:  # stuck forever in user code
        save(); time.sleep(600)
    attempt("allreduce_with_hung_peer", allreduce_value)

elif scenario == "exit":
    for step in range(3):
        attempt(f"step{step}", allreduce_value)
    if rank == 1:  # dies mid-training
        save(); os._exit(3)
    attempt("allreduce_after_peer_exit", allreduce_value)

elif scenario == "unchecked_size_mismatch":
    attempt("different_sizes", lambda: allreduce_value(n=8 + rank))

elif scenario == "mismatch":
    x = torch.ones(8, device="npu")
    attempt("different_ops", lambda: dist.all_reduce(x) if rank == 0 else dist.broadcast(x, src=0))
    attempt("different_sizes", lambda: allreduce_value(n=8 + rank))
    attempt("different_dtypes", lambda: allreduce_value(dtype=torch.float32 if rank == 0 else torch.float64))
    attempt("matching_after_mismatch", allreduce_value)
save()
'''

# name: (worker scenario, [(rank, world_size, extra env)], the ranks whose report is awaited)
_GROUPS = {
    "world_size": ("init", [(0, 2, {}), (1, 3, {})], [0, 1]),
    "duplicate_rank": ("init", [(0, 2, {}), (0, 2, {})], [0, 1]),
    "never_joins": ("init", [(0, 2, {"HCCL_CONNECT_TIMEOUT": CONNECT_S})], [0]),
    "other_backend": ("init", [(0, 2, {"HCCL_CONNECT_TIMEOUT": CONNECT_S})], [0]),
    # Started directly (env://, rank 0 hosts the store), its peer never started at all.
    "never_started": ("init", [(0, 2, {"HCCL_CONNECT_TIMEOUT": CONNECT_S, "TORCHELASTIC_USE_AGENT_STORE": None})],
                      [0]),
    "hang": ("hang", [(r, 2, {"HCCL_EXEC_TIMEOUT": EXEC_S}) for r in (0, 1)], [0]),
    "hang_no_check": ("hang", [(r, 2, {"HCCL_EXEC_TIMEOUT": EXEC_S, "TORCH_NPU_EMU_COLLECTIVE_CHECK": 0})
                               for r in (0, 1)], [0]),
    "exit": ("exit", [(r, 2, {"HCCL_EXEC_TIMEOUT": 120}) for r in (0, 1)], [0]),
    "mismatch": ("mismatch", [(r, 2, {}) for r in (0, 1)], [0, 1]),
    # Reference: the same size mismatch with the check off, as plain Gloo sees it.
    "mismatch_unchecked": ("unchecked_size_mismatch", [(r, 2, {"TORCH_NPU_EMU_COLLECTIVE_CHECK": 0,
                                                              "HCCL_EXEC_TIMEOUT": 10}) for r in (0, 1)], []),
    "mismatch_detail": ("mismatch", [(r, 2, {"TORCH_DISTRIBUTED_DEBUG": "DETAIL",
                                             "TORCH_NPU_EMU_COLLECTIVE_CHECK": 0}) for r in (0, 1)], [0, 1]),
}
# Processes that are part of a group but never report (the wrong-backend peer).
_EXTRA = {"other_backend": [("gloo", 1, 2, {})]}


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _agent_store():
    import torch.distributed as dist
    return dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=300))


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("faults")
    script = tmp / "rank.py"
    script.write_text(_WORKER)
    stores, procs, expected, by_member = [], [], {}, {}
    for name, (scenario, ranks, reporters) in _GROUPS.items():
        store = _agent_store()
        stores.append(store)
        port = store.port if name != "never_started" else _free_port()
        members = [(scenario, r, w, env) for r, w, env in ranks] + _EXTRA.get(name, [])
        for idx, (scen, rank, world, extra) in enumerate(members):
            out = tmp / f"{name}.{idx}.json"
            if idx in reporters:
                expected[(name, idx)] = out
            env = make_env(**{"RANK": rank, "LOCAL_RANK": rank, "WORLD_SIZE": world, "MASTER_ADDR": "127.0.0.1",
                              "MASTER_PORT": port, "TORCHELASTIC_USE_AGENT_STORE": "True",
                              "WORKER_ALARM_S": DEADLINE_S + 30, **extra})
            for var in ("HCCL_CONNECT_TIMEOUT", "HCCL_EXEC_TIMEOUT", "TORCH_DISTRIBUTED_DEBUG",
                        "TORCH_NPU_EMU_COLLECTIVE_CHECK"):
                if var not in extra:
                    env.pop(var, None)
            procs.append(subprocess.Popen([sys.executable, str(script), scen, str(out)], cwd=str(REPO), env=env,
                                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
            by_member[(name, idx)] = procs[-1]
    try:
        end = time.monotonic() + DEADLINE_S
        unchecked = [p for (name, _), p in by_member.items() if name == "mismatch_unchecked"]
        while time.monotonic() < end and not (all(p.exists() for p in expected.values())
                                               and all(p.poll() is not None for p in unchecked)):
            time.sleep(0.2)
    finally:
        for p in procs:  # the hung and wrong-backend peers are still waiting
            if p.poll() is None:
                p.kill()
        stderr = [p.communicate()[1] for p in procs]
    results = {"exit_codes": {key: p.returncode for key, p in by_member.items()}}
    for key, path in expected.items():
        results[key] = json.loads(path.read_text()) if path.exists() else None
    missing = [k for k, v in results.items() if v is None]
    assert not missing, f"no report from {missing} within {DEADLINE_S} s:\n" + "\n".join(e[-1500:] for e in stderr)
    return results


def step(reports, group, idx, name):
    for event in reports[(group, idx)]:
        if event["step"] == name:
            return event
    raise AssertionError(f"{group}[{idx}] never ran step {name!r}: {reports[(group, idx)]}")


def _members(reports):
    return [key for key in reports if key != "exit_codes"]


def after_last_arrival(reports, group, idx, name):
    """Seconds from the moment the last rank of the group entered step ``name`` to this rank's outcome.

    A rank that is still importing torch under load is not the fault being timed.
    """
    last = max(step(reports, g, i, name)["start"] for g, i in _members(reports) if g == group)
    return step(reports, group, idx, name)["end"] - last


def test_world_size_disagreement_fails_fast_on_every_rank(reports):
    for idx, (mine, theirs) in enumerate([(2, 3), (3, 2)]):
        e = step(reports, "world_size", idx, "init")
        assert not e["ok"] and e["error"] == "DistBackendError", e
        assert "world size mismatch" in e["message"]
        assert f"world_size={mine}" in e["message"] and f"world_size={theirs}" in e["message"], e["message"]
        assert after_last_arrival(reports, "world_size", idx, "init") < SLACK_S, e


def test_duplicate_rank_fails_fast_on_both_processes(reports):
    messages = []
    for idx in (0, 1):
        e = step(reports, "duplicate_rank", idx, "init")
        assert not e["ok"] and e["error"] == "DistBackendError", e
        assert after_last_arrival(reports, "duplicate_rank", idx, "init") < SLACK_S, e
        messages.append(e["message"])
    # One process finds its rank taken, the other learns that its rank was claimed twice.
    assert any("rank 0 is already taken" in m for m in messages), messages
    assert all("rank 0" in m and "unique RANK" in m for m in messages), messages


def test_rank_that_never_joins_fails_init_at_hccl_connect_timeout(reports):
    e = step(reports, "never_joins", 0, "init")
    assert not e["ok"] and e["error"] == "DistBackendError", e
    assert CONNECT_S <= e["s"] < CONNECT_S + SLACK_S, e
    assert "HCCL_CONNECT_TIMEOUT" in e["message"] and "ranks [1]" in e["message"], e["message"]


def test_rank_never_started_fails_init_at_hccl_connect_timeout(reports):
    # Rank 0 hosts the env:// store; it does not wait there (PyTorch's 30-minute group timeout)
    # but in the peer check, bounded by HCCL_CONNECT_TIMEOUT (default 120 s).
    e = step(reports, "never_started", 0, "init")
    assert not e["ok"] and e["error"] == "DistBackendError", e
    assert CONNECT_S <= e["s"] < CONNECT_S + SLACK_S, e
    assert "HCCL_CONNECT_TIMEOUT" in e["message"] and "ranks [1]" in e["message"], e["message"]


def test_peer_on_another_backend_is_reported_at_once(reports):
    # The gloo rank takes part in the start-up check (its own side of it is in
    # test_dist_startup_errors.py), so the mismatch is named at once, not at HCCL_CONNECT_TIMEOUT.
    e = step(reports, "other_backend", 0, "init")
    assert not e["ok"] and e["error"] == "DistBackendError", e
    assert e["s"] < CONNECT_S, e
    assert "backend mismatch" in e["message"] and re.search(r"rank 1 \([^)]*\) initialised 'gloo'", e["message"]), \
        e["message"]


@pytest.mark.parametrize("group", ["hang", "hang_no_check"])
def test_hung_peer_makes_collective_raise_at_hccl_exec_timeout(reports, group):
    assert step(reports, group, 0, "allreduce")["value"] == [3.0] * 8  # 1 + 2 while both are alive
    e = step(reports, group, 0, "allreduce_with_hung_peer")
    assert not e["ok"] and e["error"] == "DistBackendError", e
    assert EXEC_S <= e["s"] < EXEC_S + SLACK_S, e
    assert f"Timed out waiting {EXEC_S * 1000}ms" in e["message"], e["message"]
    assert "exited or is stuck" in e["message"]


def test_peer_exit_mid_training_makes_survivor_raise_quickly(reports):
    for s in range(3):
        assert step(reports, "exit", 0, f"step{s}")["value"] == [3.0] * 8
    e = step(reports, "exit", 0, "allreduce_after_peer_exit")
    assert not e["ok"] and e["error"] == "DistBackendError", e
    # Far below the 120 s exec timeout: the closed connection is seen at once.
    assert e["s"] < 5, e
    # Gloo words it "closed" or "reset" depending on which socket call sees the exit first.
    assert re.search(r"Connection (closed|reset) by peer", e["message"]), e["message"]
    assert "exited or is stuck" in e["message"]


def test_mismatched_collectives_raise_on_every_rank_and_group_stays_usable(reports):
    for idx in (0, 1):
        ops = step(reports, "mismatch", idx, "different_ops")
        sizes = step(reports, "mismatch", idx, "different_sizes")
        dtypes = step(reports, "mismatch", idx, "different_dtypes")
        for e in (ops, sizes, dtypes):
            assert not e["ok"] and e["error"] == "DistBackendError", e
            assert "mismatched collectives" in e["message"], e
            assert after_last_arrival(reports, "mismatch", idx, e["step"]) < SLACK_S, e
        assert "allreduce" in ops["message"] and "broadcast" in ops["message"], ops["message"]
        assert "numel=8" in sizes["message"] and "numel=9" in sizes["message"], sizes["message"]
        assert "dtype=Float" in dtypes["message"] and "dtype=Double" in dtypes["message"], dtypes["message"]
        # Nothing ran on the mismatch, so the ranks are still in step: 1 + 2.
        assert step(reports, "mismatch", idx, "matching_after_mismatch")["value"] == [3.0] * 8


def test_without_the_check_gloo_aborts_the_process_on_a_size_mismatch(reports):
    # What the check (and DETAIL) turn into an exception: Gloo's enforce fails and the process aborts.
    codes = [reports["exit_codes"][("mismatch_unchecked", idx)] for idx in (0, 1)]
    assert -signal.SIGABRT in codes, codes


def test_distributed_debug_detail_reports_mismatch_without_emulator_check(reports):
    for idx in (0, 1):
        ops = step(reports, "mismatch_detail", idx, "different_ops")
        sizes = step(reports, "mismatch_detail", idx, "different_sizes")
        for e in (ops, sizes):
            assert not e["ok"] and "Detected mismatch between collectives" in e["message"], e
            assert after_last_arrival(reports, "mismatch_detail", idx, e["step"]) < SLACK_S, e
        assert "OpType=ALLREDUCE" in ops["message"] and "OpType=BROADCAST" in ops["message"], ops["message"]
        assert "TensorShape=[8]" in sizes["message"] and "TensorShape=[9]" in sizes["message"], sizes["message"]
        assert step(reports, "mismatch_detail", idx, "matching_after_mismatch")["value"] == [3.0] * 8
