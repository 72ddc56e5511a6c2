"""Helpers of torch_npu.testing: tensor factories, device and CANN-version
gates, RNG freezing, profiler checks."""
import contextlib
import functools
import itertools
import json
import os
import time
import unittest
from typing import List

import numpy as np
import torch

import torch_npu
from torch_npu import _settings

__all__ = ["create_common_tensor", "create_dtype_tensor", "SupportedDevices", "SkipIfNotGteCANNVersion",
           "SkipIfNoLapack", "SkipIfNotRegistered", "freeze_rng_state", "check_operators_in_prof",
           "get_cycles_per_ms", "get_npu_device", "set_npu_device", "is_iterable", "iter_indices",
           "test_2args_broadcast", "Baseline", "dump_baseline"]


def get_npu_device():
    r"""The test device: ``npu:<SET_NPU_DEVICE>`` (default ``npu:0``)."""
    index = _settings.get("SET_NPU_DEVICE")
    return f"npu:{index}" if index is not None else "npu:0"


def set_npu_device():
    device = get_npu_device()
    torch.npu.set_device(device)
    return device


def _apply_format(tensor, npu_format):
    # Private formats (NZ, 5HD…) do not change values. While npu_format_cast is
    # not emulated the tensor keeps the ND layout, which is what it computes with.
    if npu_format == -1:
        return tensor
    try:
        return torch_npu.npu_format_cast(tensor, npu_format)
    except NotImplementedError:
        return tensor


def create_common_tensor(item, minValue, maxValue, device=None):
    r"""``item = [numpy dtype, npu format, shape]`` -> (cpu tensor, npu tensor) with the
    same uniform values in [minValue, maxValue); format -1 keeps the default."""
    dtype, npu_format, shape = item[0], item[1], item[2]
    data = np.random.uniform(minValue, maxValue, shape).astype(dtype)
    cpu_input = torch.from_numpy(data)
    npu_input = torch.from_numpy(data).to(device or get_npu_device())
    return cpu_input, _apply_format(npu_input, npu_format)


def create_dtype_tensor(shape, dtype, npu_format=-1, min_value=-5, max_value=5, no_zero=False, device=None):
    r"""(cpu tensor, npu tensor) of a torch ``dtype`` with equal random values;
    ``no_zero`` replaces zeros by ones (for divisors)."""
    if dtype == torch.bool:
        x = np.random.randint(0, 2, size=shape).astype(bool)
    elif dtype in (torch.float16, torch.float32, torch.float64, torch.bfloat16):
        x = np.random.uniform(min_value, max_value, shape).astype(np.float32)
    elif dtype in (torch.complex64, torch.complex128):
        x = (np.random.uniform(min_value, max_value, shape)
             + 1j * np.random.uniform(min_value, max_value, shape)).astype(np.complex64)
    else:
        x = np.random.randint(min_value, max_value + 1, size=shape)
    if no_zero:
        x = np.where(x == 0, 1, x)
    cpu_input = torch.from_numpy(np.asarray(x)).to(dtype)
    npu_input = cpu_input.to(device or get_npu_device())
    return cpu_input, _apply_format(npu_input, npu_format)


def _short_device_name() -> str:
    # The model prefix real tests gate on: "Ascend910B" for "Ascend910B4".
    name = torch_npu.npu.get_device_name(0)
    if name.startswith("Ascend910_"):
        return name[:12]
    if name.startswith("Ascend950"):
        return name[:9]
    return name[:10]


class SupportedDevices:
    r"""Decorator: run the test only on the listed device models (else skip)."""

    def __init__(self, supported_devices: List[str]) -> None:
        self.supported_devices = supported_devices

    def __call__(self, func):
        @functools.wraps(func)
        def wrapper(*args, **kwargs):
            device = _short_device_name()
            if device not in self.supported_devices:
                raise unittest.SkipTest(f"Only {self.supported_devices} are supported; current device is {device}")
            return func(*args, **kwargs)
        return wrapper


