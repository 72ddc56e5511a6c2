"""torch_npu's integer dtype constants (``torch_npu._C._cd.DType``, ``torch_npu.hifloat8`` ...).

The real torch_npu passes some dtypes that PyTorch has no ``torch.dtype`` for (HiFloat8,
int4, float6 ...) to ``int``-typed op arguments such as ``output_dtype=`` or ``dst_type=``.
It numbers them as CANN's ``aclDataType`` value plus 256, so that an op can tell them
from PyTorch's ScalarType codes (always below 256): ``torch_npu.float8_e4m3fn`` is
256 + ACL_FLOAT8_E4M3FN (36) = 292, the default ``src_type`` of ``npu_anti_mx_quant``.
All 27 constants are exported as ``torch_npu.<name>`` (plain ints, as in the real package).
"""
import sys
import types

import torch

__all__ = []

# The offset that separates these codes from PyTorch's ScalarType codes.
ACL_OFFSET = 256

# name -> aclDataType value (CANN acl_base.h), in the order the real module defines them.
_ACL_VALUES = (
    ("float32", 0), ("float16", 1), ("int8", 2), ("int32", 3), ("uint8", 4),
    ("int16", 6), ("uint16", 7), ("uint32", 8), ("int64", 9), ("uint64", 10),
    ("float64", 11), ("bool", 12), ("string", 13), ("complex64", 16), ("complex128", 17),
    ("bfloat16", 27), ("int4", 29), ("uint1", 30), ("complex32", 33), ("hifloat8", 34),
    ("float8_e5m2", 35), ("float8_e4m3fn", 36), ("float8_e8m0fnu", 37), ("float6_e3m2", 38),
    ("float6_e2m3", 39), ("float4_e2m1fn_x2", 40), ("float4_e1m2fn_x2", 41),
)

CODES = {name: ACL_OFFSET + acl for name, acl in _ACL_VALUES}

# Codes that have a torch.dtype of the same meaning in PyTorch 2.13 (hifloat8, int4,
# uint1, string, float6_* and float4_e1m2fn_x2 have none).
_TORCH_EQUIVALENT = {
    "float32": torch.float32, "float16": torch.float16, "int8": torch.int8, "int32": torch.int32,
    "uint8": torch.uint8, "int16": torch.int16, "uint16": torch.uint16, "uint32": torch.uint32,
    "int64": torch.int64, "uint64": torch.uint64, "float64": torch.float64, "bool": torch.bool,
    "complex64": torch.complex64, "complex128": torch.complex128, "bfloat16": torch.bfloat16,
    "complex32": torch.complex32, "float8_e5m2": torch.float8_e5m2,
    "float8_e4m3fn": torch.float8_e4m3fn, "float8_e8m0fnu": torch.float8_e8m0fnu,
    "float4_e2m1fn_x2": torch.float4_e2m1fn_x2,
}


def is_custom_code(value):
    """True for a torch_npu DType code (>= 256), False for a PyTorch ScalarType code."""
    return isinstance(value, int) and value >= ACL_OFFSET


_NAME_OF_CODE = {code: name for name, code in CODES.items()}


def code_name(value):
    """``'torch_npu.<name>'`` for a DType code, as the real error messages print it."""
    name = _NAME_OF_CODE.get(value)
    return "Unknown dtype" if name is None else "torch_npu." + name


def to_torch_dtype(value):
    """The torch.dtype a DType code stands for, or None when PyTorch has no such dtype."""
    return _TORCH_EQUIVALENT.get(_NAME_OF_CODE.get(value))


DType = type("DType", (), dict(CODES, __doc__="torch_npu's integer dtype constants "
                                          "(aclDataType + 256), as ``torch_npu._C._cd.DType``.",
                               __module__="torch_npu._C._cd"))


def install(torch_npu_module):
    """Create ``torch_npu._C._cd`` (module with ``DType``) and export every constant as
    ``torch_npu.<name>``."""
    cd = types.ModuleType("torch_npu._C._cd", "_cd bindings")
    cd.DType = DType
    torch_npu_module._C._cd = cd
    sys.modules["torch_npu._C._cd"] = cd
    for name, code in CODES.items():
        setattr(torch_npu_module, name, code)
