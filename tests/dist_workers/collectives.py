"""Worker: every torch.distributed collective on the ``hccl`` backend, npu tensors.

Run by tests/test_distributed_collectives.py on 2 ranks (``launch``). Each
check stores what the collective produced (device and CPU copy of the value)
under its name; the test compares them with references computed from
``inputs.value``. A check that raises stores its traceback instead, so one
failure does not hide the others.
"""
import os
import sys
import traceback
from datetime import timedelta

sys.path.insert(0, os.path.dirname(__file__))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.distributed._functional_collectives as funcol  # noqa: E402

import torch_npu  # noqa: E402,F401
from inputs import ints, value  # noqa: E402

OUT_DIR = sys.argv[1]
RANK = int(os.environ["RANK"])
WORLD = int(os.environ["WORLD_SIZE"])
NPU = torch.device("npu", RANK)
results = {}


def rec(t):
    """What the parent needs of a produced tensor: its device and value."""
    if isinstance(t, (list, tuple)):
        return [rec(x) for x in t]
    if isinstance(t, torch.Tensor):
        return {"device": str(t.device), "value": t.detach().cpu()}
    return t


def check(fn):
    print("check", fn.__name__, flush=True)
    try:
        results[fn.__name__] = fn()
    except BaseException:  # noqa: BLE001 - report every failure to the parent
        results[fn.__name__] = {"error": traceback.format_exc()}
        print("FAILED", fn.__name__, str(sys.exc_info()[1])[:800], flush=True)
    return fn


def v(shape, dtype=torch.float32, salt=0, rank=RANK):
    return value(rank, shape, dtype, salt).to(NPU)


store = dist.TCPStore("127.0.0.1", int(os.environ["MASTER_PORT"]), WORLD, RANK == 0,
                      timeout=timedelta(seconds=60))

# ---- phase 1: init_process_group() with no backend -------------------------
dist.init_process_group(store=dist.PrefixStore("no_backend", store), rank=RANK, world_size=WORLD)


@check
def no_backend():
    pg = dist.group.WORLD
    npu_backend = pg._get_backend(torch.device("npu"))
    cpu_backend = pg._get_backend(torch.device("cpu"))
    a = v((5,))
    dist.all_reduce(a)
    c = value(RANK, (5,))
    dist.all_reduce(c)
    return {"backend": dist.get_backend(), "npu_backend": type(npu_backend).__name__,
            "cpu_backend": type(cpu_backend).__name__, "npu": rec(a), "cpu": rec(c)}


dist.destroy_process_group()

# ---- phase 2: hccl with device_id (eagerly bound group) --------------------
torch.npu.set_device(RANK)
dist.init_process_group("hccl", store=dist.PrefixStore("main", store), rank=RANK, world_size=WORLD,
                        timeout=timedelta(seconds=float(os.environ.get("DIST_TEST_TIMEOUT", "30"))), device_id=torch.device("npu", RANK))


@check
def init_state():
    pg = dist.group.WORLD
    backend = pg._get_backend(torch.device("npu"))
    return {"backend": dist.get_backend(), "type": type(backend).__name__, "bound": str(pg.bound_device_id),
            "is_hccl_available": dist.is_hccl_available(),
            "torch_npu_is_hccl_available": torch_npu.distributed.is_hccl_available(),
            "rank": dist.get_rank(), "world": dist.get_world_size(), "check": backend._collective_check,
            "check_env": os.environ.get("TORCH_NPU_EMU_COLLECTIVE_CHECK")}


FLOAT_OPS = ["SUM", "AVG", "PRODUCT", "MIN", "MAX"]
INT_OPS = ["BAND", "BOR", "BXOR"]


@check
def all_reduce_ops():
    out = {}
    for op in FLOAT_OPS:
        t = v((3, 4), salt=FLOAT_OPS.index(op))
        dist.all_reduce(t, op=getattr(dist.ReduceOp, op))
        out[op] = rec(t)
    for op in INT_OPS + ["SUM", "MAX", "AVG"]:
        t = ints(RANK, (17,), salt=len(op)).to(NPU)
        dist.all_reduce(t, op=getattr(dist.ReduceOp, op))
        out["int_" + op] = rec(t)
    # above 1 KiB: the Gloo path (smaller ones ride on the fingerprint exchange)
    for i, op in enumerate(FLOAT_OPS):
        t = v((300,), salt=20 + i)
        dist.all_reduce(t, op=getattr(dist.ReduceOp, op))
        out["big_" + op] = rec(t)
    for op in INT_OPS:
        t = ints(RANK, (400,), salt=30 + len(op)).to(NPU)
        dist.all_reduce(t, op=getattr(dist.ReduceOp, op))
        out["big_int_" + op] = rec(t)
    t = v((300,), torch.float64, salt=40)
    dist.all_reduce(t, op=dist._make_nccl_premul_sum(1.5))
    out["big_PREMUL_SUM"] = rec(t)
    t = v((6,), torch.bfloat16)
    dist.all_reduce(t)
    out["bf16_SUM"] = rec(t)
    t = v((6,), torch.float16)
    dist.all_reduce(t, op=dist.ReduceOp.AVG)
    out["fp16_AVG"] = rec(t)
    return out


