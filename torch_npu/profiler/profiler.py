"""``torch_npu.profiler.profile``: Kineto's CPU activity for host ops plus the
emulated device timeline, written in torch_npu's output layout."""
import json
import os
import threading
import uuid

from . import _path_creator
from ._raw_writer import write_raw
from ._recorder import Recorder
from .analysis._parser import parse_one, profiler_dirs
from .experimental_config import _ExperimentalConfig
from .profiler_interface import normalize_activities, supported_activities
from .scheduler import ProfilerAction, _default_schedule

__all__ = ["supported_activities", "analyse", "tensorboard_trace_handler", "profile"]


def _bool_option(name, value):
    if isinstance(value, bool):
        return value
    print(f"[WARNING] Invalid parameter {name}, reset it to False.")
    return False


class profile:
    """Profile host ops and device kernels; see docs/profiler.md.

    Without ``schedule`` every step between start() and stop() is recorded and
    on_trace_ready runs at stop(); with one, on each RECORD_AND_SAVE step."""

    def __init__(self, *, activities=None, schedule=None, on_trace_ready=None, record_shapes: bool = False,
                 profile_memory: bool = False, with_stack: bool = False, with_flops: bool = False,
                 with_modules: bool = False, experimental_config: _ExperimentalConfig = None,
                 execution_trace_observer=None, custom_trace_id_callback=None, use_cuda=None):
        self.activities = normalize_activities(activities)
        if schedule is not None and not callable(schedule):
            print("[WARNING] Invalid parameter schedule, reset it to default.")
            schedule = None
        self.schedule = schedule or _default_schedule
        self._has_schedule = schedule is not None
        self.on_trace_ready = on_trace_ready if callable(on_trace_ready) else None
        self.record_shapes = _bool_option("record_shapes", record_shapes)
        self.profile_memory = _bool_option("profile_memory", profile_memory)
        self.with_stack = _bool_option("with_stack", with_stack)
        self.with_flops = _bool_option("with_flops", with_flops)
        self.with_modules = _bool_option("with_modules", with_modules)
        if experimental_config is not None and not isinstance(experimental_config, _ExperimentalConfig):
            print("[WARNING] Invalid parameter experimental_config, reset it to default.")
            experimental_config = None
        self.experimental_config = experimental_config or _ExperimentalConfig()
        self.custom_trace_id_callback = custom_trace_id_callback
        self.step_num = 0
        self.current_action = ProfilerAction.NONE
        self._recorder = None
        self._step_rec_fn = None
        self._metadata = {}
        self._last = None           # the last finished recording
        self._trace_id = None

    # -- context manager ------------------------------------------------
    def __enter__(self):
        self.start()
        return self

    def __exit__(self, exc_type, exc_val, exc_tb):
        self.stop()

    # -- public API -----------------------------------------------------
    def start(self):
        self.step_num = 0
        self.current_action = self.schedule(self.step_num)
        self._transition(ProfilerAction.NONE, self.current_action)
        self._enter_step()

    def stop(self):
        self._exit_step()
        self._transition(self.current_action, None)
        self.current_action = ProfilerAction.NONE

    def step(self):
        self._exit_step()
        prev = self.current_action
        self.step_num += 1
        self.current_action = self.schedule(self.step_num)
        self._transition(prev, self.current_action)
        self._enter_step()

    def export_chrome_trace(self, output: str):
        """Write the last recording's trace (host + device lanes, trace_view.json format)."""
        from .analysis._profile_data import ProfileData
        from .analysis._trace_views import build_trace_view
        import tempfile
        with tempfile.TemporaryDirectory() as tmp:
            prof_dir = self._write_raw(tmp, None)
            events = build_trace_view(ProfileData(prof_dir))
        with open(output, "w", encoding="utf-8") as f:
            f.write(json.dumps(events))

    def key_averages(self, group_by_input_shape: bool = False, group_by_stack_n: int = 0):
        """The last recording's per-op averages, as torch.profiler gives them (host times;
        on the synchronous emulated device they are also the device times). Scripts written
        for torch.profiler call this, e.g. under transfer_to_npu."""
        return self._require_last().kineto.key_averages(group_by_input_shape, group_by_stack_n)

    def events(self):
        """The last recording's events (torch.profiler's EventList)."""
        return self._require_last().kineto.events()

    def export_stacks(self, path: str, metric: str = "self_cpu_time_total"):
        """Flame-graph stacks (needs with_stack=True). The emulated device is
        synchronous, so 'self_npu_time_total' equals host self time."""
        if metric not in ("self_cpu_time_total", "self_npu_time_total"):
            print("[WARNING] Invalid parameter metric, reset it to self_cpu_time_total.")
        self._require_last().kineto.export_stacks(path, "self_cpu_time_total")

    def export_memory_timeline(self, output_path: str, device: str = None):
        """PyTorch's memory timeline for ``device`` (default npu:0); needs
        record_shapes, profile_memory and with_stack."""
        self._require_last().kineto.export_memory_timeline(output_path, device or "npu:0")

    def add_metadata(self, key: str, value: str):
        if not isinstance(key, str) or not isinstance(value, str):
            print("[WARNING] The key and value of metadata must be string, skip it.")
            return
        self._metadata[key] = value

    def add_metadata_json(self, key: str, value: str):
        if not isinstance(key, str) or not isinstance(value, str):
            print("[WARNING] The key and value of metadata must be string, skip it.")
            return
        try:
            self._metadata[key] = json.loads(value)
        except ValueError:
            print("[WARNING] The value of metadata must be a json string, skip it.")

    def get_trace_id(self) -> str:
        return self._trace_id

    def set_custom_trace_id_callback(self, callback) -> None:
        self.custom_trace_id_callback = callback if callable(callback) else None

    @staticmethod
    def enable_profiler_in_child_thread(record_shapes=False, profile_memory=False, with_stack=False,
                                        with_flops=False, with_modules=False):
        """Kineto's CPU activity already observes every thread here: nothing to do."""

    @staticmethod
    def disable_profiler_in_child_thread():
        """See enable_profiler_in_child_thread."""

    # -- internals ------------------------------------------------------
    def _new_recorder(self):
        self._recorder = Recorder(self.activities, self.record_shapes, self.profile_memory, self.with_stack,
                                  self.with_flops, self.with_modules)
        self._trace_id = (self.custom_trace_id_callback() if self.custom_trace_id_callback
                          else uuid.uuid4().hex.upper())

    def _prepare(self):
        self._new_recorder()
        self._recorder.prepare()

    def _start(self):
        if self._recorder is None:
            self._new_recorder()
        self._recorder.start()

    def _stop_and_save(self):
        recorder, self._recorder = self._recorder, None
        if recorder is None or not recorder.running:
            return
        recording = recorder.stop()
        recording.kineto = recorder.kineto
        self._last = recording
        if self.on_trace_ready is not None:
            self.on_trace_ready(self)

    def _discard(self):
        if self._recorder is not None and self._recorder.running:
            self._recorder.stop()
        self._recorder = None

    def _transition(self, prev, curr):
        recording = (ProfilerAction.RECORD, ProfilerAction.RECORD_AND_SAVE)
        if prev == ProfilerAction.RECORD_AND_SAVE or (prev in recording and curr in (None, ProfilerAction.NONE,
                                                                                       ProfilerAction.WARMUP)):
            self._stop_and_save()
        elif prev == ProfilerAction.WARMUP and curr in (None, ProfilerAction.NONE):
            self._discard()
        if curr == ProfilerAction.WARMUP and prev != ProfilerAction.WARMUP:
            self._prepare()
        elif curr in recording and (prev not in recording or prev == ProfilerAction.RECORD_AND_SAVE):
            self._start()

    def _enter_step(self):
        # as torch.profiler: ProfilerStep#N markers only when a schedule drives the steps
        if self._has_schedule and self._recorder is not None and self._recorder.running:
            import torch
            self._step_rec_fn = torch.autograd.profiler.record_function(f"ProfilerStep#{self.step_num}")
            self._step_rec_fn.__enter__()

    def _exit_step(self):
        if self._step_rec_fn is not None:
            self._step_rec_fn.__exit__(None, None, None)
            self._step_rec_fn = None

    def _require_last(self):
        if self._last is None:
            raise RuntimeError("Profiler didn't finish running")
        return self._last

    def _common_config(self) -> dict:
        return {"activities": sorted(a.name for a in self.activities), "record_shapes": self.record_shapes,
                "profile_memory": self.profile_memory, "with_stack": self.with_stack,
                "with_flops": self.with_flops, "with_modules": self.with_modules,
                "schedule": self._has_schedule, "trace_id": self._trace_id}

    def _write_raw(self, dir_name, worker_name) -> str:
        recording = self._require_last()
        prof_dir = _path_creator.create_prof_dir(dir_name, worker_name)
        write_raw(prof_dir, recording, self._common_config(), self.experimental_config(), dict(self._metadata))
        return prof_dir


