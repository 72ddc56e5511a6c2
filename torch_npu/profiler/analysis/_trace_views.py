"""trace_view.json (Ascend layout: a JSON list of Chrome trace events with a
"Python" host process and per-device "Ascend Hardware" / "Overlap Analysis"
processes labelled "NPU <id>") and the ``*.pt.trace.json`` for TensorBoard's
torch-tb-profiler (Kineto's own trace plus the device kernels)."""
import json
import os

from . import _intervals
from ._csv_views import CORE_TYPE
from ._profile_data import MSTX_PREFIX

HOST_SORT_INDEX = 0
MSTX_MARK = "mark::"
_PID_OFFSET = 10
_INDEX_OFFSET = 5


def _device_pid(host_pid: int, sort_index: int, device: int) -> int:
    """One pid per (device, process kind), derived from the host pid as torch_npu does."""
    return (host_pid << _PID_OFFSET) | (sort_index << _INDEX_OFFSET) | device


def _meta(pid, tid, name, value):
    key = {"process_name": "name", "process_labels": "labels", "process_sort_index": "sort_index",
           "thread_name": "name", "thread_sort_index": "sort_index"}[name]
    return {"ph": "M", "name": name, "pid": pid, "tid": tid, "args": {key: value}}


def _x(name, pid, tid, start_ns, end_ns, cat, args=None):
    return {"ph": "X", "name": name, "pid": pid, "tid": tid, "ts": start_ns / 1000.0,
            "dur": (end_ns - start_ns) / 1000.0, "cat": cat, "args": args or {}}


def kernel_args(kernel) -> dict:
    args = {"Task Type": CORE_TYPE.get(kernel.kind, kernel.kind), "Stream Id": kernel.stream,
            "Device Id": kernel.device}
    if kernel.op is not None:
        inputs = kernel.op.tensor_inputs()
        args["Input Shapes"] = ";".join(",".join(str(d) for d in s) for s, _ in inputs)
        args["Input Data Types"] = ";".join(d for _, d in inputs)
    if kernel.kind == "fallback":
        args["CPU fallback"] = True
        args["Bytes copied host<->device"] = kernel.bytes
    elif kernel.kind == "communication":
        args["Data Size(B)"] = kernel.bytes
    return args


def build_trace_view(data) -> list:
    host_pid = data.host_pid or os.getpid()
    with_host = "CPU" in data.activities
    mstx_on = bool(data.experimental_config.get("_mstx") or data.experimental_config.get("_msprof_tx"))
    events = [_meta(host_pid, 0, "process_name", "Python"), _meta(host_pid, 0, "process_labels", "CPU"),
              _meta(host_pid, 0, "process_sort_index", HOST_SORT_INDEX)]
    threads = set()
    for op in (data.ops if with_host else []) + data.annotations:
        if op.name.startswith(MSTX_PREFIX):
            if not mstx_on:
                continue
            events.append(_mstx_event(op, host_pid))
        elif with_host or op.name.startswith("ProfilerStep#"):
            args = {k: v for k, v in op.args.items() if k in ("Input Dims", "Input type", "Call stack",
                                                              "Sequence number", "Fwd thread id")}
            events.append(_x(op.name, host_pid, op.tid, op.start_ns, op.end_ns, op.cat, args))
        threads.add(op.tid)
    for tid in sorted(t for t in threads if t is not None):
        events += [_meta(host_pid, tid, "thread_name", f"Thread {tid}"),
                   _meta(host_pid, tid, "thread_sort_index", tid)]

    flow_id = 0
    for device in sorted({k.device for k in data.kernels}):
        hw_pid = _device_pid(host_pid, 1, device)
        overlap_pid = _device_pid(host_pid, 2, device)
        events += [_meta(hw_pid, 0, "process_name", "Ascend Hardware"),
                   _meta(hw_pid, 0, "process_labels", f"NPU {device}"),
                   _meta(hw_pid, 0, "process_sort_index", 10 + 2 * device),
                   _meta(overlap_pid, 0, "process_name", "Overlap Analysis"),
                   _meta(overlap_pid, 0, "process_labels", f"NPU {device}"),
                   _meta(overlap_pid, 0, "process_sort_index", 11 + 2 * device)]
        kernels = [k for k in data.kernels if k.device == device]
        for stream in sorted({k.stream for k in kernels}):
            events += [_meta(hw_pid, stream, "thread_name", f"Stream {stream}"),
                       _meta(hw_pid, stream, "thread_sort_index", stream)]
        for k in kernels:
            events.append(_x(k.name, hw_pid, k.stream, k.start_ns, k.end_ns, CORE_TYPE.get(k.kind, k.kind),
                             kernel_args(k)))
            if k.op is not None and with_host:
                flow_id += 1
                events += [{"ph": "s", "bp": "e", "name": "torch_to_npu", "id": flow_id, "pid": host_pid,
                            "tid": k.op.tid, "ts": k.op.start_ns / 1000.0, "cat": "async_npu"},
                           {"ph": "f", "bp": "e", "name": "torch_to_npu", "id": flow_id, "pid": hw_pid,
                            "tid": k.stream, "ts": k.start_ns / 1000.0, "cat": "async_npu"}]
        events += _overlap_events(data, overlap_pid, kernels)
    return events


