"""torch_npu's logging: one logger per component, configured from the
environment variables of the real torch_npu / CANN.

- ``TORCH_NPU_LOGS`` (like ``TORCH_LOGS``): comma-separated components;
  ``+memory`` logs DEBUG and up, ``memory`` INFO and up, ``-memory`` ERROR only;
  ``all`` (with the same prefixes) selects every component. Records go to
  stderr as ``[torch_npu.<component>] <LEVEL> <time> <pid> <message>``.
- ``TORCH_NPU_LOGS_FILTER``: comma-separated substrings; a ``-`` entry drops
  records whose message contains it, the other entries keep only records
  containing one of them (applies to the ``TORCH_NPU_LOGS`` output).
- ``ASCEND_GLOBAL_LOG_LEVEL`` (0 debug, 1 info, 2 warning, 3 error — the
  default —, 4 null): the CANN plog sink. Records at that level and above are
  written in plog style, to stdout when ``ASCEND_SLOG_PRINT_TO_STDOUT=1``,
  else to ``$ASCEND_PROCESS_LOG_PATH/plog/plog-<pid>_<time>.log`` (default
  ``~/ascend/log/debug``), the file created at the first record.
- ``TORCH_NPU_WARNING_DISABLE=1`` (old name ``TORCH_NPU_DISABLED_WARNING``):
  Python warnings raised from torch_npu's own modules are ignored.

Components: ``device`` (runtime init, device switches), ``memory`` (allocator
growth and release), ``dispatch`` (CPU fallbacks), ``distributed``
(collectives), ``env`` (environment read at import).

The rest of the package logs with ``get_logger("<component>")``.
``configure()`` re-reads the environment (tests use it).
"""
import logging
import os
import sys
import time
import warnings

from torch_npu import _settings

__all__ = []

COMPONENTS = _settings.LOG_COMPONENTS
_ROOT = "torch_npu"
# ASCEND_GLOBAL_LOG_LEVEL value -> Python level (4: nothing).
_ASCEND_LEVELS = {0: logging.DEBUG, 1: logging.INFO, 2: logging.WARNING, 3: logging.ERROR, 4: logging.CRITICAL + 10}
_PLOG_NAMES = {logging.DEBUG: "DEBUG", logging.INFO: "INFO", logging.WARNING: "WARNING", logging.ERROR: "ERROR",
               logging.CRITICAL: "ERROR"}
_NEVER = logging.CRITICAL + 10


def _ascend_level() -> int:
    return _ASCEND_LEVELS[_settings.get("ASCEND_GLOBAL_LOG_LEVEL")]


class _ComponentLevelFilter(logging.Filter):
    """TORCH_NPU_LOGS: per-component threshold plus TORCH_NPU_LOGS_FILTER substrings."""

    def __init__(self, levels, keep, drop):
        super().__init__()
        self.levels, self.keep, self.drop = levels, keep, drop

    def filter(self, record):
        component = record.name.split(".", 1)[-1]
        if record.levelno < self.levels.get(component, _NEVER):
            return False
        msg = record.getMessage()
        if any(d in msg for d in self.drop):
            return False
        return not self.keep or any(k in msg for k in self.keep)


class _TorchNpuLogsFormatter(logging.Formatter):
    def format(self, record):
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(record.created))
        return f"[{record.name}] {record.levelname} {stamp} {record.process} {record.getMessage()}"


class _PlogFormatter(logging.Formatter):
    """CANN plog line: ``[LEVEL] PTA(<pid>,python):<date-time.ms.us> [<component>] <message>``."""

    def format(self, record):
        t = record.created
        stamp = time.strftime("%Y-%m-%d-%H:%M:%S", time.localtime(t))
        frac = int((t - int(t)) * 1_000_000)
        return (f"[{_PLOG_NAMES.get(record.levelno, 'INFO')}] PTA({record.process},python):"
                f"{stamp}.{frac // 1000:03d}.{frac % 1000:03d} [{record.name.split('.', 1)[-1]}] "
                f"{record.getMessage()}")


