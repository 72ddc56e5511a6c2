"""DeepSpeed ZeRO-2 on 2 NPUs (hccl), checked against a one-process CPU run."""
import json
import subprocess

import pytest
import torch
import torch.nn as nn

from _clients import EXAMPLES, PYTHON, load_example, launcher_env, require

require("deepspeed")


@pytest.mark.xfail(strict=True, reason="unexplained: DeepSpeed's SGD weights after 4 steps differ from the full-batch "
                                       "reference by up to 0.14 (ZeRO-0 gives the same losses as ZeRO-2, so not the "
                                       "partitioning); replicas stay identical; see docs/ecosystem.md")
def test_zero2_on_two_npus_matches_full_batch_sgd(tmp_path):
    out = tmp_path / "zero2.json"
    home = tmp_path / "ascend"  # DeepSpeed's NPU op builders read ASCEND_HOME_PATH unguarded
    home.mkdir()
    proc = subprocess.run([PYTHON, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                           str(EXAMPLES / "deepspeed_zero2.py"), "--steps", "4", "--optimizer", "sgd",
                           "--lr", "0.05", "--out", str(out)],
                          env=launcher_env(ASCEND_HOME_PATH=str(home)), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    report = json.loads(out.read_text())
    assert report["accelerator"] == "NPU_Accelerator"
    assert report["backend"] == "hccl" and report["zero_stage"] == 2 and report["world_size"] == 2
    rank0, rank1 = report["weights_per_rank"]
    assert rank0 == rank1

    example = load_example("deepspeed_zero2")
    model = example.make_model(0)
    # SGD: linear in the gradients, so the all-reduce's summation order changes
    # the result only by rounding (Adam's g/sqrt(v) amplifies it near g = 0).
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    x, y = example.make_data(4 * 8 * 2, 0)
    losses = []
    for step in range(4):
        xb, yb = x[step * 16:(step + 1) * 16], y[step * 16:(step + 1) * 16]
        loss = nn.functional.mse_loss(model(xb), yb)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    expected = torch.cat([p.detach().flatten() for p in model.parameters()])
    torch.testing.assert_close(torch.tensor(rank0), expected, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(torch.tensor(report["losses"]), torch.tensor(losses), rtol=1e-5, atol=1e-6)
