"""The emulated device's kernel timeline, recorded by the C++ op-execution
layer (``torch_npu._C._npu_timeline_*``).

Each record: (name, device, stream, start_ns, end_ns, kind, bytes, thread_id),
kind in {"kernel", "fallback", "communication"}; timestamps on the system
clock (``time.time_ns()``), the clock Kineto's host events use.
"""
import torch_npu

FIELDS = ("name", "device", "stream", "start_ns", "end_ns", "kind", "bytes", "thread_id")


def enable(on: bool) -> None:
    """Start or stop recording (records cost one relaxed atomic load while off)."""
    torch_npu._C._npu_timeline_enable(bool(on))


def drain() -> list:
    """Take the recorded device events (as dicts) and clear the recorder."""
    return [dict(zip(FIELDS, record)) for record in torch_npu._C._npu_timeline_drain()]