def tensorboard_trace_handler(dir_name: str = None, worker_name: str = None, analyse_flag: bool = True,
                              async_mode: bool = False):
    """on_trace_ready callback: write ``<dir>/<worker>_<time>_ascend_pt/`` and, with
    analyse_flag, parse it (in a background thread with async_mode)."""
    dir_name = _path_creator.valid_dir_name(dir_name)
    worker_name = _path_creator.valid_worker_name(worker_name)
    if not isinstance(analyse_flag, bool):
        print("[WARNING] Invalid parameter analyse_flag, reset it to True.")
        analyse_flag = True
    if not isinstance(async_mode, bool):
        print("[WARNING] Invalid parameter async_mode, reset it to False.")
        async_mode = False

    def handler(prof: profile):
        prof_dir = prof._write_raw(dir_name, worker_name)
        prof.prof_dir = prof_dir
        if not analyse_flag:
            return
        if async_mode:
            threading.Thread(target=parse_one, args=(prof_dir,), name="torch_npu-profiler-analyse").start()
        else:
            parse_one(prof_dir)

    return handler


def analyse(profiler_path: str, max_process_number: int = max(1, (os.cpu_count() or 2) // 2), export_type=None):
    """Parse raw data written with analyse_flag=False: one ``*_ascend_pt``
    directory or a directory holding several."""
    dirs = profiler_dirs(profiler_path)
    if not dirs:
        print(f"[WARNING] No profiling data found under {profiler_path}.")
    for prof_dir in dirs:
        parse_one(prof_dir)
