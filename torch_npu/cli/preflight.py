"""``torch-npu preflight SCRIPT [ARGS…]``: a bounded dry run on the virtual NPU, then a report.

The report says what would hurt on real hardware before any is rented: ops that fall back to
the CPU (calls, bytes moved, share of op time), torch_npu fused ops used, peak device memory
against the capacity, collectives called, and (with ``--transfer``) the CUDA references that
``transfer_to_npu`` had to rewrite. Exit code: 0 when the run ended normally or at its bound,
1 when the script failed.
"""
import contextlib
import json
import sys

import click


def _mib(n):
    return f"{n / 2**20:.1f} MiB"


def text_report(r):
    lines = ["", "=" * 72, f"torch-npu preflight: {r['script']}", "=" * 72]
    how = {"completed": "ran to completion", "max-steps": f"stopped after {r['steps']} optimizer steps (--steps)",
           "max-seconds": "stopped at the time limit (--seconds)", "error": "FAILED", "exit": "exited with an error"}
    lines.append(f"run: {how.get(r['outcome'], r['outcome'])} in {r['seconds']:.2f} s, {r['steps']} optimizer "
                 f"step(s){', with transfer_to_npu' if r['transfer_to_npu'] else ''}")
    if r["error"]:
        lines.append("error:\n  " + r["error"].rstrip().replace("\n", "\n  "))
    lines.append("")
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
    return "\n".join(lines)


@click.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--transfer", is_flag=True, help="Run under torch_npu.contrib.transfer_to_npu (unchanged CUDA code).")
@click.option("--steps", "max_steps", type=click.IntRange(min=1), default=20, show_default=True,
              help="Stop after this many optimizer steps.")
@click.option("--seconds", "max_seconds", type=click.FloatRange(min=0, min_open=True), default=120.0,
              show_default=True, help="Stop after this many seconds.")
@click.option("--no-time", is_flag=True, help="Do not profile op times (no fallback time share; lower overhead).")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True,
              help="Report format (json: the script's own output goes to stderr).")
@click.argument("script", type=click.Path(exists=True, dir_okay=False))
@click.argument("script_args", nargs=-1, type=click.UNPROCESSED)
@click.pass_context
def preflight(ctx, transfer, max_steps, max_seconds, no_time, fmt, script, script_args):
    """Run SCRIPT on the virtual NPU for a bounded time and report what a port needs."""
    from . import _preflight_runner
    # In json mode stdout carries only the report.
    redirect = contextlib.redirect_stdout(sys.stderr) if fmt == "json" else contextlib.nullcontext()
    with redirect:
        report = _preflight_runner.run(script, script_args, transfer=transfer, max_steps=max_steps,
                                       max_seconds=max_seconds, measure_time=not no_time)
    sys.stdout.flush()
    if fmt == "json":
        click.echo(json.dumps(report, indent=2))
    else:
        click.echo(text_report(report))
    ctx.exit(1 if report["outcome"] in ("error", "exit") else 0)
