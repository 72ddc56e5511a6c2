"""``torch_npu.utils.profiler``: the legacy step profiler (``Profile``) and its ``Singleton`` decorator.

``Profile(start_step, save_path, profile_type)`` is a process-wide singleton;
the training loop calls ``start()``/``end()`` around each step, and at step
``start_step`` the step is profiled, the data written under ``save_path``, and
the process exits (``sys.exit()``), as the real one does.

- ``"TORCH"``: PyTorch's autograd profiler; a ``torch_prof_<time>.json``
  Chrome trace is written. ``use_npu`` has no counterpart in PyTorch 2.13's
  profiler (npu kernels are recorded as CPU ops either way).
- ``"CANN"`` / ``"GE"``: the old ``torch.npu.profile`` (CANN/GE data) no longer
  exists; here it is ``torch_npu.profiler.profile`` with the NPU activity,
  which writes its ``*_ascend_pt`` directory under ``save_path``. The
  ``config`` argument is accepted and ignored.
"""
import os
import sys
import time

import torch

from torch_npu.utils._error_code import ErrCode, prof_error

__all__ = ["Singleton", "Profile"]

_TORCH_ARGS = {"enabled", "use_cuda", "record_shapes", "with_flops", "profile_memory", "with_stack", "use_kineto",
               "use_cpu", "use_npu_simple"}
_CANN_GE_ARGS = {"config"}


def Singleton(cls):
    """Decorator: the first call creates the instance, every later call returns it (arguments ignored)."""
    instances = {}

    def get_instance(*args, **kwargs):
        if cls not in instances:
            instances[cls] = cls(*args, **kwargs)
        return instances[cls]

    return get_instance


def _profiler_for(profile_type, save_path, kwargs):
    allowed = _TORCH_ARGS if profile_type == "TORCH" else _CANN_GE_ARGS
    if not set(kwargs).issubset(allowed):
        raise ValueError("Args '%s' invaild, expect args '%s' ." % (kwargs.keys(), allowed)
                         + prof_error(ErrCode.VALUE))
    if profile_type == "TORCH":
        torch_kwargs = {k: v for k, v in kwargs.items() if k not in ("use_npu_simple", "use_cuda")}
        return torch.autograd.profiler.profile(**torch_kwargs)
    import torch_npu.profiler as npu_profiler
    return npu_profiler.profile(
        activities=[npu_profiler.ProfilerActivity.CPU, npu_profiler.ProfilerActivity.NPU],
        on_trace_ready=npu_profiler.tensorboard_trace_handler(save_path))


class _Profile:
    def __init__(self, start_step: int = 10, save_path: str = "./npu_profiling", profile_type: str = None,
                 use_npu: bool = True, use_e2e_profiler: bool = True, **kwargs):
        self.step_count = 0
        self.count = 0
        self.save_path = save_path
        self.profile_type = profile_type
        self.start_step = start_step
        self.use_npu = use_npu
        self.use_e2e_profiler = use_e2e_profiler
        self.enable = profile_type in ("TORCH", "CANN", "GE")
        if self.enable:
            self.prof = _profiler_for(profile_type, save_path, kwargs)
            try:
                os.makedirs(save_path, exist_ok=True)
            except Exception as e:
                raise ValueError("the path of '%s' is invaild." % save_path + prof_error(ErrCode.VALUE)) from e

    def start(self):
        if self.count != 0:
            raise ValueError("start interface can only be called once" + prof_error(ErrCode.INTERNAL))
        self.count += 1
        if self.enable:
            self.step_count += 1
            if self.step_count == self.start_step:
                self.prof.__enter__()

    def end(self):
        if self.count == 0:
            raise ValueError("start interface must be called after end" + prof_error(ErrCode.INTERNAL))
        self.count = 0
        if self.enable and self.step_count == self.start_step:
            self.prof.__exit__(None, None, None)
            if self.profile_type == "TORCH":
                name = "torch_prof_" + time.strftime("%Y%m%d%H%M%S") + ".json"
                self.prof.export_chrome_trace(os.path.join(self.save_path, name))
            sys.exit()


_Profile.__name__ = _Profile.__qualname__ = "Profile"
Profile = Singleton(_Profile)
