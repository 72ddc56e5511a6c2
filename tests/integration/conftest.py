"""Integration tests: client libraries (transformers, accelerate, peft, diffusers,
Lightning, DeepSpeed) running on the emulated NPU.

Optional: they are collected only when this directory is named on the command
line (``pytest tests/integration``, what ``make test-integration`` runs) or
``TORCH_NPU_INTEGRATION=1`` is set, so ``pytest tests`` stays the fast core
suite even where the libraries happen to be installed. A test whose library is
missing skips with the reason (install ``requirements-integration.txt``).
"""
import os
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _named_on_command_line(config) -> bool:
    for arg in config.args:
        path = Path(str(arg).split("::")[0]).resolve()
        if path == HERE or HERE in path.parents:
            return True
    return False


def pytest_ignore_collect(collection_path, config):
    if os.environ.get("TORCH_NPU_INTEGRATION") == "1" or _named_on_command_line(config):
        return None
    return True

