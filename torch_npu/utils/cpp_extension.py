"""``NpuExtension``: a setuptools extension that builds against torch and torch_npu."""
import os

from torch.utils.cpp_extension import CppExtension

__all__ = ["NpuExtension"]


def _torch_npu_include_dirs():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return [os.path.join(root, "include"), os.path.dirname(root)]


def NpuExtension(name, sources, *args, **kwargs):
    r"""Like ``torch.utils.cpp_extension.CppExtension`` plus torch_npu's include
    directories (the emulated plugin has no CANN headers or libraries to add)."""
    include_dirs = list(kwargs.get("include_dirs", [])) + _torch_npu_include_dirs()
    kwargs["include_dirs"] = include_dirs
    return CppExtension(name, sources, *args, **kwargs)
