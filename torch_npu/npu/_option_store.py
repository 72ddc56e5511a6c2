"""The emulated ACL option store behind ``set_option`` and friends.

On hardware, options go to C++ (``torch_npu._C._npu_setOption`` /
``_npu_getOption``, values as bytes) and reach the ACL runtime. The emulated
device has no op compiler, precision modes or dump hooks, so the values are
only remembered; they are read back by the getters (``matmul.allow_hf32``,
``are_compatible_impl_enabled``, ``is_jit_compile_false``…). When the C++
core provides ``_npu_setOption``/``_npu_getOption`` they are used instead.
"""
import os
import threading
from typing import Dict, Optional

import torch_npu

__all__ = []

_lock = threading.Lock()
_options: Dict[str, str] = {}


def _initial_options() -> Dict[str, str]:
    # TORCH_NPU_USE_COMPATIBLE_IMPL=1 turns on the compatible implementations at start-up.
    initial = {}
    if os.getenv("TORCH_NPU_USE_COMPATIBLE_IMPL") == "1":
        initial["COMPATIBLE_IMPL"] = "enable"
    return initial


_options.update(_initial_options())


def set_options(option: Dict[str, str]) -> None:
    """Store each ``name -> value`` (values already converted to str)."""
    native = getattr(torch_npu._C, "_npu_setOption", None)
    if native is not None:
        native(option)
        return
    with _lock:
        _options.update({str(k): str(v) for k, v in option.items()})


def get_option(name: str) -> Optional[bytes]:
    """The stored value as bytes (as the C++ getter returns it), or None."""
    native = getattr(torch_npu._C, "_npu_getOption", None)
    if native is not None:
        return native(name)
    with _lock:
        value = _options.get(name)
    return None if value is None else value.encode()
