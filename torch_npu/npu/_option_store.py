"""The emulated ACL option store behind ``set_option`` and friends.

On hardware, options go to the ACL runtime through C++. The emulated device
has no op compiler or dump hooks, so the values are remembered here; the
precision options are read by chip numerics mode (torch_npu/emulator/_numerics.py)
and every value is read back by the getters (``matmul.allow_hf32``,
``are_compatible_impl_enabled``, ``is_jit_compile_false``…), as bytes like the
C++ getter returns them.
"""
import threading
from typing import Callable, Dict, List, Optional

from torch_npu import _settings

__all__ = []

_lock = threading.Lock()
_options: Dict[str, str] = {}
# Called after every change; chip numerics pushes its rounding to its C++ kernels from here.
_listeners: List[Callable[[], None]] = []


def _initial_options() -> Dict[str, str]:
    # TORCH_NPU_USE_COMPATIBLE_IMPL=1 turns on the compatible implementations at start-up.
    initial = {}
    if _settings.get("TORCH_NPU_USE_COMPATIBLE_IMPL"):
        initial["COMPATIBLE_IMPL"] = "enable"
    return initial


_options.update(_initial_options())


def set_options(option: Dict[str, str]) -> None:
    """Store each ``name -> value`` (values already converted to str)."""
    with _lock:
        previous = dict(_options)
        _options.update({str(k): str(v) for k, v in option.items()})
    try:
        for listener in _listeners:
            listener()
    except Exception:
        # a value a listener cannot take: the store and the listeners keep the previous state
        with _lock:
            _options.clear()
            _options.update(previous)
        for listener in _listeners:
            listener()
        raise


def add_listener(listener: Callable[[], None]) -> None:
    """Call ``listener()`` after every ``set_options`` (outside the store's lock);
    an exception it raises undoes the change and reaches the caller."""
    with _lock:
        if listener not in _listeners:
            _listeners.append(listener)


def get_option(name: str) -> Optional[bytes]:
    """The stored value as bytes (as the C++ getter returns it), or None."""
    with _lock:
        value = _options.get(name)
    return None if value is None else value.encode()
