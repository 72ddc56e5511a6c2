"""The one registry of the environment variables torch_npu reads.

Every variable the package reads (Python under ``torch_npu/``, C++ under
``csrc/``) is declared here once: name, type, default, meaning, where it
takes effect and when it is checked. Python code reads a variable only
through :func:`get` (parsed) or :func:`raw` (the string as set, for values
that are passed through untouched). The C++ core never reads the
environment: at import, :func:`push_to_core` hands it the validated values
of the variables declared ``core=True`` (``torch_npu._C._set_core_settings``,
kept by ``csrc/core/Settings.cpp``).

Parsing is strict and identical for every variable: the whole string must
parse (no trailing garbage, no ``inf``, no overflow, no empty string unless
the type allows it) and lie in its range; otherwise :class:`SettingError`
names the variable and the value. Variables are checked when they first
take effect (``when``): ``import`` ones by ``import torch_npu``, ``device``
ones at the first device use, ``process group`` ones at
``init_process_group`` before any rank connects, ``call`` ones when the API
that reads them is called.

``docs/settings.md`` and the ``torch_npu.emulator`` docstring are generated
from this table (``tools/gen_settings_doc.py``).
"""
import os
import re
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional

__all__ = []

INT32_MAX = 2 ** 31 - 1
INT64_MAX = 2 ** 63 - 1


# A value the declaration does not accept raises a plain ValueError (as the
# real torch_npu does for TORCH_TRANSFER_TO_NPU); this name documents it.
SettingError = ValueError


class _Type:
    """A parser: ``parse(name, raw)`` returns the value or raises SettingError; ``text`` documents it."""

    def __init__(self, text: str, parse: Callable[[str], Any], expect: str, empty_ok: bool = False,
                 message: Optional[str] = None):
        self.text, self._parse, self.expect, self.empty_ok, self.message = text, parse, expect, empty_ok, message

    def parse(self, name: str, raw: str):
        if raw == "" and not self.empty_ok:
            self._fail(name, raw)
        try:
            return self._parse(raw)
        except (ValueError, OverflowError):
            self._fail(name, raw)

    def _fail(self, name, raw):
        if self.message:
            raise SettingError(self.message.format(name=name, value=raw)) from None
        raise SettingError(f"{name} must be {self.expect}, got {raw!r}") from None


_INT_RE = re.compile(r"[+-]?[0-9]+\Z")


def _int_type(lo: int, hi: int, unit: str = "") -> _Type:
    def parse(raw):
        if not _INT_RE.match(raw):
            raise ValueError(raw)
        value = int(raw)
        if not lo <= value <= hi:
            raise ValueError(raw)
        return value
    what = f"an integer{(' number of ' + unit) if unit else ''} from {lo} to {hi}"
    return _Type(f"integer {lo}..{hi}" + (f" ({unit})" if unit else ""), parse, what)


def _choice_type(choices: Dict[str, Any], message: Optional[str] = None) -> _Type:
    def parse(raw):
        if raw not in choices:
            raise ValueError(raw)
        return choices[raw]
    names = list(choices)
    listed = ", ".join(repr(c) for c in names[:-1]) + f" or {names[-1]!r}" if len(names) > 1 else repr(names[0])
    return _Type("one of " + ", ".join(f"`{c}`" for c in names), parse, f"one of {listed}"
                 if len(names) > 2 else listed, message=message)


_FLAG = _choice_type({"0": False, "1": True})

_SIZE_RE = re.compile(r"([0-9]+(?:\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?([A-Za-z]*)\Z")
_UNITS = {"": 1, "B": 1, "K": 1 << 10, "KB": 1 << 10, "KIB": 1 << 10, "M": 1 << 20, "MB": 1 << 20,
          "MIB": 1 << 20, "G": 1 << 30, "GB": 1 << 30, "GIB": 1 << 30, "T": 1 << 40, "TB": 1 << 40,
          "TIB": 1 << 40}


def _parse_size(raw):
    m = _SIZE_RE.match(raw)
    if not m or m.group(3).upper() not in _UNITS:
        raise ValueError(raw)
    from fractions import Fraction  # exact: no float rounding or overflow on huge inputs
    number = Fraction(m.group(1)) * (Fraction(10) ** int(m.group(2)[1:]) if m.group(2) else 1)
    if m.group(2) and abs(int(m.group(2)[1:])) > 40:
        raise ValueError(raw)
    value = int(number * _UNITS[m.group(3).upper()])
    if not 1 <= value <= INT64_MAX:
        raise ValueError(raw)
    return value


