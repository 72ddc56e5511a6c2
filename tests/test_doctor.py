"""``torch-npu doctor``: versions, emulated devices and settings, client-library detection."""
import json
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
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    r = json.loads(proc.stdout)
    assert [d["total_memory_bytes"] for d in r["devices"]] == [512 * 2**20] * 2
    assert r["settings"]["TORCH_NPU_EMU_DEVICE_COUNT"] == "2"
    ds = next(c for c in r["clients"] if c["library"] == "deepspeed")
    assert ds["detects"] == "cpu" and ds["how"] == "DS_ACCELERATOR"
