"""The summary people read first: top ops by device time, CPU-fallback ops and
their cost, device idle and input-wait share per step, peak memory per device.
Written as summary.txt and summary.html beside the CSVs."""
import html
import os
from collections import defaultdict

from . import _intervals
from ._csv_views import step_times

TOP_OPS = 15
INPUT_BOUND_SHARE = 0.3     # above this share of step time waiting for input: data-loading bottleneck


def compute(data) -> dict:
    by_op = defaultdict(lambda: [0, 0])
    fallback = defaultdict(lambda: [0, 0, 0])
    for k in data.kernels:
        entry = by_op[k.name]
        entry[0] += 1
        entry[1] += k.dur_ns
        if k.kind == "fallback":
            f = fallback[k.name]
            f[0] += 1
            f[1] += k.dur_ns
            f[2] += k.bytes
    device_total = sum(v[1] for v in by_op.values()) or 1
    top = [{"name": n, "calls": c, "device_us": t / 1000, "share": t / device_total}
           for n, (c, t) in sorted(by_op.items(), key=lambda kv: -kv[1][1])[:TOP_OPS]]
    fallbacks = [{"name": n, "calls": c, "device_us": t / 1000, "bytes": b}
                 for n, (c, t, b) in sorted(fallback.items(), key=lambda kv: -kv[1][1])]
    steps = []
    waits = [(a.start_ns, a.end_ns) for a in data.input_waits]
    last_step = data.steps[-1].id if data.steps else None
    for device in sorted({k.device for k in data.kernels}) or [0]:
        for t in step_times(data, device):
            span = t["end_ns"] - t["start_ns"]
            # the step stop() cut short right after the last step() call holds no work
            if span <= 0 or (t["step"] == last_step and t["free"] == span and len(data.steps) > 1):
                continue
            wait = _intervals.total(_intervals.clip(waits, t["start_ns"], t["end_ns"]))
            steps.append({"device": device, "step": t["step"], "step_ms": span / 1e6,
                          "busy_ms": (span - t["free"]) / 1e6, "idle_ratio": t["free"] / span,
                          "input_wait_share": wait / span})
    peak = {}
    for m in data.memory:
        peak[m["device"]] = max(peak.get(m["device"], 0), m["allocated"])
    return {"top_ops": top, "fallbacks": fallbacks, "steps": steps, "peak_memory": peak,
            "memory_recorded": bool(data.config.get("common_config", {}).get("profile_memory"))}


def _verdicts(s) -> list:
    lines = []
    input_bound = [st for st in s["steps"] if st["input_wait_share"] > INPUT_BOUND_SHARE]
    if input_bound:
        worst = max(input_bound, key=lambda st: st["input_wait_share"])
        lines.append(f"Data-loading bottleneck: {len(input_bound)} step(s) spend more than "
                     f"{INPUT_BOUND_SHARE:.0%} of their time waiting for input (worst: step {worst['step']}, "
                     f"{worst['input_wait_share']:.0%}); the device is idle meanwhile. Use more DataLoader "
                     "workers, pin_memory, or prefetching.")
    if s["fallbacks"]:
        cost = sum(f["device_us"] for f in s["fallbacks"]) / 1000
        lines.append(f"{len(s['fallbacks'])} op type(s) fell back to the CPU ({cost:.3f} ms in total, plus "
                     "host<->device copies); on hardware they run on the host CPU.")
    return lines


def render_text(s) -> str:
    out = ["torch_npu profiler summary", "=========================="]
    out += _verdicts(s) + [""]
    out.append(f"Top ops by device time (first {TOP_OPS})")
    out.append(f"{'op':<48} {'calls':>7} {'device us':>12} {'share':>7}")
    for op in s["top_ops"]:
        out.append(f"{op['name']:<48} {op['calls']:>7} {op['device_us']:>12.1f} {op['share']:>7.1%}")
    out.append("")
    out.append("Ops that fell back to the CPU")
    if s["fallbacks"]:
        out.append(f"{'op':<48} {'calls':>7} {'device us':>12} {'bytes copied':>14}")
        for f in s["fallbacks"]:
            out.append(f"{f['name']:<48} {f['calls']:>7} {f['device_us']:>12.1f} {f['bytes']:>14}")
    else:
        out.append("none")
    out.append("")
    out.append("Steps: device idle ratio and share of step time waiting for input")
    out.append(f"{'device':>6} {'step':>6} {'step ms':>10} {'busy ms':>10} {'idle':>7} {'input wait':>11}")
    for st in s["steps"]:
        step = "-" if st["step"] is None else st["step"]
        out.append(f"{st['device']:>6} {step:>6} {st['step_ms']:>10.3f} {st['busy_ms']:>10.3f} "
                   f"{st['idle_ratio']:>7.1%} {st['input_wait_share']:>11.1%}")
    out.append("")
    out.append("Peak memory allocated per device")
    if s["peak_memory"]:
        for device, peak in sorted(s["peak_memory"].items()):
            out.append(f"npu:{device}  {peak / 2**20:.3f} MB")
    else:
        out.append("not recorded (profile with profile_memory=True)" if not s["memory_recorded"]
                   else "no npu allocations recorded")
    return "\n".join(out) + "\n"


def render_html(s) -> str:
    def table(headers, rows):
        head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
        body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in r) + "</tr>" for r in rows)
        return f"<table border=1 cellspacing=0 cellpadding=3><tr>{head}</tr>{body}</table>"

    parts = ["<html><head><meta charset='utf-8'><title>torch_npu profiler summary</title></head><body>",
             "<h1>torch_npu profiler summary</h1>"]
    parts += [f"<p><b>{html.escape(v)}</b></p>" for v in _verdicts(s)]
    parts.append("<h2>Top ops by device time</h2>")
    parts.append(table(["op", "calls", "device us", "share"],
                       [[o["name"], o["calls"], f"{o['device_us']:.1f}", f"{o['share']:.1%}"] for o in s["top_ops"]]))
    parts.append("<h2>Ops that fell back to the CPU</h2>")
    parts.append(table(["op", "calls", "device us", "bytes copied"],
                       [[f["name"], f["calls"], f"{f['device_us']:.1f}", f["bytes"]] for f in s["fallbacks"]]))
    parts.append("<h2>Steps</h2>")
    parts.append(table(["device", "step", "step ms", "busy ms", "idle", "input wait"],
                       [[st["device"], st["step"], f"{st['step_ms']:.3f}", f"{st['busy_ms']:.3f}",
                         f"{st['idle_ratio']:.1%}", f"{st['input_wait_share']:.1%}"] for st in s["steps"]]))
    parts.append("<h2>Peak memory allocated</h2>")
    parts.append(table(["device", "MB"], [[f"npu:{d}", f"{p / 2**20:.3f}"]
                                          for d, p in sorted(s["peak_memory"].items())]))
    parts.append("</body></html>")
    return "\n".join(parts)


def write(data, out_dir) -> str:
    s = compute(data)
    text = render_text(s)
    with open(os.path.join(out_dir, "summary.txt"), "w", encoding="utf-8") as f:
        f.write(text)
    with open(os.path.join(out_dir, "summary.html"), "w", encoding="utf-8") as f:
        f.write(render_html(s))
    return text
