"""Dynamic profiling: a training loop calls ``step()`` every step; editing
``<path>/profiler_config.json`` (``start_step``, ``active``, ``prof_dir``, ...)
starts a profile of ``active`` steps without restarting the job."""
import json
import os

from .experimental_config import _ExperimentalConfig
from .profiler import profile, tensorboard_trace_handler
from .profiler_interface import ProfilerActivity

__all__ = ["init", "step", "start", "set_state"]

CONFIG_NAME = "profiler_config.json"
DEFAULT_CONFIG = {"activities": ["CPU", "NPU"], "prof_dir": "./", "analyse": False, "record_shapes": False,
                  "profile_memory": False, "with_stack": False, "with_flops": False, "with_modules": False,
                  "active": 1, "warmup": 0, "start_step": 0, "is_rank": False, "rank_list": [],
                  "experimental_config": {}}


class _State:
    config_path = None
    mtime = None
    step_num = 0
    config = None
    prof = None
    remaining = 0


def init(path: str):
    """Watch ``path/profiler_config.json`` (written with defaults if missing)."""
    os.makedirs(path, exist_ok=True)
    _State.config_path = os.path.join(path, CONFIG_NAME)
    if not os.path.exists(_State.config_path):
        with open(_State.config_path, "w", encoding="utf-8") as f:
            json.dump(DEFAULT_CONFIG, f, indent=4)
    _State.mtime = os.path.getmtime(_State.config_path)


def start(config_path: str = None):
    """Profile from the next step with the config file's settings (or defaults)."""
    config = dict(DEFAULT_CONFIG)
    if config_path and os.path.exists(config_path):
        with open(config_path, encoding="utf-8") as f:
            config.update(json.load(f))
    config["start_step"] = _State.step_num + 1
    _State.config = config


def set_state(state_step: dict):
    """Set the step counter (``{"step": n}``), e.g. after resuming from a checkpoint."""
    if isinstance(state_step, dict) and isinstance(state_step.get("step"), int):
        _State.step_num = state_step["step"]


def step():
    _State.step_num += 1
    if _State.prof is not None:
        _State.remaining -= 1
        if _State.remaining <= 0:
            _State.prof.stop()
            _State.prof = None
        else:
            _State.prof.step()
        return
    _reload_if_changed()
    config = _State.config
    if config is not None and _State.step_num >= int(config.get("start_step", 0)):
        _State.config = None
        _begin(config)


def _reload_if_changed():
    if _State.config_path is None or not os.path.exists(_State.config_path):
        return
    mtime = os.path.getmtime(_State.config_path)
    if mtime == _State.mtime:
        return
    _State.mtime = mtime
    with open(_State.config_path, encoding="utf-8") as f:
        config = dict(DEFAULT_CONFIG, **json.load(f))
    if int(config.get("start_step", 0)) < _State.step_num:
        config["start_step"] = _State.step_num
    _State.config = config


def _begin(config):
    activities = [ProfilerActivity[a] for a in config.get("activities", []) if a in ("CPU", "NPU")]
    exp = config.get("experimental_config") or {}
    exp_config = _ExperimentalConfig(**{k: v for k, v in exp.items()
                                        if k in _ExperimentalConfig.__init__.__code__.co_varnames})
    _State.prof = profile(activities=activities or None, record_shapes=bool(config["record_shapes"]),
                          profile_memory=bool(config["profile_memory"]), with_stack=bool(config["with_stack"]),
                          with_flops=bool(config["with_flops"]), with_modules=bool(config["with_modules"]),
                          experimental_config=exp_config,
                          on_trace_ready=tensorboard_trace_handler(config["prof_dir"],
                                                                   analyse_flag=bool(config["analyse"])))
    _State.remaining = max(1, int(config.get("active", 1)))
    _State.prof.start()
