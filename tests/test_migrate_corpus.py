"""The migrate corpus: ten CUDA training scripts (``tests/migrate_corpus/``) give the same
losses (a) unchanged under ``transfer_to_npu``, (b) after ``torch-npu migrate --fix`` and
(c) unchanged on the CPU (no CUDA here, so each takes its CPU path).

(a) and (b) run on the NPU and must agree exactly. The NPU computes what the CPU computes, so
(c) must agree exactly too, except in scripts marked ``# corpus: amp`` (float16 autocast on the
NPU, float32 on the CPU), compared with a relative tolerance of 2e-2. Scripts marked
``# corpus: one-card`` see one NPU (``ASCEND_RT_VISIBLE_DEVICES=0``).
"""
import concurrent.futures
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from _subproc import make_env
from torch_npu.cli import _cuda_rules, main

CORPUS = Path(__file__).parent / "migrate_corpus"
SCRIPTS = sorted(p.name for p in CORPUS.glob("*.py"))
AMP_RTOL = 2e-2
TIMEOUT_S = 600


def _values(out):
    """The script's device and its (name, value) lines: loss, acc1, ema_loss."""
    device = [line.split()[1] for line in out.splitlines() if line.startswith("device ")]
    values = [(line.split()[0], float(line.split()[1])) for line in out.splitlines()
              if re.match(r"(loss|acc1|ema_loss) ", line)]
    return device, values


def _run(script, env, port):
    if "# corpus: one-card" in script.read_text():
        env = dict(env, ASCEND_RT_VISIBLE_DEVICES=0)
    proc = subprocess.run([sys.executable, script.name, str(script.parent)], cwd=str(script.parent),
                          env=make_env(CORPUS_MASTER_PORT=port, **env), capture_output=True, text=True,
                          timeout=TIMEOUT_S)
    return proc.returncode, proc.stdout, proc.stderr


@pytest.fixture(scope="module")
def corpus_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    dirs = {mode: root / mode for mode in ("transfer", "fixed", "cpu")}
    for d in dirs.values():
        shutil.copytree(CORPUS, d)
    fix_rc = main(["migrate", "--fix", "--jobs", "1", str(dirs["fixed"])])
    modes = {"transfer": {"TORCH_TRANSFER_TO_NPU": 1}, "fixed": {"TORCH_TRANSFER_TO_NPU": 0},
             "cpu": {"TORCH_TRANSFER_TO_NPU": 0}}
    jobs = {}
    # Each run mostly waits on `import torch`: a few at a time keep the cores busy.
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(2, (os.cpu_count() or 2) + 1)) as pool:
        for i, name in enumerate(SCRIPTS):
            for j, (mode, env) in enumerate(modes.items()):
                jobs[mode, name] = pool.submit(_run, dirs[mode] / name, env, str(29600 + 3 * i + j))
        results = {key: job.result() for key, job in jobs.items()}
    return fix_rc, dirs, results


def test_corpus_has_the_styles_the_port_meets():
    assert len(SCRIPTS) >= 10
    text = {name: (CORPUS / name).read_text() for name in SCRIPTS}
    everything = "".join(text.values())
    for construct in ("DataParallel", "torch.cuda.amp.autocast", "GradScaler", "cudnn.benchmark",
                      ".cuda(non_blocking=True)", "channels_last", '"nccl"', "mp.spawn", "map_location",
                      'device = "cuda" if torch.cuda.is_available() else "cpu"'):
        assert construct in everything, construct


def test_fix_leaves_only_manual_findings(corpus_runs):
    fix_rc, dirs, _ = corpus_runs
    assert fix_rc == 1  # cudnn.benchmark and the DataParallel path stay for a person
    for name in SCRIPTS:
        findings, _ = _cuda_rules.check((dirs["fixed"] / name).read_text())
        assert [f for f in findings if f.fixable] == [], name
    imagenet = (dirs["fixed"] / "imagenet.py").read_text()
    assert "if device.type == 'cuda' and torch.cuda.device_count() > 1:" in imagenet


@pytest.mark.parametrize("name", SCRIPTS)
def test_same_losses_under_transfer_after_fix_and_on_cpu(corpus_runs, name):
    _, _, results = corpus_runs
    got = {}
    for mode in ("transfer", "fixed", "cpu"):
        rc, out, err = results[mode, name]
        assert rc == 0, f"{mode}: {name} failed\n{err[-3000:]}"
        got[mode] = _values(out)
    assert got["transfer"][0] == got["fixed"][0] == ["npu"]
    assert got["cpu"][0] == ["cpu"]
    values = got["transfer"][1]
    assert len(values) >= 3 and all(v == v for _, v in values)  # printed, and not NaN
    assert got["fixed"][1] == values
    cpu = got["cpu"][1]
    assert [k for k, _ in cpu] == [k for k, _ in values]
    if "# corpus: amp" in (CORPUS / name).read_text():
        assert [v for _, v in cpu] == pytest.approx([v for _, v in values], rel=AMP_RTOL)
        assert [v for _, v in cpu] != [v for _, v in values]  # float16 on the NPU did run
    else:
        assert cpu == values
