"""``torch-npu preflight SCRIPT [ARGS…]``: a bounded dry run on the virtual NPU, then a report.

The report says what would hurt on real hardware before any is rented: ops that fall back to
the CPU (calls, bytes moved, share of op time), torch_npu fused ops used, peak device memory
against the capacity, collectives called, (with ``--transfer``) the CUDA references that
``transfer_to_npu`` had to rewrite, and (with ``--stream-check``) the stream synchronisation
bugs the NPU sanitizer found. Exit code: 0 when the run ended normally or at its bound,
1 when the script failed.

The script runs in a child process (``_preflight_runner``). ``--seconds`` bounds the whole
command, from its start (this interpreter's own start-up and ``import torch`` before it are
not counted) to the printed report, the child's start-up included: the child stops the script a
report margin before the deadline, and is killed at the deadline if it has not finished (a
call that never returns to Python); the report printed is then the last one it wrote (step
counts at least), marked as cut short.
"""
import json
import os
import subprocess
import sys
import tempfile
import time

import click

# Share of --seconds kept for making the report after the script is stopped (bounded).
_REPORT_MARGIN = (0.1, 0.5, 10.0)  # share, minimum s, maximum s
# Kept for printing the report after the child is gone.
_PRINT_MARGIN_S = 0.1


def _mib(n):
    return f"{n / 2**20:.1f} MiB"


def text_report(r):
    lines = ["", "=" * 72, f"torch-npu preflight: {r['script']}", "=" * 72]
    how = {"completed": "ran to completion", "max-steps": f"stopped after {r['steps']} training steps (--steps)",
           "max-seconds": "stopped at the time limit (--seconds)", "error": "FAILED", "exit": "exited with an error",
           "crashed": "CRASHED"}
    seconds = "" if r.get("seconds") is None else f" in {r['seconds']:.2f} s"
    lines.append(f"run: {how.get(r['outcome'], r['outcome'])}{seconds}, {r['steps']} training step(s) "
                 f"({r['optimizer_steps']} optimizer step(s), {r['backward_calls']} backward pass(es))"
                 f"{', with transfer_to_npu' if r.get('transfer_to_npu') else ''}")
    if r.get("partial"):
        lines.append(f"partial report: {r['partial']}")
    if r.get("error"):
        lines.append("error:\n  " + r["error"].rstrip().replace("\n", "\n  "))
    lines.append("")
    if "fallback_ops" not in r:  # killed before the script stopped: only the step counts are known
        return "\n".join(lines)
    lines.append(f"CPU fallbacks on real hardware ({len(r['fallback_ops'])} op(s)):")
    for f in r["fallback_ops"]:
        share = "" if f["time_share"] is None else f", {f['time_share']:.1%} of op time ({f['time_ms']} ms)"
        lines.append(f"  {f['op']}: {f['calls']} call(s){share}, {f['bytes_to_cpu']} B to host, "
                     f"{f['bytes_to_npu']} B back")
    if not r["fallback_ops"]:
        lines.append("  none")
    lines.append(f"torch_npu fused ops ({len(r['fused_ops'])}):")
    lines += [f"  {f['op']}: {f['calls']} call(s)" for f in r["fused_ops"]] or ["  none"]
    lines.append("peak device memory:")
    for m in r["memory"]:
        verdict = "fits" if m["fits"] else "DOES NOT FIT"
        lines.append(f"  {m['device']} ({m['name']}): {_mib(m['peak_allocated_bytes'])} of "
                     f"{_mib(m['capacity_bytes'])} ({m['share']:.2%}), {verdict}")
    if not r["memory"]:
        lines.append("  no device memory used")
    lines.append(f"collectives ({len(r['collectives'])}):")
    lines += [f"  {c['op']}: {c['calls']} call(s)" for c in r["collectives"]] or ["  none"]
    if r["transfer_to_npu"]:
        lines.append(f"hidden CUDA references rewritten by transfer_to_npu ({len(r['cuda_references'])}):")
        lines += [f"  {c['site']}: {c['api']}({c['original']!s}) x{c['count']}" for c in r["cuda_references"]] \
            or ["  none"]
    if r.get("stream_check"):
        lines.append(f"stream check, NPU sanitizer ({len(r['stream_findings'])} finding(s)):")
        lines += [_finding_text(f) for f in r["stream_findings"]] or ["  none"]
    return "\n".join(lines)


def _finding_text(f):
    head = f"  {f['kind']} x{f['count']}: {f['site']} ({f['operator'].split('(')[0]}"
    if f["stream"] is not None:
        head += f", stream {f['stream']}"
    return (head + f")\n    against {f['other_site']} ({f['other_operator'].split('(')[0]}, "
            f"stream {f['other_stream']})")