_SIZE = _Type("size: bytes, or a number with K/M/G/T[i][B] (1 byte to 2^63-1)", _parse_size,
              "a size such as 512MiB, 16GiB or a byte count")


def _parse_visible(raw):
    """The real grammar: digits and commas are read up to the first other
    character; an empty element ends the list. Ids must fit a 32-bit int."""
    end = 0
    while end < len(raw) and (raw[end].isdigit() or raw[end] == ","):
        end += 1
    ids: List[int] = []
    if end == 0:
        return ids
    for elem in raw[:end].split(","):
        if not elem:
            break
        value = int(elem)
        if value > INT32_MAX:
            raise ValueError(raw)
        ids.append(value)
    return ids


_VISIBLE = _Type("comma-separated device ids (read up to the first other character)", _parse_visible,
                 f"comma-separated device ids from 0 to {INT32_MAX}", empty_ok=True)


def _parse_text(raw):
    return raw


_TEXT = _Type("string (not empty)", _parse_text, "a non-empty string")
_TEXT_OR_EMPTY = _Type("string", _parse_text, "a string", empty_ok=True)


def _parse_capability(raw):
    m = re.fullmatch(r"([0-9]{1,4})\.([0-9]{1,4})", raw)
    if not m:
        raise ValueError(raw)
    return int(m.group(1)), int(m.group(2))


_CAPABILITY = _Type('"major.minor" (e.g. "9.0")', _parse_capability, 'a version "major.minor" such as "9.0"')


# torch_npu's log components (torch_npu.utils._logging) and Python's level numbers.
LOG_COMPONENTS = ("device", "memory", "dispatch", "distributed", "env")
_DEBUG, _INFO, _ERROR = 10, 20, 40


def _parse_log_spec(spec):
    """TORCH_NPU_LOGS -> {component: level}; unknown names are an error, as in TORCH_LOGS."""
    levels = {}
    for item in filter(None, (s.strip() for s in spec.split(","))):
        level = _INFO
        if item[0] == "+":
            level, item = _DEBUG, item[1:]
        elif item[0] == "-":
            level, item = _ERROR, item[1:]
        names = LOG_COMPONENTS if item == "all" else (item,)
        for name in names:
            if name not in LOG_COMPONENTS:
                raise ValueError(f"Invalid log settings: {spec}, unknown component {name!r}; "
                                 f"valid components: {', '.join(LOG_COMPONENTS)}, all")
            levels[name] = level
    return levels


class _LogSpecType(_Type):
    # The TORCH_LOGS-style parser owns the reason (as in torch); the variable is named here.
    def parse(self, name, raw):
        try:
            return _parse_log_spec(raw)
        except ValueError as e:
            raise SettingError(f"{name}={raw!r}: {e}") from None


_LOG_SPEC = _LogSpecType("comma-separated components with +/- prefixes", _parse_log_spec, "", empty_ok=True)


@dataclass(frozen=True)
class Setting:
    """One environment variable: how it is parsed and where it acts."""
    name: str
    type: _Type
    default: Any
    meaning: str
    where: str            # the modules / C++ files that consume it
    when: str             # "import", "device", "process group" or "call"
    core: bool = False    # handed to the C++ core by push_to_core()
    owner: str = "torch_npu"   # "torch_npu", "CANN", "PyTorch", "launcher" or "OS": who defines it


