"""Rewriting CUDA device arguments to NPU ones, and remembering where it happened.

The rules follow the real ``transfer_to_npu``: in positional arguments and in the
keyword arguments ``device``, ``device_type``, ``map_location`` and ``device_id``,

- a device string ``cuda`` / ``cuda:<i>`` becomes ``npu`` / ``npu:<i>`` (only whole device
  strings: unlike the real tool, a file name such as ``"ckpt_cuda.pt"`` passed to
  ``torch.load`` is left alone);
- a ``torch.device`` of type ``cuda`` becomes ``npu`` with the same index;
- a dict (``map_location={"cuda:0": "cuda:1"}``) has its string keys and values rewritten;
- a plain int becomes ``"npu:<i>"`` only for ``to``/``to_empty`` (elsewhere an int is
  already a device index);
- ``device_ids`` lists/tuples are rewritten element-wise.

Each rewrite is recorded with the user's call site, so ``torch-npu preflight`` can list the
CUDA references a script still contains although it ran.
"""
import collections
import functools
import os
import re
import sys
import threading

import torch

DEVICE_KWARGS = ("device", "device_type", "map_location", "device_id")

_record_lock = threading.Lock()
# (api, original argument, "file:line") -> count
_records = collections.Counter()

_LIBRARY_DIRS = tuple(os.path.dirname(os.path.dirname(m.__file__)) + os.sep
                      for m in (torch,) if getattr(m, "__file__", None))
_OWN_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + os.sep


def _user_call_site():
    """First frame outside torch, torch_npu and this module: where the script asked for CUDA."""
    frame = sys._getframe(2)
    depth = 0
    while frame is not None and depth < 40:
        name = frame.f_code.co_filename
        inside = name.startswith(_OWN_DIR) or any(name.startswith(d + "torch" + os.sep) for d in _LIBRARY_DIRS)
        if not inside and not name.startswith("<frozen"):
            return f"{name}:{frame.f_lineno}"
        frame = frame.f_back
        depth += 1
    return "<unknown>"


def record(api, original):
    """Remember that ``api`` was called with the CUDA reference ``original``."""
    site = _user_call_site()
    with _record_lock:
        _records[(api, str(original), site)] += 1


def records():
    """The rewrites seen so far: ``[{"api", "original", "site", "count"}]``, most frequent first."""
    with _record_lock:
        items = list(_records.items())
    items.sort(key=lambda kv: (-kv[1], kv[0]))
    return [{"api": api, "original": orig, "site": site, "count": n} for (api, orig, site), n in items]


def reset_records():
    with _record_lock:
        _records.clear()


_CUDA_DEVICE = re.compile(r"cuda(:\d+)?")


def _device_string(s):
    return "npu" + s[4:] if _CUDA_DEVICE.fullmatch(s) else s


def _device_of(value, ints_are_devices):
    """The NPU equivalent of one device-like value, or ``None`` when it needs no change."""
    if isinstance(value, str):
        return _device_string(value) if _CUDA_DEVICE.fullmatch(value) else None
    if isinstance(value, torch.device):
        if value.type != "cuda":
            return None
        return torch.device("npu", value.index) if value.index is not None else torch.device("npu")
    if ints_are_devices and isinstance(value, int) and not isinstance(value, bool):
        return f"npu:{value}"
    if isinstance(value, dict):
        changed = False
        out = {}
        for k, v in value.items():
            nk = _device_string(k) if isinstance(k, str) else k
            nv = _device_string(v) if isinstance(v, str) else v
            changed = changed or nk is not k or nv is not v
            out[nk] = nv
        return out if changed else None
    return None


def device_args(fn, api=None):
    """Wrap ``fn`` so CUDA device arguments reach it as NPU ones."""
    api = api or getattr(fn, "__qualname__", getattr(fn, "__name__", repr(fn)))
    ints_are_devices = getattr(fn, "__name__", "") in ("to", "to_empty")

    @functools.wraps(fn)
    def rewritten(*args, **kwargs):
        if args:
            new_args = None
            for i, a in enumerate(args):
                if isinstance(a, (str, torch.device, dict)) or (ints_are_devices and type(a) is int):
                    repl = _device_of(a, ints_are_devices)
                    if repl is not None:
                        if new_args is None:
                            new_args = list(args)
                        new_args[i] = repl
                        if not isinstance(a, int):
                            record(api, a)
            if new_args is not None:
                args = tuple(new_args)
        if kwargs:
            for key in DEVICE_KWARGS:
                value = kwargs.get(key)
                if value is not None:
                    repl = _device_of(value, ints_are_devices)
                    if repl is not None:
                        kwargs[key] = repl
                        if not isinstance(value, int):
                            record(api, value)
            ids = kwargs.get("device_ids")
            if isinstance(ids, (list, tuple)):
                new_ids = [_device_of(d, False) or d for d in ids]
                if any(a is not b for a, b in zip(new_ids, ids)):
                    record(api, ids)
                    kwargs["device_ids"] = type(ids)(new_ids)
        return fn(*args, **kwargs)

    rewritten.__wrapped_by_transfer_to_npu__ = True
    return rewritten


def wrap_attributes(owner, names, prefix):
    """Replace each existing ``owner.<name>`` by its device-rewriting wrapper."""
    for name in names:
        fn = getattr(owner, name, None)
        if fn is None or getattr(fn, "__wrapped_by_transfer_to_npu__", False):
            continue
        setattr(owner, name, device_args(fn, f"{prefix}.{name}"))


def backend_name(backend):
    """``nccl`` -> ``hccl`` and ``cuda`` -> ``npu`` in a process-group backend string."""
    return backend.replace("nccl", "hccl").replace("cuda", "npu")


def backend_args(fn, api):
    """Wrap a process-group constructor so a ``nccl`` backend string becomes ``hccl``."""

    @functools.wraps(fn)
    def rewritten(*args, **kwargs):
        if args and isinstance(args[0], str) and ("nccl" in args[0] or "cuda" in args[0]):
            record(api, args[0])
            args = (backend_name(args[0]),) + tuple(args[1:])
        backend = kwargs.get("backend")
        if isinstance(backend, str) and ("nccl" in backend or "cuda" in backend):
            record(api, backend)
            kwargs["backend"] = backend_name(backend)
        device_id = kwargs.get("device_id")
        if device_id is not None:
            repl = _device_of(device_id, False)
            if repl is not None:
                record(api, device_id)
                kwargs["device_id"] = repl
        return fn(*args, **kwargs)

    rewritten.__wrapped_by_transfer_to_npu__ = True
    return rewritten


def recorded_alias(fn, api):
    """``fn`` (an NPU method standing in for a CUDA one), recording each call."""

    @functools.wraps(fn)
    def alias(*args, **kwargs):
        record(api, api.rsplit(".", 1)[-1] + "()")
        return fn(*args, **kwargs)

    alias.__wrapped_by_transfer_to_npu__ = True
    return alias
