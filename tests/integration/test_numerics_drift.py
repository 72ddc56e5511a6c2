"""The drift example at its default length (the demo's tiny LLaMA, 40 steps,
exact and chip numerics): one PNG with both loss curves and their difference."""
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_numerics_drift_example_full_run(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO), MPLBACKEND="Agg")
    proc = subprocess.run([sys.executable, str(REPO / "examples" / "numerics_drift.py"), "--out-dir", str(tmp_path)],
                          env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "numerics_drift.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    data = json.loads((tmp_path / "numerics_drift.json").read_text())
    exact, chip = data["exact"], data["chip"]
    assert len(exact) == len(chip) == 40
    # both runs learn, and HF32 moves the curve by rounding noise, not by a different trajectory
    assert exact[-1] < exact[0] - 0.5 and chip[-1] < chip[0] - 0.5
    diffs = [abs(c - e) for c, e in zip(chip, exact)]
    assert 0 < max(diffs) < 1e-2
    mm = {e["op"]: e for e in data["numerics_report"]}["mm"]
    assert mm["rounding"] == "hf32" and 0 < mm["changed"] <= mm["elements"]
    assert "ops that ran with reduced precision" in proc.stdout