_ALL: List[Setting] = [
    # --- import ---------------------------------------------------------------------------
    Setting("TORCH_DEVICE_BACKEND_AUTOLOAD", _TEXT_OR_EMPTY, None,
            "PyTorch's autoload switch; torch_npu sets it to 0 while it imports and restores it afterwards.",
            "torch_npu/__init__.py", "import", owner="PyTorch"),
    Setting("TORCH_TRANSFER_TO_NPU", _choice_type({"0": False, "1": True},
            "Invalid value for {name}: {value}. Only '0' or '1' is supported."), False,
            "1: apply torch_npu.contrib.transfer_to_npu (CUDA calls go to npu) once the package is ready.",
            "torch_npu/__init__.py", "import"),
    Setting("_TORCH_NPU_TRANSFER_NOTICES_SHOWN", _FLAG, False,
            "Internal: 1 once transfer_to_npu printed its banner and one-time warnings in a parent "
            "process (launcher, rank 0, mp.spawn parent), so the processes it starts stay quiet.",
            "torch_npu/contrib/transfer_to_npu.py", "call"),
    Setting("TORCH_NPU_SANITIZER", _TEXT_OR_EMPTY, None,
            "Set (to any value): `import torch_npu` enables the NPU stream sanitizer "
            "(torch_npu.npu._sanitizer.enable_npu_sanitizer()); `1` also reports missing "
            "record_stream calls when memory is freed. See docs/stream-sanitizer.md.",
            "torch_npu/__init__.py; torch_npu/npu/_sanitizer.py", "import"),
    Setting("ASCEND_OPP_DEBUG_PATH", _TEXT_OR_EMPTY, None,
            "CANN debug kernels directory; when set, the sanitizer picks its kernel check, which "
            "has nothing to check on the emulated NPU (unset it for the stream check).",
            "torch_npu/npu/_sanitizer.py", "call", owner="CANN"),
    Setting("TORCH_NPU_EMU_AUTOGRAD_THREADS", _FLAG, False,
            "1: keep PyTorch's per-device autograd threads for npu backward (default: the calling thread).",
            "torch_npu/__init__.py", "import"),
    Setting("TORCH_NPU_EMU_NUMERICS", _choice_type({"exact": "exact", "chip": "chip"}), "exact",
            "`exact`: npu ops compute bitwise what the CPU computes; `chip`: fp32 matmul/convolution inputs are "
            "rounded as a 910B cube unit rounds them (HF32/fp16, per torch.npu.conv/matmul.allow_hf32, "
            "cube_math_type and ACL_PRECISION_MODE; docs/numerics.md). torch_npu.emulator.set_numerics "
            "switches it at run time.", "torch_npu/emulator/_numerics.py", "import"),
    Setting("TORCH_NPU_COMPACT_ERROR_OUTPUT", _FLAG, False,
            "1: drop the `[ERROR] <time> (PID, Device, RankID) ERRxxxxx` suffix from error messages.",
            "csrc/core/NPUException.cpp", "import", core=True),
    Setting("RANK", _int_type(0, INT32_MAX), None,
            "Global rank (set by the launcher); shown as RankID in the error suffix and used by "
            "transfer_to_npu to print its notice once.",
            "csrc/core/NPUException.cpp; torch_npu/contrib/transfer_to_npu.py", "import", core=True,
            owner="launcher"),
    Setting("TORCH_NPU_FALLBACK_CPU_DISABLE", _FLAG, False,
            "1: ops without an NPU kernel raise instead of running on the CPU.",
            "csrc/aten/EmulatedCpuFallback.cpp", "import", core=True),
    Setting("TORCH_NPU_USE_COMPATIBLE_IMPL", _FLAG, False,
            "1: start with the compatible implementations on (torch.npu.use_compatible_impl).",
            "torch_npu/npu/_option_store.py", "import"),
    Setting("TORCH_NPU_LOGS", _LOG_SPEC, {},
            "TORCH_LOGS-style components to log to stderr: `+memory` DEBUG, `memory` INFO, `-memory` ERROR; "
            "`all` selects every component.", "torch_npu/utils/_logging.py", "import"),
    Setting("TORCH_NPU_LOGS_FILTER", _TEXT_OR_EMPTY, "",
            "Comma-separated substrings: `-x` drops records containing x, the others keep only matching records.",
            "torch_npu/utils/_logging.py", "import"),
    Setting("ASCEND_GLOBAL_LOG_LEVEL", _int_type(0, 4), 3,
            "CANN plog level: 0 debug, 1 info, 2 warning, 3 error, 4 none.",
            "torch_npu/utils/_logging.py", "import", owner="CANN"),
    Setting("ASCEND_SLOG_PRINT_TO_STDOUT", _FLAG, False,
            "1: plog records go to stdout instead of the plog file.",
            "torch_npu/utils/_logging.py", "import", owner="CANN"),
    Setting("ASCEND_PROCESS_LOG_PATH", _TEXT, None,
            "Directory of the plog files (default ~/ascend/log/debug).",
            "torch_npu/utils/_logging.py", "import", owner="CANN"),
    Setting("TORCH_NPU_WARNING_DISABLE", _FLAG, False,
            "1: ignore Python warnings raised from torch_npu's modules.",
            "torch_npu/utils/_logging.py", "import"),
    Setting("TORCH_NPU_DISABLED_WARNING", _FLAG, False,
            "Deprecated alias of TORCH_NPU_WARNING_DISABLE.", "torch_npu/utils/_logging.py", "import"),
    # --- emulated machine: first device use ------------------------------------------------
    Setting("TORCH_NPU_EMU_DEVICE_COUNT", _int_type(0, 64), 8,
            "Number of emulated NPUs.", "csrc/runtime/AclRuntime.cpp", "device", core=True),
    Setting("TORCH_NPU_EMU_DEVICE_NAME", _TEXT, "Ascend910B4",
            "Name of the emulated NPU (selects SoC-dependent behaviour such as inf/nan mode).",
            "csrc/runtime/AclRuntime.cpp", "device", core=True),
    Setting("TORCH_NPU_EMU_MEMORY", _SIZE, 64 << 30,
            "Capacity of each emulated device, e.g. 64GiB, 512MiB or a byte count. Host memory is used "
            "only as tensors are allocated.", "csrc/runtime/AclRuntime.cpp", "device", core=True),
    Setting("ASCEND_RT_VISIBLE_DEVICES", _VISIBLE, None,
            "Devices this process sees (CUDA_VISIBLE_DEVICES analogue): ids must ascend; an id past the "
            "device count ends the list.",
            "csrc/runtime/AclRuntime.cpp; torch_npu/npu/__init__.py", "device", core=True, owner="CANN"),
    Setting("PYTORCH_NPU_ALLOC_CONF", _TEXT, None,
            "Caching allocator options `key:value,...` (max_split_size_mb, garbage_collection_threshold, "
            "expandable_segments, ...); parsed by the allocator at the first allocation.",
            "csrc/core/NPUCachingAllocator.cpp", "device", core=True),
    Setting("PYTORCH_ALLOC_CONF", _TEXT, None,
            "PyTorch's generic spelling of PYTORCH_NPU_ALLOC_CONF (setting both is an error).",
            "csrc/core/NPUCachingAllocator.cpp", "device", core=True, owner="PyTorch"),
    Setting("PYTORCH_NO_NPU_MEMORY_CACHING", _FLAG, False,
            "1: no caching; every tensor gets and returns its own device allocation.",
            "csrc/core/NPUCachingAllocator.cpp", "device", core=True),
    # --- distributed: init_process_group ---------------------------------------------------
    Setting("HCCL_CONNECT_TIMEOUT", _int_type(1, INT32_MAX, "seconds"), 120,
            "Seconds every rank waits for its peers at init_process_group (also bounds the store rendezvous).",
            "torch_npu/distributed/_backend.py", "process group", owner="CANN"),
    Setting("HCCL_EXEC_TIMEOUT", _int_type(1, INT32_MAX, "seconds"), None,
            "Collective timeout in seconds: a dead or hung peer makes the others raise by then "
            "(default: the group timeout).", "torch_npu/distributed/_backend.py", "process group",
            owner="CANN"),
    Setting("HCCL_SOCKET_IFNAME", _TEXT, None,
            "Network interfaces HCCL binds (comma-separated); passed to Gloo as GLOO_SOCKET_IFNAME.",
            "torch_npu/distributed/_backend.py", "process group", owner="CANN"),
    Setting("GLOO_SOCKET_IFNAME", _TEXT, None,
            "Gloo's interface list; when set it wins over HCCL_SOCKET_IFNAME.",
            "torch_npu/distributed/_backend.py", "process group", owner="PyTorch"),
    Setting("TORCHELASTIC_RESTART_COUNT", _int_type(0, INT32_MAX), 0,
            "Restart number set by torchrun; keys the init-time peer check of each restart apart.",
            "torch_npu/distributed/_backend.py", "process group", owner="launcher"),
    Setting("TORCH_NPU_EMU_COLLECTIVE_CHECK",
            _choice_type({"auto": "auto", "0": "0", "1": "1", "false": "0", "true": "1", "off": "0",
                          "on": "1", "OFF": "0", "ON": "1", "all": "1"}), "auto",
            "Fingerprint check of collectives across ranks: 1/all every collective, 0 never, auto where "
            "it is cheap (the first collectives of a group and large payloads).",
            "csrc/distributed/CollectiveCheck.cpp", "process group", core=True),
    Setting("TORCH_DISTRIBUTED_DEBUG", _choice_type({"OFF": "OFF", "INFO": "INFO", "DETAIL": "DETAIL"}), "OFF",
            "PyTorch's distributed debug level; DETAIL also turns the collective fingerprint check on for "
            "every collective.", "csrc/distributed/CollectiveCheck.cpp", "process group", core=True,
            owner="PyTorch"),
    # --- read by the API that uses them ----------------------------------------------------
    Setting("TASK_QUEUE_ENABLE", _int_type(0, 2), 1,
            "Op-launch pipeline level 0/1/2 (torch.npu.get_task_queue_enable's start value).",
            "torch_npu/npu/utils.py", "call", owner="CANN"),
    Setting("INF_NAN_MODE_FORCE_DISABLE", _FLAG, False,
            "1: force saturation mode (overflow seen through the float-status flag).",
            "torch_npu/npu/utils.py; torch_npu/npu/_overflow.py", "call", owner="CANN"),
    Setting("TORCH_NPU_DEVICE_CAPABILITY", _CAPABILITY, None,
            "What torch.npu.get_device_capability() returns (unset: None with a warning).",
            "torch_npu/npu/utils.py", "call"),
    Setting("ASCEND_WORK_PATH", _TEXT, None,
            "Profiles without a dir_name go to $ASCEND_WORK_PATH/profiling_data.",
            "torch_npu/profiler/_path_creator.py", "call", owner="CANN"),
    Setting("ASCEND_HOME_PATH", _TEXT_OR_EMPTY, None,
            "CANN install directory (set_env.sh). Unset, `import torch_npu` points it at the emulated "
            "toolkit (see TORCH_NPU_EMU_CANN_ENV); `torch-npu doctor` reports who set it.",
            "torch_npu/utils/_cann_env.py; torch_npu/cli/doctor.py", "import", owner="CANN"),
    Setting("ASCEND_TOOLKIT_HOME", _TEXT_OR_EMPTY, None,
            "CANN toolkit directory (set_env.sh); set by the user, torch_npu adds no CANN variable.",
            "torch_npu/utils/_cann_env.py", "import", owner="CANN"),
    Setting("ASCEND_AICPU_PATH", _TEXT_OR_EMPTY, None,
            "CANN AI CPU kernels directory (set_env.sh); exported by torch_npu when unset.",
            "torch_npu/utils/_cann_env.py", "import", owner="CANN"),
    Setting("ASCEND_OPP_PATH", _TEXT_OR_EMPTY, None,
            "CANN operator package directory (set_env.sh); exported by torch_npu when unset.",
            "torch_npu/utils/_cann_env.py", "import", owner="CANN"),
    Setting("TOOLCHAIN_HOME", _TEXT_OR_EMPTY, None,
            "CANN toolchain directory (set_env.sh); exported by torch_npu when unset.",
            "torch_npu/utils/_cann_env.py", "import", owner="CANN"),
    Setting("TORCH_NPU_EMU_CANN_ENV", _choice_type({"0": False, "1": True},
                                                   "Invalid value for {name}: {value}. Only '0' or '1' is supported."),
            True,
            "0: `import torch_npu` does not export CANN's set_env.sh variables (ASCEND_HOME_PATH ...) "
            "pointing at the emulated toolkit; 1: it exports those that are unset.",
            "torch_npu/utils/_cann_env.py", "import"),
    Setting("XDG_CACHE_HOME", _TEXT_OR_EMPTY, None,
            "Where the emulated CANN toolkit is laid out ($XDG_CACHE_HOME/torch_npu; default ~/.cache).",
            "torch_npu/utils/_cann_env.py", "import", owner="OS"),
    Setting("DS_ACCELERATOR", _TEXT_OR_EMPTY, None,
            "DeepSpeed's accelerator override; `torch-npu doctor` reports it.", "torch_npu/cli/doctor.py",
            "call", owner="DeepSpeed"),
    Setting("ACCELERATE_TORCH_DEVICE", _TEXT_OR_EMPTY, None,
            "Accelerate's device override; `torch-npu doctor` reports it.", "torch_npu/cli/doctor.py",
            "call", owner="Accelerate"),
    # --- torch_npu.testing -----------------------------------------------------------------
    Setting("SEED", _int_type(0, 2 ** 32 - 1), 666, "Seed of torch_npu.testing.TestCase (read when "
            "torch_npu.testing.testcase is imported).", "torch_npu/testing/testcase.py", "call",
            owner="torch_npu.testing"),
    Setting("IN_CI", _FLAG, False, "1: torch_npu.testing writes XML test reports.",
            "torch_npu/testing/testcase.py", "call", owner="torch_npu.testing"),
    Setting("TEST_REPORT_PATH", _TEXT, "test-reports", "Directory of those XML reports.",
            "torch_npu/testing/testcase.py", "call", owner="torch_npu.testing"),
    Setting("SET_NPU_DEVICE", _int_type(0, 63), None, "Device index torch_npu.testing tests run on.",
            "torch_npu/testing/common_utils.py", "call", owner="torch_npu.testing"),
    Setting("DUMP_BASELINE", _FLAG, False, "1: torch_npu.testing dumps baselines instead of comparing.",
            "torch_npu/testing/common_utils.py", "call", owner="torch_npu.testing"),
    Setting("PYTORCH_TESTING_DEVICE_ONLY_FOR", _TEXT_OR_EMPTY, None,
            "PyTorch's device-type test filter; when neither it nor the EXCEPT_FOR form is set, "
            "torch_npu.testing sets PYTORCH_TESTING_DEVICE_EXCEPT_FOR=cuda,cpu.",
            "torch_npu/testing/_patch_torch_testing.py", "call", owner="PyTorch"),
    Setting("PYTORCH_TESTING_DEVICE_EXCEPT_FOR", _TEXT_OR_EMPTY, None,
            "PyTorch's device-type test filter (see PYTORCH_TESTING_DEVICE_ONLY_FOR).",
            "torch_npu/testing/_patch_torch_testing.py", "call", owner="PyTorch"),
]

