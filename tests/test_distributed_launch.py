"""torch_npu_run: torchrun's flags, one virtual card per local rank, multi-node
over c10d rendezvous on loopback, HCCL_SOCKET_IFNAME, elastic restarts.

The launches run at once (each interpreter mostly waits on ``import torch``);
the tests assert on what every worker reported. The flag and rendezvous
checks run in this process.
"""
import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest
import torch
import torch.distributed.run as torchrun

import torch_npu  # noqa: F401
from torch_npu.distributed import run as npu_run

from _subproc import REPO, make_env

LAUNCH_TIMEOUT_S = 180

_WORKER = r'''
import json, os, signal, sys, time
signal.alarm(170)  # never outlive the test
import torch, torch.distributed as dist
import torch_npu, torch_npu.emulator

out, mode = sys.argv[1], sys.argv[2]
rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
restart = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
torch.npu.set_device(local_rank)
if mode == "restart" and restart == 1 and rank == 1:
    time.sleep(1.5)  # rank 0 reads the store first: stale keys of attempt 0 would be read now
dist.init_process_group("hccl")
x = torch.full((4,), float(rank + 1), device="npu")
dist.all_reduce(x)
ranks = [torch.zeros(1, dtype=torch.int64, device="npu") for _ in range(dist.get_world_size())]
dist.all_gather(ranks, torch.tensor([rank], device="npu"))
report = dict(
    rank=rank, local_rank=local_rank, group_rank=int(os.environ["GROUP_RANK"]),
    world_size=dist.get_world_size(), env_world_size=int(os.environ["WORLD_SIZE"]),
    local_world_size=int(os.environ["LOCAL_WORLD_SIZE"]), restart=restart,
    device_count=torch.npu.device_count(), current_device=torch.npu.current_device(),
    tensor_device=str(x.device), physical=torch_npu.emulator.config()["visible_devices"][local_rank],
    allocated_here=torch.npu.memory_allocated(local_rank), allreduce=x.tolist(),
    gathered=[int(t.item()) for t in ranks], gloo_ifname=os.environ.get("GLOO_SOCKET_IFNAME"))
with open(os.path.join(out, f"rank{rank}.restart{restart}.json"), "w") as f:
    json.dump(report, f)
if mode == "restart" and restart == 0 and rank == 1:
    sys.exit(3)  # fails once; the agent restarts the group
dist.barrier()
dist.destroy_process_group()
'''

_IFNAME_PROBE = r'''
import json, sys, torch, torch.distributed as dist
import torch_npu
try:
    dist.init_process_group("hccl", init_method="tcp://127.0.0.1:0", rank=0, world_size=1)
    print(json.dumps({"raised": None}))
except Exception as e:
    print(json.dumps({"raised": type(e).__name__, "message": str(e)}))
'''


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launcher():
    path = os.path.join(os.path.dirname(sys.executable), "torch_npu_run")
    assert os.path.exists(path), "the torch_npu_run console script is not installed"
    return path


def _start(argv, env):
    # A session of its own, so that a timeout kills the agent and its workers together.
    return subprocess.Popen(argv, cwd=str(REPO), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)


def _finish(proc, deadline):
    try:
        out, _ = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        return None, out
    return proc.returncode, out


