"""Differential sweep over PyTorch's OpInfo database: npu vs CPU.

Every OpInfo variant of ``torch.testing._internal.common_methods_invocations.op_db``
is run (up to 3 samples, float32 where supported) on CPU tensors and on the same
inputs moved to ``npu``. npu ops run the stock CPU kernels on the same memory, so
outputs -- and, for differentiable ops, the grads of a weighted sum of the
outputs w.r.t. the sample's leaf tensors -- must be bitwise equal
(``assert_close(..., rtol=0, atol=0, equal_nan=True)``, plus equal strides and
storage offsets), and tensor outputs must live on npu. Inputs mutated by the op
(in-place, out=) are compared too. The per-op work is in
``tests/opinfo_sweep_worker.py``; every exclusion is in
``tests/opinfo_exclusions.py`` (``EXCLUSIONS``): nothing is skipped silently.

Tests:
  test_exclusions_name_real_variants          the exclusion file names real variants
  test_harness_catches_mismatches_and_crashes the checks are not vacuous (deliberately
                                              broken ops fail; a segfault is isolated)
  test_opinfo_sweep                           the sweep

Crash isolation: the ops run in subprocess workers, ``CHUNK_SIZE`` ops each, at
most ``TORCH_NPU_SWEEP_JOBS`` (default 2) at a time. If a worker dies (signal,
abnormal exit, timeout), the op it was running is re-run alone; if that
process dies too, the op is reported as a CRASH failure by name and the rest
of the chunk goes on in a new worker (isolated the same way). If the op does
not crash alone, every op of the chunk that did not report is re-run one per
process.

Share: by default a fixed, seeded share (``DEFAULT_SHARE``) of the op variants
runs. ``TORCH_NPU_FULL_SWEEP=1`` (or ``--full-sweep`` once
``tests/conftest_sweep.py`` is wired into ``tests/conftest.py``) runs all;
``TORCH_NPU_SWEEP_OPS=add,sum`` runs just the named variants;
``TORCH_NPU_SWEEP_REPORT=path.json`` writes every per-op result.

The summary line ``OpInfo sweep: X op variants, Y samples passed, Z failed,
W excluded [...]`` is printed with capture disabled (shown without ``-s``) and
to stderr; with conftest_sweep wired in, also in pytest's terminal summary.
"""
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "opinfo_sweep_worker.py")
sys.path.insert(0, HERE)
from opinfo_exclusions import CPU_ARGUMENTS, EXCLUSIONS, SAMPLE_FILTERS, kind_of  # noqa: E402

DEFAULT_SHARE = 1.0  # the whole sweep takes ~30 s on 2 cores, so CI runs all of it
SHARE_SEED = 1234
CHUNK_SIZE = 60  # worker start-up (~4 s: torch + op_db) dominates the per-op work
JOBS = int(os.environ.get("TORCH_NPU_SWEEP_JOBS", "2"))
SINGLE_OP_TIMEOUT = 180
LIST_TIMEOUT = 300

START = "OPINFO_SWEEP_START "
RESULT = "OPINFO_SWEEP_RESULT "
AT = "OPINFO_SWEEP_AT "

# Read by tests/conftest_sweep.py's pytest_terminal_summary, when wired in.
LAST_SUMMARY = []


