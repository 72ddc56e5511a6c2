"""accelerate on npu: `accelerate launch` on 2 NPUs with hccl DDP, checked against one CPU process."""
import json
import subprocess

import pytest
import torch
import torch.nn as nn

from _clients import EXAMPLES, PYTHON, load_example, launcher_env, require

require("accelerate")

LAUNCH = [PYTHON, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
          "--dynamo_backend", "no"]


def launch(args, timeout=300):
    proc = subprocess.run(LAUNCH + args, env=launcher_env(), capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return proc


def test_accelerate_launch_two_npus_hccl_ddp_matches_full_batch_reference(tmp_path):
    out = tmp_path / "report.json"
    launch(["--mixed_precision", "no", str(EXAMPLES / "accelerate_ddp.py"), "--epochs", "2", "--out", str(out)])
    report = json.loads(out.read_text())
    assert report["world_size"] == 2
    assert report["backend"] == "hccl"
    assert report["devices"] == ["npu:0", "npu:1"]
    rank0, rank1 = report["weights_per_rank"]
    assert rank0 == rank1  # DDP kept the replicas identical

    # Reference: one CPU process, SGD on the mean loss of each global batch of
    # 16 (rank r saw per-process batch 2k+r of 8), which DDP's averaged
    # gradients reproduce.
    example = load_example("accelerate_ddp")
    model = example.make_model(0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    x, y = example.make_data(64, 0).tensors
    losses = []
    for epoch in range(2):
        for start in range(0, 64, 16):
            loss = nn.functional.mse_loss(model(x[start:start + 16]), y[start:start + 16])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    expected = torch.cat([p.detach().flatten() for p in model.parameters()])
    torch.testing.assert_close(torch.tensor(rank0), expected, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(torch.tensor(report["losses"]), torch.tensor(losses), rtol=1e-5, atol=1e-6)
    assert report["losses"][-1] < report["losses"][0]


def test_accelerate_gather_of_2d_tensors(tmp_path):
    """accelerate.gather hands all_gather_into_tensor a flat output for a 2-D input, as eval loops do."""
    out = tmp_path / "gather.json"
    launch(["--mixed_precision", "no", str(EXAMPLES.parent / "tests" / "integration" / "_gather_2d_worker.py"),
            str(out)])
    result = json.loads(out.read_text())
    assert result.get("gathered") == [[0.0] * 3, [0.0] * 3, [1.0] * 3, [1.0] * 3], result


def test_optimizer_built_before_prepare_trains_the_npu_model():
    from accelerate import Accelerator
    accelerator = Accelerator(cpu=False)
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    assert next(model.parameters()).device.type == "npu"
    before = model.weight.detach().clone()
    loss = model(torch.ones(2, 4, device=accelerator.device)).sum()
    accelerator.backward(loss)
    optimizer.step()
    assert not torch.equal(model.weight.detach(), before)
