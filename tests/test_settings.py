"""The settings registry (torch_npu/_settings.py): every environment variable the
package reads is declared, parsed strictly, documented from the declarations,
and a bad value fails with an error naming the variable and the value."""
import importlib.util
import re
import socket

import pytest

from _subproc import REPO, result, run_many

_spec = importlib.util.spec_from_file_location("_settings_under_test", REPO / "torch_npu" / "_settings.py")
settings = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(settings)

# --------------------------------------------------------------------------
# Every read is declared
# --------------------------------------------------------------------------

_PY_READS = [
    re.compile(r"os\.environ\.get\(\s*(?P<arg>[^,)]+)"),
    re.compile(r"os\.getenv\(\s*(?P<arg>[^,)]+)"),
    re.compile(r"os\.environ\[\s*(?P<arg>[^\]]+)\](?!\s*=[^=])"),
    re.compile(r"(?P<arg>[\"'][A-Z0-9_]+[\"'])\s+(?:not\s+)?in\s+os\.environ"),
]
# Reads through the registry: a non-literal name is checked by the registry itself (KeyError).
_REGISTRY_READ = re.compile(r"_settings\.(?:get|raw|is_set)\(\s*(?P<arg>[^,)]+)")
_CPP_READ = re.compile(r"\b(?:std::)?(?:getenv|secure_getenv)\s*\(")
_LITERAL = re.compile(r"[\"']([A-Za-z0-9_]+)[\"']\Z")


def env_reads(text, python=True):
    """[(name or None for a non-literal name, line)] of the environment reads in ``text``."""
    found = []
    for no, line in enumerate(text.splitlines(), 1):
        if python:
            for pattern in _PY_READS:
                for m in pattern.finditer(line):
                    lit = _LITERAL.match(m.group("arg").strip())
                    found.append((lit.group(1) if lit else None, no))
            for m in _REGISTRY_READ.finditer(line):
                lit = _LITERAL.match(m.group("arg").strip())
                if lit:
                    found.append((lit.group(1), no))
        elif _CPP_READ.search(line):
            found.append((None, no))
    return found


def test_scanner_finds_reads():
    code = ('a = os.environ.get("FOO_A")\nb = os.getenv("FOO_B", "1")\nc = os.environ["FOO_C"]\n'
            'os.environ["NOT_A_READ"] = "1"\nd = "FOO_D" in os.environ\ne = os.getenv(name)\n'
            'f = _settings.get("FOO_F")\ng = _settings.get(name)\n')
    assert env_reads(code) == [("FOO_A", 1), ("FOO_B", 2), ("FOO_C", 3), ("FOO_D", 5), (None, 6), ("FOO_F", 7)]
    assert env_reads('const char* v = std::getenv("X");', python=False) == [(None, 1)]


def test_every_environment_read_is_declared():
    undeclared = []
    for path in sorted((REPO / "torch_npu").rglob("*.py")):
        if path.name == "_settings.py" and path.parent.name == "torch_npu":
            continue
        for name, line in env_reads(path.read_text(encoding="utf-8")):
            if name is None or name not in settings.SETTINGS:
                undeclared.append(f"{path.relative_to(REPO)}:{line}: {name or 'non-literal name'}")
    # The C++ core reads no environment: torch_npu._settings hands it its values.
    for path in sorted((REPO / "csrc").rglob("*")):
        if path.suffix in (".cpp", ".h", ".hpp", ".cc"):
            for _, line in env_reads(path.read_text(encoding="utf-8"), python=False):
                undeclared.append(f"{path.relative_to(REPO)}:{line}: getenv in the C++ core")
    assert not undeclared, "\n".join(undeclared)


def test_core_settings_are_declared_in_the_cpp_reads():
    # Every name the C++ core asks settings::get/flag for is a declared core setting, and back.
    asked = set()
    for path in (REPO / "csrc").rglob("*.cpp"):
        asked |= set(re.findall(r"settings::(?:get|flag)\(\"([A-Z0-9_]+)\"", path.read_text(encoding="utf-8")))
    core = {s.name for s in settings.SETTINGS.values() if s.core}
    assert asked == core


def test_where_names_existing_files():
    for s in settings.SETTINGS.values():
        for where in s.where.split(";"):
            assert (REPO / where.strip()).is_file(), (s.name, where)


