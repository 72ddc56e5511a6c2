"""Helpers shared by the integration tests."""
import importlib.util
import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
PYTHON = sys.executable


def require(module: str):
    """Import ``module`` or skip the test with a reason that says what to install."""
    return pytest.importorskip(module, reason=f"{module} is not installed (pip install -c <torch pin> "
                                              f"-r requirements-integration.txt)")


def load_example(name: str):
    """Import ``examples/<name>.py`` as a module (the examples are scripts, not a package)."""
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


# What CANN's set_env.sh exports. The test process imported torch_npu, which exported them
# (unless the user had); children must not inherit them, so that each client test shows
# that the client works with no CANN environment set by the user.
CANN_VARIABLES = ("ASCEND_TOOLKIT_HOME", "ASCEND_HOME_PATH", "ASCEND_AICPU_PATH", "ASCEND_OPP_PATH", "TOOLCHAIN_HOME")


def launcher_env(**extra) -> dict:
    """Environment for a multi-process launch: no inherited rank/device selection, no CANN variables."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("ASCEND_RT_VISIBLE_DEVICES", "RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
           + CANN_VARIABLES}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(REPO), **extra)
    return env
