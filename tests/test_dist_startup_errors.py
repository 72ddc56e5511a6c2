"""hccl start-up faults reach every rank as the same DistBackendError, within HCCL_CONNECT_TIMEOUT.

Each group is launched the plain env:// way (no agent): rank 0 hosts the TCPStore,
so a rank 0 that raised and left early would take its peers' store with it and they
would see ``DistNetworkError: Failed to recv`` instead of the fault. Every rank of each
group is a fresh interpreter whose ``init_process_group("hccl")`` is left to raise;
the test asserts that every rank exits non-zero, that the last line of each rank's
traceback is the same ``DistBackendError`` naming the fault, and the time bound.

Faults, with 2 and 3 ranks and each rank in turn the odd one out: a world size that
disagrees (the odd rank was launched with one more), a backend that disagrees (the odd
rank calls ``init_process_group("gloo")``), and an invalid HCCL_* value on one rank
(2 ranks, each in turn). All groups start at once (most of the time is
``import torch``); the time bound counts from the moment the last rank of a group
entered ``init_process_group``.
"""
import re
import socket
import subprocess
import sys
import time

import pytest

from _subproc import REPO, make_env

CONNECT_S = 10   # HCCL_CONNECT_TIMEOUT of every rank (a fault found at once takes far less)
SLACK_S = 8      # scheduling slack on a loaded 2-core machine
DEADLINE_S = 600  # the whole batch, ~17 imports of torch at once (a hang guard, not a bound)

_WORKER = r'''
import os, signal, sys, time
signal.alarm(int(os.environ["WORKER_ALARM_S"]))  # never outlive the test
import torch, torch.distributed as dist, torch_npu
print("init-start", time.time(), file=sys.stderr, flush=True)
try:
    dist.init_process_group(os.environ.get("WORKER_BACKEND", "hccl"))
except BaseException:
    print("init-raised", time.time(), file=sys.stderr, flush=True)
    raise
print("init-passed", file=sys.stderr, flush=True)
'''

_CASES = {}
for _n in (2, 3):
    for _odd in range(_n):
        _CASES[f"world_size-{_n}ranks-odd{_odd}"] = [
            {"RANK": r, "WORLD_SIZE": _n + 1 if r == _odd else _n} for r in range(_n)]
        _CASES[f"backend-{_n}ranks-odd{_odd}"] = [
            {"RANK": r, "WORLD_SIZE": _n, **({"WORKER_BACKEND": "gloo"} if r == _odd else {})} for r in range(_n)]
        if _n == 2:
            _CASES[f"bad_setting-{_n}ranks-odd{_odd}"] = [
                {"RANK": r, "WORLD_SIZE": _n, **({"HCCL_EXEC_TIMEOUT": "soon"} if r == _odd else {})}
                for r in range(_n)]


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("startup")
    script = tmp / "rank.py"
    script.write_text(_WORKER)
    procs, logs = {}, {}
    for name, ranks in _CASES.items():
        port = _free_port()
        for member in ranks:
            env = make_env(**{"LOCAL_RANK": member["RANK"], "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port,
                              "HCCL_CONNECT_TIMEOUT": CONNECT_S, "WORKER_ALARM_S": DEADLINE_S + 30, **member})
            for var in ("TORCHELASTIC_USE_AGENT_STORE", "HCCL_EXEC_TIMEOUT"):
                if var not in member:
                    env.pop(var, None)
            key = (name, member["RANK"])
            logs[key] = tmp / f"{name}.{member['RANK']}.err"  # a file: a full pipe would block the rank
            with open(logs[key], "w") as err:
                procs[key] = subprocess.Popen([sys.executable, str(script)], cwd=str(REPO), env=env,
                                              stdout=subprocess.DEVNULL, stderr=err)
    ended, end = {}, time.monotonic() + DEADLINE_S
    try:
        while len(ended) < len(procs) and time.monotonic() < end:
            for key, p in procs.items():
                if key not in ended and p.poll() is not None:
                    ended[key] = time.time()
            time.sleep(0.05)
    finally:
        for key, p in procs.items():
            if p.poll() is None:
                p.kill()
            elif key not in ended:
                ended[key] = time.time()
    results = {}
    for key, p in procs.items():
        p.wait()
        err = logs[key].read_text()
        start, raised = re.search(r"init-start (\S+)", err), re.search(r"init-raised (\S+)", err)
        results[key] = {"rc": p.returncode, "stderr": err, "end": ended.get(key),
                        "start": float(start.group(1)) if start else None,
                        "raised": float(raised.group(1)) if raised else None}
    return results


def _error_line(stderr):
    lines = [line for line in stderr.splitlines() if line.startswith("torch.distributed.DistBackendError: ")]
    return lines[-1] if lines else None


@pytest.mark.parametrize("case", sorted(_CASES))
def test_every_rank_raises_the_same_clear_error_in_time(outcomes, case):
    ranks = [r for (name, r) in outcomes if name == case]
    got = {r: outcomes[(case, r)] for r in ranks}
    for r, o in got.items():
        assert o["end"] is not None, f"rank {r} of {case} did not exit:\n{o['stderr'][-3000:]}"
        assert o["rc"] not in (0, None), f"rank {r} of {case} exited {o['rc']}:\n{o['stderr'][-3000:]}"
        assert "init-passed" not in o["stderr"]
        assert "DistNetworkError" not in o["stderr"] and "Failed to recv" not in o["stderr"], o["stderr"][-3000:]
    lines = {r: _error_line(o["stderr"]) for r, o in got.items()}
    assert all(lines.values()), {r: got[r]["stderr"][-2000:] for r, line in lines.items() if not line}
    assert len(set(lines.values())) == 1, lines
    message = lines[ranks[0]]
    assert message.startswith("torch.distributed.DistBackendError: HCCL init failed for group ")
    n = len(ranks)
    if case.startswith("world_size"):
        assert "world size mismatch" in message
        assert f"world_size={n}" in message and f"world_size={n + 1}" in message, message
    elif case.startswith("backend"):
        odd = int(case.rsplit("odd", 1)[1])
        assert "backend mismatch" in message and "initialised 'gloo'" in message, message
        assert re.search(rf"rank {odd} \([^)]*\) initialised 'gloo'", message), message
    else:
        odd = int(case.rsplit("odd", 1)[1])
        assert re.search(rf"rank {odd} \([^)]*\) has an invalid setting: HCCL_EXEC_TIMEOUT must be an integer "
                         r"number of seconds from 1 to 2147483647, got 'soon'", message), message
    # A fault found at start-up is raised at once: far within HCCL_CONNECT_TIMEOUT. (The exit
    # that follows is the interpreter's teardown, which takes long only on an overloaded machine.)
    last_start = max(o["start"] for o in got.values())
    for r, o in got.items():
        assert o["raised"] - last_start < CONNECT_S, (r, o["raised"] - last_start)
