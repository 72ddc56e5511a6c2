"""The CUDA DDP sample (``nccl``) on 2 emulated NPUs: unmodified under ``transfer_to_npu`` and
after ``migrate --fix``, both with ``hccl``, launched by torch_npu_run (torchrun).

Needs the ``hccl`` process-group backend (fails at ``init_process_group`` without it).
"""
import shutil
import subprocess
import sys
from pathlib import Path

from _subproc import make_env
from torch_npu.cli import main

SAMPLES = Path(__file__).parent / "migration_samples"


def _launch(script, env, log_dir):
    # Each rank's stdout goes to its own file (--redirects 1): two ranks printing
    # into one pipe can interleave inside a line.
    return subprocess.Popen([sys.executable, "-m", "torch_npu.distributed.run", "--nproc-per-node", "2",
                             "--standalone", "--log-dir", str(log_dir), "--redirects", "1", str(script)],
                            cwd=str(script.parent), env=make_env(**env), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_ddp_sample_runs_with_hccl(tmp_path):
    fixed = tmp_path / "ddp_fixed.py"
    shutil.copy(SAMPLES / "ddp_train.py", fixed)
    assert main(["migrate", "--fix", str(fixed)]) == 0
    runs = {}
    for name, script, env in (("transfer", SAMPLES / "ddp_train.py", {"TORCH_TRANSFER_TO_NPU": 1}),
                              ("fixed", fixed, {"TORCH_TRANSFER_TO_NPU": 0})):
        # one launch at a time: two concurrent torchrun jobs lost output lines here
        log_dir = tmp_path / f"logs_{name}"
        proc = _launch(script, env, log_dir)
        out, err = proc.communicate(timeout=150)
        assert proc.returncode == 0, f"{name}: {err[-3000:]}"
        outs = sorted(log_dir.rglob("stdout.log"))
        assert len(outs) == 2, outs
        lines = [line for f in outs for line in f.read_text().splitlines()]
        runs[name] = sorted(line for line in lines if line.startswith("rank "))
    assert runs["transfer"] == runs["fixed"]
    final = [line.split() for line in runs["fixed"] if "weight_sum" in line]
    assert len(final) == 2
    assert final[0][3] == final[1][3]  # DDP kept the replicas identical
    assert final[0][5] == final[1][5]  # all_reduce gave both ranks the same sum
    losses = [line for line in runs["fixed"] if " loss " in line]
    assert len(losses) == 6
