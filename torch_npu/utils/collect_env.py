"""``python -m torch_npu.utils.collect_env``: environment report for bug reports.

Prints PyTorch's own report (``torch.utils.collect_env``) followed by the
torch_npu lines: its version and install path, the CANN version and the
NPU devices — which here are emulated, and the report says so.
"""
import os
from collections import namedtuple

from torch.utils import collect_env as _torch_collect_env

__all__ = ["SystemEnv", "get_env_info", "get_pretty_env_info", "pretty_str", "main", "get_cann_version",
           "get_torch_npu_version", "get_torch_npu_install_path", "check_directory_path_readable",
           "check_path_owner_consistent"]

SystemEnv = namedtuple("SystemEnv", [
    "torch_version", "torch_npu_version", "is_debug_build", "gcc_version", "clang_version", "cmake_version",
    "os", "libc_version", "python_version", "python_platform", "pip_version", "pip_packages", "conda_packages",
    "caching_allocator_config", "is_xnnpack_available", "cpu_info", "cann_version",
])

EMULATED_NOTE = "The NPU is emulated on the CPU (hardware-free torch_npu); no CANN is installed."


def check_directory_path_readable(path):
    if not os.path.exists(path):
        raise FileNotFoundError(f"The path does not exist: {path}")
    if not os.access(path, os.R_OK):
        raise PermissionError(f"The path is not readable: {path}")


def check_path_owner_consistent(path: str):
    if not os.path.exists(path):
        raise FileNotFoundError(f"The path does not exist: {path}")
    if hasattr(os, "getuid") and os.getuid() != 0 and os.stat(path).st_uid != os.getuid():
        raise PermissionError(f"The path {path} is not owned by the current user.")


def get_torch_npu_version():
    import torch_npu
    return torch_npu.__version__


def get_torch_npu_install_path():
    import torch_npu
    return os.path.dirname(os.path.abspath(torch_npu.__file__))


def get_cann_version():
    r"""The CANN version: the emulated one (``torch_npu.emulator.cann_version()``)."""
    from torch_npu import emulator
    return emulator.cann_version()


def get_env_info():
    import torch_npu  # noqa: F401  (sets torch.version.cann, as the real report does)
    base = _torch_collect_env.get_env_info()
    return SystemEnv(
        torch_version=base.torch_version, torch_npu_version=get_torch_npu_version(),
        is_debug_build=base.is_debug_build, gcc_version=base.gcc_version, clang_version=base.clang_version,
        cmake_version=base.cmake_version, os=base.os, libc_version=base.libc_version,
        python_version=base.python_version, python_platform=base.python_platform, pip_version=base.pip_version,
        pip_packages=base.pip_packages, conda_packages=base.conda_packages,
        caching_allocator_config=os.getenv("PYTORCH_NPU_ALLOC_CONF", ""),
        is_xnnpack_available=base.is_xnnpack_available, cpu_info=base.cpu_info,
        cann_version=f"{get_cann_version()} (emulated)",
    )


def _device_lines():
    import torch_npu
    from torch_npu import emulator
    cfg = emulator.config()
    return [
        f"NPU devices (emulated): {cfg['device_count']} x {cfg['device_name']}, "
        f"{cfg['memory_per_device'] / 2 ** 30:.0f} GiB each (visible: {cfg['visible_devices']})",
        f"NPU available: {torch_npu.npu.is_available()}",
        EMULATED_NOTE,
    ]


def pretty_str(envinfo):
    r"""The torch_npu section of the report for ``envinfo`` (a SystemEnv)."""
    lines = [
        f"Torch-npu version: {envinfo.torch_npu_version}",
        f"Torch-npu install path: {get_torch_npu_install_path()}",
        f"CANN: {envinfo.cann_version}",
        f"PYTORCH_NPU_ALLOC_CONF: {envinfo.caching_allocator_config or 'N/A'}",
    ]
    return "\n".join(lines + _device_lines())


def get_pretty_env_info():
    torch_report = _torch_collect_env.get_pretty_env_info()
    return torch_report + "\n\n" + pretty_str(get_env_info())


def main():
    print("Collecting environment information...")
    print(get_pretty_env_info())


if __name__ == "__main__":
    main()
