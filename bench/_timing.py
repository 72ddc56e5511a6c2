"""Shared timing helpers for the torch_npu benchmark suite.

Everything here is device-agnostic: a "variant" is a zero-argument callable
that performs ONE unit of work (one op call, one training step); the helpers
time CPU and NPU variants *interleaved* in the same process so slow drifts of
a noisy machine (frequency scaling, neighbours, page cache) hit both sides
equally, and report medians.
"""

from __future__ import annotations

import gc
import math
import random
import resource
import statistics
import time
from dataclasses import dataclass, field, asdict
from typing import Callable, Dict, List, Optional, Sequence, Tuple

_ns = time.perf_counter_ns

CLOCKS = {
    # wall clock (default; what the user waits for)
    "wall": time.perf_counter_ns,
    # CPU time of the whole process (all threads).  Not inflated while the
    # process is descheduled by other load, but counts OpenMP spin-waiting.
    "process": time.process_time_ns,
}


def set_clock(name: str) -> None:
    """Select the clock used by all timing helpers ('wall' or 'process')."""
    global _ns
    _ns = CLOCKS[name]


def tune_malloc(mode: str) -> str:
    """'tuned': make glibc malloc keep freed memory (fixed 32 MiB mmap
    threshold, no heap trimming) so native-CPU tensors don't pay page faults
    every step.  In this VM page faults are very expensive (~10-20 µs each) and
    glibc's dynamic mmap/trim heuristics flip between a faulting and a
    non-faulting regime, making the CPU baseline bimodal.  npu tensors use the
    torch_npu caching allocator and never fault, so without this the ratio
    mostly measures glibc, not npu overhead.  'stock': leave glibc alone.
    Returns a short description for the report header."""
    if mode == "stock":
        return "stock glibc malloc"
    try:
        import ctypes
        libc = ctypes.CDLL("libc.so.6")
        M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
        ok1 = libc.mallopt(M_MMAP_THRESHOLD, 32 << 20)
        ok2 = libc.mallopt(M_TRIM_THRESHOLD, (1 << 31) - 1)
        if ok1 == 1 and ok2 == 1:
            return "glibc mallopt(M_MMAP_THRESHOLD=32MiB, M_TRIM_THRESHOLD=2GiB)"
        return f"mallopt failed ({ok1}, {ok2}); stock glibc malloc"
    except OSError as e:  # not glibc
        return f"malloc tuning unavailable ({e})"


def _noop() -> None:
    return None


@dataclass
class Variant:
    """One side of a comparison (e.g. "cpu" or "npu")."""

    name: str
    fn: Callable[[], object]
    # Called once at the end of every timed rep (inside the timed region),
    # e.g. torch.npu.synchronize.  The CPU side uses a no-op.
    sync: Callable[[], object] = _noop
    # Called before every timed rep, OUTSIDE the timed region (e.g. to reset
    # a tensor that an in-place op keeps modifying).
    setup: Optional[Callable[[], object]] = None


@dataclass
class Samples:
    """Per-call times (ns) of each timed rep, one list per variant."""

    inner: int
    reps: int
    per_call_ns: Dict[str, List[float]] = field(default_factory=dict)
    # minor page faults of the process during each variant's timed reps
    minflt: Dict[str, int] = field(default_factory=dict)

    def faults_per_call(self, name: str) -> float:
        n = len(self.per_call_ns[name]) * self.inner
        return self.minflt.get(name, 0) / n if n else float("nan")

    def median_us(self, name: str) -> float:
        return statistics.median(self.per_call_ns[name]) / 1e3

    def min_us(self, name: str) -> float:
        return min(self.per_call_ns[name]) / 1e3

    def iqr_rel(self, name: str) -> float:
        """Inter-quartile range relative to the median (noise indicator)."""
        xs = sorted(self.per_call_ns[name])
        if len(xs) < 4:
            return float("nan")
        q = statistics.quantiles(xs, n=4)
        med = statistics.median(xs)
        return (q[2] - q[0]) / med if med else float("nan")

    def paired_diff_us(self, a: str, b: str) -> float:
        """median over reps of (b_i - a_i); reps i are adjacent in time."""
        return statistics.median(
            y - x for x, y in zip(self.per_call_ns[a], self.per_call_ns[b])
        ) / 1e3

    def paired_ratio(self, a: str, b: str) -> float:
        """median over reps of (b_i / a_i)."""
        return statistics.median(
            y / x for x, y in zip(self.per_call_ns[a], self.per_call_ns[b])
        )

    def ratio_ci(self, a: str, b: str, level: float = 0.95, boots: int = 400) -> Tuple[float, float]:
        """Bootstrap confidence interval of median(b) / median(a).

        Reps are resampled as pairs (rep i of a with rep i of b): the two sides
        of a rep ran next to each other and share that moment's machine noise.
        Seeded, so one set of samples always gives one interval."""
        xa, xb = self.per_call_ns[a], self.per_call_ns[b]
        n = min(len(xa), len(xb))
        if n < 2:
            return float("nan"), float("nan")
        rng = random.Random(0)
        ratios = []
        for _ in range(boots):
            idx = [rng.randrange(n) for _ in range(n)]
            ratios.append(statistics.median(xb[i] for i in idx) / statistics.median(xa[i] for i in idx))
        ratios.sort()
        tail = (1.0 - level) / 2.0
        return ratios[int(tail * (boots - 1))], ratios[int((1.0 - tail) * (boots - 1))]

    def to_dict(self) -> dict:
        return asdict(self)


