"""python -m torch_npu.utils.collect_env: torch's report plus torch_npu, CANN and
the emulated devices, stated as emulated (spec: SURFACE.md §8)."""
import subprocess
import sys

import torch

import torch_npu


def test_collect_env_report():
    proc = subprocess.run([sys.executable, "-m", "torch_npu.utils.collect_env"], capture_output=True, text=True,
                          timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout
    assert f"PyTorch version: {torch.__version__}" in out          # torch's own report
    assert f"Torch-npu version: {torch_npu.__version__}" in out
    assert f"CANN: {torch_npu.emulator.cann_version()} (emulated)" in out
    cfg = torch_npu.emulator.config()
    assert f"NPU devices (emulated): {cfg['device_count']} x {cfg['device_name']}" in out
    assert "The NPU is emulated on the CPU" in out


def test_env_info_fields():
    from torch_npu.utils import collect_env
    assert collect_env.SystemEnv._fields[-1] == "cann_version" and "torch_npu_version" in collect_env.SystemEnv._fields
    assert collect_env.get_torch_npu_version() == torch_npu.__version__
    assert collect_env.get_cann_version() == torch.version.cann
