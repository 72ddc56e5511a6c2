"""Every torch.distributed collective on the ``hccl`` backend, 2 and 4 ranks.

Two jobs run many checks each (tests/dist_workers/collectives.py on 2 ranks,
groups.py on 4); every result is compared here with a single-process
reference computed from the same inputs (dist_workers/inputs.py).
"""
import functools
import operator
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "dist_workers"))
from inputs import ints, value  # noqa: E402
from launch import launch  # noqa: E402

W = 2


# With the collective check (default: small all_reduces fused with it) and
# without it (every call straight on Gloo).
@pytest.fixture(scope="module", params=["check", "no_check"])
def two(request):
    env = {"TORCH_NPU_EMU_COLLECTIVE_CHECK": "1" if request.param == "check" else "0"}
    return launch("collectives.py", W, timeout=240, env=env)


@pytest.fixture(scope="module")
def four():
    return launch("groups.py", 4, timeout=240)


def got(results, rank, name):
    res = results[rank][name]
    if isinstance(res, dict) and "error" in res:
        pytest.fail(f"rank {rank} {name}:\n{res['error']}")
    return res


def same(rec, expected, rank, exact=True):
    """``rec`` is a worker record: an npu tensor of this rank equal to ``expected``."""
    assert rec["device"] == f"npu:{rank}", rec["device"]
    assert rec["value"].dtype == expected.dtype
    if exact:
        torch.testing.assert_close(rec["value"], expected, rtol=0, atol=0)
    else:
        torch.testing.assert_close(rec["value"], expected)


def total(shape, dtype=torch.float32, salt=0, world=W):
    return sum(value(r, shape, dtype, salt) for r in range(world))


def test_init_without_backend_uses_hccl_for_npu_and_gloo_for_cpu(two):
    for rank in range(W):
        res = got(two, rank, "no_backend")
        assert "npu:hccl" in res["backend"]
        assert res["npu_backend"] == "ProcessGroupHCCL"
        assert res["cpu_backend"] == "ProcessGroupGloo"
        same(res["npu"], total((5,)), rank)
        assert res["cpu"]["device"] == "cpu"
        torch.testing.assert_close(res["cpu"]["value"], total((5,)))


def test_init_with_device_id(two):
    for rank in range(W):
        res = dict(got(two, rank, "init_state"))
        assert res.pop("check") is (res.pop("check_env") != "0")
        assert res == {"backend": "hccl", "type": "ProcessGroupHCCL", "bound": f"npu:{rank}",
                       "is_hccl_available": True, "torch_npu_is_hccl_available": True, "rank": rank, "world": W}


def test_all_reduce_every_op(two):
    """Small tensors (fused with the collective check) and tensors above 1 KiB (Gloo)."""
    floats = {"SUM": lambda xs: sum(xs), "AVG": lambda xs: sum(xs) / W,
              "PRODUCT": lambda xs: functools.reduce(operator.mul, xs),
              "MIN": lambda xs: functools.reduce(torch.minimum, xs),
              "MAX": lambda xs: functools.reduce(torch.maximum, xs)}
    bits = {"BAND": operator.and_, "BOR": operator.or_, "BXOR": operator.xor, "SUM": operator.add,
            "MAX": torch.maximum}
    for rank in range(W):
        res = got(two, rank, "all_reduce_ops")
        for i, (op, fn) in enumerate(floats.items()):
            same(res[op], fn([value(r, (3, 4), salt=i) for r in range(W)]), rank)
        for op, fn in bits.items():
            same(res["int_" + op], functools.reduce(fn, [ints(r, (17,), salt=len(op)) for r in range(W)]), rank)
        int_sum = sum(ints(r, (17,), salt=3) for r in range(W))
        same(res["int_AVG"], torch.div(int_sum, W, rounding_mode="trunc").to(torch.int32), rank)
        for i, (op, fn) in enumerate(floats.items()):
            same(res["big_" + op], fn([value(r, (300,), salt=20 + i) for r in range(W)]), rank)
        for op in ("BAND", "BOR", "BXOR"):
            same(res["big_int_" + op],
                 functools.reduce(bits[op], [ints(r, (400,), salt=30 + len(op)) for r in range(W)]), rank)
        same(res["big_PREMUL_SUM"], 1.5 * total((300,), torch.float64, salt=40), rank, exact=False)
        same(res["bf16_SUM"], total((6,), torch.bfloat16), rank)
        same(res["fp16_AVG"], total((6,), torch.float16) / W, rank)


def test_premul_sum(two):
    for rank in range(W):
        res = got(two, rank, "premul_sum")
        same(res["scalar"], 2.5 * total((8,), torch.float64), rank, exact=False)
        same(res["tensor_factor"], 0.5 * total((8,), torch.float64, salt=1), rank, exact=False)
        full = 3.0 * total((4, 2), torch.float64, salt=2)
        same(res["reduce_scatter"], full[rank * 2:(rank + 1) * 2], rank, exact=False)
        same(res["rs_input"], value(rank, (4, 2), torch.float64, salt=2), rank)  # input untouched


