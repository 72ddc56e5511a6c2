"""DeepSpeed on 2 NPUs (hccl), checked against a one-process CPU run; its CANN look-ups.

No test sets a CANN variable: ``launcher_env`` removes them, so DeepSpeed finds
``ASCEND_HOME_PATH`` only because ``import torch_npu`` exports it (the emulated toolkit).
"""
import json
import subprocess

import pytest
import torch
import torch.nn as nn

from _clients import CANN_VARIABLES, EXAMPLES, PYTHON, load_example, launcher_env, require

require("deepspeed")


def run_example(tmp_path, *args):
    out = tmp_path / "report.json"
    env = launcher_env()
    assert not set(CANN_VARIABLES) & set(env)
    proc = subprocess.run([PYTHON, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                           str(EXAMPLES / "deepspeed_zero2.py"), "--steps", "4", "--optimizer", "sgd",
                           "--lr", "0.05", "--out", str(out), *args],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return json.loads(out.read_text())


def full_batch_sgd(max_norm):
    """One CPU process, SGD on each global batch of 16 (rank r's 8 samples are its half);
    ``max_norm``: clip the global gradient norm first, as DeepSpeed's ``gradient_clipping``
    does (None: no clipping). Returns the final weights, the losses and the gradient norms."""
    example = load_example("deepspeed_zero2")
    model = example.make_model(0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    x, y = example.make_data(4 * 8 * 2, 0)
    losses, norms = [], []
    for step in range(4):
        xb, yb = x[step * 16:(step + 1) * 16], y[step * 16:(step + 1) * 16]
        loss = nn.functional.mse_loss(model(xb), yb)
        optimizer.zero_grad()
        loss.backward()
        norms.append(torch.cat([p.grad.flatten() for p in model.parameters()]).norm().item())
        if max_norm:
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        optimizer.step()
        losses.append(loss.item())
    return torch.cat([p.detach().flatten() for p in model.parameters()]), losses, norms


def check_report(report, stage):
    assert report["accelerator"] == "NPU_Accelerator"
    assert report["backend"] == "hccl" and report["zero_stage"] == stage and report["world_size"] == 2
    rank0, rank1 = report["weights_per_rank"]
    assert rank0 == rank1
    return torch.tensor(rank0), torch.tensor(report["losses"])


@pytest.mark.parametrize("stage", [2, 3])
def test_zero_on_two_npus_matches_full_batch_sgd_with_deepspeeds_default_clipping(tmp_path, stage):
    # DeepSpeed clips the global gradient norm to `gradient_clipping`, whose default is
    # GRADIENT_CLIPPING_DEFAULT (1.0 in 0.19.8): the same run on DeepSpeed's CPU accelerator
    # with gloo gives these weights bit for bit, so this is DeepSpeed's behaviour, not the NPU's.
    from deepspeed.runtime.constants import GRADIENT_CLIPPING_DEFAULT
    assert GRADIENT_CLIPPING_DEFAULT > 0
    weights, losses = check_report(run_example(tmp_path, "--zero-stage", str(stage)), stage)
    expected, expected_losses, norms = full_batch_sgd(GRADIENT_CLIPPING_DEFAULT)
    assert max(norms) > GRADIENT_CLIPPING_DEFAULT  # the clipping did act on these steps
    torch.testing.assert_close(weights, expected, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(losses, torch.tensor(expected_losses), rtol=1e-5, atol=1e-6)
    unclipped, _, _ = full_batch_sgd(None)
    assert (weights - unclipped).abs().max() > 1e-2  # and it shows in the result


def test_zero2_without_clipping_matches_plain_full_batch_sgd(tmp_path):
    weights, losses = check_report(run_example(tmp_path, "--gradient-clipping", "0"), 2)
    expected, expected_losses, _ = full_batch_sgd(None)
    # SGD: linear in the gradients, so the all-reduce's summation order changes
    # the result only by rounding.
    torch.testing.assert_close(weights, expected, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(losses, torch.tensor(expected_losses), rtol=1e-5, atol=1e-6)


_CANN_PROBE = r"""
import json, os
import torch_npu
from deepspeed.accelerator import get_accelerator
from deepspeed.env_report import installed_cann_path, installed_cann_version
import deepspeed.ops.op_builder.all_ops as all_ops  # what DeepSpeed's setup.py imports at build time
builder = get_accelerator().create_op_builder("FusedAdamBuilder")
print(json.dumps({"accelerator": type(get_accelerator()).__name__, "home": os.environ["ASCEND_HOME_PATH"],
                  "builder_path": builder.installed_cann_path(), "builder_version": builder.installed_cann_version(),
                  "cann_defs": builder.cann_defs(), "report_path": installed_cann_path(),
                  "report_version": installed_cann_version(), "ops": len(all_ops.ALL_OPS),
                  "emulated": torch_npu.version.cann}))
"""


def test_op_builders_and_ds_report_find_the_emulated_cann():
    proc = subprocess.run([PYTHON, "-c", _CANN_PROBE], env=launcher_env(), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    assert found["accelerator"] == "NPU_Accelerator"
    assert found["builder_path"] == found["report_path"] == found["home"]
    # They walk $ASCEND_HOME_PATH for ascend_*_install.info and read its version= line.
    assert found["builder_version"] == found["report_version"] == found["emulated"]
    assert found["cann_defs"] == "-D__ENABLE_CANN__"
    assert found["ops"] > 10


def test_ds_report_prints_the_emulated_cann_version():
    import torch_npu
    proc = subprocess.run([PYTHON, "-m", "deepspeed.env_report"], env=launcher_env(), capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = next(line for line in proc.stdout.splitlines() if "ascend_cann version" in line)
    assert line.rstrip().endswith(torch_npu.version.cann)


def test_without_the_emulated_environment_deepspeed_fails_as_on_a_server_without_cann():
    # TORCH_NPU_EMU_CANN_ENV=0: nothing exports ASCEND_HOME_PATH, and DeepSpeed's op
    # builders index it unguarded; the KeyError the emulated environment prevents.
    proc = subprocess.run([PYTHON, "-c", _CANN_PROBE], env=launcher_env(TORCH_NPU_EMU_CANN_ENV="0"),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert "KeyError: 'ASCEND_HOME_PATH'" in proc.stderr
