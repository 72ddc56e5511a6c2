"""Profiler overhead: what an op and a training step cost with profiling off,
with only the device timeline on, and inside torch_npu.profiler.profile.

    .venv/bin/python bench/profiler_bench.py [--quick]

Per-op rows interleave the variants rep by rep (the timeline is switched in
each variant's untimed setup); step rows alternate blocks of steps outside
and inside a profiling session (session start/stop and parsing not timed).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import os
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import torch_npu  # noqa: E402
import torch_npu.profiler as npu_profiler  # noqa: E402

import _timing as T  # noqa: E402


def _timeline(on: bool):
    def setup():
        torch_npu._C._npu_timeline_enable(on)
        if not on:
            torch_npu._C._npu_timeline_drain()
    return setup


def per_op(reps: int, max_seconds: float) -> list:
    rows = []
    for label, n in (("a + b, 16 elements", 16), ("a + b, 64K elements", 1 << 16)):
        a_cpu, b_cpu = torch.randn(n), torch.randn(n)
        a, b = a_cpu.npu(), b_cpu.npu()
        variants = [T.Variant("cpu", lambda: a_cpu + b_cpu),
                    T.Variant("npu_off", lambda: a + b, setup=_timeline(False)),
                    T.Variant("npu_timeline", lambda: a + b, setup=_timeline(True))]
        inner = T.calibrate_inner(variants, 0.002, max_inner=500)
        s = T.time_interleaved(variants, reps=reps, inner=inner, max_seconds=max_seconds)
        _timeline(False)()
        rows.append({"op": label, "cpu_us": s.median_us("cpu"), "off_us": s.median_us("npu_off"),
                     "timeline_us": s.median_us("npu_timeline"),
                     "off_minus_cpu_us": s.paired_diff_us("cpu", "npu_off"),
                     "timeline_added_us": s.paired_diff_us("npu_off", "npu_timeline"), "reps": s.reps})
    return rows


def _mlp_step():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)).npu()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(64, 256).npu(), torch.randint(0, 10, (64,)).npu()

    def step():
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return step


def per_step(blocks: int, steps_per_block: int) -> dict:
    step = _mlp_step()
    for _ in range(3):
        step()
    times = {"off": [], "profiled": []}
    for i in range(blocks):
        for mode in (("off", "profiled") if i % 2 == 0 else ("profiled", "off")):
            prof = npu_profiler.profile(record_shapes=True) if mode == "profiled" else None
            if prof:
                prof.start()
            for _ in range(steps_per_block):
                t0 = time.perf_counter_ns()
                step()
                times[mode].append(time.perf_counter_ns() - t0)
            if prof:
                prof.stop()     # no on_trace_ready: nothing is written or parsed
    off = statistics.median(times["off"]) / 1e6
    on = statistics.median(times["profiled"]) / 1e6
    return {"off_ms": off, "profiled_ms": on, "ratio": on / off, "steps": len(times["off"])}


def run(quick: bool = False) -> dict:
    reps, cap = (100, 2.0) if quick else (400, 6.0)
    ops = per_op(reps, cap)
    step = per_step(blocks=4 if quick else 10, steps_per_block=5)
    print("\n## Profiler overhead\n")
    print("Per op (µs per call, medians, variants interleaved): `off` = torch_npu.profiler not running; "
          "`timeline` = the emulated device timeline recording every kernel.\n")
    print("| op | CPU µs | npu, profiling off µs | off − CPU (paired) µs | npu, timeline on µs | "
          "added by timeline (paired) µs | reps |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in ops:
        print(f"| {r['op']} | {r['cpu_us']:.3f} | {r['off_us']:.3f} | {r['off_minus_cpu_us']:.3f} | "
              f"{r['timeline_us']:.3f} | **{r['timeline_added_us']:.3f}** | {r['reps']} |")
    print(f"\nMLP training step (ms, median of {step['steps']} steps each, blocks alternating): "
          f"profiling off {step['off_ms']:.3f}, inside torch_npu.profiler.profile(record_shapes=True) "
          f"{step['profiled_ms']:.3f} → **{step['ratio']:.2f}x**\n")
    sys.stdout.flush()
    return {"ops": ops, "step": step}


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true")
    args = p.parse_args()
    torch.set_num_threads(2)
    run(args.quick)