def test_settings_page_is_current():
    spec = importlib.util.spec_from_file_location("_gen_settings_doc", REPO / "tools" / "gen_settings_doc.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    assert (REPO / "docs" / "settings.md").read_text(encoding="utf-8") == gen.render(), \
        "docs/settings.md is out of date: run python tools/gen_settings_doc.py"


def test_emulator_docstring_lists_its_settings():
    import torch_npu.emulator as emulator
    for name in ("TORCH_NPU_EMU_DEVICE_COUNT", "TORCH_NPU_EMU_DEVICE_NAME", "TORCH_NPU_EMU_MEMORY",
                 "TORCH_NPU_EMU_AUTOGRAD_THREADS", "TORCH_NPU_EMU_COLLECTIVE_CHECK", "TORCH_NPU_EMU_NUMERICS",
                 "ASCEND_RT_VISIBLE_DEVICES"):
        assert f"``{name}``" in emulator.__doc__
    assert settings.listing(settings.EMULATOR_SETTINGS) in emulator.__doc__
    assert set(emulator.settings()) == set(settings.EMULATOR_SETTINGS)


# --------------------------------------------------------------------------
# Strict parsing: each declared variable and its bad values
# --------------------------------------------------------------------------

_INT_BAD = ["", "abc", "1x", " 1", "1 ", "1.5", "inf", "0x10", "1_0", "99999999999999999999"]
_FLAG_BAD = ["", "2", "-1", "true", "yes", "1 ", "inf"]
_TEXT_BAD = [""]

BAD = {
    "TORCH_TRANSFER_TO_NPU": ["yes", "", "2"],
    "TORCH_NPU_EMU_AUTOGRAD_THREADS": _FLAG_BAD,
    "TORCH_NPU_COMPACT_ERROR_OUTPUT": _FLAG_BAD,
    "RANK": _INT_BAD + ["-1", "2147483648"],
    "TORCH_NPU_FALLBACK_CPU_DISABLE": _FLAG_BAD,
    "TORCH_NPU_USE_COMPATIBLE_IMPL": _FLAG_BAD,
    "TORCH_NPU_LOGS": ["+nonsense", "memory,bogus"],
    "ASCEND_GLOBAL_LOG_LEVEL": _INT_BAD + ["-1", "5"],
    "ASCEND_SLOG_PRINT_TO_STDOUT": _FLAG_BAD,
    "ASCEND_PROCESS_LOG_PATH": _TEXT_BAD,
    "TORCH_NPU_WARNING_DISABLE": _FLAG_BAD,
    "TORCH_NPU_DISABLED_WARNING": _FLAG_BAD,
    "TORCH_NPU_EMU_DEVICE_COUNT": _INT_BAD + ["-1", "65"],
    "TORCH_NPU_EMU_DEVICE_NAME": _TEXT_BAD,
    "TORCH_NPU_EMU_MEMORY": ["", "lots", "12XB", "-5", "inf", "nan", "0", "0.1", "1e400", "1GiBx", "1 GiB",
                             "99999999999999999999999", "8388608TiB"],
    "ASCEND_RT_VISIBLE_DEVICES": ["99999999999999999999", "4294967297", "2147483648", "1,99999999999999999999"],
    "PYTORCH_NPU_ALLOC_CONF": _TEXT_BAD,
    "PYTORCH_ALLOC_CONF": _TEXT_BAD,
    "PYTORCH_NO_NPU_MEMORY_CACHING": _FLAG_BAD,
    "HCCL_CONNECT_TIMEOUT": _INT_BAD + ["0", "-5", "2147483648"],
    "HCCL_EXEC_TIMEOUT": _INT_BAD + ["0", "-5", "2147483648"],
    "HCCL_SOCKET_IFNAME": _TEXT_BAD,
    "GLOO_SOCKET_IFNAME": _TEXT_BAD,
    "TORCHELASTIC_RESTART_COUNT": _INT_BAD + ["-1"],
    "TORCH_NPU_EMU_COLLECTIVE_CHECK": ["", "2", "maybe", "AUTO"],
    "TORCH_DISTRIBUTED_DEBUG": ["", "detail", "ALL"],
    "TASK_QUEUE_ENABLE": _INT_BAD + ["-1", "3"],
    "INF_NAN_MODE_FORCE_DISABLE": _FLAG_BAD,
    "TORCH_NPU_DEVICE_CAPABILITY": ["", "9", "9.0.1", "a.b", "inf", "9.0 "],
    "ASCEND_WORK_PATH": _TEXT_BAD,
    "SEED": _INT_BAD + ["-1", "4294967296"],
    "IN_CI": _FLAG_BAD,
    "TEST_REPORT_PATH": _TEXT_BAD,
    "SET_NPU_DEVICE": _INT_BAD + ["-1", "64"],
    "DUMP_BASELINE": _FLAG_BAD,
    "TORCH_NPU_EMU_CANN_ENV": ["", "2", "yes", "true", "1 "],
    "TORCH_NPU_EMU_NUMERICS": ["", "Chip", "EXACT", "hf32", "chip ", "1"],
    "_TORCH_NPU_TRANSFER_NOTICES_SHOWN": _FLAG_BAD,
}
# Passed through untouched: any string is a value their owner accepts.
ANY_STRING = {"TORCH_DEVICE_BACKEND_AUTOLOAD", "TORCH_NPU_LOGS_FILTER", "ASCEND_HOME_PATH", "DS_ACCELERATOR",
              "ASCEND_TOOLKIT_HOME", "ASCEND_AICPU_PATH", "ASCEND_OPP_PATH", "TOOLCHAIN_HOME", "XDG_CACHE_HOME",
              "ACCELERATE_TORCH_DEVICE", "PYTORCH_TESTING_DEVICE_ONLY_FOR", "PYTORCH_TESTING_DEVICE_EXCEPT_FOR",
              # the real torch_npu enables the sanitizer when the variable is present, whatever its value
              "TORCH_NPU_SANITIZER", "ASCEND_OPP_DEBUG_PATH"}

GOOD = {
    "TORCH_NPU_EMU_MEMORY": [("512MiB", 512 << 20), ("1.5GiB", 3 << 29), ("1e3", 1000), ("64g", 64 << 30),
                             ("9223372036854775807", 2 ** 63 - 1)],
    "ASCEND_RT_VISIBLE_DEVICES": [("1,a,2", [1]), ("0,,3", [0]), ("", []), ("2,5", [2, 5]),
                                  ("2147483647", [2147483647])],
    "TORCH_NPU_EMU_DEVICE_COUNT": [("0", 0), ("64", 64), ("+3", 3)],
    "HCCL_EXEC_TIMEOUT": [("1", 1), ("2147483647", 2147483647)],
    "TORCH_NPU_EMU_COLLECTIVE_CHECK": [("all", "1"), ("off", "0"), ("auto", "auto")],
    "TORCH_NPU_DEVICE_CAPABILITY": [("9.0", (9, 0))],
}


def test_bad_value_table_covers_every_declared_variable():
    assert set(BAD) | ANY_STRING == set(settings.SETTINGS)
    assert not set(BAD) & ANY_STRING


@pytest.mark.parametrize("name", sorted(BAD))
def test_bad_values_are_rejected_naming_variable_and_value(monkeypatch, name):
    for value in BAD[name]:
        monkeypatch.setenv(name, value)
        with pytest.raises(ValueError) as ei:
            settings.get(name)
        msg = str(ei.value)
        assert name in msg and (repr(value) in msg or f": {value}." in msg), (name, value, msg)


@pytest.mark.parametrize("name", sorted(GOOD))
def test_good_values_parse(monkeypatch, name):
    for value, expected in GOOD[name]:
        monkeypatch.setenv(name, value)
        assert settings.get(name) == expected, (name, value)


def test_unset_gives_the_default(monkeypatch):
    for s in settings.SETTINGS.values():
        monkeypatch.delenv(s.name, raising=False)
        assert settings.get(s.name) == s.default


def test_undeclared_name_is_refused():
    with pytest.raises(KeyError, match="NOT_DECLARED_ANYWHERE is not declared"):
        settings.get("NOT_DECLARED_ANYWHERE")


# --------------------------------------------------------------------------
# End to end: the error comes where the variable takes effect, never a crash
# --------------------------------------------------------------------------

_IMPORT = r'''
import os
R = {"import": catch(lambda: __import__("torch_npu"))}
R["autoload"] = os.environ.get("TORCH_DEVICE_BACKEND_AUTOLOAD")  # restored after the failed import
emit(R)
'''

_NO_AUTOLOAD = {"TORCH_DEVICE_BACKEND_AUTOLOAD": None}  # unset, to see that a failed import restores it

_DEVICE = r'''
import torch, torch_npu
R = {"use": catch(lambda: torch.ones(1, device="npu")), "config": torch_npu.emulator.config()}
emit(R)
'''

# Every device-phase variable in one process: the first device use fails, so
# the next attempt checks the settings again.
_DEVICE_ALL = r'''
import os, torch, torch_npu
R = []
for name, values in BAD.items():
    for value in values:
        os.environ[name] = value
        R.append([name, value, catch(lambda: torch.ones(1, device="npu"))])
    del os.environ[name]
R.append(["clean", "", catch(lambda: torch.ones(1, device="npu"))])
emit(R)
'''

_HCCL = r'''
import time, datetime, torch, torch_npu
import torch.distributed as dist
t0 = time.monotonic()
# rank 1 never starts: a check after connecting would wait for it until the timeout.
err = catch(lambda: dist.init_process_group("hccl", init_method="tcp://127.0.0.1:%d", rank=0, world_size=2,
                                            timeout=datetime.timedelta(seconds=60)))
emit({"err": err, "s": time.monotonic() - t0})
'''


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_DEVICE_NAMES = [s.name for s in settings.SETTINGS.values() if s.when == "device"]


@pytest.fixture(scope="module")
def fresh():
    device_bad = {n: BAD[n] for n in _DEVICE_NAMES}
    return run_many({
        "autograd_threads": (_IMPORT, dict(_NO_AUTOLOAD, TORCH_NPU_EMU_AUTOGRAD_THREADS="2")),
        "rank": (_IMPORT, dict(_NO_AUTOLOAD, RANK="4294967297")),
        "compact": (_IMPORT, dict(_NO_AUTOLOAD, TORCH_NPU_COMPACT_ERROR_OUTPUT="yes")),
        "memory_inf": (_DEVICE, {"TORCH_NPU_EMU_MEMORY": "inf"}),
        "memory_huge": (_DEVICE, {"TORCH_NPU_EMU_MEMORY": "99999999999999999999999"}),
        "visible_huge": (_DEVICE, {"ASCEND_RT_VISIBLE_DEVICES": "99999999999999999999"}),
        "visible_wrap": (_DEVICE, {"ASCEND_RT_VISIBLE_DEVICES": "4294967297"}),
        "device_all": (f"BAD = {device_bad!r}\n" + _DEVICE_ALL, {}),
        "hccl_exec": (_HCCL % _free_port(), {"HCCL_EXEC_TIMEOUT": "abc", "HCCL_CONNECT_TIMEOUT": "3"}),
    })


@pytest.mark.parametrize("job,name,value", [("autograd_threads", "TORCH_NPU_EMU_AUTOGRAD_THREADS", "2"),
                                            ("rank", "RANK", "4294967297"),
                                            ("compact", "TORCH_NPU_COMPACT_ERROR_OUTPUT", "yes")])
def test_import_fails_on_a_bad_import_setting(fresh, job, name, value):
    r = result(fresh, job)
    err = r["import"]
    assert r["autoload"] is None
    assert err[0] == "ValueError" and err[1].startswith(f"{name} must be ") and err[1].endswith(f"got {value!r}")


@pytest.mark.parametrize("job,name,value", [("memory_inf", "TORCH_NPU_EMU_MEMORY", "inf"),
                                            ("memory_huge", "TORCH_NPU_EMU_MEMORY", "99999999999999999999999"),
                                            ("visible_huge", "ASCEND_RT_VISIBLE_DEVICES", "99999999999999999999"),
                                            ("visible_wrap", "ASCEND_RT_VISIBLE_DEVICES", "4294967297")])
def test_device_settings_fail_at_first_device_use(fresh, job, name, value):
    r = result(fresh, job)
    assert r["use"][0] == "RuntimeError"
    assert r["use"][1].startswith(f"{name} must be ") and f"got {value!r}" in r["use"][1]
    assert "ERR00003 PTA invalid value" in r["use"][1]
    # the core never saw the bad value: the default machine, not a 0-byte device or device [-1]/[1]
    assert r["config"]["memory_per_device"] == 64 << 30
    assert r["config"]["visible_devices"] == list(range(8))


def test_every_device_setting_bad_value_fails_in_process(fresh):
    r = result(fresh, "device_all")
    assert len(r) == sum(len(BAD[n]) for n in _DEVICE_NAMES) + 1
    for name, value, err in r[:-1]:
        assert err is not None and err[0] == "RuntimeError", (name, value, err)
        assert err[1].startswith(f"{name} must be ") and f"got {value!r}" in err[1], (name, value, err)
    assert r[-1] == ["clean", "", None]


def test_bad_hccl_timeout_fails_at_init_before_any_collective(fresh):
    # The bad rank still joins the peer check (so its peers get the same verdict), and
    # raises within HCCL_CONNECT_TIMEOUT even when its peer never comes.
    r = result(fresh, "hccl_exec")
    assert r["err"][0] == "DistBackendError", r
    assert ("HCCL_EXEC_TIMEOUT must be an integer number of seconds from 1 to 2147483647, got 'abc'"
            in r["err"][1]), r
    assert r["s"] < 30  # bounded by HCCL_CONNECT_TIMEOUT=3, not the 60 s group timeout
