"""No public call of torch.npu, torch_npu (custom ops included) or
torch.accelerator can kill the process, whatever it is given.

Every public callable is called with no arguments, with one obviously
wrong argument (None, a string, -1, a huge int, a CPU tensor, a float) and
with one or two npu tensors, in worker subprocesses. A worker records each call in a progress file before
making it, so a death by signal (or a call that blocks past the per-call
limit) is attributed to its callable; the sweep then resumes after it. The
test fails listing every such call. Exceptions of any type are fine here: what
is checked is that the process survives.
"""
import json
import os
import signal
import subprocess
import sys
import time

from _subproc import make_env

PER_CALL_LIMIT_S = 20
WORKERS = 3
MODULES = ["torch.npu", "torch_npu", "torch.accelerator", "torch.accelerator.memory"]

# name -> why it is not called. None is needed: no public call blocks forever or
# ends the process by design. A crash is never a reason.
EXCLUDED = {}

_WORKER = r'''
import faulthandler, importlib, json, os, sys
import torch, torch_npu
import torch.accelerator
ARGS = [("()", lambda: ()), ("(None)", lambda: (None,)), ("('x')", lambda: ("x",)), ("(-1)", lambda: (-1,)),
        ("(2**62)", lambda: (2 ** 62,)), ("(cpu tensor)", lambda: (torch.ones(2, 3),)), ("(1.5)", lambda: (1.5,)),
        # Custom ops get past argument parsing only with device tensors.
        ("(npu tensor)", lambda: (torch.ones(2, 3, device="npu"),)),
        ("(npu tensor, npu tensor)", lambda: (torch.ones(2, 3, device="npu"), torch.ones(2, 3, device="npu")))]


def calls(modules, excluded):
    seen = set()
    out = []
    for modname in modules:
        mod = importlib.import_module(modname)
        for name in sorted(dir(mod)):
            if name.startswith("_"):
                continue
            fn = getattr(mod, name, None)
            if not callable(fn) or type(fn).__name__ == "module" or id(fn) in seen:
                continue
            seen.add(id(fn))
            full = f"{modname}.{name}"
            if full in excluded:
                continue
            for desc, make in ARGS:
                out.append((full, fn, desc, make))
    return out


def main():
    progress, start, stop, limit = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    what = json.loads(sys.argv[5])
    todo = calls(what["modules"], what["excluded"])
    if start == -1:                        # only count
        print(len(todo))
        return
    fd = os.open(progress, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    for i in range(start, min(stop, len(todo))):
        full, fn, desc, make = todo[i]
        os.write(fd, f"S {i} {full}{desc}\n".encode())
        faulthandler.dump_traceback_later(limit, exit=True)
        try:
            fn(*make())
        except BaseException:
            pass
        faulthandler.cancel_dump_traceback_later()
        os.write(fd, f"E {i}\n".encode())
    os.write(fd, b"DONE\n")
    os.close(fd)
    os._exit(0)       # the interpreter's own exit is covered by tests/test_exit.py


main()
'''


def _what(modules):
    return json.dumps({"modules": modules, "excluded": sorted(EXCLUDED)})


def _count(tmp_path, modules):
    proc = subprocess.run([sys.executable, "-c", _WORKER, "-", "-1", "0", "0", _what(modules)],
                          cwd=str(tmp_path), env=make_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return int(proc.stdout.strip().splitlines()[-1])


def _sweep_range(tmp_path, modules, tag, start, stop, deadline, per_call_limit):
    """Run calls [start, stop) in as many workers as deaths require; return the findings."""
    findings = []
    while start < stop:
        progress = tmp_path / f"progress_{tag}_{start}"
        proc = subprocess.Popen([sys.executable, "-c", _WORKER, str(progress), str(start), str(stop),
                                 str(per_call_limit), _what(modules)],
                                cwd=str(tmp_path), env=make_env(), stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)
        yield proc
        try:
            _, err = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            _, err = proc.communicate()
            findings.append(f"sweep ran out of time in [{start}, {stop})")
            break
        lines = progress.read_text().splitlines() if progress.exists() else []
        if lines and lines[-1] == "DONE":
            break
        started = [ln for ln in lines if ln.startswith("S ")]
        if not started:
            findings.append(f"worker died before its first call (rc={proc.returncode}): {err[-2000:]}")
            break
        last = started[-1].split(" ", 2)
        what = "signal %d" % -proc.returncode if proc.returncode < 0 else (
            "blocked > %d s" % per_call_limit if "Timeout" in err else f"exit {proc.returncode}")
        findings.append(f"{last[2]}: {what}")
        start = int(last[1]) + 1
    yield findings


def _sweep(tmp_path, modules, workers, per_call_limit=PER_CALL_LIMIT_S, budget_s=900):
    """Sweep ``modules`` with ``workers`` concurrent ranges; return (number of calls, findings)."""
    total = _count(tmp_path, modules)
    deadline = time.monotonic() + budget_s
    bounds = [total * k // workers for k in range(workers + 1)]
    gens = [_sweep_range(tmp_path, modules, k, bounds[k], bounds[k + 1], deadline, per_call_limit)
            for k in range(workers)]
    # The ranges run at once; each restarts after a death on its own.
    findings = []
    active = {k: next(g) for k, g in enumerate(gens)}
    while active:
        for k in list(active):
            item = next(gens[k])
            if isinstance(item, list):
                findings += item
                del active[k]
    return total, findings


def test_sweep_attributes_deaths_and_hangs_to_their_call(tmp_path):
    (tmp_path / "sweep_probe.py").write_text(
        "import os, time\n"
        "def a_fine(*args):\n    return args\n"
        "def b_aborts(*args):\n    if args == ('x',):\n        os.abort()\n"
        "def c_blocks(*args):\n    if args == (-1,):\n        time.sleep(600)\n"
        "def d_fine(*args):\n    return None\n")
    total, findings = _sweep(tmp_path, ["sweep_probe"], workers=1, per_call_limit=3, budget_s=300)
    assert total == 4 * 9
    assert findings == ["sweep_probe.b_aborts('x'): signal %d" % signal.SIGABRT,
                        "sweep_probe.c_blocks(-1): blocked > 3 s"]


def test_no_public_call_kills_the_process(tmp_path):
    total, findings = _sweep(tmp_path, MODULES, WORKERS)
    assert total > 2000            # torch.npu + torch_npu (custom ops) + torch.accelerator, 9 argument sets each
    assert findings == [], "\n".join(findings)