@click.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--transfer", is_flag=True, help="Run under torch_npu.contrib.transfer_to_npu (unchanged CUDA code).")
@click.option("--steps", "max_steps", type=click.IntRange(min=1), default=20, show_default=True,
              help="Stop after this many training steps: iterations of the training loop, counted by "
                   "optimizer steps or by backward passes (loss.backward(), torch.autograd.grad), "
                   "whichever count is ahead, so a loop that updates its weights by hand is bounded "
                   "too. A script with neither is bounded by --seconds only.")
@click.option("--seconds", "max_seconds", type=click.FloatRange(min=0, min_open=True), default=120.0,
              show_default=True, help="Bound on the whole command, report included: the script is "
                                      "stopped before, and killed at, this many seconds.")
@click.option("--stream-check", is_flag=True,
              help="Run under the NPU stream sanitizer (as TORCH_NPU_SANITIZER=1) and list the stream "
                   "bugs it finds: unsynchronized accesses, missing record_stream, host reads of "
                   "non_blocking copies. The script goes on after each finding.")
@click.option("--no-time", is_flag=True, help="Do not profile op times (no fallback time share; lower overhead).")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True,
              help="Report format (json: the script's own output goes to stderr).")
@click.argument("script", type=click.Path(exists=True, dir_okay=False))
@click.argument("script_args", nargs=-1, type=click.UNPROCESSED)
@click.pass_context
def preflight(ctx, transfer, max_steps, max_seconds, stream_check, no_time, fmt, script, script_args):
    """Run SCRIPT on the virtual NPU for a bounded time and report what a port needs."""
    started = time.monotonic()
    deadline = started + max_seconds
    share, least, most = _REPORT_MARGIN
    margin = min(max(max_seconds * share, least), most)
    with tempfile.TemporaryDirectory(prefix="torch-npu-preflight-") as tmp:
        report_path = os.path.join(tmp, "report.json")
        spec = {"script": script, "args": list(script_args), "transfer": transfer, "max_steps": max_steps,
                "measure_time": not no_time, "report_path": report_path, "stream_check": stream_check,
                "seconds_left": deadline - margin - time.monotonic()}
        sys.stdout.flush()
        # In json mode stdout carries only the report: the script's output goes to stderr.
        child = subprocess.Popen([sys.executable, "-m", "torch_npu.cli._preflight_runner", json.dumps(spec)],
                                 stdout=sys.stderr.fileno() if fmt == "json" else None)
        killed = False
        try:
            child.wait(timeout=max(deadline - _PRINT_MARGIN_S - time.monotonic(), 0))
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
            killed = True
        except BaseException:
            child.kill()
            child.wait()
            raise
        report = _read_report(report_path)
    report = _settle(report, script, script_args, transfer, child.returncode, killed, max_seconds)
    report["wall_seconds"] = round(time.monotonic() - started, 3)
    if fmt == "json":
        click.echo(json.dumps(report, indent=2))
    else:
        click.echo(text_report(report))
    ctx.exit(1 if report["outcome"] in ("error", "exit", "crashed") else 0)


def _read_report(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _settle(report, script, script_args, transfer, returncode, killed, max_seconds):
    """The report to print: the child's last one, completed with how the child ended.

    The child writes its step counts while the script runs (``partial == "running"``), then
    the report without op times, then the full one; it may have been killed at any point.
    """
    started_script = report is not None
    if report is None:
        report = {"script": script, "args": list(script_args), "transfer_to_npu": transfer, "steps": 0,
                  "optimizer_steps": 0, "backward_calls": 0, "seconds": None, "error": None}
    finished_script = "outcome" in report
    if killed and not finished_script:
        report.update(outcome="max-seconds", partial=(
            f"the script did not stop before the {max_seconds:g} s limit ("
            + ("it was in a call that does not return to Python" if started_script
               else "still starting, or in a call that does not return to Python")
            + ") and was killed; only its step counts are known"))
    elif killed and report.get("partial"):
        report["partial"] = f"killed at the {max_seconds:g} s limit while computing op times; they are missing"
    # else killed after its last report was complete (in interpreter teardown): nothing is missing
    elif not finished_script or (returncode != 0 and report.get("partial")):
        report.update(outcome="crashed", error=f"the run ended with exit status {returncode}"
                      + (f" (signal {-returncode})" if returncode < 0 else "") + " before its report was complete")
    return report