@check
def premul_sum():
    t = v((8,), torch.float64)
    dist.all_reduce(t, op=dist._make_nccl_premul_sum(2.5))
    f = torch.tensor([0.5], dtype=torch.float64, device=NPU)
    u = v((8,), torch.float64, salt=1)
    dist.all_reduce(u, op=dist._make_nccl_premul_sum(f))
    w = v((4, 2), torch.float64, salt=2)
    out = torch.empty(2, 2, dtype=torch.float64, device=NPU)
    dist.reduce_scatter_tensor(out, w, op=dist._make_nccl_premul_sum(3.0))
    return {"scalar": rec(t), "tensor_factor": rec(u), "reduce_scatter": rec(out), "rs_input": rec(w)}


@check
def broadcast():
    t = v((2, 3), salt=RANK)
    dist.broadcast(t, src=1)
    return rec(t)


@check
def reduce():
    s = v((5,))
    dist.reduce(s, dst=0, op=dist.ReduceOp.SUM)
    a = v((5,), salt=1)
    dist.reduce(a, dst=1, op=dist.ReduceOp.AVG)
    return {"sum": rec(s), "avg": rec(a)}


@check
def all_gather():
    outs = [torch.empty(3, device=NPU) for _ in range(WORLD)]
    dist.all_gather(outs, v((3,)))
    return rec(outs)


@check
def all_gather_into_tensor():
    out = torch.empty(WORLD * 2, 3, device=NPU)
    dist.all_gather_into_tensor(out, v((2, 3)))
    stacked = torch.empty(WORLD, 2, 3, device=NPU)
    dist.all_gather_into_tensor(stacked, v((2, 3), salt=1))
    return {"cat": rec(out), "stack": rec(stacked)}


@check
def reduce_scatter():
    out = torch.empty(4, device=NPU)
    dist.reduce_scatter(out, [v((4,), salt=i) for i in range(WORLD)])
    avg = torch.empty(4, device=NPU)
    dist.reduce_scatter(avg, [v((4,), salt=10 + i) for i in range(WORLD)], op=dist.ReduceOp.AVG)
    return {"sum": rec(out), "avg": rec(avg)}


@check
def reduce_scatter_tensor():
    out = torch.empty(3, 2, device=NPU)
    dist.reduce_scatter_tensor(out, v((WORLD * 3, 2)))
    mx = torch.empty(3, 2, device=NPU)
    dist.reduce_scatter_tensor(mx, v((WORLD * 3, 2), salt=1), op=dist.ReduceOp.MAX)
    avg = torch.empty(3, 2, device=NPU)
    dist.reduce_scatter_tensor(avg, v((WORLD * 3, 2), salt=2), op=dist.ReduceOp.AVG)
    return {"sum": rec(out), "max": rec(mx), "avg": rec(avg)}


@check
def coalesced():
    ts = [v((3,), salt=0), v((2, 2), salt=1)]
    dist.all_reduce_coalesced(ts)
    cm = [v((4,), salt=2), v((5,), salt=3)]
    with dist._coalescing_manager(device=NPU, async_ops=True) as cm_work:
        for t in cm:
            dist.all_reduce(t)
    cm_work.wait()
    gathered = [torch.empty(WORLD * 2, device=NPU), torch.empty(WORLD * 3, device=NPU)]
    with dist._coalescing_manager(device=NPU):
        dist.all_gather_into_tensor(gathered[0], v((2,), salt=4))
        dist.all_gather_into_tensor(gathered[1], v((3,), salt=5))
    scattered = [torch.empty(2, device=NPU), torch.empty(1, device=NPU)]
    with dist._coalescing_manager(device=NPU):
        dist.reduce_scatter_tensor(scattered[0], v((WORLD * 2,), salt=6))
        dist.reduce_scatter_tensor(scattered[1], v((WORLD * 1,), salt=7))
    return {"all_reduce_coalesced": rec(ts), "manager_all_reduce": rec(cm), "manager_all_gather": rec(gathered),
            "manager_reduce_scatter": rec(scattered)}


