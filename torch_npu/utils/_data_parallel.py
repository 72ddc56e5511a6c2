"""``torch.nn.DataParallel`` on npu: one device works, several get a clear error.

DataParallel scatters inputs with ``torch._C._scatter`` (a CUDA-only
function), so on npu it died with ``AttributeError: module 'torch._C' has no
attribute '_scatter'``. torch_npu runs one process per device: data
parallelism is DistributedDataParallel over ``hccl``, launched with
``torch_npu_run``. With a single device nothing needs scattering: the inputs
are moved to that device (a differentiable copy, as the one-way scatter
is) and the module is called, as PyTorch does for one device.
"""
import importlib

import torch
from torch._utils import _get_available_device_type, _get_device_index
from torch.nn.parallel.scatter_gather import _is_namedtuple

from torch_npu.utils._error_code import ErrCode, pta_error

__all__ = []

_MULTI_DEVICE_MESSAGE = (
    "torch.nn.DataParallel cannot scatter across NPU devices (device_ids={ids}): single-process multi-device "
    "execution is not supported on the NPU. Use torch.nn.parallel.DistributedDataParallel with the 'hccl' "
    "backend, one process per device, launched with torch_npu_run (for example "
    "`torch_npu_run --nproc-per-node {n} train.py`), or give DataParallel a single device "
    "(device_ids=[{first}]).")


def _move(obj, device):
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if _is_namedtuple(obj):
        return type(obj)(*(_move(o, device) for o in obj))
    if isinstance(obj, tuple):
        return tuple(_move(o, device) for o in obj)
    if isinstance(obj, list):
        return [_move(o, device) for o in obj]
    if isinstance(obj, dict):
        return type(obj)((k, _move(v, device)) for k, v in obj.items())
    return obj


def npu_scatter_kwargs(inputs, kwargs, target_gpus, dim=0):
    """``scatter_kwargs`` for npu devices: the one-device case moves the inputs
    to that device (same result structure as PyTorch's: a 1-tuple of input
    tuples and a 1-tuple of kwargs dicts); more than one device raises a
    ``RuntimeError`` naming DistributedDataParallel and ``torch_npu_run``."""
    ids = [_get_device_index(d, True) for d in target_gpus]
    if len(ids) > 1:
        raise RuntimeError(_MULTI_DEVICE_MESSAGE.format(ids=ids, n=len(ids), first=ids[0])
                           + pta_error(ErrCode.NOT_SUPPORT))
    device = torch.device(torch._C._get_privateuse1_backend_name(), ids[0])
    scattered_inputs = [_move(tuple(inputs), device)] if inputs else []
    scattered_kwargs = [_move(kwargs, device)] if kwargs else []
    if len(scattered_inputs) < len(scattered_kwargs):
        scattered_inputs.append(())
    elif len(scattered_kwargs) < len(scattered_inputs):
        scattered_kwargs.append({})
    return tuple(scattered_inputs), tuple(scattered_kwargs)


def _install():
    """Route DataParallel's (and ``data_parallel``'s) scatter through
    :func:`npu_scatter_kwargs` when the available accelerator is the npu."""
    # (torch.nn.parallel.data_parallel is also the name of a function there)
    _dp_module = importlib.import_module("torch.nn.parallel.data_parallel")
    original = _dp_module.scatter_kwargs
    if getattr(original, "_npu_guard", False):
        return

    def scatter_kwargs(inputs, kwargs, target_gpus, dim=0):
        if target_gpus and _get_available_device_type() == torch._C._get_privateuse1_backend_name():
            return npu_scatter_kwargs(inputs, kwargs, target_gpus, dim)
        return original(inputs, kwargs, target_gpus, dim)

    scatter_kwargs._npu_guard = True
    scatter_kwargs.__doc__ = original.__doc__
    _dp_module.scatter_kwargs = scatter_kwargs