class _PlogFileHandler(logging.Handler):
    """Writes to the plog file, creating it at the first record only."""

    def __init__(self, directory):
        super().__init__()
        self.directory = directory
        self.stream = None

    def emit(self, record):
        try:
            if self.stream is None:
                os.makedirs(self.directory, exist_ok=True)
                name = f"plog-{os.getpid()}_{time.strftime('%Y%m%d%H%M%S')}.log"
                self.stream = open(os.path.join(self.directory, name), "a", encoding="utf-8")
            self.stream.write(self.format(record) + "\n")
            self.stream.flush()
        except Exception:  # logging must never break the program
            self.handleError(record)


def _plog_handler():
    if _settings.get("ASCEND_SLOG_PRINT_TO_STDOUT"):
        # Resolved at emit time, so redirected stdout (pytest capsys) is honoured.
        handler = logging.StreamHandler(_StdoutProxy())
    else:
        base = _settings.get("ASCEND_PROCESS_LOG_PATH") or os.path.join(os.path.expanduser("~"), "ascend", "log", "debug")
        handler = _PlogFileHandler(os.path.join(base, "plog"))
    handler.setFormatter(_PlogFormatter())
    return handler


class _StdoutProxy:
    def write(self, s):
        sys.stdout.write(s)

    def flush(self):
        sys.stdout.flush()


class _StderrProxy:
    def write(self, s):
        sys.stderr.write(s)

    def flush(self):
        sys.stderr.flush()


_state = {"warning_filter": False}


def configure() -> None:
    """(Re)read the logging environment variables and rebuild the handlers."""
    root = logging.getLogger(_ROOT)
    for handler in list(root.handlers):
        root.removeHandler(handler)
        handler.close()
    root.propagate = False
    levels = _settings.get("TORCH_NPU_LOGS")
    ascend_level = _ascend_level()
    filters = [f.strip() for f in _settings.get("TORCH_NPU_LOGS_FILTER").split(",") if f.strip()]
    keep = [f for f in filters if not f.startswith("-")]
    drop = [f[1:] for f in filters if f.startswith("-")]

    if levels:
        console = logging.StreamHandler(_StderrProxy())
        console.setFormatter(_TorchNpuLogsFormatter())
        console.addFilter(_ComponentLevelFilter(levels, keep, drop))
        root.addHandler(console)
    if ascend_level < _NEVER:
        plog = _plog_handler()
        plog.setLevel(ascend_level)
        root.addHandler(plog)
    root.setLevel(min([ascend_level] + list(levels.values())))
    _configure_core(levels, ascend_level)
    _configure_warnings()


def _core_sink(component, level, message):
    logging.getLogger(f"{_ROOT}.{component}").log(level, message)


def _configure_core(levels, ascend_level):
    """The C++ core (allocator growth/release/OOM, CPU fallbacks) logs through the same
    loggers; it is told each component's threshold so that disabled records cost nothing."""
    from torch_npu import _C as core
    thresholds = {c: min(levels.get(c, _NEVER), ascend_level) for c in COMPONENTS}
    core._emu_set_log_levels({c: v for c, v in thresholds.items() if v < _NEVER})
    core._emu_set_log_sink(_core_sink if any(v < _NEVER for v in thresholds.values()) else None)


def _configure_warnings():
    disabled = _settings.get("TORCH_NPU_WARNING_DISABLE") or _settings.get("TORCH_NPU_DISABLED_WARNING")
    if disabled and not _state["warning_filter"]:
        warnings.filterwarnings("ignore", module=r"torch_npu(\..*)?$")
        _state["warning_filter"] = True
    elif not disabled and _state["warning_filter"]:
        warnings.filters[:] = [f for f in warnings.filters
                               if not (f[0] == "ignore" and f[3] is not None
                                       and getattr(f[3], "pattern", None) == r"torch_npu(\..*)?$")]
        warnings._filters_mutated()
        _state["warning_filter"] = False


def get_logger(component: str) -> logging.Logger:
    """The logger of one component (``torch_npu.<component>``)."""
    if component not in COMPONENTS:
        raise ValueError(f"unknown torch_npu log component {component!r}")
    return logging.getLogger(f"{_ROOT}.{component}")


def is_enabled(component: str, level: int) -> bool:
    """Cheap check before building an expensive message."""
    return get_logger(component).isEnabledFor(level)