@check
def all_to_all():
    # rank r sends (r + j + 1) elements to rank j
    inputs = [v((RANK + j + 1,), salt=j) for j in range(WORLD)]
    outputs = [torch.empty(i + RANK + 1, device=NPU) for i in range(WORLD)]
    dist.all_to_all(outputs, inputs)
    return rec(outputs)


@check
def all_to_all_single():
    even_out = torch.empty(WORLD * 2, 3, device=NPU)
    dist.all_to_all_single(even_out, v((WORLD * 2, 3)))
    in_splits = [RANK + j + 1 for j in range(WORLD)]
    out_splits = [i + RANK + 1 for i in range(WORLD)]
    split_out = torch.empty(sum(out_splits), 2, device=NPU)
    dist.all_to_all_single(split_out, v((sum(in_splits), 2), salt=1), out_splits, in_splits)
    return {"even": rec(even_out), "splits": rec(split_out)}


@check
def gather_scatter():
    gathered = [torch.empty(3, device=NPU) for _ in range(WORLD)] if RANK == 0 else None
    dist.gather(v((3,)), gathered, dst=0)
    out = torch.empty(2, device=NPU)
    chunks = [value(1, (2,), salt=i).to(NPU) for i in range(WORLD)] if RANK == 1 else None
    dist.scatter(out, chunks, src=1)
    return {"gather": rec(gathered), "scatter": rec(out)}