@pytest.fixture(scope="module")
def launches(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("launch")
    script = tmp / "worker.py"
    script.write_text(_WORKER)
    outs = {name: tmp / name for name in ("restart_static", "restart_default", "multinode")}
    for d in outs.values():
        d.mkdir()
    procs = {}
    # Elastic restart: a worker fails once. With an explicit master port (static rendezvous) and without.
    env = make_env(ASCEND_RT_VISIBLE_DEVICES="3,5")
    env.pop("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", None)
    procs["restart_static"] = _start(
        [launcher(), "--nproc-per-node=2", "--max-restarts=1", f"--master-port={free_port()}",
         str(script), str(outs["restart_static"]), "restart"], env)
    procs["restart_default"] = _start(
        [launcher(), "--nproc-per-node=2", "--max-restarts=1",
         str(script), str(outs["restart_default"]), "restart"], env)
    # Two nodes on loopback: two launcher invocations meeting at one c10d rendezvous endpoint.
    endpoint = f"127.0.0.1:{free_port()}"
    node_env = make_env(HCCL_SOCKET_IFNAME="lo")
    node_env.pop("GLOO_SOCKET_IFNAME", None)
    for node in (0, 1):
        procs[f"node{node}"] = _start(
            [launcher(), "--nnodes=2", "--nproc-per-node=2", "--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}",
             "--rdzv-id=emu-job", str(script), str(outs["multinode"]), "plain"], node_env)
    # HCCL_SOCKET_IFNAME naming an interface this machine lacks.
    probe_env = make_env(HCCL_SOCKET_IFNAME="nosuch0")
    probe_env.pop("GLOO_SOCKET_IFNAME", None)
    procs["ifname_probe"] = _start([sys.executable, "-c", _IFNAME_PROBE], probe_env)

    deadline = time.monotonic() + LAUNCH_TIMEOUT_S
    finished = {name: _finish(p, deadline) for name, p in procs.items()}
    reports = {}
    for name, d in outs.items():
        reports[name] = {f.name[:-5]: json.loads(f.read_text()) for f in d.glob("*.json")}
    return finished, reports


def _ok(launches, *names):
    finished, _ = launches
    for name in names:
        rc, out = finished[name]
        assert rc == 0, f"{name}: rc={rc}\n{out[-4000:]}"


# -- flags and rendezvous choices (no launch) ---------------------------------------------------

def test_parse_args_takes_torchrun_flags_unchanged():
    argv = ["--nnodes=1:2", "--nproc-per-node=4", "--max-restarts=3", "--rdzv-backend=c10d",
            "--rdzv-endpoint=10.0.0.1:29400", "--rdzv-id=job7", "--master-addr=10.0.0.1", "--master-port=1234",
            "--monitor-interval=0.5", "--redirects=3", "--log-dir=/tmp/x", "train.py", "--lr", "0.1"]
    ours, theirs = npu_run.parse_args(argv), torchrun.parse_args(argv)
    for key, value in vars(theirs).items():
        assert getattr(ours, key) == value, key
    assert ours.training_script == "train.py" and ours.training_script_args == ["--lr", "0.1"]
    assert npu_run.parse_args(["x.py"]).enable_tiered_parallel_tcpstore == "false"
    assert npu_run.parse_args(["--enable-tiered-parallel-tcpstore=true", "x.py"]).enable_tiered_parallel_tcpstore \
        == "true"
    assert npu_run.__all__ == ["parse_args"]


def test_nproc_per_node_npu_and_auto_count_visible_npus():
    assert torchrun.determine_local_world_size("npu") == torch.npu.device_count()
    assert torchrun.determine_local_world_size("auto") == torch.npu.device_count()


def test_prepare_gives_restarts_a_fresh_store():
    single = npu_run.parse_args(["--nproc-per-node=2", "--max-restarts=2", "--master-port=4321", "x.py"])
    env = {}
    npu_run._prepare(single, env)
    assert (single.rdzv_backend, single.rdzv_endpoint) == ("c10d", "localhost:0")
    assert env == {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}

    # Without restarts, the static rendezvous (and MASTER_PORT=4321 for the workers) stays.
    plain = npu_run.parse_args(["--nproc-per-node=2", "--master-port=4321", "x.py"])
    npu_run._prepare(plain, {})
    assert plain.rdzv_backend == "static"

    # Multi-node static keeps its node ranks; only a warning. A user's own choice of the variable stays.
    multi = npu_run.parse_args(["--nnodes=2", "--node-rank=1", "--max-restarts=1", "--master-port=4321", "x.py"])
    env = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "0"}
    npu_run._prepare(multi, env)
    assert multi.rdzv_backend == "static" and multi.node_rank == 1
    assert env == {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "0"}

    parallel = npu_run.parse_args(["--rdzv-backend=parallel", "--nnodes=2", "x.py"])
    npu_run._prepare(parallel, {})
    assert parallel.rdzv_backend == "static"


# -- launches -----------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["restart_static", "restart_default"])
def test_worker_failing_once_is_restarted_and_job_succeeds(launches, name):
    _ok(launches, name)
    reports = launches[1][name]
    # Attempt 0 ran on both ranks, rank 1 failed; attempt 1 ran to the end on both.
    assert sorted(reports) == ["rank0.restart0", "rank0.restart1", "rank1.restart0", "rank1.restart1"], reports
    for key, r in reports.items():
        assert r["allreduce"] == [3.0] * 4 and r["gathered"] == [0, 1], r
        assert r["world_size"] == r["env_world_size"] == r["local_world_size"] == 2


@pytest.mark.parametrize("name", ["restart_static", "restart_default"])
def test_each_local_rank_lands_on_its_own_visible_card(launches, name):
    _ok(launches, name)
    for r in launches[1][name].values():
        # ASCEND_RT_VISIBLE_DEVICES=3,5: every worker sees two cards, numbered 0 and 1.
        assert r["device_count"] == 2
        assert r["current_device"] == r["local_rank"] == r["rank"]
        assert r["tensor_device"] == f"npu:{r['local_rank']}"
        assert r["physical"] == [3, 5][r["local_rank"]]
        assert r["allocated_here"] > 0


def test_two_launchers_form_one_job_over_c10d_rendezvous(launches):
    _ok(launches, "node0", "node1")
    reports = launches[1]["multinode"]
    assert sorted(reports) == [f"rank{r}.restart0" for r in range(4)], reports
    by_rank = {r["rank"]: r for r in reports.values()}
    for rank, r in by_rank.items():
        assert r["world_size"] == 4 and r["local_world_size"] == 2
        assert r["allreduce"] == [10.0] * 4  # 1 + 2 + 3 + 4
        assert r["gathered"] == [0, 1, 2, 3]
        assert r["rank"] == 2 * r["group_rank"] + r["local_rank"]
        assert r["current_device"] == r["local_rank"]
    assert sorted(r["group_rank"] for r in by_rank.values()) == [0, 0, 1, 1]


def test_hccl_socket_ifname_becomes_gloo_interface(launches):
    _ok(launches, "node0", "node1")
    assert {r["gloo_ifname"] for r in launches[1]["multinode"].values()} == {"lo"}
    # An interface this machine lacks fails init with its name (so the mapping is really applied).
    _ok(launches, "ifname_probe")
    probe = json.loads(launches[0]["ifname_probe"][1].strip().splitlines()[-1])
    assert probe["raised"] is not None and "nosuch0" in probe["message"], probe
