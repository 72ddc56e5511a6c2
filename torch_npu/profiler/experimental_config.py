"""``_ExperimentalConfig``: the Ascend-specific profiler options and their enums.

All options are accepted with the real names and defaults. Those that need
Ascend hardware counters (AI Core metrics, L2 cache, sys_io, ...) cannot
produce data on the emulated device: each warns once and is otherwise ignored,
never raises.
"""
import warnings

__all__ = ["_ExperimentalConfig", "supported_profiler_level", "supported_ai_core_metrics",
           "supported_export_type", "ProfilerLevel", "AiCMetrics", "ExportType", "HostSystem"]


class ProfilerLevel:
    Level0 = "Level0"
    Level1 = "Level1"
    Level2 = "Level2"
    Level_none = "Level_none"


class AiCMetrics:
    PipeUtilization = "ACL_AICORE_PIPE_UTILIZATION"
    ArithmeticUtilization = "ACL_AICORE_ARITHMETIC_UTILIZATION"
    Memory = "ACL_AICORE_MEMORY_BANDWIDTH"
    MemoryL0 = "ACL_AICORE_L0B_AND_WIDTH"
    MemoryUB = "ACL_AICORE_UB_BANDWIDTH"
    ResourceConflictRatio = "ACL_AICORE_RESOURCE_CONFLICT_RATIO"
    L2Cache = "ACL_AICORE_L2_CACHE"
    MemoryAccess = "ACL_AICORE_MEMORY_ACCESS"
    AiCoreNone = "ACL_AICORE_NONE"


class ExportType:
    Text = "text"
    Db = "db"


class HostSystem:
    CPU = "cpu"
    MEM = "mem"
    DISK = "disk"
    NETWORK = "network"
    OSRT = "osrt"
    NUMA = "numa"


def _values(enum_cls) -> set:
    return {v for k, v in vars(enum_cls).items() if not k.startswith("_")}


def supported_profiler_level() -> set:
    return _values(ProfilerLevel)


def supported_ai_core_metrics() -> set:
    return _values(AiCMetrics)


def supported_export_type() -> set:
    return _values(ExportType)


_warned = set()


def _warn_once(key: str, message: str) -> None:
    """Warn once per process and option: the emulator cannot honour it."""
    if key in _warned:
        return
    _warned.add(key)
    warnings.warn(message, RuntimeWarning, stacklevel=3)


def _reset(option: str, default):
    print(f"[WARNING] Invalid parameter {option}, reset it to default.")
    return default


class _ExperimentalConfig:
    def __init__(self, profiler_level: int = ProfilerLevel.Level0,
                 aic_metrics: int = AiCMetrics.PipeUtilization,
                 l2_cache: bool = False, msprof_tx: bool = False, mstx: bool = False,
                 data_simplification: bool = True, record_op_args: bool = False, op_attr: bool = False,
                 gc_detect_threshold=None, export_type="text", host_sys=None,
                 mstx_domain_include=None, mstx_domain_exclude=None,
                 sys_io: bool = False, sys_interconnection: bool = False):
        self._profiler_level = profiler_level
        self._aic_metrics = aic_metrics
        self._l2_cache = l2_cache
        self._msprof_tx = msprof_tx
        self._mstx = mstx
        self._data_simplification = data_simplification
        self.record_op_args = record_op_args
        self._op_attr = op_attr
        self._gc_detect_threshold = gc_detect_threshold
        self._export_type = export_type
        self._host_sys = host_sys
        self._mstx_domain_include = mstx_domain_include
        self._mstx_domain_exclude = mstx_domain_exclude
        self._sys_io = sys_io
        self._sys_interconnection = sys_interconnection
        self._check_params()

    # Invalid values are reset with a printed warning, as in the real profiler.
    def _check_params(self):
        if self._profiler_level not in supported_profiler_level():
            self._profiler_level = _reset("profiler_level", ProfilerLevel.Level0)
        if self._aic_metrics not in supported_ai_core_metrics():
            self._aic_metrics = _reset("aic_metrics", AiCMetrics.PipeUtilization)
        if self._profiler_level == ProfilerLevel.Level_none:
            self._aic_metrics = AiCMetrics.AiCoreNone
        for name in ("_l2_cache", "_msprof_tx", "_mstx", "_data_simplification", "record_op_args", "_op_attr",
                     "_sys_io", "_sys_interconnection"):
            if not isinstance(getattr(self, name), bool):
                setattr(self, name, _reset(name.lstrip("_"), name == "_data_simplification"))
        export = self._export_type if isinstance(self._export_type, list) else [self._export_type]
        if not export or any(e not in supported_export_type() for e in export):
            export = [_reset("export_type", ExportType.Text)]
        self._export_type = export
        if self._host_sys is not None:
            valid = _values(HostSystem)
            if not isinstance(self._host_sys, list) or any(h not in valid for h in self._host_sys):
                self._host_sys = _reset("host_sys", None)
        if self._gc_detect_threshold is not None:
            t = self._gc_detect_threshold
            if not isinstance(t, (int, float)) or isinstance(t, bool) or t < 0:
                self._gc_detect_threshold = _reset("gc_detect_threshold", None)
        self._warn_hardware_only()

    def _warn_hardware_only(self):
        hw = []
        if self._aic_metrics not in (AiCMetrics.PipeUtilization, AiCMetrics.AiCoreNone):
            hw.append(f"aic_metrics={self._aic_metrics}")
        for flag in ("l2_cache", "sys_io", "sys_interconnection", "op_attr"):
            if getattr(self, "_" + flag):
                hw.append(flag)
        if self._host_sys:
            hw.append("host_sys")
        if self._gc_detect_threshold is not None:
            hw.append("gc_detect_threshold")
        if ExportType.Db in self._export_type:
            hw.append("export_type=db")
        for option in hw:
            _warn_once(option, f"torch_npu.profiler: '{option}' needs Ascend hardware or CANN tools and is ignored "
                               "on the emulated NPU (see docs/profiler.md).")

    def __call__(self) -> dict:
        """The options as the profiler_info.json 'experimental_config' block."""
        return {
            "_profiler_level": self._profiler_level, "_aic_metrics": self._aic_metrics,
            "_l2_cache": self._l2_cache, "_msprof_tx": self._msprof_tx, "_mstx": self._mstx,
            "_data_simplification": self._data_simplification, "record_op_args": self.record_op_args,
            "_op_attr": self._op_attr, "_gc_detect_threshold": self._gc_detect_threshold,
            "_export_type": self._export_type, "_host_sys": self._host_sys,
            "_mstx_domain_include": self._mstx_domain_include, "_mstx_domain_exclude": self._mstx_domain_exclude,
            "_sys_io": self._sys_io, "_sys_interconnection": self._sys_interconnection,
        }

    @property
    def profiler_level(self):
        return self._profiler_level

    @property
    def aic_metrics(self):
        return self._aic_metrics

    @property
    def export_type(self):
        return self._export_type
