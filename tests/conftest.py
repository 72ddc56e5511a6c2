"""pytest configuration shared by the suite."""
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

from conftest_sweep import pytest_addoption, pytest_terminal_summary  # noqa: E402,F401
