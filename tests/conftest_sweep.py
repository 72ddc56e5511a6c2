"""pytest hooks for the OpInfo sweep (tests/test_opinfo_sweep.py).

Not a conftest by itself. To enable, add to tests/conftest.py::

    from conftest_sweep import pytest_addoption, pytest_terminal_summary  # noqa: F401

(tests/ is on sys.path while pytest collects tests/conftest.py). If
tests/conftest.py already defines either hook, call these from it instead.

This gives
  * ``--full-sweep``: run every OpInfo variant (same as TORCH_NPU_FULL_SWEEP=1);
  * the sweep's summary line in pytest's terminal summary, which CI logs show
    even without ``-s``.
Without it the sweep still works: TORCH_NPU_FULL_SWEEP=1 selects the full
sweep, and the test prints its summary with capture disabled.
"""


def pytest_addoption(parser):
    parser.addoption("--full-sweep", action="store_true", default=False,
                     help="OpInfo sweep: run all op variants, not the default seeded share "
                          "(same as TORCH_NPU_FULL_SWEEP=1)")


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    import sys
    mod = sys.modules.get("test_opinfo_sweep")
    lines = getattr(mod, "LAST_SUMMARY", None) if mod is not None else None
    if lines:
        terminalreporter.section("OpInfo sweep")
        for line in lines:
            terminalreporter.write_line(line)
