#!/usr/bin/env python
"""Worker for the process-isolated step comparison (used by run.py).

Runs ONE training-step workload on ONE device in a fresh process and prints a
JSON line with per-step times.  The cpu worker is started with
TORCH_DEVICE_BACKEND_AUTOLOAD=0 so torch_npu is never imported: it is a
truly native CPU process, unaffected by anything the npu side does to the
process (e.g. the autograd engine's npu worker thread creating a second
OpenMP thread team, which slows every OpenMP parallel region in the process
on a 2-core machine).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--device", choices=["cpu", "npu"], required=True)
    p.add_argument("--workload", required=True)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--malloc", default="tuned")
    p.add_argument("--foreach", default="default")
    p.add_argument("--autograd-mt", default="default")
    p.add_argument("--inner", type=int, default=1)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--reps", type=int, default=1000)
    p.add_argument("--max-seconds", type=float, default=5.0)
    p.add_argument("--min-reps", type=int, default=3)
    p.add_argument("--clock", default="wall")
    args = p.parse_args(argv)

    import _timing as T
    malloc_desc = T.tune_malloc(args.malloc)
    import torch
    import workloads as W

    torch.set_num_threads(args.threads)
    T.set_clock(args.clock)
    W.BUILD_OPTS["autograd_mt"] = {"default": None, "on": True, "off": False}[args.autograd_mt]
    foreach = {"default": None, "on": True, "off": False}[args.foreach]
    dev = args.device
    if dev == "npu":
        import torch_npu  # noqa: F401
    ts = W.TRAIN_STEPS[args.workload](foreach=foreach, devices=(dev,))
    sync = W.npu_sync if dev == "npu" else T._noop
    v = T.Variant(dev, ts.steps[dev], sync=sync)
    s = T.time_interleaved([v], reps=args.reps, inner=args.inner, warmup=args.warmup,
                           max_seconds=args.max_seconds, min_reps=args.min_reps)
    out = {
        "device": dev,
        "workload": args.workload,
        "per_call_ns": s.per_call_ns[dev],
        "faults_per_call": s.faults_per_call(dev),
        "torch_npu_loaded": "torch_npu" in sys.modules,
        "threads": torch.get_num_threads(),
        "malloc": malloc_desc,
        "optimizer_path": W.optimizer_path(ts).get(dev),
    }
    sys.stdout.write("@@RESULT@@" + json.dumps(out) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    t0 = time.perf_counter()
    rc = main()
    sys.exit(rc)
