"""``torch-npu preflight``: a bounded run reports the planted fallback op, the fused op, the
memory peak and (with --transfer) the CUDA references that were rewritten."""
import json
import subprocess
import sys
from pathlib import Path

from _subproc import REPO, make_env

SAMPLES = Path(__file__).parent / "migration_samples"


def _preflight(*args):
    return subprocess.Popen([sys.executable, "-m", "torch_npu", "preflight", "--format", "json", *map(str, args)],
                            cwd=str(REPO), env=make_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def _report(proc):
    out, err = proc.communicate(timeout=300)
    assert out.strip().startswith("{"), err[-3000:]
    return proc.returncode, json.loads(out), err


def test_reports_fallback_fused_op_memory_and_bounds(tmp_path):
    procs = {
        "steps": _preflight("--steps", 3, SAMPLES / "preflight_fallback.py"),
        "seconds": _preflight("--steps", 100000, "--seconds", 6, "--no-time", SAMPLES / "preflight_fallback.py"),
        "transfer": _preflight("--transfer", SAMPLES / "train_amp.py", tmp_path),
    }
    rc, r, err = _report(procs["steps"])
    assert rc == 0 and r["outcome"] == "max-steps" and r["steps"] == 3, err[-2000:]
    # fmax.out with npu args h, zeros (64x256 float32) and out=buf: three 64 KiB copies to the
    # host and the result back, per call.
    tile = 64 * 256 * 4
    assert r["fallback_ops"] == [{"op": "aten::fmax.out", "calls": 3, "bytes_to_cpu": 3 * 3 * tile,
                                  "bytes_to_npu": 3 * tile, "ns": r["fallback_ops"][0]["ns"],
                                  "time_ms": r["fallback_ops"][0]["time_ms"],
                                  "time_share": r["fallback_ops"][0]["time_share"]}]
    assert 0 < r["fallback_ops"][0]["time_share"] < 1 and r["fallback_ops"][0]["time_ms"] > 0
    # the emulator's own clock of the fallbacks (copies included)
    assert r["fallback_ops"][0]["ns"] > 0
    assert r["fused_ops"] == [{"op": "torch_npu.npu_rms_norm", "calls": 3}]
    assert r["collectives"] == []
    mem = {m["device"]: m for m in r["memory"]}
    assert set(mem) == {"npu:0", "npu:1"}
    # the 64 MiB tensor, plus at most a few 512-byte blocks made while switching devices
    assert 64 * 2**20 <= mem["npu:1"]["peak_allocated_bytes"] <= 64 * 2**20 + 4096
    # npu:0 holds at least the weights, gamma, buf and one batch (x): all float32.
    assert mem["npu:0"]["peak_allocated_bytes"] >= 4 * (256 * 256 + 256 + 256 + 2 * 64 * 256)
    assert mem["npu:0"]["capacity_bytes"] > 0 and mem["npu:0"]["fits"]
    # the script's own prints went to stderr, leaving stdout to the report
    assert "step 0 loss" in err

    rc, r, err = _report(procs["seconds"])
    assert rc == 0 and r["outcome"] == "max-seconds" and r["steps"] < 100000, err[-2000:]
    assert r["seconds"] >= 6
    calls = r["fallback_ops"][0]["calls"] if r["fallback_ops"] else 0
    assert calls in (r["steps"], r["steps"] + 1)  # stopped between two steps or inside one
    assert all(f["time_share"] is None for f in r["fallback_ops"])

    rc, r, err = _report(procs["transfer"])
    assert rc == 0 and r["outcome"] == "completed", err[-3000:]
    sites = {(c["site"].rsplit(":", 1)[1], c["api"]) for c in r["cuda_references"]
             if c["site"].endswith(tuple(f":{n}" for n in range(1, 100))) and "train_amp.py" in c["site"]}
    # lines of train_amp.py whose CUDA reference is rewritten while it runs
    assert {("30", "torch.nn.Module.cuda"), ("37", "torch.Tensor.cuda"), ("37", "torch.Tensor.to"),
            ("50", "torch.load"), ("53", "torch.ones")} <= sites
    assert any(api.startswith("torch.amp.autocast_mode.autocast") and line == "40" for line, api in sites)


def test_script_error_is_reported_with_exit_code_1(tmp_path):
    script = tmp_path / "broken.py"
    script.write_text("import torch\nx = torch.ones(2, device='npu')\nraise RuntimeError('planted failure')\n")
    rc, r, _ = _report(_preflight(script))
    assert rc == 1 and r["outcome"] == "error" and "planted failure" in r["error"]
    assert r["memory"][0]["device"] == "npu:0" and r["memory"][0]["peak_allocated_bytes"] == 512
