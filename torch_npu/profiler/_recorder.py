"""One recording: Kineto's CPU activity for host ops (names, shapes, memory
events, stacks) plus the emulated device timeline, started and stopped together."""
import json
import os
import tempfile
import time

from torch.profiler import ProfilerActivity as _TorchActivity
from torch.profiler.profiler import _KinetoProfile

from . import _device_timeline
from .profiler_interface import ProfilerActivity


class Recording:
    """What one finished recording holds (the raw data the analysis reads)."""

    def __init__(self, host_trace: dict, device_events: list, start_ns: int, end_ns: int):
        self.host_trace = host_trace
        self.device_events = device_events
        self.start_ns = start_ns
        self.end_ns = end_ns


class Recorder:
    def __init__(self, activities, record_shapes, profile_memory, with_stack, with_flops, with_modules):
        self.activities = activities
        self.kineto = _KinetoProfile(activities=[_TorchActivity.CPU], record_shapes=record_shapes,
                                     profile_memory=profile_memory, with_stack=with_stack,
                                     with_flops=with_flops, with_modules=with_modules)
        self.prepared = False
        self.running = False
        self.start_ns = 0

    def prepare(self):
        if not self.prepared:
            self.kineto.prepare_trace()
            self.prepared = True

    def start(self):
        self.prepare()
        self.kineto.start_trace()
        if ProfilerActivity.NPU in self.activities:
            _device_timeline.drain()     # events from before this recording do not belong to it
            _device_timeline.enable(True)
        self.start_ns = time.time_ns()
        self.running = True

    def stop(self) -> Recording:
        end_ns = time.time_ns()
        device_events = []
        if ProfilerActivity.NPU in self.activities:
            _device_timeline.enable(False)
            device_events = _device_timeline.drain()
        self.kineto.stop_trace()
        self.running = False
        fd, path = tempfile.mkstemp(suffix=".json")
        os.close(fd)
        try:
            self.kineto.export_chrome_trace(path)
            with open(path, encoding="utf-8") as f:
                host_trace = json.load(f)
        finally:
            os.remove(path)
        return Recording(host_trace, device_events, self.start_ns, end_ns)
