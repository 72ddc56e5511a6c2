#!/usr/bin/env python
"""What chip numerics mode costs per matmul, against its yardstick: one clone of the rounded inputs.

    .venv/bin/python bench/chip_numerics_cost.py            # 64², 256², 1024² fp32 mm, HF32
    .venv/bin/python bench/chip_numerics_cost.py --fp16     # ACL_PRECISION_MODE=allow_fp32_to_fp16 instead

docs/numerics.md: in chip mode the cube ops round their fp32 inputs (one elementwise pass each)
before running the exact kernel. So chip − exact should cost about what copying the inputs
costs: the yardstick is ``mm(a.clone(), b.clone()) − mm(a, b)`` in exact mode. The three
variants run interleaved in one process (exact, chip, clone, exact, ...), one intra-op thread,
medians over repetitions. A report, not a test: it exits 0.
"""
import argparse
import statistics
import sys
import time

import torch

import torch_npu


def _per_call(fn, calls):
    fn()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls


def measure(n, reps, fp16):
    a, b = torch.randn(n, n).npu(), torch.randn(n, n).npu()
    calls = max(3, int(2e8 // (2 * n ** 3) + 1))
    exact, chip, clone = [], [], []
    for _ in range(reps):
        torch_npu.emulator.set_numerics("exact")
        exact.append(_per_call(lambda: torch.mm(a, b), calls))
        clone.append(_per_call(lambda: torch.mm(a.clone(), b.clone()), calls))
        torch_npu.emulator.set_numerics("chip")
        if fp16:
            torch.npu.set_option({"ACL_PRECISION_MODE": "allow_fp32_to_fp16"})
        else:
            torch.npu.matmul.allow_hf32 = True
        chip.append(_per_call(lambda: torch.mm(a, b), calls))
        torch.npu.matmul.allow_hf32 = False
        torch.npu.set_option({"ACL_PRECISION_MODE": "must_keep_origin_dtype"})
    torch_npu.emulator.set_numerics("exact")
    med = statistics.median
    return med(exact), med(chip) - med(exact), med(clone) - med(exact)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--fp16", action="store_true", help="round to fp16 (allow_fp32_to_fp16) instead of HF32")
    p.add_argument("--reps", type=int, default=9)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    kind = "fp16" if args.fp16 else "HF32"
    print(f"# chip numerics cost per fp32 mm ({kind} rounding), one thread, medians of {args.reps} interleaved reps\n")
    print("| mm | exact | chip − exact | clone of both inputs (yardstick) | ratio |")
    print("|---|---:|---:|---:|---:|")
    for n in (64, 256, 1024):
        exact, added, clone = measure(n, args.reps, args.fp16)
        unit, scale = ("µs", 1e6) if exact < 1e-3 else ("ms", 1e3)
        print(f"| {n}×{n} | {exact * scale:.2f} {unit} | +{added * scale:.2f} {unit} | +{clone * scale:.2f} {unit} | "
              f"{added / clone:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
