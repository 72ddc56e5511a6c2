"""``torch-npu migrate``: finds every planted CUDA construct (and nothing else), fixes the safe
ones keeping comments, and the fixed script computes what the original computes under
``transfer_to_npu``.

The sample scripts in ``migration_samples/`` mark each planted construct with an
``# expect: <kind> [<kind>…]`` comment on its line: that is the reference.
"""
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from _subproc import make_env
from torch_npu.cli import _cuda_rules, main

SAMPLES = Path(__file__).parent / "migration_samples"


def planted(path):
    """{(line, kind)} from the ``# expect:`` markers of a sample."""
    out = set()
    for i, line in enumerate(path.read_text().splitlines(), 1):
        m = re.search(r"# expect: (.*)$", line)
        if m:
            out |= {(i, kind) for kind in m.group(1).split()}
    return out


@pytest.mark.parametrize("name", ["train_amp.py", "cuda_libraries.py", "ddp_train.py"])
def test_finds_each_planted_construct_and_nothing_else(name):
    findings, _ = _cuda_rules.check((SAMPLES / name).read_text())
    assert {(f.line, f.kind) for f in findings} == planted(SAMPLES / name)


def test_clean_npu_script_has_no_findings():
    findings, _ = _cuda_rules.check((SAMPLES / "clean_npu.py").read_text())
    assert findings == []


def test_names_are_resolved_through_imports():
    src = ("import torch as th\nfrom torch import cuda as tc\nimport torch.distributed as dist\n"
           "th.cuda.synchronize()\nx = tc.current_device()\nok = dist.is_nccl_available()\n"
           "cuda = 3\nprint(cuda)\n")
    findings, fixed = _cuda_rules.check(src, fix=True)
    got = {(f.line, f.kind, f.fixable) for f in findings}
    # `tc.X` resolves to torch.cuda.X but has no `torch.cuda` spelled out to rewrite.
    assert got == {(4, "torch-cuda", True), (5, "torch-cuda", False), (6, "nccl", False)}
    assert "th.npu.synchronize()" in fixed and "print(cuda)" in fixed


def test_unknown_torch_cuda_names_are_manual():
    findings, _ = _cuda_rules.check("import torch\ntorch.cuda.nvtx.range_push('a')\ntorch.cuda.jiterator\n")
    assert [(f.line, f.kind, f.fixable) for f in findings] == [(2, "torch-cuda", False), (3, "torch-cuda", False)]
    assert "mstx" in findings[0].replacement


def test_strings_are_judged_by_value():
    src = ('a = "cuda"\nb = r"cuda:1"\nc = "cuda:%d" % 1\nd = "cpu:gloo,cuda:nccl"\ne = "nccl"\n'
           'f = "ckpt_cuda.pt"\ng = "cudagraph"\nh = b"cuda"\n')
    findings, fixed = _cuda_rules.check(src, fix=True)
    assert [(f.line, f.kind) for f in findings] == [(1, "device-string"), (2, "device-string"),
                                                    (3, "device-string"), (4, "nccl"), (5, "nccl")]
    assert fixed.splitlines() == ['a = "npu"', 'b = r"npu:1"', 'c = "npu:%d" % 1', 'd = "cpu:gloo,npu:hccl"',
                                  'e = "hccl"', 'f = "ckpt_cuda.pt"', 'g = "cudagraph"', 'h = b"cuda"']


def _cli(args, capsys):
    rc = main(args)
    return rc, capsys.readouterr().out


def test_cli_text_json_and_exit_codes(capsys):
    rc, out = _cli(["migrate", str(SAMPLES / "clean_npu.py")], capsys)
    assert rc == 0 and out.startswith("0 finding(s)")
    rc, out = _cli(["migrate", "--format", "json", str(SAMPLES)], capsys)
    assert rc == 1
    report = json.loads(out)
    per_file = {}
    for f in report["findings"]:
        per_file.setdefault(Path(f["path"]).name, set()).add((f["line"], f["kind"]))
    for name in ("train_amp.py", "cuda_libraries.py", "ddp_train.py"):
        assert per_file.pop(name) == planted(SAMPLES / name)
    assert per_file == {}  # clean_npu.py and preflight_fallback.py have none
    rc, out = _cli(["migrate", str(SAMPLES / "train_amp.py")], capsys)
    assert rc == 1
    assert re.search(r"train_amp\.py:50:\d+: map-location: \"cuda:0\" -> \"npu:0\" \[fixable\]", out)
    assert re.search(r"train_amp\.py:14:1: cudnn-flag: .* \[manual\]", out)