SETTINGS: Dict[str, Setting] = {s.name: s for s in _ALL}
WHEN = ("import", "device", "process group", "call")


def _declared(name: str) -> Setting:
    try:
        return SETTINGS[name]
    except KeyError:
        raise KeyError(f"{name} is not declared in torch_npu._settings") from None


def raw(name: str) -> Optional[str]:
    """The variable's string as set (None when unset), for a declared variable."""
    _declared(name)
    return os.environ.get(name)


def is_set(name: str) -> bool:
    """Whether a declared variable is present in the environment."""
    return raw(name) is not None


def get(name: str):
    """The parsed value of a declared variable, its default when unset.

    Raises SettingError naming the variable and the value when the value is
    not accepted. Reads the environment on every call (tests change it).
    """
    s = _declared(name)
    value = os.environ.get(name)
    if value is None:
        return s.default
    return s.type.parse(name, value)


def validate(when: str) -> None:
    """Parse every variable checked at ``when``; raise the first SettingError."""
    if when not in WHEN:
        raise ValueError(f"unknown phase {when!r}; one of {WHEN}")
    for s in _ALL:
        if s.when == when:
            get(s.name)


def _core_text(s: Setting, value) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    return str(value)


def core_values() -> Dict[str, str]:
    """Canonical strings of the set ``core`` variables whose values parse.

    A value that does not parse is left out (the core keeps its default) and
    its error is raised by Python when the variable takes effect.
    """
    out = {}
    for s in _ALL:
        if not s.core or s.name not in os.environ:
            continue
        try:
            out[s.name] = _core_text(s, get(s.name))
        except SettingError:
            continue
    return out


