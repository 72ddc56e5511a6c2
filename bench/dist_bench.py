#!/usr/bin/env python
"""Allreduce on 2 ranks: ``hccl`` on npu tensors vs ``gloo`` on CPU tensors.

    .venv/bin/python bench/dist_bench.py            # ~1 min on 2 cores
    .venv/bin/python bench/dist_bench.py --quick    # ~30 s
    .venv/bin/python bench/dist_bench.py --json out.json

Both backends live in the same two processes (``cpu:gloo,npu:hccl``), so the
runs interleave (hccl then gloo, gloo then hccl, …) under the same machine
load. Bus bandwidth is NCCL-tests' definition for allreduce:
``bytes / time * 2 (n - 1) / n`` (= bytes / time for n = 2). Figures are
medians over reps. The per-call overhead is the median time of one allreduce
of a small tensor; the hccl group is timed with its default fingerprint
check (one extra small Gloo allgather per collective) and, in a second group
created under ``TORCH_NPU_EMU_COLLECTIVE_CHECK=0``, without it.

hccl here is the emulated backend: it runs Gloo on zero-copy CPU views of the
npu tensors, so the ratio measures what the emulation layer costs, not HCCL.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)

WORLD = 2
SIZES_MB = (1, 16, 128)
STARTUP_CHECKS = 32  # csrc/distributed/CollectiveCheck.cpp kStartupChecks
BANDWIDTH_TARGET = 0.95
SMALL_NUMEL = 8

# reps per size (each rep is `calls` back-to-back allreduces) and small-tensor reps.
# One call per rep, variants alternating call by call: on a shared machine the load
# drifts on the scale of milliseconds, so the finest interleaving is the fairest.
PROFILES = {
    "full": dict(reps={1: 300, 16: 60, 128: 12}, calls={1: 1, 16: 1, 128: 1}, small_reps=2000, small_calls=1),
    "quick": dict(reps={1: 100, 16: 20, 128: 4}, calls={1: 1, 16: 1, 128: 1}, small_reps=600, small_calls=1),
}


# -- worker side (one process per rank) ---------------------------------------------------------

def _time_calls(fn, calls):
    t0 = time.perf_counter_ns()
    for _ in range(calls):
        fn()
    return (time.perf_counter_ns() - t0) / calls / 1e9


def _interleaved(variants, reps, calls, sync=None):
    """{name: fn} -> {name: [seconds per call, one per rep]}, order alternating every rep.

    ``sync`` (a barrier on a group of its own) runs before every timed rep: a
    rank's time for a collective includes waiting for its peer to arrive, and
    without it a variant that follows a synchronising one looks faster.
    """
    samples = {name: [] for name in variants}
    names = list(variants)
    for rep in range(reps):
        for name in (names if rep % 2 == 0 else names[::-1]):
            if sync is not None:
                sync()
            samples[name].append(_time_calls(variants[name], calls))
    return samples


def _worker(profile):
    import torch
    import torch.distributed as dist
    import torch_npu  # noqa: F401

    prof = PROFILES[profile]
    rank = int(os.environ["RANK"])
    torch.npu.set_device(rank)
    dist.init_process_group("cpu:gloo,npu:hccl")
    os.environ["TORCH_NPU_EMU_COLLECTIVE_CHECK"] = "0"  # read when a group is built
    unchecked = dist.new_group(backend="hccl")
    os.environ.pop("TORCH_NPU_EMU_COLLECTIVE_CHECK")
    sync_group = dist.new_group(backend="gloo")

    def sync():
        dist.barrier(group=sync_group)

    # Correctness first: both paths must sum the same way.
    for device in ("cpu", "npu"):
        x = torch.full((1000,), float(rank + 1), device=device)
        dist.all_reduce(x)
        assert torch.equal(x.cpu(), torch.full((1000,), float(sum(range(1, WORLD + 1))))), device

    # Past the startup window: the first 32 collectives of every group are checked
    # (docs/distributed.md), a one-time cost the steady-state rows below must not sample.
    for _ in range(STARTUP_CHECKS):
        dist.all_reduce(torch.zeros(8, device="npu"))
        dist.all_reduce(torch.zeros(8, device="npu"), group=unchecked)

    result = {"world": WORLD, "bandwidth": [], "overhead": {}}
    for mb in SIZES_MB:
        numel = mb * (1 << 20) // 4
        npu_buf, cpu_buf = torch.zeros(numel, device="npu"), torch.zeros(numel)
        variants = {
            "gloo": lambda: dist.all_reduce(cpu_buf),
            "hccl": lambda: dist.all_reduce(npu_buf),
            "hccl_no_check": lambda: dist.all_reduce(npu_buf, group=unchecked),
        }
        _interleaved(variants, 1, 1, sync)  # warm-up: connections, buffers
        samples = _interleaved(variants, prof["reps"][mb], prof["calls"][mb], sync)
        nbytes = numel * 4
        row = {"mb": mb, "reps": prof["reps"][mb], "calls": prof["calls"][mb]}
        for name, secs in samples.items():
            t = statistics.median(secs)
            row[f"{name}_s"] = t
            row[f"{name}_busbw_gbs"] = nbytes / t * 2 * (WORLD - 1) / WORLD / 1e9
        row["ratio"] = row["hccl_busbw_gbs"] / row["gloo_busbw_gbs"]
        row["ratio_no_check"] = row["hccl_no_check_busbw_gbs"] / row["gloo_busbw_gbs"]
        result["bandwidth"].append(row)
        del npu_buf, cpu_buf, variants

    small_npu, small_cpu = torch.zeros(SMALL_NUMEL, device="npu"), torch.zeros(SMALL_NUMEL)
    variants = {
        "gloo": lambda: dist.all_reduce(small_cpu),
        "hccl": lambda: dist.all_reduce(small_npu),
        "hccl_no_check": lambda: dist.all_reduce(small_npu, group=unchecked),
    }
    _interleaved(variants, 5, prof["small_calls"], sync)
    samples = _interleaved(variants, prof["small_reps"], prof["small_calls"], sync)
    result["overhead"] = {name: statistics.median(s) * 1e6 for name, s in samples.items()}
    result["overhead"]["numel"] = SMALL_NUMEL
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        print("@@DIST_BENCH@@" + json.dumps(result), flush=True)


def _solo_worker(profile):
    """World size 1: no peer, no network, no fingerprint check; what the hccl layer itself adds per call."""
    import torch
    import torch.distributed as dist
    import torch_npu  # noqa: F401

    prof = PROFILES[profile]
    dist.init_process_group("cpu:gloo,npu:hccl", init_method="tcp://127.0.0.1:0", rank=0, world_size=1)
    small_npu, small_cpu = torch.zeros(SMALL_NUMEL, device="npu"), torch.zeros(SMALL_NUMEL)
    variants = {"gloo": lambda: dist.all_reduce(small_cpu), "hccl": lambda: dist.all_reduce(small_npu)}
    _interleaved(variants, 5, prof["small_calls"])
    samples = _interleaved(variants, prof["small_reps"], prof["small_calls"])
    dist.destroy_process_group()
    print("@@DIST_BENCH@@" + json.dumps({name: statistics.median(s) * 1e6 for name, s in samples.items()}),
          flush=True)


# -- driver ---------------------------------------------------------------------------------------

def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure(quick=False, timeout_s=600):
    """Run the 2-rank benchmark, then the 1-rank one; return rank 0's result dict."""
    result = _run_ranks(WORLD, "--worker", quick, timeout_s)
    result["solo_overhead"] = _run_ranks(1, "--solo", quick, timeout_s)
    result["loadavg_end"] = os.getloadavg()
    return result


