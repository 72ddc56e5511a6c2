"""Build torch_npu: the Python package plus the C++ core (torch_npu._C)."""
import glob
import os

# Building must not import an installed (possibly stale) torch_npu through
# torch's backend autoload.
os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"

from setuptools import find_packages, setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

ROOT = os.path.dirname(os.path.abspath(__file__))
VERSION = "2.13.0+emu"

sources = sorted(glob.glob("csrc/**/*.cpp", recursive=True))

setup(
    name="torch_npu",
    version=VERSION,
    description="Hardware-free torch_npu: the Ascend NPU plugin for PyTorch, with the NPU emulated on the CPU",
    long_description=open(os.path.join(ROOT, "README.md"), encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    license="BSD-3-Clause",
    python_requires=">=3.9",
    packages=find_packages(include=["torch_npu", "torch_npu.*"]),
    # The torch-npu console script: outside the package so that `torch-npu migrate` and
    # `--help` start without importing torch (see torch_npu_cli.py).
    py_modules=["torch_npu_cli"],
    package_data={"torch_npu": ["_data/*.txt", "_data/*.tsv"]},
    # What `import torch_npu`, `torch_npu_run` and `torch-npu` need. The rest is optional and
    # named by the part that needs it: torch_npu.testing -> [testing] (expecttest).
    # [migrate] stays, empty, for installs that name it: `torch-npu migrate` parses with the
    # standard library's ast since it stopped needing libcst.
    install_requires=["torch==2.13.0", "numpy", "pyyaml", "click>=8.0"],
    extras_require={
        "migrate": [],
        "testing": ["expecttest"],
    },
    ext_modules=[
        CppExtension(
            name="torch_npu._C",
            sources=sources,
            include_dirs=[os.path.join(ROOT, "csrc")],
            extra_compile_args=["-O2", "-std=c++17", "-fvisibility=hidden", "-Wno-unused-parameter"],
        )
    ],
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
    entry_points={
        "torch.backends": ["torch_npu = torch_npu:_autoload"],
        "torch_dynamo_backends": [
            "npu = torch_npu.dynamo.backends:_npu_backend",
            "npugraph_ex = torch_npu.dynamo.backends:_npugraph_ex_backend",
            "npugraphs = torch_npu.dynamo.backends:_npugraphs_backend",
        ],
        "console_scripts": [
            "torch_npu_run = torch_npu.distributed.run:_main",
            "torch-npu = torch_npu_cli:main",
        ],
    },
    zip_safe=False,
)
