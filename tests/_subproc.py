"""Run Python snippets in fresh interpreters for tests that need a clean process.

The emulator reads TORCH_NPU_EMU_*, ASCEND_RT_VISIBLE_DEVICES and the allocator
variables once, at first device use, and fork/lazy-init rules only show in a
process that has not touched the NPU yet.  Such checks run here.

A snippet reports back by calling ``emit(obj)`` (JSON-serialisable); the helper
``catch(fn)`` returns ``None`` when ``fn()`` succeeds and ``[type name, message,
is RuntimeError]`` when it raises, so that the parent test can assert on it.

``run_many`` starts several snippets at once (each one mostly waits on
``import torch``), which keeps the wall time of the suite low.
"""
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# Variables that change emulator / allocator / error-format behaviour.  They are
# removed from the child's environment unless a test sets them explicitly.
_CONTROLLED = (
    "TORCH_NPU_EMU_DEVICE_COUNT", "TORCH_NPU_EMU_DEVICE_NAME", "TORCH_NPU_EMU_MEMORY",
    "ASCEND_RT_VISIBLE_DEVICES", "PYTORCH_NPU_ALLOC_CONF", "PYTORCH_ALLOC_CONF",
    "PYTORCH_NO_NPU_MEMORY_CACHING", "TORCH_NPU_COMPACT_ERROR_OUTPUT", "RANK",
    "TORCH_NPU_FALLBACK_CPU_DISABLE", "TORCH_NPU_DEVICE_CAPABILITY", "TORCH_NPU_EMU_NUMERICS",
    "_TORCH_NPU_TRANSFER_NOTICES_SHOWN",  # set by transfer_to_npu in a process that printed its banner
)

_MARK = "@@RESULT@@"

_PRELUDE = f'''
import json as _json, sys as _sys
def emit(obj):
    _sys.stdout.write({_MARK!r} + _json.dumps(obj) + "\\n")
    _sys.stdout.flush()
def catch(fn):
    try:
        fn()
    except BaseException as _e:
        return [type(_e).__name__, str(_e), isinstance(_e, RuntimeError)]
    return None
'''


def make_env(**overrides):
    """os.environ minus the controlled variables, plus ``overrides`` (None = unset)."""
    env = {k: v for k, v in os.environ.items() if k not in _CONTROLLED}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env.setdefault("OMP_NUM_THREADS", "1")
    for k, v in overrides.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = str(v)
    return env


def _popen(code, env):
    src = _PRELUDE + textwrap.dedent(code)
    return subprocess.Popen([sys.executable, "-c", src], cwd=str(REPO), env=make_env(**(env or {})),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _collect(name, proc, timeout):
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(f"subprocess {name!r} timed out\nstdout:\n{out}\nstderr:\n{err[-4000:]}")
    results = [line[len(_MARK):] for line in out.splitlines() if line.startswith(_MARK)]
    if proc.returncode != 0 or not results:
        raise AssertionError(f"subprocess {name!r} failed (rc={proc.returncode})\nstdout:\n{out[-4000:]}\n"
                             f"stderr:\n{err[-4000:]}")
    return json.loads(results[-1])


def run_json(code, env=None, timeout=180):
    """Run ``code`` in a fresh interpreter; return the object it last ``emit``-ted."""
    return _collect("snippet", _popen(code, env), timeout)


def run_many(jobs, timeout=240):
    """``jobs``: {name: (code, env_overrides)}.  Runs them concurrently; returns {name: result}."""
    procs = {name: _popen(code, env) for name, (code, env) in jobs.items()}
    out = {}
    for name, proc in procs.items():
        try:
            out[name] = _collect(name, proc, timeout)
        except AssertionError as e:  # report per job; the tests using it fail individually
            out[name] = e
    return out


def result(results, name):
    """Fetch a job result from ``run_many`` output, raising its failure if it failed."""
    r = results[name]
    if isinstance(r, AssertionError):
        raise r
    return r
