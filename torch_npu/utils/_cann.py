"""CANN version queries of the emulated machine.

The real ``torch_npu._C._get_cann_version(module)`` asks the installed CANN
(``aclsysGetCANNVersion``) and ``_is_gte_cann_version(version, module)``
compares numerically. Here every CANN package reports
``torch_npu.emulator.cann_version()`` and the driver reports
``EMULATED_DRIVER_VERSION``. The emulated CANN is a Python-level fact, so
these are also what ``torch_npu._C._get_cann_version`` / ``_is_gte_cann_version``
answer (installed onto ``torch_npu._C`` at import).
"""
import re
import warnings

import torch_npu
from torch_npu.utils._error_code import ErrCode, pta_error

__all__ = []

CANN_MODULES = ("CANN", "RUNTIME", "COMPILER", "HCCL", "TOOLKIT", "OPP", "OPP_KERNEL", "DRIVER")
EMULATED_DRIVER_VERSION = "25.2.0"
# The oldest version a gate may ask about (older CANN cannot answer the query).
_BASE_VERSION = "8.1.RC1"

_warned = set()


def _warn_once(msg):
    if msg not in _warned:
        _warned.add(msg)
        warnings.warn(msg)


def _native(name):
    fn = getattr(torch_npu._C, name, None)
    return None if fn is None or getattr(fn, "_python_fallback", False) else fn


def get_cann_version(module="CANN") -> str:
    native = _native("_get_cann_version")
    if native is not None:
        return native(module)
    if module not in CANN_MODULES:
        _warn_once(f"module {module}is invalid.")
        return ""
    if module == "DRIVER":
        return EMULATED_DRIVER_VERSION
    from torch_npu import emulator
    return emulator.cann_version()


_PATTERNS = (
    # (regex, names of the captured fields after major/minor)
    (re.compile(r"(\d+)\.(\d+)\.RC(\d+)"), ("rc",)),
    (re.compile(r"(\d+)\.(\d+)\.(\d+)"), ("release",)),
    (re.compile(r"(\d+)\.(\d+)\.T(\d+)"), ("t",)),
    (re.compile(r"(\d+)\.(\d+)\.RC(\d+)\.alpha(\d+)"), ("rc", "alpha")),
    (re.compile(r"(\d+)\.(\d+)\.(\d+)\.alpha(\d+)"), ("release", "alpha")),
)


def version_to_num(version: str) -> int:
    r"""One integer per CANN version string, increasing with the release order:
    for the same major.minor, test (Tn) < release candidates (RCn) < releases (n);
    0 for a string that is no CANN version (with a warning)."""
    for pattern, fields in _PATTERNS:
        m = pattern.fullmatch(version)
        if m is None:
            continue
        parts = {"release": -1, "rc": -51, "t": -1, "alpha": 0}
        parts.update(zip(fields, map(int, m.groups()[2:])))
        major, minor = int(m.group(1)), int(m.group(2))
        return ((major + 1) * 100000000 + (minor + 1) * 1000000 + (parts["release"] + 1) * 10000
                + (parts["rc"] + 1) * 100 + 5000 + (parts["t"] + 1) * 100 - (100 - parts["alpha"]))
    _warn_once(f"Version: {version} is invalid.")
    return 0


def is_gte_cann_version(version: str, module="CANN") -> bool:
    native = _native("_is_gte_cann_version")
    if native is not None:
        return bool(native(version, module))
    if module == "DRIVER":
        raise RuntimeError("When the module is DRIVER, this function is not supported." + pta_error(ErrCode.VALUE))
    if version < _BASE_VERSION:
        raise RuntimeError(f"When the version {version} is less than \"8.1.RC1\", this function is not supported."
                           + pta_error(ErrCode.VALUE))
    return version_to_num(get_cann_version(module)) >= version_to_num(version)


def install_c_fallbacks():
    r"""Give ``torch_npu._C`` the two version functions: test harnesses call
    ``torch_npu._C._get_cann_version`` directly, as on the real package."""
    for name, fn in (("_get_cann_version", get_cann_version), ("_is_gte_cann_version", is_gte_cann_version)):
        if not hasattr(torch_npu._C, name):
            def fallback(*args, _fn=fn, **kwargs):
                return _fn(*args, **kwargs)
            fallback._python_fallback = True
            fallback.__name__ = name
            setattr(torch_npu._C, name, fallback)
