"""Legacy typed storages (``torch.npu.FloatStorage`` …) and tensor types
(``torch.npu.FloatTensor`` …) of torch.npu.

Storages are ``torch.storage._LegacyStorage`` subclasses whose module is
``torch_npu.npu``: TypedStorage derives the device from the last part of the
module name, so ``torch.npu.FloatStorage(4)`` lives on ``npu``.

Tensor types are Python classes (on hardware they are C-bound): calling one
builds an npu tensor of its dtype (``FloatTensor(2, 3)`` uninitialised,
``FloatTensor([1, 2])`` from data), and ``isinstance(t, torch.npu.FloatTensor)``
is true for npu tensors of that dtype. ``Tensor.type("torch.npu.FloatTensor")``
goes through PyTorch's C++ type table and is not supported.
"""
import torch
from torch._utils import classproperty
from torch.storage import _LegacyStorage, _warn_typed_storage_removal

from torch_npu.utils._error_code import ErrCode, pta_error

_DTYPES = {
    "Bool": torch.bool, "Byte": torch.uint8, "Char": torch.int8, "Short": torch.short, "Int": torch.int,
    "Long": torch.long, "Half": torch.half, "BFloat16": torch.bfloat16, "Float": torch.float,
    "Double": torch.double,
}

__all__ = [f"{n}Storage" for n in _DTYPES] + [f"{n}Tensor" for n in _DTYPES]


class _NPULegacyStorage(_LegacyStorage):
    @classmethod
    def from_buffer(cls, *args, **kwargs):
        _warn_typed_storage_removal()
        raise RuntimeError("from_buffer: Not available for NPU storage" + pta_error(ErrCode.UNAVAIL))

    @classmethod
    def _new_with_weak_ptr(cls, *args, **kwargs):
        raise RuntimeError("_new_with_weak_ptr: Not available for NPU storage" + pta_error(ErrCode.UNAVAIL))

    @classmethod
    def _new_shared_filename(cls, manager, obj, size, *, device=None, dtype=None):
        raise RuntimeError("_new_shared_filename: Not available for NPU storage" + pta_error(ErrCode.UNAVAIL))


def _make_storage(prefix, dtype):
    def _dtype_of(cls):
        return dtype

    def _warned_dtype(cls):
        _warn_typed_storage_removal()
        return dtype

    cls = type(f"{prefix}Storage", (_NPULegacyStorage,), {
        "__module__": "torch_npu.npu",
        "_dtype": classproperty(_dtype_of),
        "dtype": classproperty(_warned_dtype),
    })
    torch._storage_classes.add(cls)
    return cls


class _TensorTypeMeta(type):
    def __instancecheck__(cls, obj):
        return isinstance(obj, torch.Tensor) and obj.device.type == "npu" and obj.dtype == cls.dtype


class _NPUTensorType(metaclass=_TensorTypeMeta):
    dtype = None
    is_npu = True
    is_sparse = False

    def __new__(cls, *args, device=None):
        import torch_npu.npu
        torch_npu.npu._lazy_init()
        device = torch.device("npu", torch_npu.npu.current_device()) if device is None else torch.device(device)
        if len(args) == 1 and not isinstance(args[0], int):
            if isinstance(args[0], torch.Size):
                return torch.empty(args[0], dtype=cls.dtype, device=device)
            return torch.tensor(args[0], dtype=cls.dtype, device=device)
        return torch.empty(args, dtype=cls.dtype, device=device)


def _make_tensor_type(prefix, dtype):
    return _TensorTypeMeta(f"{prefix}Tensor", (_NPUTensorType,), {"__module__": "torch_npu.npu", "dtype": dtype})


for _prefix, _dtype in _DTYPES.items():
    globals()[f"{_prefix}Storage"] = _make_storage(_prefix, _dtype)
    globals()[f"{_prefix}Tensor"] = _make_tensor_type(_prefix, _dtype)
del _prefix, _dtype
