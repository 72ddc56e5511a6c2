"""Worker of the conformance suite (see README.md): runs instantiated tests of
``cases_ops`` / ``cases_modules`` by id, one result line each.

Usage::

    python tests/conformance/worker.py --list
        one line per npu test id (``TestOpConformanceNPU.test_out_add_npu_float32``)
    python tests/conformance/worker.py --ops-json '["<id>", ...]'
        runs them; prints the OpInfo sweep's markers (START / AT / RESULT / DONE,
        see tests/opinfo_sweep_worker.py), so the sweep's crash-isolating runner
        drives it. RESULT's JSON: op (the test id), status ("pass", "fail",
        "cpu_fails", "skip"), passed (1 or 0), failed ([{sample, phase, msg}]),
        notes (the skip reason or the CPU twin's outcome).

A failing npu test is re-run as its CPU twin (the same check with the CPU as
the device): if that fails too, the property does not hold on the CPU either
and the status is "cpu_fails" (not an npu miss).
"""
import argparse
import json
import os
import re
import sys
import unittest
import warnings

os.environ.setdefault("OMP_NUM_THREADS", "1")
for _k in ("PYTORCH_TESTING_DEVICE_ONLY_FOR", "PYTORCH_TESTING_DEVICE_EXCEPT_FOR",
           "PYTORCH_TESTING_DEVICE_FOR_CUSTOM"):
    os.environ.pop(_k, None)  # torch_npu.testing narrows these; the suite picks its devices itself

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import torch  # noqa: E402
import torch_npu  # noqa: E402,F401  (registers "npu" before common_device_type lists the device bases)

MODULES = ("cases_ops", "cases_modules")
# instantiate_device_type_tests names the class and the test after the device
# type: "privateuse1" until PrivateUse1TestBase's setUpClass has run once, "npu" after.
NPU_CLASS_SUFFIXES = ("PRIVATEUSE1", "NPU")
_DEVICE_IN_NAME = re.compile(r"_(npu|privateuse1)(?=_|$)")
MSG_LEN = 1500


def load():
    import importlib
    return {name: importlib.import_module(name) for name in MODULES}


def npu_test_ids(mods):
    """[(test id, kind, OpInfo/ModuleInfo name)] of the npu tests."""
    from torch.testing._internal.common_methods_invocations import op_db
    from torch.testing._internal.common_modules import module_db
    names = {op.formatted_name: op.full_name for op in op_db}
    for m in module_db:
        names.update({m.formatted_name + sfx: m.name for sfx in ("", "_train_mode", "_eval_mode")})
    kinds = sorted({k[len("test_"):] for mod in mods.values() for cname, cls in vars(mod).items()
                    if isinstance(cls, type) and cname.endswith(NPU_CLASS_SUFFIXES)
                    for k in getattr(cls, "generic_kinds", ())}, key=len, reverse=True)
    out = []
    for mod in mods.values():
        for cname, cls in vars(mod).items():
            if not (isinstance(cls, type) and cname.endswith(NPU_CLASS_SUFFIXES)):
                continue
            for meth in sorted(vars(cls)):
                if not meth.startswith("test_"):
                    continue
                kind = next(k for k in kinds if meth.startswith(f"test_{k}_"))
                rest = meth[len(f"test_{kind}_"):]
                formatted = rest[:list(_DEVICE_IN_NAME.finditer(rest))[-1].start()]
                out.append((f"{cname}.{meth}", kind, names.get(formatted, formatted)))
    return out


def cpu_twin(test_id):
    cname, meth = test_id.split(".", 1)
    base = next(cname[:-len(s)] for s in NPU_CLASS_SUFFIXES if cname.endswith(s))
    last = list(_DEVICE_IN_NAME.finditer(meth))[-1]
    return f"{base}CPU.{meth[:last.start()]}_cpu{meth[last.end():]}"


def find_class(mods, cname):
    for mod in mods.values():
        if cname in vars(mod):
            return vars(mod)[cname]
    return None


def run_one(mods, test_id):
    """(status, message) of one test id."""
    cname, meth = test_id.split(".", 1)
    cls = find_class(mods, cname)
    if cls is None or not hasattr(cls, meth):
        return "fail", f"no such test: {test_id}"
    result = unittest.TestResult()
    suite = unittest.TestSuite([cls(meth)])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        suite.run(result)
    if result.errors or result.failures:
        return "fail", (result.errors + result.failures)[0][1][-MSG_LEN:]
    if result.unexpectedSuccesses:
        return "pass", "unexpected success of an expected failure"
    if result.expectedFailures:
        return "fail", "expected failure (declared by the OpInfo/ModuleInfo): " + result.expectedFailures[0][1][-400:]
    if result.skipped:
        return "skip", result.skipped[0][1][:300]
    return "pass", ""


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--list", action="store_true")
    parser.add_argument("--ops-json", default=None)
    a = parser.parse_args(argv)
    torch.set_num_threads(1)
    mods = load()
    if a.list:
        for tid, kind, name in npu_test_ids(mods):
            print(f"{tid} {kind} {name}")
        sys.stdout.flush()
        os._exit(0)
    for tid in json.loads(a.ops_json or "[]"):
        print("OPINFO_SWEEP_START " + tid, flush=True)
        print("OPINFO_SWEEP_AT npu test", flush=True)
        status, msg = run_one(mods, tid)
        res = {"op": tid, "status": status, "passed": int(status == "pass"), "failed": [], "notes": []}
        if status == "fail":
            print("OPINFO_SWEEP_AT cpu twin", flush=True)
            twin_status, twin_msg = run_one(mods, cpu_twin(tid))
            if twin_status in ("fail", "skip"):
                res["status"] = "cpu_fails"
                res["notes"].append(f"CPU twin: {twin_status}: {twin_msg[-300:]}")
            res["failed"].append({"sample": -1, "phase": "npu", "msg": msg})
        elif status == "skip":
            res["notes"].append(msg)
        print("OPINFO_SWEEP_RESULT " + json.dumps(res), flush=True)
    print("OPINFO_SWEEP_DONE", flush=True)
    sys.stderr.flush()
    os._exit(0)  # as the sweep's worker: skip finalization (autograd device thread exit race)


if __name__ == "__main__":
    sys.exit(main())