def test_diff_changes_nothing_and_fix_keeps_comments(tmp_path, capsys):
    target = tmp_path / "train_amp.py"
    shutil.copy(SAMPLES / "train_amp.py", target)
    before = target.read_text()
    rc, out = _cli(["migrate", "--diff", str(target)], capsys)
    assert rc == 1 and target.read_text() == before
    assert '-state = torch.load(ckpt, map_location="cuda:0")  # expect: map-location' in out
    assert '+state = torch.load(ckpt, map_location="npu:0")  # expect: map-location' in out

    rc, out = _cli(["migrate", "--fix", str(target)], capsys)
    after = target.read_text()
    assert rc == 1  # the cudnn flag needs a person
    assert "13 finding(s) fixed; 1 remaining" in out
    # Comments, docstring and blank lines survive; only the planted tokens changed.
    assert after.count("# expect:") == before.count("# expect:")
    assert "# The loader pins host batches for fast copies to the device." in after
    assert after.splitlines()[9] == "import torch_npu"  # added after `import torch`
    assert len(before.splitlines()) + 1 == len(after.splitlines())
    left = {(f.line - 1, f.kind) for f in _cuda_rules.check(after)[0]}
    assert left == {(14, "cudnn-flag")}


def test_fix_is_idempotent(tmp_path, capsys):
    target = tmp_path / "ddp_train.py"
    shutil.copy(SAMPLES / "ddp_train.py", target)
    assert _cli(["migrate", "--fix", str(target)], capsys)[0] == 0
    once = target.read_text()
    assert _cli(["migrate", "--fix", str(target)], capsys)[0] == 0
    assert target.read_text() == once


def test_fixed_script_matches_original_under_transfer_to_npu(tmp_path, capsys):
    orig_dir, fixed_dir = tmp_path / "orig", tmp_path / "fixed"
    orig_dir.mkdir()
    fixed_dir.mkdir()
    shutil.copy(SAMPLES / "train_amp.py", orig_dir / "train.py")
    shutil.copy(SAMPLES / "train_amp.py", fixed_dir / "train.py")
    _cli(["migrate", "--fix", str(fixed_dir / "train.py")], capsys)

    procs = {
        # the unmodified CUDA script on the NPU through transfer_to_npu
        "transfer": subprocess.Popen([sys.executable, "train.py", str(orig_dir)], cwd=str(orig_dir),
                                     env=make_env(TORCH_TRANSFER_TO_NPU=1), stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True),
        # the --fix output, no transfer_to_npu
        "fixed": subprocess.Popen([sys.executable, "train.py", str(fixed_dir)], cwd=str(fixed_dir),
                                  env=make_env(TORCH_TRANSFER_TO_NPU=0), stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True),
        # control: the unmodified script without the patch cannot run (CPU-only torch has no CUDA)
        "plain": subprocess.Popen([sys.executable, "train.py", str(orig_dir / "plain")], cwd=str(orig_dir),
                                  env=make_env(TORCH_TRANSFER_TO_NPU=0), stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True),
    }
    results = {k: (p.communicate(timeout=300), p.returncode) for k, p in procs.items()}
    for k in ("transfer", "fixed"):
        (out, err), rc = results[k]
        assert rc == 0, f"{k}: {err[-3000:]}"
    out_t = results["transfer"][0][0].splitlines()
    out_f = results["fixed"][0][0].splitlines()
    losses = [line for line in out_t if line.startswith("loss ")]
    assert len(losses) == 8
    assert out_t == out_f  # every loss, the probe after reload and the peak memory, to the printed digit
    assert float(out_t[-1].split()[1]) > 0  # the peak was measured on the npu
    (_, err), rc = results["plain"]
    assert rc != 0 and ("CUDA" in err or "cuda" in err)
