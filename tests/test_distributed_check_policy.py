"""The mismatch check's default covers what is cheap: the first 32 collectives of a
group and payloads of 32 MiB and more; TORCH_NPU_EMU_COLLECTIVE_CHECK=1 (or
TORCH_DISTRIBUTED_DEBUG=DETAIL) covers every collective, =0 none."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from _subproc import make_env

WORKER = Path(__file__).parent / "dist_workers" / "check_policy.py"


def _run(tmp_path, name, **env):
    out = tmp_path / f"{name}.json"
    proc = subprocess.run([sys.executable, "-m", "torch_npu.distributed.run", "--nproc-per-node", "2",
                           "--standalone", str(WORKER), str(out)],
                          env=make_env(**env), capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.mark.parametrize("name,env,small,big", [
    ("default", {"TORCH_NPU_EMU_COLLECTIVE_CHECK": None, "TORCH_DISTRIBUTED_DEBUG": None}, 32, 33),
    ("all", {"TORCH_NPU_EMU_COLLECTIVE_CHECK": "1"}, 40, 41),
    ("detail", {"TORCH_NPU_EMU_COLLECTIVE_CHECK": None, "TORCH_DISTRIBUTED_DEBUG": "DETAIL"}, 40, 41),
    ("off", {"TORCH_NPU_EMU_COLLECTIVE_CHECK": "0"}, 0, 0),
])
def test_check_policy(tmp_path, name, env, small, big):
    r = _run(tmp_path, name, **env)
    assert r == {"after_40_small": small, "after_big": big, "big_ok": True, "small_ok": True}
