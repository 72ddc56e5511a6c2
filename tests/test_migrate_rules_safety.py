"""``torch-npu migrate`` never rewrites a working script into a failing one, and starts without torch.

Constructs with no NPU equivalent (DataParallel, the tests that choose a DataParallel path,
CUDA extension builds, ``nvidia-smi``, ``torch.cuda.nvtx``, cudnn flags) are manual findings and
stay as written; the launcher ``torch_npu_cli`` loads the command without importing torch.
"""
import json
import subprocess
import sys
import textwrap

from _subproc import REPO, make_env
from torch_npu.cli import _cuda_rules

IMAGENET_STYLE = textwrap.dedent('''\
    import subprocess
    import torch
    import torch.nn as nn
    from torch.nn import DataParallel
    from torch.utils.cpp_extension import load, load_inline
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = nn.Linear(2, 2)
    if device.type == 'cuda' and torch.cuda.device_count() > 1:
        model = nn.DataParallel(model)
    elif device.type == "cuda":
        model = model.cuda()
    model2 = DataParallel(model) if device.type == "cuda" else model
    ext = load(name="x", sources=["a.cpp", "k.cu"])
    ext2 = load(name="y", sources=["a.cpp"])
    ext3 = load_inline(name="z", cpp_sources="", cuda_sources="...")
    subprocess.run(["nvidia-smi", "-L"])
    torch.cuda.nvtx.range_push("x")
    torch.backends.cudnn.benchmark = True
    ''')


def test_data_parallel_paths_and_cuda_only_tools_are_manual_and_kept():
    findings, fixed = _cuda_rules.check(IMAGENET_STYLE, fix=True)
    got = {(f.line, f.kind, f.fixable) for f in findings}
    assert got == {
        (6, "device-string", True), (6, "torch-cuda", True),
        # the test of the if that leads to DataParallel is left as written
        (8, "data-parallel-guard", False), (8, "data-parallel-guard", False),
        (9, "data-parallel", False),
        # the elif's own branch has no DataParallel: an ordinary device comparison
        (10, "device-string", True), (11, "cuda-call", True),
        (12, "data-parallel", False), (12, "data-parallel-guard", False),
        (13, "cuda-library", False),  # sources name a .cu file; line 14 (C++ only) is fine
        (15, "cuda-library", False),
        (16, "nvidia-smi", False),
        (17, "torch-cuda", False),
        (18, "cudnn-flag", False),
    }
    lines = fixed.splitlines()
    assert "import torch_npu" in lines
    assert "if device.type == 'cuda' and torch.cuda.device_count() > 1:" in lines
    assert 'elif device.type == "npu":' in lines
    assert 'model2 = DataParallel(model) if device.type == "cuda" else model' in lines
    for kept in ('subprocess.run(["nvidia-smi", "-L"])', 'torch.cuda.nvtx.range_push("x")',
                 'ext = load(name="x", sources=["a.cpp", "k.cu"])', "torch.backends.cudnn.benchmark = True"):
        assert kept in lines
    hints = {f.kind: f.replacement for f in findings}
    assert "torch_npu_run" in hints["data-parallel"] and "DistributedDataParallel" in hints["data-parallel"]
    assert "npu-smi" in hints["nvidia-smi"]


def test_is_available_guarding_data_parallel_is_not_rewritten():
    src = "import torch\nif torch.cuda.is_available():\n    m = torch.nn.DataParallel(m).cuda()\n"
    findings, fixed = _cuda_rules.check(src, fix=True)
    assert [(f.line, f.kind, f.fixable) for f in findings] == [
        (2, "data-parallel-guard", False), (3, "cuda-call", True), (3, "data-parallel", False)]
    assert "if torch.cuda.is_available():" in fixed


_IN_PROCESS = textwrap.dedent('''
    import json, sys
    {setup}
    import torch_npu_cli
    rc = torch_npu_cli.main(["migrate", "--format", "json", {path!r}])
    print(json.dumps({{"rc": rc, "torch": "torch" in sys.modules,
                      "torch_npu": sorted(m for m in sys.modules if m == "torch_npu")}}))
    ''')


def _run_cli(path, setup=""):
    proc = subprocess.run([sys.executable, "-c", _IN_PROCESS.format(path=str(path), setup=setup)], cwd=str(REPO),
                          env=make_env(), capture_output=True, text=True, timeout=120)
    return proc, json.loads(proc.stdout.strip().splitlines()[-1])


def test_migrate_runs_without_importing_torch():
    proc, state = _run_cli(REPO / "tests" / "migration_samples")
    report = json.loads(proc.stdout[:proc.stdout.rindex("\n{")])
    assert state == {"rc": 1, "torch": False, "torch_npu": []}, proc.stderr[-2000:]
    assert any(f["kind"] == "cuda-call" for f in report["findings"])


def test_migrate_needs_no_third_party_parser():
    # sys.modules[name] = None makes `import libcst` raise ModuleNotFoundError, as when absent:
    # the rules use the standard library's ast, so the same report comes out.
    proc, state = _run_cli(REPO / "tests" / "migration_samples", setup="sys.modules['libcst'] = None")
    report = json.loads(proc.stdout[:proc.stdout.rindex("\n{")])
    assert state == {"rc": 1, "torch": False, "torch_npu": []}, proc.stderr[-2000:]
    assert any(f["kind"] == "cuda-call" for f in report["findings"])
