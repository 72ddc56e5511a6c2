#!/usr/bin/env python
"""Profile where npu time goes vs native CPU for one training-step workload.

    .venv/bin/python bench/profile_step.py gpt            # default: gpt
    .venv/bin/python bench/profile_step.py mlp --steps 20 --foreach off

Runs the CPU and npu variants (identical weights) under torch.profiler (CPU
activity, record_shapes off), interleaved step by step, then prints per-op
count and self-CPU time for both devices side by side, sorted by the npu-cpu
self-time difference, plus ops that only appear on one side.  Use it to spot
ops that take a different path on npu (extra aten::copy_/_to_copy, a
different SDPA kernel, composite vs fused kernels, foreach vs for-loop
optimizers, ...).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from collections import defaultdict

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import json  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

import _timing as T  # noqa: E402
import workloads as W  # noqa: E402


def collect(ts, devices, steps):
    """Profile `steps` steps per device (devices alternate step by step).
    Returns per device: counts/self totals, per-step self time per op, and
    per-step total self time."""
    agg = {d: defaultdict(lambda: [0, 0.0, 0.0]) for d in devices}  # count, self_us, total_us
    per_step = {d: defaultdict(list) for d in devices}  # op -> [self_us per step]
    step_wall = {d: [] for d in devices}
    for _ in range(steps):
        for dev in devices:
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                ts.steps[dev]()
                if dev == "npu":
                    torch.npu.synchronize()
            ka = prof.key_averages()
            for e in ka:
                a = agg[dev][e.key]
                a[0] += e.count
                a[1] += e.self_cpu_time_total
                a[2] += e.cpu_time_total
                per_step[dev][e.key].append(e.self_cpu_time_total)
            step_wall[dev].append(sum(e.self_cpu_time_total for e in ka))
    return {d: {"agg": dict(agg[d]), "per_step": dict(per_step[d]), "step_wall": step_wall[d]}
            for d in devices}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("workload", nargs="?", default="gpt", choices=sorted(W.TRAIN_STEPS))
    p.add_argument("--steps", type=int, default=5, help="profiled steps per device")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--foreach", choices=["default", "on", "off"], default="default")
    p.add_argument("--malloc", choices=["tuned", "stock"], default="tuned")
    p.add_argument("--autograd-mt", choices=["default", "on", "off"], default="default")
    p.add_argument("--isolated", action="store_true",
                   help="profile cpu and npu in separate fresh processes (cpu without torch_npu), "
                        "like run.py section 3")
    p.add_argument("--collect-only", choices=["cpu", "npu"], help=argparse.SUPPRESS)
    p.add_argument("--dump", help=argparse.SUPPRESS)
    p.add_argument("--top", type=int, default=40)
    p.add_argument("--min-us", type=float, default=0.0,
                   help="hide rows whose self time is below this on both sides (µs/step)")
    args = p.parse_args(argv)
    malloc_desc = T.tune_malloc(args.malloc)
    torch.set_num_threads(args.threads)
    W.BUILD_OPTS["autograd_mt"] = {"default": None, "on": True, "off": False}[args.autograd_mt]
    foreach = {"default": None, "on": True, "off": False}[args.foreach]

    if args.collect_only:  # child process of --isolated
        dev = args.collect_only
        if dev == "npu":
            import torch_npu  # noqa: F401
        ts = W.TRAIN_STEPS[args.workload](foreach=foreach, devices=(dev,))
        for _ in range(3):
            ts.steps[dev]()
        data = collect(ts, (dev,), args.steps)
        data[dev]["optimizer_path"] = W.optimizer_path(ts)[dev]
        data[dev]["torch_npu_loaded"] = "torch_npu" in sys.modules
        with open(args.dump, "w") as f:
            json.dump(data, f)
        return 0

    print(f"# allocator: {malloc_desc}; threads {torch.get_num_threads()}; autograd multithreading {args.autograd_mt}")
    if args.isolated:
        data = {}
        with tempfile.TemporaryDirectory() as td:
            for dev in ("cpu", "npu"):
                path = os.path.join(td, dev + ".json")
                env = dict(os.environ)
                if dev == "cpu":
                    env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
                cmd = [sys.executable, os.path.abspath(__file__), args.workload, "--steps", str(args.steps),
                       "--threads", str(args.threads), "--foreach", args.foreach, "--malloc", args.malloc,
                       "--autograd-mt", args.autograd_mt, "--collect-only", dev, "--dump", path]
                r = subprocess.run(cmd, env=env, capture_output=True, text=True)
                if not os.path.exists(path):
                    print(r.stdout[-2000:], r.stderr[-4000:])
                    return 1
                with open(path) as f:
                    data.update(json.load(f))
        print(f"# isolated processes; optimizer impl: cpu={data['cpu']['optimizer_path']}, "
              f"npu={data['npu']['optimizer_path']}; torch_npu loaded in cpu process: "
              f"{data['cpu']['torch_npu_loaded']}")
    else:
        import torch_npu  # noqa: F401
        ts = W.TRAIN_STEPS[args.workload](foreach=foreach)
        print(f"# profile: {ts.name}; optimizer impl: {W.optimizer_path(ts)}")
        print(f"# equivalence: {W.check_equivalence(ts, 2)}")
        for _ in range(2):  # extra warm-up
            ts.steps["cpu"]()
            ts.steps["npu"]()
            torch.npu.synchronize()
        data = collect(ts, ("cpu", "npu"), args.steps)

    agg = {d: data[d]["agg"] for d in ("cpu", "npu")}
    per_step = {d: data[d]["per_step"] for d in ("cpu", "npu")}
    step_wall = {d: data[d]["step_wall"] for d in ("cpu", "npu")}
    wall = {d: sum(step_wall[d]) for d in ("cpu", "npu")}

    n = args.steps
    keys = set(agg["cpu"]) | set(agg["npu"])

    def med(dev, k):
        xs = per_step[dev].get(k)
        return statistics.median(xs) if xs else 0.0

    rows = []
    for k in keys:
        c = agg["cpu"].get(k, [0, 0.0, 0.0])
        d = agg["npu"].get(k, [0, 0.0, 0.0])
        cm, dm = med("cpu", k), med("npu", k)
        rows.append((k, c[0] / n, d[0] / n, cm, dm, dm - cm))
    rows.sort(key=lambda r: -abs(r[5]))

    mc, mn = statistics.median(step_wall["cpu"]), statistics.median(step_wall["npu"])
    print(f"\nself CPU time per step (median of {n}): cpu {mc / 1e3:.2f} ms, npu {mn / 1e3:.2f} ms "
          f"(ratio {mn / max(mc, 1):.3f}); mean ratio {wall['npu'] / max(wall['cpu'], 1):.3f}\n")
    print("| op | calls/step cpu | calls/step npu | self µs/step cpu (median) | self µs/step npu (median) | Δ µs (npu−cpu) |")
    print("|---|---:|---:|---:|---:|---:|")
    shown = 0
    for k, cc, nc, cs, ns, dd in rows:
        if max(cs, ns) < args.min_us:
            continue
        print(f"| `{k}` | {cc:g} | {nc:g} | {cs:.1f} | {ns:.1f} | {dd:+.1f} |")
        shown += 1
        if shown >= args.top:
            break

    diff_counts = [(k, cc, nc) for k, cc, nc, *_ in rows if cc != nc]
    print("\n## ops whose call count differs between cpu and npu\n")
    if not diff_counts:
        print("(none — identical op sequence)")
    else:
        print("| op | calls/step cpu | calls/step npu |")
        print("|---|---:|---:|")
        for k, cc, nc in sorted(diff_counts):
            print(f"| `{k}` | {cc:g} | {nc:g} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
