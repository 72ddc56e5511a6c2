"""Logging from the real variables: TORCH_NPU_LOGS(+_FILTER), ASCEND_GLOBAL_LOG_LEVEL,
ASCEND_SLOG_PRINT_TO_STDOUT, TORCH_NPU_WARNING_DISABLE (spec: env_vars.tsv)."""
import logging
import re
import warnings

import pytest

import torch_npu  # noqa: F401
from torch_npu.utils import _logging

_VARS = ("TORCH_NPU_LOGS", "TORCH_NPU_LOGS_FILTER", "ASCEND_GLOBAL_LOG_LEVEL", "ASCEND_SLOG_PRINT_TO_STDOUT",
         "ASCEND_PROCESS_LOG_PATH", "TORCH_NPU_WARNING_DISABLE", "TORCH_NPU_DISABLED_WARNING")


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for v in _VARS:
        monkeypatch.delenv(v, raising=False)
    yield
    for v in _VARS:
        monkeypatch.delenv(v, raising=False)
    _logging.configure()


def _log_all(component="memory"):
    log = _logging.get_logger(component)
    log.debug("dbg-msg")
    log.info("info-msg")
    log.warning("warn-msg")
    log.error("err-msg")


def test_torch_npu_logs_levels(monkeypatch, capsys):
    monkeypatch.setenv("ASCEND_GLOBAL_LOG_LEVEL", "4")
    for spec, expected in (("+memory", ["dbg", "info", "warn", "err"]), ("memory", ["info", "warn", "err"]),
                           ("-memory", ["err"]), ("device", [])):
        monkeypatch.setenv("TORCH_NPU_LOGS", spec)
        _logging.configure()
        _log_all("memory")
        err = capsys.readouterr().err
        got = re.findall(r"\[torch_npu\.memory\] \w+ [\d\- :]+ \d+ (\w+)-msg", err)
        assert got == expected, (spec, err)


def test_torch_npu_logs_rejects_unknown_component(monkeypatch):
    monkeypatch.setenv("TORCH_NPU_LOGS", "+nonsense")
    with pytest.raises(ValueError, match="unknown component 'nonsense'"):
        _logging.configure()


def test_torch_npu_logs_filter(monkeypatch, capsys):
    monkeypatch.setenv("ASCEND_GLOBAL_LOG_LEVEL", "4")
    monkeypatch.setenv("TORCH_NPU_LOGS", "+all")
    monkeypatch.setenv("TORCH_NPU_LOGS_FILTER", "info,err,-err")
    _logging.configure()
    _log_all("dispatch")
    err = capsys.readouterr().err
    assert "info-msg" in err and "err-msg" not in err and "warn-msg" not in err


def test_ascend_log_level_to_stdout(monkeypatch, capsys):
    monkeypatch.setenv("ASCEND_SLOG_PRINT_TO_STDOUT", "1")
    for level, expected in (("0", ["DEBUG", "INFO", "WARNING", "ERROR"]), ("1", ["INFO", "WARNING", "ERROR"]),
                            ("2", ["WARNING", "ERROR"]), ("3", ["ERROR"]), ("4", [])):
        monkeypatch.setenv("ASCEND_GLOBAL_LOG_LEVEL", level)
        _logging.configure()
        _log_all("device")
        out = capsys.readouterr().out
        got = re.findall(r"^\[(\w+)\] PTA\(\d+,python\):\d{4}-\d\d-\d\d-\d\d:\d\d:\d\d\.\d{3}\.\d{3} \[device\] \w+-msg$",
                         out, re.M)
        assert got == expected, (level, out)


def test_plog_file_created_only_when_logging(monkeypatch, tmp_path):
    monkeypatch.setenv("ASCEND_PROCESS_LOG_PATH", str(tmp_path))
    _logging.configure()                      # default level 3: error only
    _logging.get_logger("memory").info("quiet")
    assert not (tmp_path / "plog").exists()
    _logging.get_logger("memory").error("allocator grew past the limit")
    files = list((tmp_path / "plog").glob("plog-*.log"))
    assert len(files) == 1
    assert "[ERROR] PTA(" in files[0].read_text() and "allocator grew past the limit" in files[0].read_text()


def test_device_init_is_logged(monkeypatch, capsys):
    import torch
    monkeypatch.setenv("TORCH_NPU_LOGS", "device")
    _logging.configure()
    monkeypatch.setattr(torch.npu, "_initialized", False)
    torch.npu._lazy_init()
    assert re.search(r"\[torch_npu\.device\] INFO .* NPU runtime initialised: \d+ device\(s\)", capsys.readouterr().err)


@pytest.mark.parametrize("var", ["TORCH_NPU_WARNING_DISABLE", "TORCH_NPU_DISABLED_WARNING"])
def test_warning_disable(monkeypatch, var):
    import torch
    with warnings.catch_warnings(record=True) as ws:
        warnings.simplefilter("always")
        monkeypatch.setenv(var, "1")
        _logging.configure()
        torch.npu.current_blas_handle()          # warns from torch_npu.npu.utils
        warnings.warn("user warning stays")       # from the test module
        monkeypatch.delenv(var)
        _logging.configure()
        torch.npu.current_blas_handle()
    msgs = [str(w.message) for w in ws]
    assert msgs == ["user warning stays", "NPU does not use blas handle."]
