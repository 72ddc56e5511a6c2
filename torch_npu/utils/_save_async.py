"""torch_npu.utils.save_async: save a checkpoint without waiting for the disk.

The object is serialized at call time, on the calling thread: the npu storages
are copied to host memory then, so later training steps cannot change what is
saved (the emulated device is synchronous, so this copy is the whole
device-side part of the save).  Only the file write happens in the background.

A write to a path is atomic: the bytes go to a temporary file in the same
directory, which is fsync-ed and then renamed over the target, and the
directory is fsync-ed.  A process killed at any moment therefore leaves either
the previous file or the new one at ``f``, never a partial file (a stale
``.<name>.tmp-*`` file may remain; it is safe to delete).
"""
import io
import os
import pickle
import sys
import threading
from typing import Any

import torch
from torch.serialization import DEFAULT_PROTOCOL

from torch_npu.utils._error_code import ErrCode, pta_error

__all__ = ["save_async"]

# The last background write started; each new write waits for it first, so
# saves to the same file land in call order.
_last_writer = None
_writer_lock = threading.Lock()
_tmp_counter = 0


def _fsync_directory(directory):
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_bytes(path, data):
    """Write ``data`` to ``path`` so that ``path`` is never seen partially written."""
    global _tmp_counter
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    with _writer_lock:
        _tmp_counter += 1
        tmp = os.path.join(directory, f".{os.path.basename(path)}.tmp-{os.getpid()}-{_tmp_counter}")
    try:
        with open(tmp, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    _fsync_directory(directory)


def _write(data, f, previous):
    if previous is not None:
        previous.join()
    try:
        if isinstance(f, (str, os.PathLike)):
            atomic_write_bytes(f, data)
        else:
            f.write(data)
            f.flush()
    except Exception as e:  # a background thread has nobody to raise to
        print(f"torch_npu.utils.save_async: writing {f!r} failed: {type(e).__name__}: {e}", file=sys.stderr)


def save_async(
    obj: object,
    f,
    pickle_module: Any = pickle,
    pickle_protocol: int = DEFAULT_PROTOCOL,
    _use_new_zipfile_serialization: bool = True,
    _disable_byteorder_record: bool = False,
    model: torch.nn.Module = None,
) -> None:
    """Serialize ``obj`` now and write it to ``f`` (a path or a binary file) in the background.

    ``model`` is accepted for compatibility: on hardware it delays the next
    backward pass until the device-to-host copy is done; here that copy is
    finished before this function returns.
    """
    global _last_writer
    if _use_new_zipfile_serialization is False:
        raise RuntimeError("torch_npu.utils.save_async does not support _use_new_zipfile_serialization=False "
                           "for npu tensors; save with _use_new_zipfile_serialization=True, or move the npu "
                           "tensors to the cpu first." + pta_error(ErrCode.PARAM))
    if model is not None and not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module or None, got {type(model).__name__}"
                        + pta_error(ErrCode.TYPE))
    buffer = io.BytesIO()
    torch.save(obj, buffer, pickle_module=pickle_module, pickle_protocol=pickle_protocol,
               _use_new_zipfile_serialization=True, _disable_byteorder_record=_disable_byteorder_record)
    data = buffer.getvalue()
    with _writer_lock:
        # Not a daemon: the interpreter waits for pending writes at exit.
        writer = threading.Thread(target=_write, args=(data, f, _last_writer), name="torch_npu-save_async")
        _last_writer = writer
        writer.start()


def _wait_for_pending_saves():
    """Block until every save_async started so far has written its file."""
    with _writer_lock:
        last = _last_writer
    if last is not None:
        last.join()
