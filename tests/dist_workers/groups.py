"""Worker: process subgroups and device meshes of the ``hccl`` backend on 4 ranks.

``new_group``, ``new_subgroups``, ``split_group``, a group this rank is not
in, ``init_device_mesh("npu", (2, 2))`` and DTensor ops on it. Results are
saved per rank for tests/test_distributed_collectives.py (see collectives.py
for the conventions).
"""
import os
import sys
import traceback
from datetime import timedelta

sys.path.insert(0, os.path.dirname(__file__))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.tensor import Replicate, Shard, distribute_tensor  # noqa: E402

import torch_npu  # noqa: E402,F401
from inputs import value  # noqa: E402

OUT_DIR = sys.argv[1]
RANK = int(os.environ["RANK"])
WORLD = int(os.environ["WORLD_SIZE"])
NPU = torch.device("npu", RANK)
results = {}


def rec(t):
    if isinstance(t, (list, tuple)):
        return [rec(x) for x in t]
    if isinstance(t, torch.Tensor):
        return {"device": str(t.device), "value": t.detach().cpu()}
    return t


def check(fn):
    print("check", fn.__name__, flush=True)
    try:
        results[fn.__name__] = fn()
    except BaseException:  # noqa: BLE001
        results[fn.__name__] = {"error": traceback.format_exc()}
        print("FAILED", fn.__name__, str(sys.exc_info()[1])[:800], flush=True)
    return fn


def v(shape, salt=0):
    return value(RANK, shape, salt=salt).to(NPU)


torch.npu.set_device(RANK)
dist.init_process_group("hccl", timeout=timedelta(seconds=float(os.environ.get("DIST_TEST_TIMEOUT", "30"))),
                        device_id=NPU)


@check
def world_ops():
    s = v((5,))
    dist.all_reduce(s, op=dist.ReduceOp.PRODUCT)
    out = torch.empty(2, 3, device=NPU)
    dist.reduce_scatter_tensor(out, v((WORLD * 2, 3), salt=1), op=dist.ReduceOp.AVG)
    return {"product": rec(s), "rs_avg": rec(out)}


@check
def new_group():
    # every rank creates every group, in the same order
    evens, odds = dist.new_group([0, 2]), dist.new_group([1, 3])
    mine = evens if RANK % 2 == 0 else odds
    t = v((4,))
    dist.all_reduce(t, group=mine)
    b = v((3,), salt=1)
    dist.broadcast(b, group=mine, group_src=1)
    g = torch.empty(2, 2, device=NPU)
    dist.all_gather_into_tensor(g, v((1, 2), salt=2), group=mine)
    return {"sum": rec(t), "broadcast": rec(b), "gather": rec(g), "group_rank": dist.get_rank(mine),
            "group_size": dist.get_world_size(mine), "backend": type(mine._get_backend(torch.device("npu"))).__name__}


@check
def new_subgroups():
    cur, _ = dist.new_subgroups(group_size=2)
    t = v((3,), salt=4)
    dist.all_reduce(t, group=cur)
    return {"sum": rec(t), "ranks": dist.get_process_group_ranks(cur)}


@check
def split_group():
    sub = dist.split_group(split_ranks=[[0, 1], [2, 3]])
    t = v((4,), salt=5)
    dist.all_reduce(t, group=sub)
    out = torch.empty(1, 3, device=NPU)
    dist.reduce_scatter_tensor(out, v((2, 3), salt=6), group=sub)
    return {"sum": rec(t), "rs": rec(out), "ranks": dist.get_process_group_ranks(sub),
            "backend": type(sub._get_backend(torch.device("npu"))).__name__}


@check
def mesh_2d():
    mesh = init_device_mesh("npu", (2, 2), mesh_dim_names=("dp", "tp"))
    tp = mesh["tp"].get_group()
    t = v((3,), salt=7)
    dist.all_reduce(t, group=tp)
    full_a = value(0, (8, 6), salt=8).to(NPU)  # the same global tensors on every rank
    full_b = value(0, (6, 4), salt=9).to(NPU)
    a = distribute_tensor(full_a, mesh, [Shard(0), Shard(1)])
    b = distribute_tensor(full_b, mesh, [Replicate(), Shard(0)])
    c = a @ b
    s = (a * 2 + 1).sum()
    r = a.redistribute(mesh, [Replicate(), Replicate()])
    return {"device_type": mesh.device_type, "tp_ranks": dist.get_process_group_ranks(tp),
            "tp_sum": rec(t), "local_a": rec(a.to_local()), "matmul": rec(c.full_tensor()),
            "sum": rec(s.full_tensor()), "replicated": rec(r.to_local()), "placements": str(c.placements)}


# Last: a group without rank 3. Groups made after it get c10d names that depend
# on how many groups each rank holds, which now differs (as with NCCL).
@check
def non_member():
    trio = dist.new_group([0, 1, 2])
    out = {"non_member": trio == dist.GroupMember.NON_GROUP_MEMBER}
    if RANK != 3:
        t = v((2,), salt=3)
        dist.all_reduce(t, group=trio)
        out.update(group_rank=dist.get_rank(trio), sum=rec(t))
    # a split after it still meets: every rank of the world takes part
    sub = dist.split_group(split_ranks=[[0, 3], [1, 2]])
    u = v((2,), salt=10)
    dist.all_reduce(u, group=sub)
    out.update(split_sum=rec(u), split_ranks=dist.get_process_group_ranks(sub))
    return out


torch.save(results, os.path.join(OUT_DIR, f"rank{RANK}.pt"))
dist.barrier()
dist.destroy_process_group()