@check
def point_to_point():
    peer = (RANK + 1) % WORLD
    prev = (RANK - 1) % WORLD
    got = torch.empty(4, device=NPU)
    if RANK % 2 == 0:
        dist.send(v((4,)), dst=peer)
        dist.recv(got, src=prev)
    else:
        dist.recv(got, src=prev)
        dist.send(v((4,)), dst=peer)
    async_got = torch.empty(3, device=NPU)
    works = [dist.isend(v((3,), salt=1), dst=peer), dist.irecv(async_got, src=prev)]
    for w in works:
        w.wait()
    batch_got = [torch.empty(2, device=NPU), torch.empty(5, device=NPU)]
    ops = [dist.P2POp(dist.isend, v((2,), salt=2), peer), dist.P2POp(dist.isend, v((5,), salt=3), peer),
           dist.P2POp(dist.irecv, batch_got[0], prev), dist.P2POp(dist.irecv, batch_got[1], prev)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    return {"send_recv": rec(got), "isend_irecv": rec(async_got), "batch": rec(batch_got)}


@check
def barriers():
    dist.barrier()
    dist.barrier(device_ids=[RANK])
    dist.monitored_barrier(timeout=timedelta(seconds=30))
    dist.monitored_barrier(timeout=timedelta(seconds=30), wait_all_ranks=True)
    return "ok"


@check
def objects():
    objs = [{"from": RANK, "list": [1, 2, RANK]}, None]
    dist.broadcast_object_list(objs, src=0)
    everyone = [None] * WORLD
    dist.all_gather_object(everyone, ("rank", RANK, torch.tensor([RANK])))
    gathered = [None] * WORLD if RANK == 1 else None
    dist.gather_object({"r": RANK}, gathered, dst=1)
    scattered = [None]
    dist.scatter_object_list(scattered, [f"to {i}" for i in range(WORLD)] if RANK == 0 else None, src=0)
    npu_obj = [v((2,)) if RANK == 0 else None]
    dist.broadcast_object_list(npu_obj, src=0, device=NPU)
    return {"broadcast": objs, "all_gather": [(a, b, c.tolist()) for a, b, c in everyone], "gather": gathered,
            "scatter": scattered[0], "broadcast_tensor": rec(npu_obj[0])}


@check
def functional():
    group = dist.group.WORLD
    ar = funcol.all_reduce(v((4,)), "sum", group)
    ag = funcol.all_gather_tensor(v((2, 3)), 0, group)
    rs = funcol.reduce_scatter_tensor(v((WORLD * 2, 3), salt=1), "sum", 0, group)
    avg = funcol.all_reduce(v((4,), salt=2), "avg", group)
    a2a = funcol.all_to_all_single(v((WORLD * 2,), salt=3), None, None, group)
    return {"all_reduce": rec(funcol.wait_tensor(ar)), "all_gather": rec(funcol.wait_tensor(ag)),
            "reduce_scatter": rec(funcol.wait_tensor(rs)), "avg": rec(funcol.wait_tensor(avg)),
            "all_to_all_single": rec(funcol.wait_tensor(a2a))}


@check
def async_results():
    t = v((3,))
    work = dist.all_reduce(t, async_op=True)
    fut_value = work.get_future().wait()
    work.wait()
    g = torch.empty(WORLD * 3, device=NPU)
    gwork = dist.all_gather_into_tensor(g, v((3,), salt=1), async_op=True)
    gwork.wait()
    chained = dist.all_reduce(v((2,), salt=2), async_op=True).get_future().then(lambda f: f.value()[0] * 2)
    return {"future": rec(fut_value), "result": rec(work.result()), "tensor": rec(t),
            "completed": work.is_completed(), "success": work.is_success(),
            "gather_result": rec(gwork.result()), "chained": rec(chained.wait())}


@check
def extras():
    import torch_npu.distributed as npu_dist
    rs_splits = [3, 1] if WORLD == 2 else [1] * WORLD
    rs_out = torch.empty(rs_splits[RANK], 2, device=NPU)
    npu_dist.reduce_scatter_tensor_uneven(rs_out, v((sum(rs_splits), 2)), input_split_sizes=rs_splits)
    ag_splits = [2, 3] if WORLD == 2 else [1] * WORLD
    ag_out = torch.empty(sum(ag_splits), 2, device=NPU)
    npu_dist.all_gather_into_tensor_uneven(ag_out, v((ag_splits[RANK], 2), salt=1), output_split_sizes=ag_splits)
    # counts[i * world + j]: elements from rank i to rank j
    counts = [i + 2 * j + 1 for i in range(WORLD) for j in range(WORLD)]
    send = sum(counts[RANK * WORLD:(RANK + 1) * WORLD])
    recv = sum(counts[i * WORLD + RANK] for i in range(WORLD))
    vc_out = torch.zeros(recv, device=NPU)
    npu_dist.all_to_all_vc(vc_out, v((send,), salt=2), counts)
    work = npu_dist.reduce_scatter_tensor_uneven(torch.empty(rs_splits[RANK], 2, device=NPU),
                                                 v((sum(rs_splits), 2)), input_split_sizes=rs_splits, async_op=True)
    work.wait()
    same = npu_dist.reinit_process_group() is dist.group.WORLD
    return {"rs_uneven": rec(rs_out), "ag_uneven": rec(ag_out), "vc": rec(vc_out), "reinit_same_group": same}


@check
def comm_name_and_mc2():
    backend = dist.group.WORLD._get_backend(torch.device("npu"))
    name = backend.get_hccl_comm_name(RANK)
    x1 = v((3, 4), salt=1)
    x2 = value(0, (4, 2), salt=2).to(NPU)  # same weight on every rank
    y = torch_npu.npu_mm_all_reduce_base(x1, x2, name)
    sub = dist.new_group([0, 1])
    sub_name = sub._get_backend(torch.device("npu")).get_hccl_comm_name(RANK)
    y_sub = torch_npu.npu_mm_all_reduce_base(x1, x2, sub_name)
    return {"name": name, "group_name": dist.group.WORLD.group_name, "mm": rec(y), "sub_name": sub_name,
            "sub_group_name": sub.group_name, "mm_sub": rec(y_sub)}


@check
def options():
    opts = torch_npu._C._distributed_c10d.ProcessGroupHCCL.Options()
    defaults = {"is_high_priority_stream": opts.is_high_priority_stream, "hccl_config": dict(opts.hccl_config),
                "op_timeout": opts.op_timeout, "group_id": opts.group_id}
    opts.is_high_priority_stream = True
    opts.hccl_config = {"hccl_buffer_size": "200"}
    opts._timeout = timedelta(seconds=77)
    g = dist.new_group([0, 1], pg_options=opts, timeout=timedelta(seconds=77))
    b = g._get_backend(torch.device("npu"))
    t = v((2,))
    dist.all_reduce(t, group=g)
    o = b.options
    return {"defaults": defaults, "high": o.is_high_priority_stream, "config": dict(o.hccl_config),
            "timeout_s": o._timeout.total_seconds(), "ranks": list(o.global_ranks_in_group),
            "group_id": o.group_id, "group_name": g.group_name, "sum": rec(t),
            "alias": dist.ProcessGroupHCCL is type(b)}


torch.save(results, os.path.join(OUT_DIR, f"rank{RANK}.pt"))
dist.barrier()
dist.destroy_process_group()
