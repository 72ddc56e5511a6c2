"""Running a script in this process for a bounded time and measuring what a port needs to know.

Measured while the script runs:

- CPU fallbacks: ``torch_npu.emulator.fallback_report()`` (calls, bytes), with each op's
  self time from torch's own op profiler (``torch.autograd.profiler.profile``, CPU events)
  as a share of all op time;
- torch_npu fused ops: the ``torch_npu.<op>`` exports and ``torch.ops.npu.<op>`` packets are
  replaced by counting wrappers for the run (outermost calls only: an emulated op built from
  other npu ops counts once). Wrapping the ~400 Python names costs nothing per ATen op,
  unlike a dispatch mode that would see every op;
- fused optimizers: a global optimizer step hook (it also counts steps);
- collectives: the ``torch.distributed`` functions are wrapped for the run (the gradient
  all-reduce of DDP happens inside its C++ reducer and is not seen);
- peak memory per device, against the device capacity;
- with ``transfer_to_npu``: the CUDA references it rewrote, with their call sites;
- with ``stream_check``: the stream synchronisation bugs the NPU sanitizer finds
  (``torch_npu.npu._sanitizer`` in report mode: the script goes on after each finding),
  grouped by kind and source lines.

Bounds: a step limit and a time limit. Steps are iterations of the training loop: optimizer
steps (the hook) or backward passes (``Tensor.backward`` / ``torch.autograd.backward`` /
``torch.autograd.grad``), whichever count is ahead, so a loop that updates its weights by hand
is bounded too. The time limit is a deadline (``SIGALRM``). Reaching either raises
``PreflightStop`` inside the script, which unwinds it; the report is made afterwards either way.

Run as ``python -m torch_npu.cli._preflight_runner SPEC`` (what ``torch-npu preflight`` does),
the script runs in a child process that writes its report to a file, in two passes: first
without the op-time shares (quick), then with them; and, while the script runs, its step
counts every 0.2 s. The ``preflight`` command kills the child at the deadline if it has not
finished, and prints the last report it wrote.
"""
import contextlib
import json
import os
import runpy
import signal
import sys
import threading
import time
import traceback

COLLECTIVES = (
    "all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object", "all_to_all", "all_to_all_single",
    "barrier", "batch_isend_irecv", "broadcast", "broadcast_object_list", "gather", "gather_object", "irecv",
    "isend", "recv", "reduce", "reduce_scatter", "reduce_scatter_tensor", "scatter", "scatter_object_list", "send",
    "monitored_barrier", "_broadcast_coalesced",
)


class PreflightStop(BaseException):
    """Raised inside the script when its step or time budget is spent (not an ``Exception``,
    so ``except Exception`` in the script does not swallow it)."""

    def __init__(self, reason):
        super().__init__(reason)
        self.reason = reason


class _Counter:
    def __init__(self):
        self.counts = {}
        self.local = threading.local()

    def wrap(self, fn, name):
        counter = self

        class Counted:
            """Calls ``fn`` and counts outermost calls; other attributes (``.default``,
            overloads, schema) come from ``fn``."""

            def __call__(self, *args, **kwargs):
                depth = getattr(counter.local, "depth", 0)
                if depth == 0:
                    counter.counts[name] = counter.counts.get(name, 0) + 1
                counter.local.depth = depth + 1
                try:
                    return fn(*args, **kwargs)
                finally:
                    counter.local.depth = depth

            def __getattr__(self, attr):
                return getattr(fn, attr)

            def __repr__(self):
                return repr(fn)

        return Counted()


class _Patches:
    """setattr that remembers the old values, undone in reverse order."""

    def __init__(self):
        self.saved = []

    def set(self, owner, name, value):
        self.saved.append((owner, name, owner.__dict__.get(name, _MISSING) if hasattr(owner, "__dict__")
                           else getattr(owner, name)))
        setattr(owner, name, value)

    def undo(self):
        for owner, name, old in reversed(self.saved):
            if old is _MISSING:
                try:
                    delattr(owner, name)
                except AttributeError:
                    pass
            else:
                setattr(owner, name, old)
        self.saved.clear()


