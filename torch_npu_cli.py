"""Entry point of the ``torch-npu`` console script.

It lives outside the ``torch_npu`` package on purpose: importing anything under
``torch_npu`` first runs ``torch_npu/__init__.py``, which imports torch and starts the
emulated device (seconds). ``torch-npu migrate`` and ``--help`` only read source text, so
the command modules of ``torch_npu/cli/`` are loaded here as the private package
``_torch_npu_cli`` (they import each other relatively and torch only inside the
commands that need it). ``import torch_npu.cli`` keeps working as before.
"""
import importlib.util
import os
import sys

_ALIAS = "_torch_npu_cli"


def _load_cli():
    """The ``torch_npu/cli`` package, loaded without running ``torch_npu/__init__.py``."""
    if _ALIAS in sys.modules:
        return sys.modules[_ALIAS]
    if "torch_npu.cli" in sys.modules:  # torch_npu already imported: no cost to use it
        return sys.modules["torch_npu.cli"]
    spec = importlib.util.find_spec("torch_npu")  # finds the package without executing it
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("torch_npu is not installed (no torch_npu package on sys.path)")
    cli_dir = os.path.join(list(spec.submodule_search_locations)[0], "cli")
    cli_spec = importlib.util.spec_from_file_location(_ALIAS, os.path.join(cli_dir, "__init__.py"),
                                                      submodule_search_locations=[cli_dir])
    module = importlib.util.module_from_spec(cli_spec)
    sys.modules[_ALIAS] = module
    try:
        cli_spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[_ALIAS]
        raise
    return module


def main(argv=None):
    """Console-script entry point of ``torch-npu``; returns the exit code."""
    return _load_cli().main(argv)


if __name__ == "__main__":
    sys.exit(main())