def _minflt() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def _run_rep(v: Variant, inner: int) -> int:
    """Time one rep of `inner` calls; returns elapsed ns (whole rep)."""
    fn = v.fn
    if v.setup is not None:
        v.setup()
    if inner == 1:
        t0 = _ns()
        fn()
        v.sync()
        return _ns() - t0
    rng = range(inner)
    t0 = _ns()
    for _ in rng:
        fn()
    v.sync()
    return _ns() - t0


def calibrate_inner(
    variants: Sequence[Variant],
    target_rep_s: float,
    max_inner: int = 2000,
    min_inner: int = 1,
) -> int:
    """Pick calls-per-rep so that one rep of the slowest variant takes about
    `target_rep_s` seconds (clamped to [min_inner, max_inner])."""
    worst = 0.0
    for v in variants:
        n = 1
        while True:
            el = _run_rep(v, n) / 1e9
            if el > 0.002 or n >= max_inner:
                break
            n *= 4
        # re-measure at that size and keep the fastest: a single noisy
        # sample must not shrink N
        el = min([el] + [_run_rep(v, n) / 1e9 for _ in range(2)])
        worst = max(worst, el / n)
    if worst <= 0:
        return max_inner
    return int(max(min_inner, min(max_inner, math.ceil(target_rep_s / worst))))


def time_interleaved(
    variants: Sequence[Variant],
    reps: int,
    inner: int = 1,
    warmup: int = 3,
    max_seconds: Optional[float] = None,
    min_reps: int = 5,
    max_reps: Optional[int] = None,
    precise: Optional[Callable[[Samples], bool]] = None,
) -> Samples:
    """Warm up every variant, then time `reps` reps of `inner` calls of each
    variant, interleaved.  The order alternates each rep (A B, B A, A B, ...)
    so neither side systematically runs "first" (cache / turbo effects).

    With `max_reps` and `precise`, timing goes on past `reps` (up to
    `max_reps`) while `precise(samples)` says the estimate is still too
    uncertain (checked every 10 reps, outside the timed regions): a noisy
    machine gets more samples, a quiet one stops at `reps`.

    If `max_seconds` is given, stop early (after at least `min_reps` reps) once
    that wall time has been spent, so the suite's total time stays bounded on
    a slower machine.

    GC is collected before and disabled during timing.
    """
    for _ in range(warmup):
        for v in variants:
            _run_rep(v, inner)
    out = Samples(inner=inner, reps=0, per_call_ns={v.name: [] for v in variants},
                  minflt={v.name: 0 for v in variants})
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    t_start = time.perf_counter()
    try:
        for r in range(max(reps, max_reps or 0) if precise is not None else reps):
            if r >= reps and (r - reps) % 10 == 0 and precise(out):
                break
            order = variants if r % 2 == 0 else list(reversed(variants))
            for v in order:
                f0 = _minflt()
                out.per_call_ns[v.name].append(_run_rep(v, inner) / inner)
                out.minflt[v.name] += _minflt() - f0
            out.reps = r + 1
            if (
                max_seconds is not None
                and out.reps >= min_reps
                and time.perf_counter() - t_start > max_seconds
            ):
                break
    finally:
        if was_enabled:
            gc.enable()
    return out


def write_json(path: str, results: dict) -> None:
    """Write a bench's results as JSON to ``path`` (parent folders created) and say so."""
    import json
    import os
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(results, f, indent=2, default=str)
    print(f"_results written to {path}_")