def _mstx_event(op, host_pid):
    """mstx ranges as spans named by their message, marks as instant events."""
    message = op.name[len(MSTX_PREFIX):]
    if message.startswith(MSTX_MARK):
        return {"ph": "i", "s": "t", "name": message[len(MSTX_MARK):], "pid": host_pid, "tid": op.tid,
                "ts": op.start_ns / 1000.0, "cat": "MsTx", "args": {"mstx": "mark"}}
    return _x(message, host_pid, op.tid, op.start_ns, op.end_ns, "MsTx", {"mstx": "range"})


def _overlap_events(data, pid, kernels):
    """Computing / Communication / Communication(Not Overlapped) / Free lanes."""
    compute = [(k.start_ns, k.end_ns) for k in kernels if k.kind != "communication"]
    comm = [(k.start_ns, k.end_ns) for k in kernels if k.kind == "communication"]
    lanes = {"Computing": (0, _intervals.union(compute)),
             "Communication": (1, _intervals.union(comm)),
             "Communication(Not Overlapped)": (2, _intervals.union(_intervals.subtract(comm, compute)))}
    lo, hi = data.window()
    busy = _intervals.union(compute + comm)
    lanes["Free"] = (3, _intervals.union(_intervals.subtract([(lo, hi)], busy)) if hi > lo else [])
    events = []
    for name, (tid, spans) in lanes.items():
        events += [_meta(pid, tid, "thread_name", name), _meta(pid, tid, "thread_sort_index", tid)]
        events += [_x(name, pid, tid, s, e, name) for s, e in spans]
    return events


def write_trace_view(data, out_dir):
    with open(os.path.join(out_dir, "trace_view.json"), "w", encoding="utf-8") as f:
        f.write(json.dumps(build_trace_view(data)))   # dumps: the C encoder, 5x faster than dump


def build_tb_trace(data) -> dict:
    """Kineto's host trace with the device kernels added the way Kineto writes
    GPU kernels (runtime launch on the host thread, kernel on pid=device,
    tid=stream, linked by 'correlation'), so torch-tb-profiler's kernel and
    overview views and the operator view's device times see them."""
    trace = dict(data.host_trace)          # host events are reused as they are, never modified
    base = data.base_ns
    events = trace["traceEvents"] = list(data.host_trace.get("traceEvents", []))
    host_pid = data.host_pid or os.getpid()
    for device in sorted({k.device for k in data.kernels}):
        events += [_meta(device, 0, "process_name", f"NPU {device}"),
                   _meta(device, 0, "process_labels", f"NPU {device}"),
                   _meta(device, 0, "process_sort_index", 0x1000000 + device)]
    for corr, k in enumerate(data.kernels, start=1 << 20):
        external = k.op.args.get("External id") if k.op is not None else None
        args = {"device": k.device, "stream": k.stream, "correlation": corr, **kernel_args(k)}
        if external is not None:
            args["External id"] = external
        kernel = _x(k.name, k.device, k.stream, k.start_ns - base, k.end_ns - base, "kernel", args)
        events.append(kernel)
        if k.op is not None:
            launch_end = min(k.end_ns, k.start_ns + 1000)
            runtime_args = {"correlation": corr}
            if external is not None:
                runtime_args["External id"] = external
            # cat "runtime": torch-tb-profiler 0.4.3 maps only that name (not Kineto's later
            # "cuda_runtime") to a launch, and a kernel reaches its op's device time through it.
            events.append(_x("aclrtLaunchKernel", host_pid, k.op.tid, k.start_ns - base, launch_end - base,
                             "runtime", runtime_args))
            events += [{"ph": "s", "id": corr, "pid": host_pid, "tid": k.op.tid, "ts": (k.start_ns - base) / 1000.0,
                        "cat": "ac2g", "name": "ac2g"},
                       {"ph": "f", "id": corr, "pid": k.device, "tid": k.stream, "ts": (k.start_ns - base) / 1000.0,
                        "cat": "ac2g", "name": "ac2g", "bp": "e"}]
    trace["deviceProperties"] = [{"id": d, "name": data.info.get("device_name", "Ascend"),
                                  "totalGlobalMem": data.info.get("memory_per_device", 1)}
                                 for d in sorted({k.device for k in data.kernels})]
    return trace


def write_tb_trace(data, path):
    with open(path, "w", encoding="utf-8") as f:
        f.write(json.dumps(build_tb_trace(data)))
