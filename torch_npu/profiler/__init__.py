"""torch_npu.profiler: the Ascend PyTorch profiler on the emulated NPU.

Host ops come from PyTorch's own profiler (Kineto CPU activity); device
kernels from the emulated device's timeline. Output follows torch_npu's
layout (``*_ascend_pt/ASCEND_PROFILER_OUTPUT/``). See docs/profiler.md.
"""
import torch as _torch

from .experimental_config import (_ExperimentalConfig, supported_profiler_level, supported_ai_core_metrics,
                                  supported_export_type, ProfilerLevel, AiCMetrics, ExportType, HostSystem)
from .profiler import profile, analyse, tensorboard_trace_handler, supported_activities
from .profiler_interface import ProfilerActivity
from .scheduler import Schedule as schedule, ProfilerAction
from . import dynamic_profile

__all__ = ["profile", "ProfilerActivity", "supported_activities", "tensorboard_trace_handler", "schedule",
           "ProfilerAction", "_ExperimentalConfig", "supported_profiler_level", "supported_ai_core_metrics",
           "supported_export_type", "ProfilerLevel", "AiCMetrics", "ExportType", "HostSystem"]

_KinetoProfile = _torch.profiler.profiler._KinetoProfile
