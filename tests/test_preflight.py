"""``torch-npu preflight``: a bounded run reports the planted fallback op, the fused op, the
memory peak and (with --transfer) the CUDA references that were rewritten."""
import json
import subprocess
import sys
import textwrap
import time
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
        "seconds": _preflight("--steps", 100000, "--seconds", 30, "--no-time", SAMPLES / "preflight_fallback.py"),
        "transfer": _preflight("--transfer", SAMPLES / "train_amp.py", tmp_path),
    }
    rc, r, err = _report(procs["steps"])
    assert rc == 0 and r["outcome"] == "max-steps" and r["steps"] == 3, err[-2000:]
    # one training step per iteration: the optimizer step and the backward pass of it
    assert r["optimizer_steps"] == 3 and r["backward_calls"] == 3
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
    # --seconds bounds the whole command (the child's start-up and the report included)
    assert r["wall_seconds"] <= 30 * 1.1, r
    if r["partial"] is None:  # else the child was still importing torch on an overloaded machine
        calls = r["fallback_ops"][0]["calls"] if r["fallback_ops"] else 0
        assert calls in (r["steps"], r["steps"] + 1)  # stopped between two steps or inside one
        assert all(f["time_share"] is None for f in r["fallback_ops"])
    else:
        assert "was killed" in r["partial"], r

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


def _timed(*args, timeout=300):
    t0 = time.monotonic()
    proc = _preflight(*args)
    rc, r, err = _report(proc)
    return rc, r, err, time.monotonic() - t0


def _startup_seconds():
    """What starting the command costs before its clock starts (interpreter + import torch_npu), now."""
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-c", "import torch_npu.cli"], cwd=str(REPO), env=make_env(), check=True)
    return time.monotonic() - t0


def test_steps_bound_a_loop_that_updates_weights_by_hand(tmp_path):
    script = tmp_path / "manual.py"
    script.write_text(textwrap.dedent("""
        import torch, torch_npu
        w = torch.zeros(4, device="npu", requires_grad=True)
        i = 0
        while True:  # no optimizer: plain gradient descent by hand
            loss = ((w - 1) ** 2).sum()
            loss.backward()
            with torch.no_grad():
                w -= 0.1 * w.grad
                w.grad = None
            i += 1
            print("iteration", i, "w", round(w[0].item(), 6), flush=True)
    """))
    rc, r, err, _ = _timed("--steps", 3, "--seconds", 60, "--no-time", script)
    assert rc == 0 and r["outcome"] == "max-steps", (r, err[-2000:])
    assert (r["steps"], r["backward_calls"], r["optimizer_steps"]) == (3, 3, 0)
    # three whole iterations ran, the fourth stopped at its backward pass: w = 1 - 0.8 ** 3
    assert "iteration 3 w 0.488" in err and "iteration 4" not in err


def test_seconds_bound_the_whole_command_for_an_endless_script(tmp_path):
    script = tmp_path / "endless.py"
    script.write_text("import torch, torch_npu\nx = torch.ones(4, device='npu')\nwhile True:\n    x = x * 1\n")
    startup = _startup_seconds()
    rc, r, err, wall = _timed("--seconds", 5, script)
    assert rc == 0 and r["outcome"] == "max-seconds", (r, err[-2000:])
    assert r["wall_seconds"] <= 5.5, r
    assert wall < 2 * 5 + 2 * startup, (wall, startup)


def test_a_script_stuck_in_a_c_call_is_killed_at_the_deadline_and_reported(tmp_path):
    script = tmp_path / "stuck.py"
    script.write_text(textwrap.dedent("""
        import ctypes, torch, torch_npu
        w = torch.zeros(4, device="npu", requires_grad=True)
        for _ in range(2):
            (w * 2).sum().backward()
        ctypes.CDLL(None).sleep(1000)  # holds on in C: SIGALRM's Python handler never runs
    """))
    startup = _startup_seconds()
    rc, r, err, wall = _timed("--seconds", 5, script)
    assert rc == 0 and r["outcome"] == "max-seconds", (r, err[-2000:])
    assert "was killed" in r["partial"] and r["wall_seconds"] <= 5.5, r
    assert r["steps"] <= 2  # fewer when the child was still starting under load
    assert wall < 2 * 5 + 2 * startup, (wall, startup)


_STREAM_BUG = """\
import torch, torch_npu
w = torch.zeros(64, device="npu", requires_grad=True)
side = torch.npu.Stream()
opt = torch.optim.SGD([w], lr=0.1)
for step in range(100):
    x = torch.ones(64, device="npu")
    side.wait_stream(torch.npu.current_stream())
    with torch.npu.stream(side):
        x.mul_(2)
    {fix}
    loss = (w * x).sum()
    loss.backward()
    opt.step()
    opt.zero_grad()
"""


def test_stream_check_lists_the_sanitizer_findings(tmp_path):
    buggy, fixed = tmp_path / "stream_bug.py", tmp_path / "stream_fixed.py"
    buggy.write_text(_STREAM_BUG.format(fix="pass"))
    fixed.write_text(_STREAM_BUG.format(fix="torch.npu.current_stream().wait_stream(side); x.record_stream(side)"))
    procs = {"buggy": _preflight("--stream-check", "--steps", 3, "--no-time", buggy),
             "fixed": _preflight("--stream-check", "--steps", 3, "--no-time", fixed),
             "off": _preflight("--steps", 3, "--no-time", buggy),
             "text": subprocess.Popen([sys.executable, "-m", "torch_npu", "preflight", "--stream-check", "--steps",
                                       "2", "--no-time", str(buggy)], cwd=str(REPO), env=make_env(),
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)}
    rc, r, err = _report(procs["buggy"])
    # the script goes on after each finding: all three steps ran
    assert rc == 0 and r["outcome"] == "max-steps" and r["steps"] == 3 and r["stream_check"], err[-3000:]
    found = {(f["kind"], f["site"].rsplit(":", 1)[1], f["other_site"].rsplit(":", 1)[1]): f
             for f in r["stream_findings"]}
    assert all(f["site"].startswith(str(buggy)) for f in r["stream_findings"]), r["stream_findings"]
    # the read of x on the default stream (line 11) races with its write on the side stream (line 9)
    race = found[("unsynchronized access", "11", "9")]
    assert race["count"] == 3 and race["operator"].startswith("aten::mul.Tensor(")
    assert race["other_operator"].startswith("aten::mul_.Tensor(") and race["stream"] == 0
    assert race["other_stream"] != 0 and race["access"] == "reading from" and race["other_access"] == "writing to"
    # x, allocated on the default stream (line 6) and used on the side stream (line 9), is freed at
    # the next iteration without record_stream
    missing = found[("missing record_stream", "9", "6")]
    assert missing["count"] >= 2 and missing["stream"] == race["other_stream"] and missing["other_stream"] == 0
    assert set(k[0] for k in found) <= {"unsynchronized access", "missing record_stream"}

    rc, r, err = _report(procs["fixed"])
    assert rc == 0 and r["steps"] == 3 and r["stream_check"] and r["stream_findings"] == [], (r, err[-2000:])

    rc, r, err = _report(procs["off"])
    assert rc == 0 and r["steps"] == 3 and not r["stream_check"] and r["stream_findings"] == []

    out, err = procs["text"].communicate(timeout=300)
    assert procs["text"].returncode == 0, err[-2000:]
    section = out.split("stream check, NPU sanitizer (", 1)[1]
    assert section.split(" ", 1)[0] != "0" and f"unsynchronized access x2: {buggy}:11 (aten::mul.Tensor" in section
    assert f"against {buggy}:9 (aten::mul_.Tensor, stream " in section