def listing(names=None) -> str:
    """reST bullet list of the declared variables (all, or ``names`` in order)."""
    chosen = [SETTINGS[n] for n in names] if names is not None else _ALL
    lines = []
    for s in chosen:
        default = "unset" if s.default is None else f"``{_core_text(s, s.default)}``" if not isinstance(
            s.default, dict) else "empty"
        lines.append(f"- ``{s.name}`` ({s.type.text}; default {default}; checked at {s.when}): {s.meaning}")
    return "\n".join(lines)


EMULATOR_SETTINGS = ("TORCH_NPU_EMU_DEVICE_COUNT", "TORCH_NPU_EMU_DEVICE_NAME", "TORCH_NPU_EMU_MEMORY",
                     "TORCH_NPU_EMU_AUTOGRAD_THREADS", "TORCH_NPU_EMU_COLLECTIVE_CHECK", "TORCH_NPU_EMU_NUMERICS",
                     "ASCEND_RT_VISIBLE_DEVICES")


def push_to_core() -> None:
    """Hand the core variables to the C++ core (it reads no environment itself),
    with whether Python is interactive (the error suffix is dropped there)."""
    import sys
    from torch_npu import _C
    interactive = bool(getattr(sys, "ps1", None)) or bool(sys.flags.interactive)
    _C._set_core_settings(core_values(), interactive)
