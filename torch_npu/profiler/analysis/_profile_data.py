"""Reads one ``*_ascend_pt`` directory's raw data (FRAMEWORK/) into events the
views are built from: host ops (Kineto), device kernels (the emulated device
timeline) matched to the host op that launched them, steps, memory records."""
import bisect
import json
import os

FRAMEWORK = "FRAMEWORK"
HOST_TRACE = "torch_host_trace.json"
DEVICE_TIMELINE = "device_timeline.json"
PROFILER_INFO = "profiler_info.json"
PROFILER_METADATA = "profiler_metadata.json"
MSTX_PREFIX = "mstx::"
DATALOADER_PREFIX = "enumerate(DataLoader)#"
STEP_PREFIX = "ProfilerStep#"

# Kineto's C++ type names -> the dtype names CANN's op summary uses.
_DTYPE_NAMES = {
    "float": "FLOAT", "double": "DOUBLE", "c10::Half": "FLOAT16", "c10::BFloat16": "BF16",
    "long int": "INT64", "int": "INT32", "short int": "INT16", "signed char": "INT8",
    "unsigned char": "UINT8", "bool": "BOOL", "c10::complex<float>": "COMPLEX64",
    "c10::complex<double>": "COMPLEX128",
}


class HostOp:
    __slots__ = ("name", "cat", "start_ns", "end_ns", "tid", "args", "parent", "children", "kernels")

    def __init__(self, event: dict, base_ns: int):
        self.name = event["name"]
        self.cat = event.get("cat", "")
        self.start_ns = base_ns + round(event["ts"] * 1000)
        self.end_ns = self.start_ns + round(event.get("dur", 0) * 1000)
        self.tid = event.get("tid")
        self.args = event.get("args", {})
        self.parent = None
        self.children = []
        self.kernels = []      # device events this op launched itself (innermost match)

    @property
    def dur_ns(self):
        return self.end_ns - self.start_ns

    def tensor_inputs(self):
        """(shape, dtype) of the tensor inputs, in argument order."""
        dims = self.args.get("Input Dims") or []
        types = self.args.get("Input type") or []
        out = []
        for shape, dtype in zip(dims, types):
            if dtype in _DTYPE_NAMES:
                out.append((shape, _DTYPE_NAMES[dtype]))
        return out


class Kernel:
    __slots__ = ("name", "device", "stream", "start_ns", "end_ns", "kind", "bytes", "thread_id", "op")

    def __init__(self, record: dict):
        for field in ("name", "device", "stream", "start_ns", "end_ns", "kind", "bytes", "thread_id"):
            setattr(self, field, record[field])
        self.op = None

    @property
    def dur_ns(self):
        return self.end_ns - self.start_ns

    @property
    def op_type(self):
        """'aten::addmm.out' -> 'addmm' (CANN's OP Type column is the bare op)."""
        return self.name.split("::")[-1].split(".")[0]


class Step:
    def __init__(self, step_id, start_ns, end_ns):
        self.id = step_id
        self.start_ns = start_ns
        self.end_ns = end_ns

    @property
    def dur_ns(self):
        return self.end_ns - self.start_ns