def test_broadcast_and_reduce(two):
    for rank in range(W):
        same(got(two, rank, "broadcast"), value(1, (2, 3), salt=1), rank)
    res0, res1 = got(two, 0, "reduce"), got(two, 1, "reduce")
    same(res0["sum"], total((5,)), 0)
    same(res1["avg"], total((5,), salt=1) / W, 1)


def test_all_gather_variants(two):
    for rank in range(W):
        outs = got(two, rank, "all_gather")
        for r in range(W):
            same(outs[r], value(r, (3,)), rank)
        res = got(two, rank, "all_gather_into_tensor")
        same(res["cat"], torch.cat([value(r, (2, 3)) for r in range(W)]), rank)
        same(res["stack"], torch.stack([value(r, (2, 3), salt=1) for r in range(W)]), rank)


def test_reduce_scatter_variants(two):
    for rank in range(W):
        res = got(two, rank, "reduce_scatter")
        same(res["sum"], total((4,), salt=rank), rank)
        same(res["avg"], total((4,), salt=10 + rank) / W, rank)
        res = got(two, rank, "reduce_scatter_tensor")
        rows = slice(rank * 3, (rank + 1) * 3)
        same(res["sum"], total((W * 3, 2))[rows], rank)
        same(res["max"], torch.maximum(*[value(r, (W * 3, 2), salt=1) for r in range(W)])[rows], rank)
        same(res["avg"], (total((W * 3, 2), salt=2) / W)[rows], rank)


def test_coalesced(two):
    for rank in range(W):
        res = got(two, rank, "coalesced")
        same(res["all_reduce_coalesced"][0], total((3,)), rank)
        same(res["all_reduce_coalesced"][1], total((2, 2), salt=1), rank)
        same(res["manager_all_reduce"][0], total((4,), salt=2), rank)
        same(res["manager_all_reduce"][1], total((5,), salt=3), rank)
        same(res["manager_all_gather"][0], torch.cat([value(r, (2,), salt=4) for r in range(W)]), rank)
        same(res["manager_all_gather"][1], torch.cat([value(r, (3,), salt=5) for r in range(W)]), rank)
        same(res["manager_reduce_scatter"][0], total((W * 2,), salt=6)[rank * 2:(rank + 1) * 2], rank)
        same(res["manager_reduce_scatter"][1], total((W,), salt=7)[rank:rank + 1], rank)


def test_all_to_all(two):
    for rank in range(W):
        outs = got(two, rank, "all_to_all")
        for i in range(W):
            same(outs[i], value(i, (i + rank + 1,), salt=rank), rank)
        res = got(two, rank, "all_to_all_single")
        same(res["even"], torch.cat([value(q, (W * 2, 3))[2 * rank:2 * rank + 2] for q in range(W)]), rank)
        pieces = []
        for q in range(W):
            splits = [q + j + 1 for j in range(W)]
            start = sum(splits[:rank])
            pieces.append(value(q, (sum(splits), 2), salt=1)[start:start + splits[rank]])
        same(res["splits"], torch.cat(pieces), rank)


def test_gather_scatter(two):
    res0 = got(two, 0, "gather_scatter")
    for r in range(W):
        same(res0["gather"][r], value(r, (3,)), 0)
    for rank in range(W):
        same(got(two, rank, "gather_scatter")["scatter"], value(1, (2,), salt=rank), rank)


def test_point_to_point(two):
    for rank in range(W):
        prev = (rank - 1) % W
        res = got(two, rank, "point_to_point")
        same(res["send_recv"], value(prev, (4,)), rank)
        same(res["isend_irecv"], value(prev, (3,), salt=1), rank)
        same(res["batch"][0], value(prev, (2,), salt=2), rank)
        same(res["batch"][1], value(prev, (5,), salt=3), rank)


def test_barriers(two):
    assert [got(two, r, "barriers") for r in range(W)] == ["ok"] * W


def test_object_collectives(two):
    for rank in range(W):
        res = got(two, rank, "objects")
        assert res["broadcast"] == [{"from": 0, "list": [1, 2, 0]}, None]
        assert res["all_gather"] == [("rank", r, [r]) for r in range(W)]
        assert res["gather"] == ([{"r": r} for r in range(W)] if rank == 1 else None)
        assert res["scatter"] == f"to {rank}"
        torch.testing.assert_close(res["broadcast_tensor"]["value"], value(0, (2,)))


def test_functional_collectives(two):
    for rank in range(W):
        res = got(two, rank, "functional")
        same(res["all_reduce"], total((4,)), rank)
        same(res["all_gather"], torch.cat([value(r, (2, 3)) for r in range(W)]), rank)
        same(res["reduce_scatter"], total((W * 2, 3), salt=1)[2 * rank:2 * rank + 2], rank)
        same(res["avg"], total((4,), salt=2) / W, rank)
        same(res["all_to_all_single"],
             torch.cat([value(q, (W * 2,), salt=3)[2 * rank:2 * rank + 2] for q in range(W)]), rank)


