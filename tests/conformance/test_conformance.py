"""The conformance suite's driver: PyTorch's device-generic test kinds over the
installed wheel's op_db and module_db, instantiated for npu, run in
crash-isolated workers (see README.md).

Tests:
  test_kinds_are_the_templates      KINDS names exactly the templates' test kinds
  test_exclusions_name_real_entries every exclusion names an op/module of the databases
  test_conformance[<kind>]          the (seeded share of the) npu tests of one kind pass,
                                    except those whose property fails on the CPU too and
                                    the known bugs of exclusions.KNOWN_FAILURES
  test_known_failures_are_current   every known bug still fails somewhere (runs last)

Share: CI runs a fixed, seeded share (SHARE of every kind, the same ids each
run); ``TORCH_NPU_CONFORMANCE_FULL=1`` runs every test.
``TORCH_NPU_CONFORMANCE_REPORT=path.json`` writes every per-test result. The per-kind counts
are printed in pytest's terminal summary (tests/conformance/conftest.py).
"""
import json
import os
import random
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))
import exclusions  # noqa: E402
import test_opinfo_sweep as sweep_driver  # noqa: E402  (its crash-isolating chunk runner)

WORKER = os.path.join(HERE, "worker.py")
KINDS = ("out", "out_warning", "variant_consistency", "noncontiguous_samples", "conj_view", "neg_view",
         "errors", "meta", "dtypes", "forward", "inplace", "factory_kwargs", "repr", "pickle",
         "non_contiguous_tensors", "grad")
SHARE = 0.5  # ~2.5 CPU-minutes (about 1.5 min wall on 2 idle cores); the full run is twice that
SEED = 20260
CHUNK_SIZE = 150
JOBS = int(os.environ.get("TORCH_NPU_SWEEP_JOBS", "2"))

# Read by conftest.py's terminal summary.
SUMMARY = {}
# {kind: {KNOWN_FAILURES key: whether one of its tests failed}} (test_known_failures_are_current).
KNOWN_SEEN = {}


def full_run():
    return os.environ.get("TORCH_NPU_CONFORMANCE_FULL", "") not in ("", "0")


@pytest.fixture(scope="module")
def listing():
    lines = sweep_driver._list_variants(WORKER)
    return [tuple(line.split(" ", 2)) for line in lines]


def select(listing, full):
    """{kind: [(test id, name)]}: everything, or a seeded SHARE of each kind (at least one)."""
    by_kind = {}
    for tid, kind, name in listing:
        by_kind.setdefault(kind, []).append((tid, name))
    if full:
        return by_kind
    rng = random.Random(SEED)
    return {k: sorted(rng.sample(sorted(v), max(1, round(len(v) * SHARE)))) for k, v in sorted(by_kind.items())}


@pytest.fixture(scope="module")
def results(listing):
    """{test id: worker result} for every selected, not excluded test; plus the selection."""
    chosen = select(listing, full_run())
    to_run, excluded = [], {}
    for kind, items in chosen.items():
        for tid, name in items:
            reason = exclusions.reason_for(kind, name)
            if reason:
                excluded[tid] = reason
            else:
                to_run.append(tid)
    t0 = time.time()
    out, lock = {}, threading.Lock()

    def work(chunk):
        r = sweep_driver._run_chunk(chunk, worker=WORKER)
        with lock:
            out.update(r)

    chunks = [to_run[i::max(1, len(to_run) // CHUNK_SIZE)] for i in range(max(1, len(to_run) // CHUNK_SIZE))]
    with ThreadPoolExecutor(max_workers=max(1, JOBS)) as ex:
        for f in [ex.submit(work, c) for c in chunks if c]:
            f.result()
    report = os.environ.get("TORCH_NPU_CONFORMANCE_REPORT")
    if report:  # every per-test result, e.g. as a CI artifact or to compare two runs
        with open(report, "w") as f:
            json.dump({"excluded": excluded, "results": out}, f, indent=1)
    return {"chosen": chosen, "excluded": excluded, "results": out, "seconds": time.time() - t0}


def test_kinds_are_the_templates(listing):
    assert sorted({kind for _, kind, _ in listing}) == sorted(KINDS)


def test_exclusions_name_real_entries(listing):
    names = {name for _, _, name in listing}
    unknown = sorted(k for k in exclusions.EXCLUSIONS if k.split(":")[-1] not in names
                     and k not in sweep_driver.EXCLUSIONS)  # sweep-only names: not instantiated here
    unknown += sorted(k for k in exclusions.EXCLUSIONS if ":" in k and k.split(":")[0] not in KINDS)
    assert not unknown, f"tests/conformance/exclusions.py names unknown ops/modules: {unknown}"
    for reason in exclusions.EXCLUSIONS.values():
        assert reason.split(":")[0] in ("RANDOM", "UNINITIALIZED", "NONDETERMINISTIC", "UNSUPPORTED"), reason


@pytest.mark.parametrize("kind", KINDS)
def test_conformance(kind, results):
    items = results["chosen"].get(kind, [])
    counts = dict.fromkeys(("pass", "fail", "cpu_fails", "skip", "crash", "excluded"), 0)
    failures = []
    known_seen = {}
    counts["known"] = 0
    for tid, name in items:
        if tid in results["excluded"]:
            counts["excluded"] += 1
            continue
        r = results["results"].get(tid) or sweep_driver._crash_result(tid, "gave no result", "")
        status = r.get("status") or "crash"  # the sweep runner's crash result has no status
        key = exclusions.known_failure(kind, name)
        if key is not None:
            known_seen.setdefault(key, False)
            if status == "fail":
                known_seen[key] = True
                status = "known"
        counts[status] += 1
        if status in ("fail", "crash"):
            failures.append((tid, r["failed"][0]["msg"] if r["failed"] else ""))
    KNOWN_SEEN.setdefault(kind, {}).update(known_seen)
    scope = "all" if full_run() else f"seeded {SHARE:.0%} share"
    SUMMARY[kind] = (f"{kind:24s} {counts['pass']:5d} passed {len(failures):4d} failed "
                     f"{counts['cpu_fails']:4d} fail on CPU too {counts['known']:4d} known bugs {counts['skip']:4d} skipped "
                     f"{counts['excluded']:4d} excluded  of {len(items)} ({scope})")
    if failures:
        lines = [f"  {tid}:\n    " + "\n    ".join(msg.strip().splitlines()[-6:]) for tid, msg in failures[:30]]
        pytest.fail(f"{len(failures)} npu conformance failures in {kind} (the CPU passes these):\n"
                    + "\n".join(lines), pytrace=False)


def test_known_failures_are_current():
    """Every KNOWN_FAILURES entry with tests in this run still has a failing one (else remove it)."""
    seen = {}
    for per_kind in KNOWN_SEEN.values():
        for key, failed in per_kind.items():
            seen[key] = seen.get(key, False) or failed
    stale = sorted(k for k, failed in seen.items() if not failed)
    assert not stale, f"KNOWN_FAILURES entries whose tests all pass now (remove them): {stale}"
