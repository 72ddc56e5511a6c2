"""A process that used npu, hccl, the profiler or torch.compile exits promptly.

Each case is a fresh subprocess whose last statement prints a CLOCK_MONOTONIC
timestamp and its own CPU time so far. The parent waits for the process to end
without reaping it (``waitid(WNOWAIT)``), reads the zombie's own CPU time from
``/proc/<pid>/stat``, then reaps it. Two figures cover the exit alone (start-up
and the work are before the timestamp):

* the wall interval from the last statement to the end of the process, under
  1 s (3 s when the machine is loaded beyond twice its cores);
* the CPU the process itself spent after its last statement (all its threads,
  not its children), under 0.5 s: independent of other load. Interpreter
  finalization used to spend 0.7 s (plain npu) to 2+ s (after compile) of CPU
  in full garbage collections over every object PyTorch keeps.
"""
import os
import subprocess
import sys
import time

import pytest

from _subproc import REPO, make_env

WALL_LIMIT_S = 1.0
LOADED_WALL_LIMIT_S = 3.0
CPU_LIMIT_S = 0.5

_LAST = r'''
import resource as _r, time as _t
_u = _r.getrusage(_r.RUSAGE_SELF)
print("@@LAST", _t.monotonic(), _u.ru_utime + _u.ru_stime, flush=True)
'''

CASES = {
    "npu": r'''
import torch, torch_npu
x = torch.randn(64, 64, device="npu", requires_grad=True)
(x @ x).sum().backward()
torch.npu.synchronize()
''',
    "hccl": r'''
import os, tempfile, torch, torch_npu, torch.distributed as dist
path = os.path.join(tempfile.mkdtemp(), "store")
dist.init_process_group("hccl", init_method="file://" + path, rank=0, world_size=1)
t = torch.ones(4, device="npu")
dist.all_reduce(t)
assert t.tolist() == [1.0] * 4
''',
    "profiler": r'''
import tempfile, torch, torch_npu
acts = [torch_npu.profiler.ProfilerActivity.CPU, torch_npu.profiler.ProfilerActivity.NPU]
with torch_npu.profiler.profile(activities=acts,
                                on_trace_ready=torch_npu.profiler.tensorboard_trace_handler(tempfile.mkdtemp())):
    x = torch.randn(64, 64, device="npu")
    y = x @ x
    torch.npu.synchronize()
''',
    "compile": r'''
import torch, torch_npu
f = torch.compile(lambda a: (a.sin() + 1).sum())
x = torch.randn(64, device="npu")
assert torch.allclose(f(x).cpu(), (x.cpu().sin() + 1).sum())
''',
}


def _own_cpu_s(pid):
    """utime + stime of process ``pid`` (all its threads, not its children), in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _measure(code, tmp_path):
    script = tmp_path / "case.py"
    script.write_text(code + _LAST)
    with open(tmp_path / "stderr.txt", "w+") as err_file:
        p = subprocess.Popen([sys.executable, str(script)], cwd=str(REPO), env=make_env(), stdout=subprocess.PIPE,
                             stderr=err_file, text=True)
        try:
            out = p.stdout.read()   # EOF once the process closed its stdout (at exit)
            os.waitid(os.P_PID, p.pid, os.WEXITED | os.WNOWAIT)   # ended, not reaped yet
            end = time.monotonic()
            cpu_total = _own_cpu_s(p.pid)
        finally:
            if p.poll() is None:
                p.kill()
            p.wait()
        err_file.seek(0)
        err = err_file.read()
    assert p.returncode == 0, f"case failed (rc={p.returncode}):\n{err[-3000:]}"
    lines = [ln for ln in out.splitlines() if ln.startswith("@@LAST")]
    assert lines, f"no @@LAST line:\n{out[-2000:]}\n{err[-2000:]}"
    _, last, cpu_last = lines[-1].split()
    return end - float(last), cpu_total - float(cpu_last)


@pytest.mark.parametrize("case", sorted(CASES))
def test_exit_is_prompt(case, tmp_path):
    wall, cpu = _measure(CASES[case], tmp_path)
    loaded = os.getloadavg()[0] > 2 * (os.cpu_count() or 1)
    limit = LOADED_WALL_LIMIT_S if loaded else WALL_LIMIT_S
    assert cpu < CPU_LIMIT_S, f"{case}: the process spent {cpu:.2f} s of CPU after its last statement"
    assert wall < limit, f"{case}: exit took {wall:.2f} s after the last statement (limit {limit} s)"