class ProfileData:
    def __init__(self, prof_dir: str):
        self.prof_dir = prof_dir
        self.info = _read_json(os.path.join(prof_dir, PROFILER_INFO), {})
        self.metadata = _read_json(os.path.join(prof_dir, PROFILER_METADATA), {})
        self.host_trace = _read_json(os.path.join(prof_dir, FRAMEWORK, HOST_TRACE), {"traceEvents": []})
        device_records = _read_json(os.path.join(prof_dir, FRAMEWORK, DEVICE_TIMELINE), [])
        self.base_ns = int(self.host_trace.get("baseTimeNanoseconds", 0))
        self.host_pid = None
        self.ops = []            # cpu ops (Kineto cat cpu_op)
        self.annotations = []    # user annotations (record_function), steps and mstx included
        self.memory = []         # Kineto [memory] records of npu devices
        for event in self.host_trace.get("traceEvents", []):
            if event.get("ph") == "X":
                op = HostOp(event, self.base_ns)
                if op.cat in ("cpu_op", "user_annotation") and isinstance(event.get("pid"), int):
                    self.host_pid = event["pid"]
                if op.cat == "cpu_op":
                    self.ops.append(op)
                elif op.cat == "user_annotation":
                    self.annotations.append(op)
            elif event.get("name") == "[memory]" and event.get("args", {}).get("Device Type") == 20:
                args = event["args"]
                self.memory.append({"ts_ns": self.base_ns + round(event["ts"] * 1000),
                                    "device": args.get("Device Id", 0), "bytes": args.get("Bytes", 0),
                                    "addr": args.get("Addr"),
                                    "allocated": args.get("Total Allocated", 0),
                                    "reserved": args.get("Total Reserved", 0)})
        self.kernels = sorted((Kernel(r) for r in device_records), key=lambda k: (k.start_ns, k.end_ns))
        self.steps = sorted((Step(int(a.name[len(STEP_PREFIX):]), a.start_ns, a.end_ns)
                             for a in self.annotations if a.name.startswith(STEP_PREFIX)),
                            key=lambda s: s.id)
        self.mstx = [a for a in self.annotations if a.name.startswith(MSTX_PREFIX)]
        self.input_waits = [a for a in self.annotations
                            if a.name.startswith(DATALOADER_PREFIX) or a.name == MSTX_PREFIX + "dataloader"]
        _build_op_tree(self.ops)
        _match_kernels(self.ops, self.kernels)

    @property
    def config(self) -> dict:
        return self.info.get("config", {})

    @property
    def experimental_config(self) -> dict:
        return self.config.get("experimental_config", {})

    @property
    def activities(self) -> list:
        return self.config.get("common_config", {}).get("activities", ["CPU", "NPU"])

    @property
    def devices(self) -> list:
        return sorted({k.device for k in self.kernels} | {m["device"] for m in self.memory})

    def step_of(self, ts_ns: int):
        for step in self.steps:
            if step.start_ns <= ts_ns < step.end_ns:
                return step.id
        return None

    def window(self):
        """The recorded span: the steps when there are steps, else the recording."""
        if self.steps:
            return self.steps[0].start_ns, self.steps[-1].end_ns
        rec = self.info.get("start_info", {}), self.info.get("end_info", {})
        return rec[0].get("start_ns", 0), rec[1].get("end_ns", 0)


def _read_json(path, default):
    if not os.path.exists(path):
        return default
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _build_op_tree(ops):
    """Nest host ops by time containment per thread (Kineto records no parents)."""
    by_thread = {}
    for op in ops:
        by_thread.setdefault(op.tid, []).append(op)
    for thread_ops in by_thread.values():
        thread_ops.sort(key=lambda o: (o.start_ns, -o.end_ns))
        stack = []
        for op in thread_ops:
            while stack and stack[-1].end_ns < op.end_ns:
                stack.pop()
            if stack:
                op.parent = stack[-1]
                stack[-1].children.append(op)
            stack.append(op)


def _match_kernels(ops, kernels):
    """Each kernel belongs to the innermost host op of the same name whose span
    contains it (the device is synchronous: the kernel runs inside its op)."""
    by_name = {}
    for op in ops:
        by_name.setdefault(op.name, []).append(op)
    starts = {}
    for name, named in by_name.items():
        named.sort(key=lambda o: o.start_ns)
        starts[name] = [o.start_ns for o in named]
    for kernel in kernels:
        name = kernel.name.split(".")[0]
        named = by_name.get(name)
        if not named:
            continue
        i = bisect.bisect_right(starts[name], kernel.start_ns) - 1
        best = None
        while i >= 0:
            op = named[i]
            if op.end_ns >= kernel.end_ns and (best is None or op.start_ns >= best.start_ns):
                best = op
                break
            i -= 1
            if kernel.start_ns - op.start_ns > 60_000_000_000:   # far enough back: give up
                break
        if best is not None:
            kernel.op = best
            best.kernels.append(kernel)
