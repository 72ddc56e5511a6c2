"""``NPUTensorPipeRpcBackendOptions``: TensorPipe RPC options whose device maps and
device lists hold NPU devices (an integer means ``npu:<index>``), validated as
PyTorch validates CUDA ones for ``TensorPipeRpcBackendOptions``."""
from typing import Dict, List, Optional, Union

import torch
from torch.distributed.rpc import constants as _rpc_constants

try:
    from torch._C._distributed_rpc import _TensorPipeRpcBackendOptionsBase
except ImportError:  # torch built without TensorPipe
    _TensorPipeRpcBackendOptionsBase = object

__all__ = ["NPUTensorPipeRpcBackendOptions"]

DeviceType = Union[int, str, torch.device]


def _to_npu_device(device: DeviceType) -> torch.device:
    device = torch.device("npu", device) if isinstance(device, int) else torch.device(device)
    if device.type != "npu":
        raise ValueError(f"`set_devices` expect a list of NPU devices, but got device type {device.type}.")
    return device


def _to_npu_device_map(device_map: Dict[DeviceType, DeviceType]) -> Dict[torch.device, torch.device]:
    full_map, reverse_map = {}, {}
    for k, v in device_map.items():
        k, v = _to_npu_device(k), _to_npu_device(v)
        if v in reverse_map:
            raise ValueError("`device_map` only supports 1-to-1 mapping, "
                             f"trying to map {k} and {reverse_map[v]} to {v}")
        full_map[k] = v
        reverse_map[v] = k
    return full_map


class NPUTensorPipeRpcBackendOptions(_TensorPipeRpcBackendOptionsBase):
    """Options for torch_npu's TensorPipe agent: worker threads, timeout, init method,
    per-callee NPU device maps and the local NPU devices."""

    def __init__(self, *, num_worker_threads: int = _rpc_constants.DEFAULT_NUM_WORKER_THREADS,
                 rpc_timeout: float = _rpc_constants.DEFAULT_RPC_TIMEOUT_SEC,
                 init_method: str = _rpc_constants.DEFAULT_INIT_METHOD,
                 device_maps: Optional[Dict[str, Dict[DeviceType, DeviceType]]] = None,
                 devices: Optional[List[DeviceType]] = None,
                 _transports: Optional[List] = None, _channels: Optional[List] = None):
        full_maps = {} if device_maps is None else {to: _to_npu_device_map(m) for to, m in device_maps.items()}
        full_devices = [] if devices is None else [_to_npu_device(d) for d in devices]
        super().__init__(num_worker_threads, _transports, _channels, rpc_timeout, init_method,
                         full_maps, full_devices)

    def set_device_map(self, to: str, device_map: Dict[DeviceType, DeviceType]):
        """Add NPU device mappings from this worker to callee ``to`` (must stay 1-to-1)."""
        full_map = _to_npu_device_map(device_map)
        current = super().device_maps
        if to in current:
            for k, v in full_map.items():
                if k in current[to] and v != current[to][k]:
                    raise ValueError("`set_device_map` only supports 1-to-1 mapping, trying"
                                     f" to map {k} to {v} and {current[to][k]}")
        super()._set_device_map(to, full_map)

    def set_devices(self, devices: List[DeviceType]):
        """Set the local NPU devices the agent uses."""
        self.devices = [_to_npu_device(d) for d in devices]