_MISSING = object()


def _op_base(op):
    """``aten::fmax.out`` -> ``aten::fmax`` (the profiler's event name)."""
    ns, _, rest = op.partition("::")
    return f"{ns}::{rest.split('.')[0]}"


def _write_json(path, obj):
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f)
    os.replace(tmp, path)


class _ProgressWriter(threading.Thread):
    """Writes ``snapshot()`` to ``path`` every 0.2 s while it changes, so that the step counts
    survive a kill of this process (also while the script is in a call that holds on)."""

    def __init__(self, path, snapshot):
        super().__init__(name="preflight-progress", daemon=True)
        self.path, self.snapshot, self.done = path, snapshot, threading.Event()
        self.start()

    def run(self):
        last = None
        while not self.done.wait(0.2):
            now = self.snapshot()
            if now != last:
                _write_json(self.path, now)
                last = now

    def stop(self):
        self.done.set()
        self.join()


_FINDING_KINDS = {"UnsynchronizedAccessError": "unsynchronized access",
                  "MissingRecordStreamError": "missing record_stream",
                  "UnsynchronizedHostAccessError": "host access before synchronize"}
_MAX_FINDINGS = 50


def _user_site(stack):
    """``file:line`` of the innermost frame outside torch, torch_npu and the standard
    library (the user's code that made the access), else of the innermost frame."""
    import sysconfig
    import torch
    import torch_npu
    skip = tuple(os.path.dirname(m.__file__) + os.sep for m in (torch, torch_npu)) + (
        sysconfig.get_paths()["stdlib"] + os.sep,)
    frames = [f for f in stack if f.filename and not f.filename.startswith("<")]
    for frame in reversed(frames):
        if not os.path.abspath(frame.filename).startswith(skip):
            return f"{frame.filename}:{frame.lineno}"
    return f"{frames[-1].filename}:{frames[-1].lineno}" if frames else "?"


def _stream_findings(errors, record_stream_errors):
    """The sanitizer's errors as report entries, one per kind and source lines, with counts."""
    found = {}
    for err in list(errors) + list(record_stream_errors):
        kind = _FINDING_KINDS.get(type(err).__name__, type(err).__name__)
        if kind == "unsynchronized access":
            now, before = err.current_access, err.previous_access
            entry = {"kind": kind, "site": _user_site(now.stack_trace), "operator": now.operator,
                     "access": str(now.type), "stream": now.stream,
                     "other_site": _user_site(before.stack_trace), "other_operator": before.operator,
                     "other_access": str(before.type), "other_stream": before.stream}
        elif kind == "missing record_stream":
            entry = {"kind": kind, "site": _user_site(err.usage.stack_trace), "operator": err.usage.operator,
                     "stream": err.usage_stream,
                     "other_site": _user_site(err.allocation_stack_trace) if err.allocation_stack_trace else "?",
                     "other_operator": "allocation", "other_stream": err.allocation_stream}
        else:
            entry = {"kind": kind, "site": _user_site(err.stack_trace), "operator": err.operator, "stream": None,
                     "other_site": _user_site(err.copy.stack_trace), "other_operator": err.copy.operator,
                     "other_stream": err.copy.stream}
        key = (entry["kind"], entry["site"], entry["other_site"], entry["operator"], entry["other_operator"])
        if key in found:
            found[key]["count"] += 1
        elif len(found) < _MAX_FINDINGS:
            found[key] = dict(entry, count=1)
    return list(found.values())


def _start_stream_check():
    """The NPU sanitizer in report mode (record_stream check on): findings are kept, not raised."""
    from torch_npu.npu import _sanitizer
    san = _sanitizer.npu_sanitizer
    san.disable()
    san.enable()
    san.check_record_stream = san.event_handler.check_record_stream = True
    san.dispatch.raise_errors = False
    san.event_handler.print_errors = False
    return san