def test_async_work_and_futures_hold_npu_tensors(two):
    for rank in range(W):
        res = got(two, rank, "async_results")
        assert res["completed"] and res["success"]
        for rec in (res["future"][0], res["result"][0], res["tensor"]):
            same(rec, total((3,)), rank)
        same(res["gather_result"][0], torch.cat([value(r, (3,), salt=1) for r in range(W)]), rank)
        same(res["chained"], 2 * total((2,), salt=2), rank)


def test_torch_npu_distributed_extras(two):
    rs_splits, ag_splits = [3, 1], [2, 3]
    counts = [i + 2 * j + 1 for i in range(W) for j in range(W)]
    for rank in range(W):
        res = got(two, rank, "extras")
        start = sum(rs_splits[:rank])
        same(res["rs_uneven"], total((4, 2))[start:start + rs_splits[rank]], rank)
        same(res["ag_uneven"], torch.cat([value(q, (ag_splits[q], 2), salt=1) for q in range(W)]), rank)
        pieces = []
        for i in range(W):
            row = counts[i * W:(i + 1) * W]
            start = sum(row[:rank])
            pieces.append(value(i, (sum(row),), salt=2)[start:start + row[rank]])
        same(res["vc"], torch.cat(pieces), rank)
        assert res["reinit_same_group"] is True


def test_comm_name_drives_mc2_ops(two):
    expected = total((3, 4), salt=1) @ value(0, (4, 2), salt=2)
    for rank in range(W):
        res = got(two, rank, "comm_name_and_mc2")
        assert res["name"] == res["group_name"]
        assert res["sub_name"] == res["sub_group_name"] != res["name"]
        same(res["mm"], expected, rank, exact=False)
        same(res["mm_sub"], expected, rank, exact=False)


def test_hccl_options(two):
    for rank in range(W):
        res = got(two, rank, "options")
        assert res["defaults"] == {"is_high_priority_stream": False, "hccl_config": {}, "op_timeout": 0,
                                   "group_id": ""}
        assert res["high"] is True and res["config"] == {"hccl_buffer_size": "200"}
        assert res["timeout_s"] == 77 and res["ranks"] == [0, 1]
        assert res["group_id"] == res["group_name"]
        assert res["alias"] is True
        same(res["sum"], total((2,)), rank)


# ---- 4 ranks: subgroups, split_group, device meshes ------------------------

def test_world_of_four(four):
    for rank in range(4):
        res = got(four, rank, "world_ops")
        same(res["product"], functools.reduce(operator.mul, [value(r, (5,)) for r in range(4)]), rank)
        same(res["rs_avg"], (total((8, 3), salt=1, world=4) / 4)[2 * rank:2 * rank + 2], rank)


def test_new_group_and_subgroups(four):
    for rank in range(4):
        peers = [rank % 2, rank % 2 + 2]
        res = got(four, rank, "new_group")
        assert res["backend"] == "ProcessGroupHCCL"
        assert (res["group_rank"], res["group_size"]) == (peers.index(rank), 2)
        same(res["sum"], sum(value(r, (4,)) for r in peers), rank)
        same(res["broadcast"], value(peers[1], (3,), salt=1), rank)
        same(res["gather"], torch.cat([value(r, (1, 2), salt=2) for r in peers]), rank)
        sub = got(four, rank, "new_subgroups")
        pair = [rank - rank % 2, rank - rank % 2 + 1]
        assert sub["ranks"] == pair
        same(sub["sum"], sum(value(r, (3,), salt=4) for r in pair), rank)


def test_split_group(four):
    for rank in range(4):
        pair = [0, 1] if rank < 2 else [2, 3]
        res = got(four, rank, "split_group")
        assert res["ranks"] == pair and res["backend"] == "ProcessGroupHCCL"
        same(res["sum"], sum(value(r, (4,), salt=5) for r in pair), rank)
        full = sum(value(r, (2, 3), salt=6) for r in pair)
        same(res["rs"], full[pair.index(rank):pair.index(rank) + 1], rank)


def test_non_member_and_split_after_it(four):
    for rank in range(4):
        res = got(four, rank, "non_member")
        assert res["non_member"] is (rank == 3)
        if rank != 3:
            assert res["group_rank"] == rank
            same(res["sum"], sum(value(r, (2,), salt=3) for r in range(3)), rank)
        pair = [0, 3] if rank in (0, 3) else [1, 2]
        assert res["split_ranks"] == pair
        same(res["split_sum"], sum(value(r, (2,), salt=10) for r in pair), rank)


def test_device_mesh_2d_and_dtensor(four):
    a = value(0, (8, 6), salt=8)
    b = value(0, (6, 4), salt=9)
    for rank in range(4):
        res = got(four, rank, "mesh_2d")
        dp, tp = divmod(rank, 2)
        assert res["device_type"] == "npu"
        assert res["tp_ranks"] == [2 * dp, 2 * dp + 1]
        same(res["tp_sum"], sum(value(r, (3,), salt=7) for r in res["tp_ranks"]), rank)
        same(res["local_a"], a[4 * dp:4 * dp + 4, 3 * tp:3 * tp + 3], rank)
        same(res["matmul"], a @ b, rank, exact=False)
        same(res["sum"], (a * 2 + 1).sum(), rank, exact=False)
        same(res["replicated"], a, rank)