def _worker_env():
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = "1"
    env["MKL_NUM_THREADS"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONFAULTHANDLER"] = "1"  # a crash prints the Python stack to stderr
    return env


def _list_variants(worker=WORKER):
    p = subprocess.run([sys.executable, worker, "--list"], capture_output=True, text=True,
                       timeout=LIST_TIMEOUT, env=_worker_env(), cwd=os.path.dirname(HERE))
    assert p.returncode == 0, f"listing OpInfo variants failed:\n{p.stderr[-3000:]}"
    return [line.strip() for line in p.stdout.splitlines() if line.strip()]


def _exit_text(rc):
    if rc is None:
        return "timed out"
    if rc < 0:
        try:
            return f"died with signal {signal.Signals(-rc).name}"
        except ValueError:
            return f"died with signal {-rc}"
    return f"exited with code {rc}"


def _run_worker(ops, timeout, worker=WORKER):
    """Run ops in one worker (a script speaking the markers above; the conformance suite's
    worker does too). Returns (results by op, ok, exit text, stderr tail, last started op)."""
    cmd = [sys.executable, worker, "--ops-json", json.dumps(ops)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=_worker_env(), cwd=os.path.dirname(HERE), start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
        rc = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        rc = None
    results = {}
    last_started = last_at = None
    for line in out.splitlines():
        if line.startswith(RESULT):
            r = json.loads(line[len(RESULT):])
            results[r["op"]] = r
        elif line.startswith(START):
            last_started, last_at = line[len(START):].strip(), None
        elif line.startswith(AT):
            last_at = line[len(AT):].strip()
    ok = rc == 0 and "OPINFO_SWEEP_DONE" in out
    exit_text = _exit_text(rc) + (f" during {last_at}" if last_at and last_started not in results else "")
    return results, ok, exit_text, err[-4000:], last_started


def _crash_result(op, exit_text, stderr_tail):
    # faulthandler's report: keep "Fatal Python error" and the Python frames.
    lines = [ln for ln in stderr_tail.splitlines()
             if ln.strip() and "<no Python frame>" not in ln and not ln.startswith("Extension modules")]
    fatal = [ln for ln in lines if ln.startswith("Fatal Python error")]
    frames = [ln for ln in lines if ln.strip().startswith("File ")]
    tail = "\n".join(fatal[:1] + (frames[:6] if frames else lines[-6:]))
    return {"op": op, "dtype": None, "mode": kind_of(op), "passed": 0, "notes": [], "seconds": 0.0,
            "failed": [{"sample": -1, "phase": "crash",
                        "msg": f"CRASH: worker running only {op!r} {exit_text}\n{tail}"}]}


def _run_single(op, worker=WORKER):
    single, ok, exit_text, err, _ = _run_worker([op], timeout=SINGLE_OP_TIMEOUT, worker=worker)
    if ok and op in single:
        return single[op], False
    return _crash_result(op, exit_text, err), True


def _run_chunk(ops, worker=WORKER):
    """Results of ops, run in one worker; crash-isolated (see module doc)."""
    results, ok, exit_text, err, last_started = _run_worker(ops, timeout=120 + 5 * len(ops), worker=worker)
    if ok:
        return results
    remaining = [op for op in ops if op not in results]
    # The op that was running when the worker died is the prime suspect:
    # confirm it alone. If it crashes alone, it is the crasher; the ops after
    # it go on as a fresh chunk (crash-isolated the same way).
    if last_started in remaining:
        results[last_started], crashed = _run_single(last_started, worker)
        remaining.remove(last_started)
        if crashed:
            if remaining:
                results.update(_run_chunk(remaining, worker))
            return results
    # Otherwise (the crash needs earlier state, or nothing was running):
    # every op that did not report runs one per process.
    for op in remaining:
        results[op], _ = _run_single(op, worker)
    return results


def _select(all_names, full, only):
    if only:
        return [n for n in only.split(",") if n]
    if full:
        return list(all_names)
    k = max(1, round(len(all_names) * DEFAULT_SHARE))
    return sorted(random.Random(SHARE_SEED).sample(sorted(all_names), k))


def _full_requested(request):
    if os.environ.get("TORCH_NPU_FULL_SWEEP", "") not in ("", "0"):
        return True
    try:
        return bool(request.config.getoption("--full-sweep"))
    except (ValueError, AttributeError):
        return False


def _first_lines(msg, n=4):
    return "\n".join(("      " + ln) for ln in msg.strip().splitlines()[:n])


@pytest.fixture(scope="module")
def all_variants():
    return _list_variants()


def test_exclusions_name_real_variants(all_variants):
    names = set(all_variants)
    unknown = sorted(k for k in EXCLUSIONS if k not in names)
    assert not unknown, f"opinfo_exclusions.EXCLUSIONS names unknown OpInfo variants: {unknown}"
    for k in EXCLUSIONS:
        kind_of(k)  # raises on a reason without a known prefix
    unknown = sorted(k for k in list(CPU_ARGUMENTS) + list(SAMPLE_FILTERS) if k not in names)
    assert not unknown, f"opinfo_exclusions names unknown OpInfo variants: {unknown}"
    not_meta = sorted(k for k in SAMPLE_FILTERS if kind_of(k) != "meta")
    assert not not_meta, f"SAMPLE_FILTERS entries need a shape/dtype/device-only EXCLUSIONS reason: {not_meta}"


def test_harness_catches_mismatches_and_crashes():
    """The sweep's checks are not vacuous, and a crash is isolated and named."""
    ops = ["__selftest_wrong_fwd__", "__selftest_wrong_grad__", "__selftest_wrong_device__",
           "__selftest_segfault__", "abs"]
    r = _run_chunk(ops)
    assert set(r) == set(ops), r.keys()
    assert {f["phase"] for f in r["__selftest_wrong_fwd__"]["failed"]} == {"fwd", "grad"}, r["__selftest_wrong_fwd__"]
    wrong_grad = r["__selftest_wrong_grad__"]
    assert [f["phase"] for f in wrong_grad["failed"]] == ["grad"] and wrong_grad["passed"] == 1, wrong_grad
    assert "expected device npu" in r["__selftest_wrong_device__"]["failed"][0]["msg"]
    crash = r["__selftest_segfault__"]["failed"]
    assert len(crash) == 1 and crash[0]["phase"] == "crash", crash
    assert "'__selftest_segfault__'" in crash[0]["msg"] and "SIGSEGV" in crash[0]["msg"], crash
    assert r["abs"]["failed"] == [] and r["abs"]["passed"] > 0, r["abs"]


def test_opinfo_sweep(all_variants, request, capsys):
    full = _full_requested(request)
    only = os.environ.get("TORCH_NPU_SWEEP_OPS", "")
    selected = _select(all_variants, full, only)
    skipped = [n for n in selected if kind_of(n) == "skip"]
    to_run = [n for n in selected if kind_of(n) != "skip"]

    t0 = time.time()
    chunks = [to_run[i:i + CHUNK_SIZE] for i in range(0, len(to_run), CHUNK_SIZE)]
    results = {}
    lock = threading.Lock()

    def work(chunk):
        r = _run_chunk(chunk)
        with lock:
            results.update(r)

    with ThreadPoolExecutor(max_workers=max(1, JOBS)) as ex:
        for f in [ex.submit(work, c) for c in chunks]:
            f.result()
    elapsed = time.time() - t0

    passed_samples = failed_samples = excluded_samples = both_raised = meta_samples = 0
    failures = []          # (op, result) of non-excluded ops with failures
    stale = []             # BUG entries whose op now passes
    meta_ops = []
    for name in to_run:
        r = results.get(name)
        if r is None:
            r = _crash_result(name, "gave no result", "")
        kind = kind_of(name)
        nfail = len(r["failed"])
        if kind == "known_failure":
            excluded_samples += r["passed"] + nfail
            # Strict, in the standard configuration (another dtype may miss the bug).
            if nfail == 0 and r["passed"] > 0 and not os.environ.get("TORCH_NPU_SWEEP_DTYPE"):
                stale.append(name)
            continue
        if kind == "meta":
            meta_ops.append(name)
        passed_samples += r["passed"]
        failed_samples += nfail
        both_raised += sum(1 for note in r["notes"] if note.endswith("both raised"))
        meta_samples += r.get("meta_samples", 0)
        if nfail:
            failures.append((name, r))

    n_excluded = len(skipped) + sum(1 for n in to_run if kind_of(n) != "exact")
    n_bugs = sum(1 for n in to_run if kind_of(n) == "known_failure")
    if only:
        scope = "ops from TORCH_NPU_SWEEP_OPS"
    elif full:
        scope = "full sweep"
    else:
        scope = f"seeded {100 * DEFAULT_SHARE:.0f}% share of {len(all_variants)} (TORCH_NPU_FULL_SWEEP=1 for all)"
    summary = (f"OpInfo sweep: {len(selected)} op variants, {passed_samples} samples passed, "
               f"{failed_samples} failed, {n_excluded} excluded "
               f"[{scope}; {elapsed:.1f}s; excluded = {len(skipped)} not run + {len(meta_ops)} compared by "
               f"shape/dtype/device only ({meta_samples} samples) + {n_bugs} known bugs ({excluded_samples} "
               f"samples); {both_raised} passed samples raised the same exception type on cpu and npu]")
    LAST_SUMMARY[:] = [summary]
    report = os.environ.get("TORCH_NPU_SWEEP_REPORT")
    if report:  # full per-op results, e.g. as a CI artifact
        with open(report, "w") as f:
            json.dump({"summary": summary, "skipped": skipped,
                       "results": [results.get(n) for n in to_run]}, f, indent=1)
    with capsys.disabled():
        print("\n" + summary, flush=True)
    print(summary, file=sys.stderr, flush=True)

    problems = []
    for name, r in sorted(failures):
        lines = [f"  {name} [{r.get('dtype')}]: {len(r['failed'])} failed, {r['passed']} passed"]
        for f in r["failed"][:2]:
            lines.append(f"    sample {f['sample']} ({f['phase']}):\n{_first_lines(f['msg'])}")
        problems.append("\n".join(lines))
    for name in stale:
        problems.append(f"  {name}: listed in opinfo_exclusions as {EXCLUSIONS[name]!r} "
                        f"but all samples pass now -- remove the entry")
    if problems:
        pytest.fail(f"{summary}\n{len(failures)} op variants failed, {len(stale)} stale exclusions:\n"
                    + "\n".join(problems), pytrace=False)
