"""``torch_npu.distributed.rpc``: the options class of torch_npu's ``NPU_TENSORPIPE`` RPC backend.

The backend itself is not registered in the emulator (docs/distributed.md)."""
from . import options  # noqa: F401
from .options import NPUTensorPipeRpcBackendOptions  # noqa: F401

__all__ = []
