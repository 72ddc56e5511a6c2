"""``torch-npu doctor``: versions, emulated devices and settings, client-library detection."""
import importlib
import json
import os
import subprocess
import sys

import torch
import torch_npu

from _subproc import REPO, make_env
from torch_npu.cli.doctor import collect


def test_collect_matches_the_runtime():
    r = collect()
    assert r["torch"] == torch.__version__ and r["torch_npu"] == torch_npu.__version__
    assert len(r["devices"]) == torch.npu.device_count()
    assert r["devices"][0] == {"device": "npu:0", "name": torch.npu.get_device_name(0),
                               "total_memory_bytes": torch.npu.get_device_properties(0).total_memory}
    checks = {c["check"]: c["status"] for c in r["checks"]}
    assert checks["torch version"] == "ok" and checks["npu devices"] == "ok"
    assert checks["hccl backend"] == ("ok" if torch.distributed.is_backend_available("hccl") else "warn")
    libs = {c["library"]: c for c in r["clients"]}
    assert set(libs) == {"accelerate", "transformers", "peft", "diffusers", "deepspeed", "lightning"}
    assert libs["lightning"]["detects"] == "cpu"


def test_cli_shows_emulator_settings_and_deepspeed_override():
    env = make_env(TORCH_NPU_EMU_DEVICE_COUNT=2, TORCH_NPU_EMU_MEMORY="512MiB", DS_ACCELERATOR="cpu")
    proc = subprocess.run([sys.executable, "-m", "torch_npu", "doctor", "--format", "json"], cwd=str(REPO), env=env,
                          capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr[-2000:]
    r = json.loads(proc.stdout)
    assert [d["total_memory_bytes"] for d in r["devices"]] == [512 * 2**20] * 2
    assert r["settings"]["TORCH_NPU_EMU_DEVICE_COUNT"] == "2"
    ds = next(c for c in r["clients"] if c["library"] == "deepspeed")
    assert ds["detects"] == "cpu" and ds["how"] == "DS_ACCELERATOR"


def _fake_site(tmp_path):
    """A site directory with what users end up with: torchvision built for another torch (its
    import fails as the CUDA build does on a CPU machine) and a real torch_npu's dist-info."""
    site = tmp_path / "site"
    (site / "torchvision").mkdir(parents=True)
    (site / "torchvision" / "__init__.py").write_text(
        'raise RuntimeError("operator torchvision::nms does not exist")\n')
    meta = site / "torchvision-0.29.0+cu130.dist-info"
    meta.mkdir()
    (meta / "METADATA").write_text("Metadata-Version: 2.1\nName: torchvision\nVersion: 0.29.0+cu130\n"
                                   "Requires-Dist: numpy\nRequires-Dist: torch==2.14.0\n")
    real = site / "torch_npu-2.13.0.dist-info"
    real.mkdir()
    (real / "METADATA").write_text("Metadata-Version: 2.1\nName: torch_npu\nVersion: 2.13.0\n")
    return site


def test_broken_torchvision_is_a_failure_with_its_fix(tmp_path, monkeypatch):
    doctor = importlib.import_module("torch_npu.cli.doctor")  # the module, not the command
    site = _fake_site(tmp_path)
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(site), str(REPO)]))
    monkeypatch.setattr(doctor, "STACK", (("torchvision", "torchvision"),))
    [found] = doctor.check_stack_imports("2.13.0+cpu")
    assert found["check"] == "torchvision 0.29.0+cu130" and found["status"] == "fail"
    assert "built for torch 2.14.0" in found["detail"]
    assert "operator torchvision::nms does not exist" in found["detail"]
    assert "pip install 'torchvision==0.28.*'" in found["detail"]


def test_real_torch_npu_beside_the_emulator_is_a_failure(tmp_path, monkeypatch):
    doctor = importlib.import_module("torch_npu.cli.doctor")  # the module, not the command
    monkeypatch.syspath_prepend(str(_fake_site(tmp_path)))
    [found] = doctor.check_torch_npu_distributions()
    assert found["status"] == "fail"
    assert "torch_npu 2.13.0 in" in found["detail"] and "pip uninstall -y torch_npu" in found["detail"]


def test_autoload_variable(monkeypatch):
    doctor = importlib.import_module("torch_npu.cli.doctor")  # the module, not the command
    got = {}
    for value in (None, "1", "0", "yes"):
        if value is None:
            monkeypatch.delenv("TORCH_DEVICE_BACKEND_AUTOLOAD", raising=False)
        else:
            monkeypatch.setenv("TORCH_DEVICE_BACKEND_AUTOLOAD", value)
        [found] = doctor.check_autoload_variable()
        got[value] = found["status"]
    assert got == {None: "ok", "1": "ok", "0": "warn", "yes": "warn"}


def test_emulator_setting_that_does_not_parse_fails_without_crashing_doctor():
    env = make_env(TORCH_NPU_EMU_MEMORY="lots")
    proc = subprocess.run([sys.executable, "torch_npu_cli.py", "doctor", "--format", "json"], cwd=str(REPO),
                          env=env, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 1, proc.stderr[-2000:]
    checks = {c["check"]: c for c in json.loads(proc.stdout)["checks"]}
    assert checks["emulator settings"]["status"] == "fail"
    assert "TORCH_NPU_EMU_MEMORY must be a size such as 512MiB" in checks["emulator settings"]["detail"]
    assert checks["npu devices"]["status"] == "fail"
