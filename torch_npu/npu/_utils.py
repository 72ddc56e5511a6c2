"""Device-index helpers that torch internals (serialization, DDP) look up as
``torch.npu._utils``."""
from .utils import _get_device_index

__all__ = ["_get_device_index"]
