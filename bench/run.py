#!/usr/bin/env python
"""torch_npu (emulated) overhead benchmark.

    .venv/bin/python bench/run.py            # full run (~5 min on 2 cores)
    .venv/bin/python bench/run.py --quick    # ~1 min
    .venv/bin/python bench/run.py --json out.json --threads 2

CPU and NPU variants of every workload run in the same process, interleaved,
from identical weights/inputs; numbers are medians over many reps.  See
bench/README.md for what each column means.  Always exits 0 on a target miss
(this is a report, not a test); exits non-zero only if the harness itself
crashes.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import torch  # noqa: E402
import torch_npu  # noqa: E402,F401

import _timing as T  # noqa: E402
import workloads as W  # noqa: E402

SMALL_OP_TARGET_US = 1.5

# micro_*: reps / target seconds per rep (sets N calls per rep) / wall cap per op
# step_*:  reps / target seconds per rep (sets N steps per rep) / wall cap per
#          workload / warm-up reps.  Caps bound total time on a slow machine.
# iso_*:   process-isolated check: rounds of (cpu process, npu process) per
#          workload / timed seconds per process (plus ~3 s start-up each).
PROFILES = {
    "full":  dict(micro_reps=1000, micro_rep_s=0.005, micro_cap_s=8.0,
                  step_reps=100, step_rep_s=0.1, step_cap_s=60.0, step_warmup=3,
                  iso_rounds=2, iso_proc_s=5.0),
    "quick": dict(micro_reps=200, micro_rep_s=0.005, micro_cap_s=2.0,
                  step_reps=20, step_rep_s=0.05, step_cap_s=8.0, step_warmup=1,
                  iso_rounds=1, iso_proc_s=2.0),
}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="short run (~1 min)")
    p.add_argument("--threads", type=int, default=2, help="torch.set_num_threads value (default 2)")
    p.add_argument("--json", metavar="PATH", help="also write results as JSON to PATH")
    p.add_argument("--only", default="micro,mlp,gpt,gpt_amp,conv,profiler,dist",
                   help="comma list of sections: micro,mlp,gpt,gpt_amp,conv,profiler,dist (default all)")
    p.add_argument("--foreach", choices=["default", "on", "off"], default="default",
                   help="optimizer foreach= for BOTH devices; 'default' lets torch pick per "
                        "device (NB: torch picks foreach=True for npu, False for cpu)")
    p.add_argument("--step-reps", type=int, help="override reps for training steps")
    p.add_argument("--micro-reps", type=int, help="override reps for micro ops")
    p.add_argument("--clock", choices=sorted(T.CLOCKS), default="wall",
                   help="wall = time.perf_counter_ns (default); process = time.process_time_ns "
                        "(CPU time of all threads; less sensitive to other load, counts OMP spinning)")
    p.add_argument("--malloc", choices=["tuned", "stock"], default="tuned",
                   help="tuned (default): glibc mallopt so native-CPU tensors don't re-fault freed "
                        "memory every step (stable CPU baseline); stock: glibc defaults")
    p.add_argument("--autograd-mt", choices=["default", "on", "off"], default="default",
                   help="default: torch_npu's setting (npu backward in the calling thread); on: force the "
                        "autograd engine's per-device worker thread (stock PyTorch behaviour for devices); "
                        "off: force the calling thread")
    p.add_argument("--no-isolated", action="store_true",
                   help="skip the process-isolated step comparison (section 3)")
    p.add_argument("--no-extra", action="store_true",
                   help="skip the informational extra micro rows (.item(), tiny backward)")
    p.add_argument("--raw", action="store_true", help="store raw per-rep samples in the JSON")
    p.add_argument("--numerics", choices=["exact", "chip"], default="exact",
                   help="npu numerics mode (torch_npu.emulator.set_numerics; docs/numerics.md): chip rounds fp32 "
                        "conv/matmul inputs as a 910B does (sections 1-2; section 3 gets TORCH_NPU_EMU_NUMERICS)")
    p.add_argument("--matmul-hf32", choices=["default", "on"], default="default",
                   help="on: torch.npu.matmul.allow_hf32 = True (the chip default is off), so chip mode also "
                        "rounds the matmuls (sections 1-2 only)")
    return p.parse_args(argv)


def fmt(x, nd=2):
    if x is None:
        return "-"
    if isinstance(x, float) and (x != x):
        return "nan"
    return f"{x:.{nd}f}"


def load_note():
    try:
        la = os.getloadavg()
        return f"- load average at start: {la[0]:.2f} {la[1]:.2f} {la[2]:.2f} (other processes add noise)"
    except OSError:
        return ""


def header(args, prof_name):
    lines = [
        "# torch_npu (emulated) overhead benchmark",
        "",
        f"- date: {datetime.datetime.now().astimezone().isoformat(timespec='seconds')}",
        f"- torch: {torch.__version__}  |  torch_npu: {getattr(torch_npu, '__version__', '?')}",
        f"- threads: torch.get_num_threads()={torch.get_num_threads()} (requested {args.threads}),"
        f" interop={torch.get_num_interop_threads()}, os.cpu_count()={os.cpu_count()}",
        f"- python: {platform.python_version()}  |  host: {platform.machine()} {platform.system()}"
        f"  |  profile: {prof_name}  |  optimizer foreach: {args.foreach}  |  clock: {args.clock}"
        f"  |  autograd multithreading: {args.autograd_mt}",
        f"- npu numerics: {args.numerics} (matmul.allow_hf32={torch.npu.matmul.allow_hf32}, "
        f"conv.allow_hf32={torch.npu.conv.allow_hf32})",
        f"- npu device: {torch.npu.get_device_name(0) if torch.npu.is_available() else 'n/a'}",
        load_note(),
    ]
    return "\n".join(lines)


def run_micro(prof, args, results):
    print("\n## 1. Per-op added cost (µs per call)\n", flush=True)
    print("Each rep = N back-to-back calls (N calibrated, ≤2000), then `torch.npu.synchronize()` on the npu side; "
          "per-call time = rep time / N. CPU and npu reps interleaved.\n")
    rows = []
    reps = args.micro_reps or prof["micro_reps"]
    ops = W.micro_ops()
    if not args.no_extra:
        try:
            ops += W.extra_micro_ops()
        except Exception as e:
            results["micro"].append({"name": "extra micro ops (build)", "error": f"{type(e).__name__}: {e}",
                                     "traceback": traceback.format_exc()})
            print(f"extra micro ops failed to build: `{type(e).__name__}: {e}`")
    for op in ops:
        rec = {"name": op.name, "small": op.small}
        try:
            variants = [
                T.Variant("cpu", op.fns["cpu"], setup=op.setups.get("cpu")),
                T.Variant("npu", op.fns["npu"], sync=W.npu_sync, setup=op.setups.get("npu")),
            ]
            inner = T.calibrate_inner(variants, prof["micro_rep_s"], max_inner=2000)
            s = T.time_interleaved(variants, reps=reps, inner=inner, warmup=3,
                                   max_seconds=prof["micro_cap_s"], min_reps=20)
            cpu_us, npu_us = s.median_us("cpu"), s.median_us("npu")
            rec.update(cpu_us=cpu_us, npu_us=npu_us, added_us=npu_us - cpu_us,
                       paired_added_us=s.paired_diff_us("cpu", "npu"),
                       cpu_min_us=s.min_us("cpu"), npu_min_us=s.min_us("npu"),
                       cpu_iqr_rel=s.iqr_rel("cpu"), npu_iqr_rel=s.iqr_rel("npu"),
                       ratio=npu_us / cpu_us, inner=s.inner, reps=s.reps,
                       cpu_faults_per_call=s.faults_per_call("cpu"),
                       npu_faults_per_call=s.faults_per_call("npu"))
            if op.small:
                rec["target_us"] = SMALL_OP_TARGET_US
                rec["status"] = "PASS" if rec["added_us"] <= SMALL_OP_TARGET_US else "FAIL"
            if args.raw:
                rec["samples_ns"] = s.per_call_ns
        except Exception as e:  # report, don't die
            rec["error"] = f"{type(e).__name__}: {e}"
            rec["traceback"] = traceback.format_exc()
        rows.append(rec)
        results["micro"].append(rec)

    print("| op | CPU µs | npu µs | added µs (median npu − median cpu) | paired Δ µs | min-based Δ µs | npu/cpu | "
          "target | status | N×reps | page faults/call cpu / npu |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|:---:|---:|---:|")
    for r in rows:
        if "error" in r:
            print(f"| {r['name']} | - | - | ERROR: `{r['error']}` | | | | | ERROR | | | |")
            continue
        tgt = f"≤ {SMALL_OP_TARGET_US}" if r["small"] else "-"
        print(f"| {r['name']} | {fmt(r['cpu_us'], 3)} | {fmt(r['npu_us'], 3)} | "
              f"**{fmt(r['added_us'], 3)}** | {fmt(r['paired_added_us'], 3)} | "
              f"{fmt(r['npu_min_us'] - r['cpu_min_us'], 3)} | {fmt(r['ratio'], 3)} | "
              f"{tgt} | {r.get('status', '-')} | {r['inner']}×{r['reps']} | "
              f"{fmt(r['cpu_faults_per_call'], 1)} / {fmt(r['npu_faults_per_call'], 1)} |")
    sys.stdout.flush()


def run_steps(prof, args, results, sections):
    print("\n## 2. Training-step ratio (npu / native CPU)\n", flush=True)
    print("Each rep = N full train steps (zero_grad, forward, loss, backward, optimizer.step) + sync. "
          "Models built once on CPU, deep-copied to npu. Ratio = median(npu) / median(cpu).\n")
    foreach = {"default": None, "on": True, "off": False}[args.foreach]
    reps = args.step_reps or prof["step_reps"]
    rows = []
    for key in ("mlp", "gpt", "gpt_amp", "conv"):
        if key not in sections:
            continue
        rec = {"key": key}
        t0 = time.perf_counter()
        try:
            ts = W.TRAIN_STEPS[key](foreach=foreach)
            rec["name"] = ts.name
            rec["description"] = ts.description
            rec["target_ratio"] = ts.target_ratio
            rec["equivalence"] = W.check_equivalence(ts, n_steps=2)   # also warm-up
            rec["optimizer_path"] = W.optimizer_path(ts)
            variants = [T.Variant("cpu", ts.steps["cpu"]),
                        T.Variant("npu", ts.steps["npu"], sync=W.npu_sync)]
            inner = T.calibrate_inner(variants, prof["step_rep_s"], max_inner=50)
            s = T.time_interleaved(variants, reps=reps, inner=inner,
                                   warmup=prof["step_warmup"],
                                   max_seconds=prof["step_cap_s"], min_reps=5)
            cpu_ms, npu_ms = s.median_us("cpu") / 1e3, s.median_us("npu") / 1e3
            rec.update(cpu_ms=cpu_ms, npu_ms=npu_ms, ratio=npu_ms / cpu_ms,
                       paired_ratio=s.paired_ratio("cpu", "npu"),
                       cpu_min_ms=s.min_us("cpu") / 1e3, npu_min_ms=s.min_us("npu") / 1e3,
                       min_ratio=s.min_us("npu") / s.min_us("cpu"),
                       cpu_iqr_rel=s.iqr_rel("cpu"), npu_iqr_rel=s.iqr_rel("npu"),
                       inner=s.inner, reps=s.reps,
                       cpu_faults_per_step=s.faults_per_call("cpu"),
                       npu_faults_per_step=s.faults_per_call("npu"))
            if ts.target_ratio is not None:
                rec["status"] = "PASS" if rec["ratio"] <= ts.target_ratio else "FAIL"
            if args.raw:
                rec["samples_ns"] = s.per_call_ns
        except Exception as e:
            rec.setdefault("name", key)
            rec["error"] = f"{type(e).__name__}: {e}"
            rec["traceback"] = traceback.format_exc()
        rec["wall_s"] = time.perf_counter() - t0
        rows.append(rec)
        results["steps"].append(rec)
        print(f"<!-- {key} done in {rec['wall_s']:.1f}s -->", flush=True)

    print()
    print("| workload | CPU ms/step | npu ms/step | **ratio** | paired ratio | min ratio | "
          "IQR cpu / npu | target | status | N×reps | max |Δloss| | page faults/step cpu / npu |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|:---:|---:|---:|---:|")
    for r in rows:
        if "error" in r:
            print(f"| {r['name']} | - | - | ERROR: `{r['error']}` | | | | | ERROR | | | |")
            continue
        tgt = f"≤ {r['target_ratio']}" if r["target_ratio"] is not None else "-"
        eq = r["equivalence"]["max_loss_abs_diff"]
        print(f"| {r['name']} | {fmt(r['cpu_ms'])} | {fmt(r['npu_ms'])} | **{fmt(r['ratio'], 3)}** | "
              f"{fmt(r['paired_ratio'], 3)} | {fmt(r['min_ratio'], 3)} | "
              f"{fmt(100 * r['cpu_iqr_rel'], 1)}% / {fmt(100 * r['npu_iqr_rel'], 1)}% | {tgt} | "
              f"{r.get('status', '-')} | {r['inner']}×{r['reps']} | {eq:.2g} | "
              f"{fmt(r['cpu_faults_per_step'], 0)} / {fmt(r['npu_faults_per_step'], 0)} |")
    print()
    for r in rows:
        if "error" not in r:
            op = r["optimizer_path"]
            print(f"- {r['key']}: {r['description']}; optimizer impl cpu=`{op['cpu']}`, npu=`{op['npu']}`; "
                  f"max |Δparam| after 2 steps = {r['equivalence']['max_param_abs_diff']:.2g}")
    for r in rows:
        if "error" in r:
            print(f"\n<details><summary>{r['name']} traceback</summary>\n\n```\n{r['traceback']}```\n</details>")
    sys.stdout.flush()


def _iso_worker(args, dev, key, inner, proc_s):
    cmd = [sys.executable, os.path.join(HERE, "_isolated.py"), "--device", dev, "--workload", key,
           "--threads", str(args.threads), "--malloc", args.malloc, "--foreach", args.foreach,
           "--autograd-mt", args.autograd_mt, "--inner", str(inner), "--max-seconds", str(proc_s),
           "--min-reps", "5",
           "--clock", args.clock]
    env = dict(os.environ)
    if dev == "cpu":
        env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"   # never load torch_npu: truly native CPU
    else:
        env["TORCH_NPU_EMU_NUMERICS"] = args.numerics
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=proc_s * 4 + 120)
    for line in p.stdout.splitlines():
        if line.startswith("@@RESULT@@"):
            r = json.loads(line[len("@@RESULT@@"):])
            r["returncode"] = p.returncode   # npu workers may abort at exit (see README)
            return r
    raise RuntimeError(f"{dev} worker for {key} failed (rc={p.returncode}): {p.stderr[-2000:]}")


def run_isolated(prof, args, results, sections):
    print("\n## 3. Process-isolated training-step ratio\n", flush=True)
    print("Each device runs in its own fresh process, alternating cpu/npu processes "
          f"({prof['iso_rounds']} round(s) of ~{prof['iso_proc_s']:.0f} s timed per process). "
          "The cpu process never loads torch_npu (`TORCH_DEVICE_BACKEND_AUTOLOAD=0`). "
          "This catches npu side effects that also slow CPU ops in a shared process (section 2 cannot see them).\n")
    rows = []
    steps_by_key = {r["key"]: r for r in results["steps"]}
    for key in ("mlp", "gpt", "gpt_amp", "conv"):
        if key not in sections:
            continue
        base = steps_by_key.get(key, {})
        inner = base.get("inner", 1)
        rec = {"key": key, "name": base.get("name", key), "target_ratio": base.get("target_ratio"),
               "inner": inner}
        t0 = time.perf_counter()
        try:
            samples = {"cpu": [], "npu": []}
            per_round = []
            info = {}
            for r in range(prof["iso_rounds"]):
                order = ("cpu", "npu") if r % 2 == 0 else ("npu", "cpu")
                meds = {}
                for dev in order:
                    out = _iso_worker(args, dev, key, inner, prof["iso_proc_s"])
                    samples[dev] += out["per_call_ns"]
                    meds[dev] = statistics.median(out["per_call_ns"])
                    info[dev] = {k: out[k] for k in ("torch_npu_loaded", "optimizer_path", "faults_per_call",
                                                     "returncode", "malloc")}
                per_round.append(meds["npu"] / meds["cpu"])
            cpu_ms = statistics.median(samples["cpu"]) / 1e6
            npu_ms = statistics.median(samples["npu"]) / 1e6
            rec.update(cpu_ms=cpu_ms, npu_ms=npu_ms, ratio=npu_ms / cpu_ms,
                       min_ratio=min(samples["npu"]) / min(samples["cpu"]),
                       per_round_ratios=per_round, n_cpu=len(samples["cpu"]), n_npu=len(samples["npu"]),
                       workers=info)
            if rec["target_ratio"] is not None:
                rec["status"] = "PASS" if rec["ratio"] <= rec["target_ratio"] else "FAIL"
            if args.raw:
                rec["samples_ns"] = samples
        except Exception as e:
            rec["error"] = f"{type(e).__name__}: {e}"
            rec["traceback"] = traceback.format_exc()
        rec["wall_s"] = time.perf_counter() - t0
        rows.append(rec)
        results["isolated"].append(rec)
        print(f"<!-- isolated {key} done in {rec['wall_s']:.1f}s -->", flush=True)

    print()
    print("| workload | CPU ms/step (native process) | npu ms/step (npu process) | **ratio** | min ratio | "
          "per-round ratios | target | status | samples cpu / npu | npu worker exit code |")
    print("|---|---:|---:|---:|---:|---|---:|:---:|---:|---:|")
    for r in rows:
        if "error" in r:
            print(f"| {r['name']} | - | - | ERROR: `{r['error'][:300]}` | | | | ERROR | | |")
            continue
        tgt = f"≤ {r['target_ratio']}" if r["target_ratio"] is not None else "-"
        pr = ", ".join(f"{x:.3f}" for x in r["per_round_ratios"])
        print(f"| {r['name']} | {fmt(r['cpu_ms'])} | {fmt(r['npu_ms'])} | **{fmt(r['ratio'], 3)}** | "
              f"{fmt(r['min_ratio'], 3)} | {pr} | {tgt} | {r.get('status', '-')} | "
              f"{r['n_cpu']} / {r['n_npu']} | {r['workers']['npu']['returncode']} |")
    sys.stdout.flush()


def main(argv=None):
    args = parse_args(argv)
    prof_name = "quick" if args.quick else "full"
    prof = PROFILES[prof_name]
    malloc_desc = T.tune_malloc(args.malloc)
    W.BUILD_OPTS["autograd_mt"] = {"default": None, "on": True, "off": False}[args.autograd_mt]
    torch.set_num_threads(args.threads)
    T.set_clock(args.clock)
    torch_npu.emulator.set_numerics(args.numerics)
    if args.matmul_hf32 == "on":
        torch.npu.matmul.allow_hf32 = True
    sections = {s.strip() for s in args.only.split(",") if s.strip()}
    t0 = time.perf_counter()

    hdr = header(args, prof_name) + f"\n- CPU-side allocator: {malloc_desc} (`--malloc {args.malloc}`)"
    print(hdr, flush=True)
    results = {
        "meta": {
            "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
            "torch": torch.__version__,
            "torch_npu": getattr(torch_npu, "__version__", None),
            "threads": torch.get_num_threads(),
            "interop_threads": torch.get_num_interop_threads(),
            "cpu_count": os.cpu_count(),
            "python": platform.python_version(),
            "profile": prof_name,
            "foreach": args.foreach,
            "clock": args.clock,
            "autograd_mt": args.autograd_mt,
            "numerics": args.numerics,
            "matmul_hf32": args.matmul_hf32,
            "malloc": malloc_desc,
            "argv": sys.argv[1:],
        },
        "micro": [],
        "steps": [],
        "isolated": [],
    }
    if "micro" in sections:
        run_micro(prof, args, results)
    if "compile" in sections:  # graph mode (not in the default list: compiling takes minutes)
        import compile_bench
        results["compile"] = compile_bench.run_section(quick=args.quick)
    if sections & {"mlp", "gpt", "gpt_amp", "conv"}:
        run_steps(prof, args, results, sections)
        if not args.no_isolated:
            run_isolated(prof, args, results, sections)

    if "profiler" in sections:
        import profiler_bench
        try:
            results["profiler"] = profiler_bench.run(quick=args.quick)
        except Exception as e:  # report, don't die
            results["profiler"] = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
            print(f"\nprofiler section failed: `{type(e).__name__}: {e}`")

    if "dist" in sections:  # 2-rank allreduce, hccl vs gloo (bench/dist_bench.py)
        import dist_bench
        results["dist"] = dist_bench.run_section(quick=args.quick)

    total = time.perf_counter() - t0
    results["meta"]["total_wall_s"] = total
    try:
        results["meta"]["loadavg_end"] = os.getloadavg()
        print(f"\n_load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}_", end="")
    except OSError:
        pass
    print(f"\n_total bench wall time: {total:.1f} s_")
    if args.json:
        d = os.path.dirname(os.path.abspath(args.json))
        os.makedirs(d, exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2, default=str)
        print(f"_results written to {args.json}_")
    return 0


if __name__ == "__main__":
    sys.exit(main())
