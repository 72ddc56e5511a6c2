"""pytest hooks of the conformance suite: the pass counts per test kind in the
terminal summary (shown in CI logs without ``-s``)."""
import sys


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    mod = sys.modules.get("test_conformance")
    summary = getattr(mod, "SUMMARY", None) if mod is not None else None
    if summary:
        terminalreporter.section("npu conformance (tests/conformance)")
        for kind in sorted(summary):
            terminalreporter.write_line(summary[kind])
