"""The CSV files of ASCEND_PROFILER_OUTPUT/, with torch_npu 2.13.0's headers.

Times are microseconds. Like torch_npu, absolute timestamps are written as
strings ending in a tab so spreadsheet tools keep every digit."""
import bisect
import csv
import os
from collections import defaultdict

from . import _intervals

KERNEL_BASE_HEADERS = ["Device_id", "Name", "Type", "Accelerator Core", "Start Time(us)", "Duration(us)",
                       "Wait Time(us)", "Block Num"]
KERNEL_EXTRA_HEADERS = ["Mix Block Num", "Input Shapes", "Input Data Types", "Input Formats", "Output Shapes",
                        "Output Data Types", "Output Formats"]
OPERATOR_HEADERS = ["Name", "Input Shapes", "Call Stack", "Host Self Duration(us)", "Host Total Duration(us)",
                    "Device Self Duration(us)", "Device Total Duration(us)", "Device Self Duration With AICore(us)",
                    "Device Total Duration With AICore(us)"]
OP_STATISTIC_HEADERS = ["OP Type", "Core Type", "Count", "Total Time(us)", "Min Time(us)", "Avg Time(us)",
                        "Max Time(us)", "Ratio(%)"]
STEP_TRACE_HEADERS = ["Device_id", "Step", "Computing", "Communication(Not Overlapped)", "Overlapped",
                      "Communication", "Free", "Stage", "Bubble", "Communication(Not Overlapped and Exclude Receive)",
                      "Preparing"]
MEMORY_RECORD_HEADERS = ["Component", "Timestamp(us)", "Total Allocated(MB)", "Total Reserved(MB)",
                         "Total Active(MB)", "Stream Ptr", "Device Type"]
OPERATOR_MEMORY_HEADERS = ["Name", "Size(KB)", "Allocation Time(us)", "Release Time(us)", "Active Release Time(us)",
                           "Duration(us)", "Active Duration(us)", "Allocation Total Allocated(MB)",
                           "Allocation Total Reserved(MB)", "Allocation Total Active(MB)",
                           "Release Total Allocated(MB)", "Release Total Reserved(MB)", "Release Total Active(MB)",
                           "Stream Ptr", "Device Type"]
NPU_MODULE_MEM_HEADERS = ["Device_id", "Component", "Timestamp(us)", "Total Reserved(MB)", "Device"]

# What runs where: native kernels on the AI Core, collectives on HCCL; ops the
# emulated CPU fallback ran would run on the host CPU on hardware.
CORE_TYPE = {"kernel": "AI_CORE", "communication": "HCCL", "fallback": "CPU_FALLBACK"}


def us(ns) -> float:
    return round(ns / 1000.0, 3)


def timestamp_us(ns) -> str:
    return f"{ns // 1000}.{ns % 1000:03d}\t"


def _write(path, headers, rows):
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(headers)
        writer.writerows(rows)


def _shapes(inputs):
    return ";".join(",".join(str(d) for d in shape) for shape, _ in inputs)


def write_kernel_details(data, out_dir, all_headers: bool):
    headers = KERNEL_BASE_HEADERS + (KERNEL_EXTRA_HEADERS if all_headers else [])
    if data.steps:
        headers = ["Step Id"] + headers
    last_end = {}
    rows = []
    for k in data.kernels:
        lane = (k.device, k.stream)
        wait = max(0, k.start_ns - last_end[lane]) if lane in last_end else 0
        last_end[lane] = max(k.end_ns, last_end.get(lane, 0))
        row = [k.device, k.name, k.op_type, CORE_TYPE.get(k.kind, k.kind), timestamp_us(k.start_ns),
               us(k.dur_ns), us(wait), 0]
        if all_headers:
            inputs = k.op.tensor_inputs() if k.op else []
            row += ["N/A", _shapes(inputs), ";".join(d for _, d in inputs),
                    ";".join("ND" for _ in inputs), "N/A", "N/A", "N/A"]
        if data.steps:
            row = [data.step_of(k.start_ns)] + row
        rows.append(row)
    _write(os.path.join(out_dir, "kernel_details.csv"), headers, rows)


def write_operator_details(data, out_dir):
    rows = []
    for op in data.ops:
        children_ns = sum(c.dur_ns for c in op.children)
        device_self = sum(k.dur_ns for k in op.kernels)
        device_self_aic = sum(k.dur_ns for k in op.kernels if k.kind == "kernel")
        device_total = device_self
        device_total_aic = device_self_aic
        stack = list(op.children)
        while stack:
            child = stack.pop()
            device_total += sum(k.dur_ns for k in child.kernels)
            device_total_aic += sum(k.dur_ns for k in child.kernels if k.kind == "kernel")
            stack.extend(child.children)
        dims = op.args.get("Input Dims") or []
        shapes = ";".join(",".join(str(d) for d in shape) for shape in dims) if any(dims) else ""
        call_stack = op.args.get("Call stack", "")
        rows.append([op.name, shapes, call_stack, us(op.dur_ns - children_ns), us(op.dur_ns),
                     us(device_self), us(device_total), us(device_self_aic), us(device_total_aic)])
    _write(os.path.join(out_dir, "operator_details.csv"), OPERATOR_HEADERS, rows)


