"""Training stacks on the ``hccl`` backend equal a single-process full-batch reference.

One 2-rank job (dist_workers/training.py: DDP, Join, fp16/bf16 compress
hooks, FSDP2 fp32 / bf16 mixed precision / ShardedGradScaler, DCP round trip)
and one 4-rank job (training_2d.py: TP x FSDP2 on a (2, 2) npu mesh). The
references run the same model, data and SGD steps on the CPU in this process.
"""
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "dist_workers"))
from launch import launch  # noqa: E402
from models import batch, loss_fn, make_model, reference_steps, shard  # noqa: E402

W = 2


@pytest.fixture(scope="module")
def two():
    return launch("training.py", W, timeout=240)


@pytest.fixture(scope="module")
def four():
    return launch("training_2d.py", 4, timeout=240)


@pytest.fixture(scope="module")
def reference():
    return reference_steps(3)


def got(results, rank, name):
    res = results[rank][name]
    if isinstance(res, dict) and "error" in res:
        pytest.fail(f"rank {rank} {name}:\n{res['error']}")
    return res


def max_diff(params, ref):
    assert sorted(params) == sorted(ref)
    return max((params[k] - ref[k]).abs().max().item() for k in ref)


def check_run(res, reference, tol):
    """The rank's losses average to the full-batch loss; parameters match the reference."""
    ref_losses, ref_params = reference
    diff = max_diff(res["params"], ref_params)
    assert diff <= tol, diff
    return diff


def mean_losses(results, name):
    return [sum(results[r][name]["losses"][i] for r in range(W)) / W for i in range(3)]


def test_ddp_equals_full_batch(two, reference):
    for rank in range(W):
        res = got(two, rank, "ddp")
        assert res["device"] == f"npu:{rank}"
        check_run(res, reference, 1e-6)
    assert mean_losses(two, "ddp") == pytest.approx(reference[0], abs=1e-6)


def test_ddp_join_uneven_inputs(two):
    # Steps 0-1: both ranks; step 2: rank 0 alone, the joined rank contributes zeros
    # and the average still divides by the initial world size.
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(3):
        x, y = batch(step)
        opt.zero_grad()
        if step < 2:
            loss_fn(model(x), y).backward()
        else:
            loss_fn(model(shard(x, 0, W)), shard(y, 0, W)).backward()
            for p in model.parameters():
                p.grad /= W
        opt.step()
    res = got(two, 0, "ddp_join")
    assert len(res["losses"]) == 3 and len(got(two, 1, "ddp_join")["losses"]) == 2
    assert max_diff(res["params"], dict(model.named_parameters())) <= 1e-6


def test_ddp_compress_hooks(two, reference):
    for rank in range(W):
        fp16 = check_run(got(two, rank, "ddp_fp16_hook"), reference, 1e-4)
        bf16 = check_run(got(two, rank, "ddp_bf16_hook"), reference, 2e-3)
        # the gradients really travelled compressed (bf16 loses more than fp16)
        assert 0 < fp16 < bf16


def test_fsdp2_equals_full_batch(two, reference):
    for rank in range(W):
        res = got(two, rank, "fsdp2")
        check_run(res, reference, 1e-6)
        assert res["placements"] == "(Shard(dim=0),)"
        assert res["local_shape"] == [8, 8] and res["local_device"] == f"npu:{rank}"
    assert mean_losses(two, "fsdp2") == pytest.approx(reference[0], abs=1e-6)


def test_fsdp2_bf16_mixed_precision(two, reference):
    for rank in range(W):
        res = got(two, rank, "fsdp2_bf16")
        assert res["forward_dtype"] == "torch.bfloat16" and res["stored_dtype"] == "torch.float32"
        assert 0 < check_run(res, reference, 2e-3)
    assert mean_losses(two, "fsdp2_bf16") == pytest.approx(reference[0], abs=5e-3)


def test_fsdp2_sharded_grad_scaler_fp16(two, reference):
    for rank in range(W):
        res = got(two, rank, "fsdp2_sharded_grad_scaler")
        check_run(res, reference, 2e-4)
        assert res["scale"] == 1024.0  # no overflow, no growth within 3 steps


def test_distributed_checkpoint_round_trip(two):
    for rank in range(W):
        res = got(two, rank, "checkpoint_round_trip")
        assert res["differed_before_load"]
        assert res["files"] == [".metadata", "__0_0.distcp", "__1_0.distcp"]
        for k, v in res["before"].items():
            assert torch.equal(res["after"][k], v), k
        for k, v in res["ref_exp_avg"].items():
            assert torch.equal(res["exp_avg"][k], v), k
        for k, v in res["next_saved"].items():
            assert torch.equal(res["next_restored"][k], v), k


def test_tp_x_fsdp2_on_2d_mesh(four, reference):
    for rank in range(4):
        res = got(four, rank, "train")
        assert res["dp_rank"] == rank // 2 and res["local_device"] == f"npu:{rank}"
        assert res["placements"]["2.weight"] == "(Shard(dim=0), Shard(dim=1))"  # dp x tp row-wise
        check_run(res, reference, 1e-6)
    losses = [(four[0]["train"]["losses"][i] + four[2]["train"]["losses"][i]) / 2 for i in range(3)]
    assert losses == pytest.approx(reference[0], abs=1e-6)