def SkipIfNotGteCANNVersion(base_version, module="CANN"):
    r"""Decorator: skip unless the CANN ``module`` version is >= ``base_version``."""
    def decorator(func):
        @functools.wraps(func)
        def wrapper(*args, **kwargs):
            if not torch_npu._C._is_gte_cann_version(base_version, module):
                current = torch_npu._C._get_cann_version(module)
                raise unittest.SkipTest(f"CANN {module} version {current} is older than {base_version}")
            return func(*args, **kwargs)
        return wrapper
    return decorator


def SkipIfNoLapack(fn=None):
    def decorator(func):
        @functools.wraps(func)
        def wrapper(*args, **kwargs):
            if not torch._C.has_lapack:
                raise unittest.SkipTest("PyTorch compiled without Lapack")
            return func(*args, **kwargs)
        return wrapper
    return decorator(fn) if fn is not None else decorator


def SkipIfNotRegistered(op_name=None, message=None):
    r"""Decorator: skip when ``torch.ops.npu.<op_name>`` is not registered."""
    def decorator(func):
        @functools.wraps(func)
        def wrapper(*args, **kwargs):
            if op_name is not None and not hasattr(torch.ops.npu, op_name):
                raise unittest.SkipTest(message or f"{op_name} is not registered")
            return func(*args, **kwargs)
        return wrapper
    return decorator


@contextlib.contextmanager
def freeze_rng_state():
    r"""Restore the CPU and current-npu RNG states after the block."""
    cpu_state = torch.get_rng_state()
    npu_state = torch.npu.get_rng_state()
    try:
        yield
    finally:
        torch.npu.set_rng_state(npu_state)
        torch.set_rng_state(cpu_state)


def check_operators_in_prof(expected_operators, prof, unexpected_operators=None):
    r"""True if every expected operator and no unexpected one appears in the
    profile (``prof`` is a finished torch/torch_npu profiler)."""
    names = {e.key for e in prof.key_averages()}
    if any(op not in names for op in expected_operators):
        return False
    return not any(op in names for op in (unexpected_operators or []))


def get_cycles_per_ms() -> float:
    r"""Cycles per millisecond of ``torch.npu._sleep`` (measured, median of 5)."""
    def measure():
        start, end = torch.npu.Event(enable_timing=True), torch.npu.Event(enable_timing=True)
        start.record()
        torch.npu._sleep(1000000)
        end.record()
        end.synchronize()
        return 1000000 / start.elapsed_time(end)
    samples = sorted(measure() for _ in range(5))
    return samples[2]


def is_iterable(obj):
    try:
        iter(obj)
        return True
    except TypeError:
        return False


def iter_indices(tensor):
    if tensor.dim() == 0:
        return range(0)
    if tensor.dim() == 1:
        return range(tensor.size(0))
    return itertools.product(*(range(s) for s in tensor.size()))


def test_2args_broadcast(fn):
    r"""(cpu results, npu results) of ``fn`` over broadcasting shape pairs."""
    shapes = [((3, 1, 4), (1, 5, 4)), ((2, 3), (3,)), ((4, 1), (1, 4))]
    cpu_out, npu_out = [], []
    for a, b in shapes:
        x, y = torch.randn(a), torch.randn(b)
        cpu_out.append(fn(x, y).numpy())
        npu_out.append(fn(x.npu(), y.npu()).cpu().numpy())
    return cpu_out, npu_out


class Baseline:
    r"""A JSON file of named baseline values (performance tests)."""

    def __init__(self, baselineFile):
        self._file = baselineFile
        self._baseline = {}
        if os.path.exists(baselineFile):
            with open(baselineFile, encoding="utf-8") as f:
                self._baseline = json.load(f)

    def get_baseline(self, resourceId):
        return self._baseline.get(resourceId)

    def set_baseline(self, resourceId, baseline):
        self._baseline[resourceId] = baseline

    def save_baseline(self):
        with open(self._file, "w", encoding="utf-8") as f:
            json.dump(self._baseline, f, indent=2)


def dump_baseline():
    return _settings.get("DUMP_BASELINE")