def run(script, args, *, transfer=False, max_steps=None, max_seconds=None, measure_time=True, deadline=None,
        report_path=None, stream_check=False):
    """Run ``script`` with ``args`` and return the report (a dict).

    ``deadline`` (a ``time.monotonic()`` value) stops the script like ``max_seconds`` (which
    counts from now); the earlier of the two applies. With ``report_path``, the step counts
    are written there while the script runs and the report (first without the op-time
    shares) as soon as it is known.
    """
    import torch
    import torch_npu

    torch_npu.emulator.reset_fallback_report()

    patches = _Patches()
    fused = _Counter()
    for name, value in list(vars(torch_npu).items()):
        if isinstance(value, torch._ops.OpOverloadPacket):
            counted = fused.wrap(value, f"torch_npu.{name}")
            patches.set(torch_npu, name, counted)
            patches.set(torch.ops.npu, name, counted)
    collectives = _Counter()
    if torch.distributed.is_available():
        for name in COLLECTIVES:
            fn = getattr(torch.distributed, name, None)
            if fn is not None:
                patches.set(torch.distributed, name, collectives.wrap(fn, name.lstrip("_")))

    state = {"optimizer_steps": 0, "backward_calls": 0, "optimizers": {}}
    sanitizer = _start_stream_check() if stream_check else None
    started = time.monotonic()
    if max_seconds:
        deadline = min(deadline, started + max_seconds) if deadline is not None else started + max_seconds

    def counts():
        return {"steps": max(state["optimizer_steps"], state["backward_calls"]),
                "optimizer_steps": state["optimizer_steps"], "backward_calls": state["backward_calls"]}

    progress_writer = _ProgressWriter(report_path, lambda: dict(counts(), script=script, partial="running")) \
        if report_path is not None else None

    def on_step(optimizer, _args, _kwargs):
        state["optimizer_steps"] += 1
        cls = type(optimizer)
        if cls.__module__.startswith("torch_npu."):
            key = f"{cls.__module__.rsplit('.', 1)[0]}.{cls.__name__}.step"
            state["optimizers"][key] = state["optimizers"].get(key, 0) + 1
        if max_steps is not None and state["optimizer_steps"] >= max_steps:
            raise PreflightStop("max-steps")

    from torch.optim.optimizer import register_optimizer_step_post_hook
    hook = register_optimizer_step_post_hook(on_step)

    engine_run_backward = torch.autograd._engine_run_backward

    def counted_backward(*b_args, **b_kwargs):
        # The (max_steps + 1)-th backward pass starts an iteration beyond the bound.
        if max_steps is not None and state["backward_calls"] >= max_steps:
            raise PreflightStop("max-steps")
        result = engine_run_backward(*b_args, **b_kwargs)
        state["backward_calls"] += 1
        return result

    patches.set(torch.autograd, "_engine_run_backward", counted_backward)

    def on_alarm(_signum, _frame):
        raise PreflightStop("max-seconds")

    old_alarm = None
    if deadline is not None:
        old_alarm = signal.signal(signal.SIGALRM, on_alarm)
        # A deadline already passed (a slow start) still lets the script begin, for an instant.
        signal.setitimer(signal.ITIMER_REAL, max(deadline - time.monotonic(), 0.001))

    outcome, error = "completed", None
    profiler = torch.autograd.profiler.profile(use_cpu=True) if measure_time else contextlib.nullcontext()
    old_argv, old_path0 = sys.argv, sys.path[0]
    sys.argv = [script] + list(args)
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    # Left running until the first report is written: stopping it (collecting its events)
    # takes long after a long run.
    profiler.__enter__()
    profiling = [True]

    def stop_profiler():
        if profiling[0]:
            profiling[0] = False
            profiler.__exit__(None, None, None)

    try:
        try:
            if transfer:
                # After the profiler started: transfer_to_npu swaps torch.profiler's
                # activity enum for the NPU profiler's, which torch's own profiler rejects.
                import torch_npu.contrib.transfer_to_npu  # noqa: F401
                from torch_npu.contrib._transfer import rewrite
                rewrite.reset_records()
            runpy.run_path(script, run_name="__main__")
        finally:
            if deadline is not None:
                signal.setitimer(signal.ITIMER_REAL, 0)
    except PreflightStop as stop:
        outcome = stop.reason
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        outcome = "completed" if code == 0 else "exit"
        if code:
            error = f"SystemExit({e.code!r})"
    except Exception:
        outcome = "error"
        error = traceback.format_exc(limit=-8)
    finally:
        if deadline is not None:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old_alarm)
        sys.argv, sys.path[0] = old_argv, old_path0
        hook.remove()
        patches.undo()
        stream_errors = record_stream_errors = ()
        if sanitizer is not None and sanitizer.event_handler is not None:
            stream_errors = sanitizer.dispatch.collected_errors
            record_stream_errors = sanitizer.event_handler.record_stream_errors
            sanitizer.disable()
        if progress_writer is not None:
            progress_writer.stop()
    seconds = time.monotonic() - started
    try:
        memory = []
        for d in range(torch.npu.device_count()):
            peak = torch.npu.max_memory_allocated(d)
            if peak:
                props = torch.npu.get_device_properties(d)
                memory.append({"device": f"npu:{d}", "name": props.name, "peak_allocated_bytes": peak,
                               "capacity_bytes": props.total_memory,
                               "share": round(peak / props.total_memory, 6), "fits": peak <= props.total_memory})

        cuda_references = []
        if transfer:
            from torch_npu.contrib._transfer import rewrite
            cuda_references = rewrite.records()

        fused_ops = [{"op": k, "calls": v} for k, v in sorted(fused.counts.items())]
        fused_ops += [{"op": k, "calls": v} for k, v in sorted(state["optimizers"].items())]
        fallback_counts = torch_npu.emulator.fallback_report()
        report = {
            "script": script,
            "args": list(args),
            "transfer_to_npu": transfer,
            "outcome": outcome,
            "error": error,
            **counts(),
            "seconds": round(seconds, 3),
            "op_time_ms": None,
            "fallback_ops": [dict(entry, time_ms=None, time_share=None) for entry in fallback_counts],
            "fused_ops": fused_ops,
            "memory": memory,
            "collectives": [{"op": k, "calls": v} for k, v in sorted(collectives.counts.items())],
            "cuda_references": cuda_references,
            "stream_check": stream_check,
            "stream_findings": _stream_findings(stream_errors, record_stream_errors) if stream_check else [],
            "partial": "op times not computed yet" if measure_time else None,
        }
        if report_path is not None:
            _write_json(report_path, report)
    finally:
        stop_profiler()
    if not measure_time or profiler.function_events is None:
        report["partial"] = None
        return report

    # Aggregating the profiler's events takes long after a long run: hence the report above.
    op_times, total_us = {}, 0.0
    for event in profiler.key_averages():
        op_times[event.key] = op_times.get(event.key, 0.0) + event.self_cpu_time_total
        total_us += event.self_cpu_time_total
    report["fallback_ops"] = []
    for entry in fallback_counts:
        us = op_times.get(_op_base(entry["op"]))
        report["fallback_ops"].append(dict(entry, time_ms=None if us is None else round(us / 1000, 3),
                                           time_share=None if us is None or not total_us else round(us / total_us, 4)))
    report["op_time_ms"] = round(total_us / 1000, 3)
    report["partial"] = None
    if report_path is not None:
        _write_json(report_path, report)
    return report


def main(argv=None):
    """Child-process entry: ``SPEC`` is the JSON of ``run``'s keyword arguments plus ``script``
    and ``args``; ``deadline`` is given as seconds from now (the parent's clock is not ours)."""
    spec = json.loads((argv or sys.argv[1:])[0])
    seconds_left = spec.pop("seconds_left", None)
    deadline = None if seconds_left is None else time.monotonic() + seconds_left
    run(spec.pop("script"), spec.pop("args"), deadline=deadline, **spec)
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
