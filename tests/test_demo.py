"""`make demo` at its tiny size: the CUDA script on 2 NPUs, kill -9 after a checkpoint, exact resume.

One run of `examples/demo.py --size tiny` (three torch_npu_run jobs), then
every check reads the files the run left, not only what it printed.
"""
import json
import os
import struct
import subprocess
import sys
import zlib

import pytest

from _subproc import REPO, make_env

TOTAL, CKPT_STEP = 40, 10  # examples/demo.py RUNS["tiny"]
NPROC = 2


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo") / "out"
    proc = subprocess.run([sys.executable, str(REPO / "examples" / "demo.py"), "--size", "tiny",
                           "--out-dir", str(out)], cwd=REPO, env=make_env(), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out, proc.stdout


def _losses(out, run):
    with open(out / "runs" / run / "losses.json") as f:
        return {int(step): value for step, value in json.load(f).items()}


def test_job_was_killed_after_the_checkpoint(demo):
    out, stdout = demo
    assert "checkpoint written -> SIGKILL to the workers" in stdout
    with open(out / "logs" / "interrupted.log", errors="replace") as f:
        log = f.read()
    # torchrun's own account of the crash: a worker ended by signal 9.
    assert "Signal 9 (SIGKILL)" in log
    # The killed job never got to write its results.
    assert not (out / "runs" / "interrupted" / "losses.json").exists()
    import torch
    ckpt = torch.load(out / "checkpoint.pt", map_location="cpu", weights_only=False)
    assert ckpt["step"] == CKPT_STEP


def test_resumed_losses_equal_uninterrupted_bitwise(demo):
    out, stdout = demo
    full, resumed = _losses(out, "uninterrupted"), _losses(out, "resumed")
    assert sorted(full) == list(range(1, TOTAL + 1))
    assert sorted(resumed) == list(range(CKPT_STEP + 1, TOTAL + 1))
    assert {s: resumed[s] for s in resumed} == {s: full[s] for s in resumed}
    # The comparison is not vacuous: the loss moves from step to step and falls over the run.
    values = [float.fromhex(full[s]) for s in sorted(full)]
    assert len(set(values)) == TOTAL
    assert values[-1] < values[0] - 0.5
    assert f"all {TOTAL - CKPT_STEP} resumed losses equal the uninterrupted ones bit for bit" in stdout


def test_peak_memory_per_card_and_fallback_report(demo):
    out, stdout = demo
    for rank in range(NPROC):
        with open(out / "runs" / "uninterrupted" / f"rank{rank}.json") as f:
            card = json.load(f)
        assert card["device"] == f"npu:{rank}"  # .cuda() on LOCAL_RANK landed on that NPU
        assert 0 < card["max_memory_allocated"] <= card["max_memory_reserved"]
        assert (f"rank {rank} on npu:{rank}: {card['max_memory_allocated'] / 2**20:.2f} MiB allocated"
                in stdout)
        with open(out / "runs" / "uninterrupted" / f"fallback_rank{rank}.json") as f:
            report = json.load(f)
        assert isinstance(report, list)
        for row in report:
            assert row["op"] in stdout
    assert "Ops that fell back to the CPU" in stdout


def _png_header(path):
    """(width, height, colour type) of a PNG whose chunks all pass their CRC, ending in IEND."""
    with open(path, "rb") as f:
        data = f.read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, header, kinds = 8, None, []
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        assert struct.unpack(">I", data[pos + 8 + length:pos + 12 + length])[0] == zlib.crc32(kind + body)
        if kind == b"IHDR":
            header = struct.unpack(">IIBB", body[:10])
        kinds.append(kind)
        pos += 12 + length
    assert kinds[0] == b"IHDR" and kinds[-1] == b"IEND" and b"IDAT" in kinds
    width, height, _, colour_type = header
    return width, height, colour_type


def _has_matplotlib():
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def test_loss_curve_png(demo):
    out, stdout = demo
    png = out / "loss_curve.png"
    if not _has_matplotlib():  # a venv without it: the demo says so and draws nothing
        assert "matplotlib is not installed" in stdout and not png.exists()
        return
    assert f"loss curve          {png}" in stdout
    width, height, colour_type = _png_header(png)
    assert (width, height) == (800, 500) and colour_type in (2, 6)  # RGB(A), matplotlib's figsize x dpi
    assert 10_000 < png.stat().st_size < 1_000_000
    from PIL import Image  # matplotlib depends on Pillow
    colours = {rgb for _, rgb in Image.open(png).convert("RGB").getcolors(maxcolors=width * height)}
    # The uninterrupted line, the resumed markers and the checkpoint marker (matplotlib's tab colours).
    assert {(31, 119, 180), (255, 127, 14), (214, 39, 40)} <= colours


def test_demo_without_matplotlib_skips_only_the_picture(tmp_path):
    out = tmp_path / "out"
    blocked = ("import runpy, sys; sys.modules['matplotlib'] = None; "
               f"sys.argv = ['demo.py', '--size', 'tiny', '--out-dir', {str(out)!r}]; "
               f"runpy.run_path({str(REPO / 'examples' / 'demo.py')!r}, run_name='__main__')")
    proc = subprocess.run([sys.executable, "-c", blocked], cwd=REPO, env=make_env(), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "loss curve          matplotlib is not installed (pip install matplotlib): the loss-curve picture is " \
           "skipped" in proc.stdout
    assert not (out / "loss_curve.png").exists()
    assert f"all {TOTAL - CKPT_STEP} resumed losses equal the uninterrupted ones bit for bit" in proc.stdout
    assert proc.stdout.rstrip().endswith("stray processes: none")


def test_profiler_directory(demo):
    out, stdout = demo
    profile = out / "profile"
    runs = sorted(p for p in profile.iterdir() if p.name.endswith("_ascend_pt"))
    assert len(runs) == NPROC  # one per rank
    devices = set()
    for run in runs:
        output = run / "ASCEND_PROFILER_OUTPUT"
        for name in ("summary.txt", "kernel_details.csv", "op_statistic.csv", "step_trace_time.csv"):
            assert (output / name).is_file(), name
        with open(output / "trace_view.json") as f:
            events = json.load(f)
        kernels = [e for e in events if e.get("ph") == "X" and "Task Type" in e.get("args", {})]
        # Matmuls ran as device kernels and DDP's gradient all-reduce as an HCCL task, on this rank's card.
        assert any(e["name"] == "aten::mm" and e["args"]["Task Type"] == "AI_CORE" for e in kernels)
        assert any(e["args"]["Task Type"] == "HCCL" and e["args"].get("Data Size(B)", 0) > 0 for e in kernels)
        rank_devices = {e["args"]["Device Id"] for e in kernels}
        assert len(rank_devices) == 1
        devices |= rank_devices
        assert str(output / "summary.txt") in stdout
    assert devices == set(range(NPROC))


def test_no_stray_processes(demo):
    out, stdout = demo
    assert stdout.rstrip().endswith("stray processes: none")
    mine = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if str(out).encode() in f.read():
                        mine.append(int(entry))
            except OSError:
                pass
    assert mine == []