def write_op_statistic(data, out_dir):
    groups = defaultdict(list)
    for k in data.kernels:
        groups[(k.op_type, CORE_TYPE.get(k.kind, k.kind))].append(k.dur_ns)
    grand = sum(sum(v) for v in groups.values()) or 1
    rows = []
    for (op_type, core), durs in sorted(groups.items(), key=lambda kv: -sum(kv[1])):
        total = sum(durs)
        rows.append([op_type, core, len(durs), us(total), us(min(durs)), us(total / len(durs)), us(max(durs)),
                     round(100.0 * total / grand, 2)])
    _write(os.path.join(out_dir, "op_statistic.csv"), OP_STATISTIC_HEADERS, rows)


def step_times(data, device):
    """Per step on one device: the step_trace_time.csv quantities, in ns.

    Computing = union of kernel time; Communication = union of collective
    time; Free = step time with neither; Preparing = from the step's start to
    its first device task; Stage = device end-to-end span (no receive bubble
    without pipeline parallelism, so Bubble = 0)."""
    kernels = [k for k in data.kernels if k.device == device]
    steps = data.steps or [None]
    result = []
    for step in steps:
        lo, hi = (step.start_ns, step.end_ns) if step else data.window()
        compute = _intervals.clip([(k.start_ns, k.end_ns) for k in kernels if k.kind != "communication"], lo, hi)
        comm = _intervals.clip([(k.start_ns, k.end_ns) for k in kernels if k.kind == "communication"], lo, hi)
        busy = _intervals.union(compute + comm)
        computing = _intervals.total(compute)
        communication = _intervals.total(comm)
        not_overlapped = _intervals.total(_intervals.subtract(comm, compute))
        first_task = busy[0][0] if busy else hi
        stage = (busy[-1][1] - busy[0][0]) if busy else 0
        result.append({"step": step.id if step else None, "start_ns": lo, "end_ns": hi,
                       "computing": computing, "communication": communication,
                       "not_overlapped": not_overlapped, "overlapped": communication - not_overlapped,
                       "free": (hi - lo) - _intervals.total(busy), "stage": stage, "bubble": 0,
                       "preparing": first_task - lo})
    return result


def write_step_trace_time(data, out_dir):
    rows = []
    for device in sorted({k.device for k in data.kernels}):
        for t in step_times(data, device):
            rows.append([device, "" if t["step"] is None else t["step"], us(t["computing"]),
                         us(t["not_overlapped"]), us(t["overlapped"]), us(t["communication"]), us(t["free"]),
                         us(t["stage"]), us(t["bubble"]), us(t["not_overlapped"] - t["bubble"]),
                         us(t["preparing"])])
    _write(os.path.join(out_dir, "step_trace_time.csv"), STEP_TRACE_HEADERS, rows)


def _mb(nbytes) -> float:
    return round(nbytes / (1024 * 1024), 6)


def write_memory_views(data, out_dir):
    """memory_record.csv (the allocator's totals over time), operator_memory.csv
    (each allocation attributed to the host op that made it) and
    npu_module_mem.csv (reserved memory per device)."""
    records = []
    module_rows = []
    for m in sorted(data.memory, key=lambda m: m["ts_ns"]):
        device_type = f"NPU:{m['device']}"
        records.append(["PTA", timestamp_us(m["ts_ns"]), _mb(m["allocated"]), _mb(m["reserved"]),
                        _mb(m["allocated"]), 0, device_type])
        module_rows.append([m["device"], "PTA", timestamp_us(m["ts_ns"]), _mb(m["reserved"]), device_type])
    _write(os.path.join(out_dir, "memory_record.csv"), MEMORY_RECORD_HEADERS, records)
    _write(os.path.join(out_dir, "npu_module_mem.csv"), NPU_MODULE_MEM_HEADERS, module_rows)
    _write(os.path.join(out_dir, "operator_memory.csv"), OPERATOR_MEMORY_HEADERS, _operator_memory_rows(data))


def _operator_memory_rows(data):
    """Pair allocations (Bytes > 0) with their frees (Bytes < 0) by address."""
    ops_by_start = sorted(data.ops, key=lambda o: o.start_ns)
    starts = [o.start_ns for o in ops_by_start]
    open_allocs = {}
    rows = []
    for m in sorted(data.memory, key=lambda m: m["ts_ns"]):
        addr = m.get("addr")
        if m["bytes"] > 0:
            open_allocs[(m["device"], addr)] = m
        elif (m["device"], addr) in open_allocs:
            alloc = open_allocs.pop((m["device"], addr))
            owner = _innermost_op_at(ops_by_start, starts, alloc["ts_ns"])
            rows.append(_op_mem_row(owner, alloc, m))
    for alloc in open_allocs.values():
        rows.append(_op_mem_row(_innermost_op_at(ops_by_start, starts, alloc["ts_ns"]), alloc, None))
    return rows


def _op_mem_row(owner, alloc, release):
    dur = us(release["ts_ns"] - alloc["ts_ns"]) if release else ""
    rel_ts = timestamp_us(release["ts_ns"]) if release else ""
    return [owner.name if owner else "", round(alloc["bytes"] / 1024, 3), timestamp_us(alloc["ts_ns"]), rel_ts,
            rel_ts, dur, dur, _mb(alloc["allocated"]), _mb(alloc["reserved"]), _mb(alloc["allocated"]),
            _mb(release["allocated"]) if release else "", _mb(release["reserved"]) if release else "",
            _mb(release["allocated"]) if release else "", 0, f"NPU:{alloc['device']}"]


def _innermost_op_at(ops_by_start, starts, ts_ns):
    """The latest-starting op at or before ts, or its nearest ancestor that contains ts."""
    i = bisect.bisect_right(starts, ts_ns) - 1
    op = ops_by_start[i] if i >= 0 else None
    while op is not None and op.end_ns < ts_ns:
        op = op.parent
    return op
