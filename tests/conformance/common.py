"""Shared pieces of the conformance suite's test templates (see README.md).

Every check runs a sample on the device under test (``npu``; the CPU twin of
a test runs the same check with a fresh CPU copy, to tell whether the
property holds on the CPU at all) and compares with the CPU result of the
same sample, exactly. Moving samples and comparing results reuse the OpInfo
sweep's worker (``tests/opinfo_sweep_worker.py``).
"""
import os
import sys
import warnings

import torch

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if TESTS not in sys.path:
    sys.path.insert(0, TESTS)

import opinfo_sweep_worker as sweep  # noqa: E402

# Samples per test: the first MAX_SAMPLES of the OpInfo's / ModuleInfo's
# sample generator (a fixed prefix: seeded, reproducible).
MAX_SAMPLES = 3

Mismatch = sweep.Mismatch


def device_type(device):
    return torch.device(device).type


def first_samples(gen, n=MAX_SAMPLES):
    out = []
    for s in gen:
        out.append(s)
        if len(out) >= n:
            break
    return out


def move(tree, device, memo=None, keep_args_on_cpu=False):
    """A fresh copy of ``tree`` on ``device`` (layout and aliasing kept); returns (tree, moved).
    With ``keep_args_on_cpu`` only the input's tensors move (see opinfo_exclusions.CPU_ARGUMENTS)."""
    return sweep.to_npu_tree(tree, {} if memo is None else memo, keep_args_on_cpu, device=device_type(device))


def assert_same(dev_result, cpu_result, device, path="out", on_device=True):
    """``dev_result`` (computed on ``device``) equals ``cpu_result`` bitwise, strides included."""
    sweep.compare(dev_result, cpu_result, False, path, on_device, device_type(device))


def run(fn, *args, **kwargs):
    """(result, exception, resize warnings) of ``fn(*args, **kwargs)``."""
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        try:
            r = fn(*args, **kwargs)
            exc = None
        except Exception as e:  # noqa: BLE001
            r, exc = None, e
    resized = [str(x.message).split(".")[0] for x in w if "resized" in str(x.message)]
    return r, exc, resized


def same_outcome(dev, cpu, device, what):
    """Both raised the same exception type, or both returned equal results."""
    (dr, de), (cr, ce) = dev, cpu
    if de is not None or ce is not None:
        if de is None or ce is None or type(de) is not type(ce):
            raise Mismatch(f"{what}: cpu {_exc(ce)} / {device_type(device)} {_exc(de)}")
        return False
    assert_same(dr, cr, device, what)
    return True


def _exc(e):
    return "returned" if e is None else f"raised {type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"


def tensors(tree):
    return sweep.tensor_leaves(tree)