def _run_ranks(world, mode, quick, timeout_s):
    port = _free_port()
    procs = []
    for rank in range(world):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
        env.pop("TORCH_NPU_EMU_COLLECTIVE_CHECK", None)
        env["PYTHONPATH"] = os.pathsep.join([REPO] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
        procs.append(subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), mode, "quick" if quick else "full"],
            env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outputs = []
    deadline = time.monotonic() + timeout_s
    for p in procs:
        try:
            outputs.append(p.communicate(timeout=max(1.0, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise RuntimeError(f"dist bench ranks did not finish within {timeout_s} s")
    for rank, (p, (out, err)) in enumerate(zip(procs, outputs)):
        if p.returncode != 0:
            raise RuntimeError(f"dist bench rank {rank} failed (rc={p.returncode}):\n{err[-3000:]}")
    line = [l for l in outputs[0][0].splitlines() if l.startswith("@@DIST_BENCH@@")][-1]
    return json.loads(line[len("@@DIST_BENCH@@"):])


def report(result):
    lines = ["\n## Distributed: allreduce on 2 ranks, hccl (npu tensors) vs gloo (CPU tensors)\n",
             "Bus bandwidth = bytes / time (n = 2); medians of interleaved reps; "
             f"target ratio ≥ {BANDWIDTH_TARGET}; load average at the end: "
             f"{' '.join(f'{x:.1f}' for x in result['loadavg_end'])} on {os.cpu_count()} CPUs.\n",
             "| size | reps×calls | gloo GB/s | hccl GB/s | hccl/gloo | target | hccl, no check GB/s | ratio |",
             "|---:|---:|---:|---:|---:|:---:|---:|---:|"]
    for r in result["bandwidth"]:
        ok = "ok" if r["ratio"] >= BANDWIDTH_TARGET else "MISS"
        lines.append(f"| {r['mb']} MB | {r['reps']}×{r['calls']} | {r['gloo_busbw_gbs']:.3f} | "
                     f"{r['hccl_busbw_gbs']:.3f} | {r['ratio']:.3f} | {ok} | "
                     f"{r['hccl_no_check_busbw_gbs']:.3f} | {r['ratio_no_check']:.3f} |")
    o, solo = result["overhead"], result["solo_overhead"]
    lines += ["", f"Per-call time of one allreduce of {o['numel']} floats (µs, median):", "",
              "| gloo (CPU) | hccl (npu) | hccl, TORCH_NPU_EMU_COLLECTIVE_CHECK=0 | hccl − gloo | check costs |",
              "|---:|---:|---:|---:|---:|",
              f"| {o['gloo']:.1f} | {o['hccl']:.1f} | {o['hccl_no_check']:.1f} | "
              f"{o['hccl_no_check'] - o['gloo']:+.1f} | {o['hccl'] - o['hccl_no_check']:+.1f} |",
              "", "The same on 1 rank (no peer, no network, no check): what the hccl layer itself adds per call:",
              "", "| gloo (CPU) µs | hccl (npu) µs | hccl − gloo |", "|---:|---:|---:|",
              f"| {solo['gloo']:.1f} | {solo['hccl']:.1f} | {solo['hccl'] - solo['gloo']:+.1f} |"]
    return "\n".join(lines)


def run_section(quick=False):
    """bench/run.py's ``dist`` section: print the tables, return the numbers (or the error)."""
    try:
        result = measure(quick=quick)
    except Exception as e:  # a report, not a test
        print(f"\ndist section failed: `{type(e).__name__}: {e}`")
        return {"error": f"{type(e).__name__}: {e}"}
    print(report(result), flush=True)
    return result


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="fewer reps (~30 s)")
    p.add_argument("--json", metavar="PATH", help="also write the numbers as JSON to PATH")
    p.add_argument("--worker", choices=sorted(PROFILES), help=argparse.SUPPRESS)
    p.add_argument("--solo", choices=sorted(PROFILES), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        _worker(args.worker)
        return 0
    if args.solo:
        _solo_worker(args.solo)
        return 0
    t0 = time.perf_counter()
    result = measure(quick=args.quick)
    print(report(result))
    print(f"\n_dist bench wall time: {time.perf_counter() - t0:.1f} s_")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
