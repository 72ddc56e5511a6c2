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

A failed write is never lost: the temporary file is removed, the previous
checkpoint at ``f`` is left untouched, and the failure (file and cause) is
raised as a ``RuntimeError`` by the next ``save_async`` call or the next
``_wait_for_pending_saves()``, whichever comes first.  A failure nobody has
been told about when the interpreter exits is printed to stderr and the
process exits with status 1 (see ``_report_at_exit``).
"""
import atexit
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
# (target, exception) of background writes that failed and were not yet raised to the caller.
_failures = []
# Exit status when a failed write is still unreported at interpreter exit.
_EXIT_STATUS_ON_LOST_SAVE = 1


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
    except BaseException as e:  # kept for the caller: raised at the next call, the wait, or exit
        with _writer_lock:
            _failures.append((f, e))


def _target_label(f):
    if isinstance(f, (str, os.PathLike)):
        return repr(os.fspath(f))
    return repr(getattr(f, "name", None) or f"<{type(f).__name__}>")


def _failure_message(failures):
    f, e = failures[0]
    text = (f"torch_npu.utils.save_async: the checkpoint {_target_label(f)} was NOT saved: writing it failed "
            f"with {type(e).__name__}: {e}. The previous file at that path (if any) is unchanged.")
    if len(failures) > 1:
        text += " %d more save(s) failed too: %s." % (
            len(failures) - 1, "; ".join(f"{_target_label(g)} ({type(x).__name__}: {x})" for g, x in failures[1:]))
    return text


def _raise_failures():
    """Raise (once) the failures of background writes that finished since the last report."""
    with _writer_lock:
        failures = _failures[:]
        _failures.clear()
    if failures:
        raise RuntimeError(_failure_message(failures) + pta_error(ErrCode.SYSCALL)) from failures[0][1]


def _report_at_exit():
    """At interpreter exit (after the writer threads were joined): a failed save nobody was told
    about is printed and turns the exit status to 1.

    Raising in an atexit handler only prints a traceback, and the status was fixed before
    the handlers ran, so the process ends with ``os._exit``: after flushing the standard
    streams and shutting logging and multiprocessing down, which are the handlers registered
    before this one (those run after it and are skipped by ``os._exit``).
    """
    _wait_quietly()
    with _writer_lock:
        failures = _failures[:]
        _failures.clear()
    if not failures:
        return
    try:
        print(_failure_message(failures) + " Exiting with status 1.", file=sys.stderr)
        import logging
        logging.shutdown()
        if "multiprocessing.util" in sys.modules:
            sys.modules["multiprocessing.util"]._exit_function()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        os._exit(_EXIT_STATUS_ON_LOST_SAVE)


def _wait_quietly():
    with _writer_lock:
        last = _last_writer
    if last is not None:
        last.join()


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

    Raises ``RuntimeError`` (naming the file and the cause) when an earlier save_async
    write has failed since the last report, before starting this one.
    ``model`` is accepted for compatibility: on hardware it delays the next
    backward pass until the device-to-host copy is done; here that copy is
    finished before this function returns.
    """
    global _last_writer
    _raise_failures()
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
    """Block until every save_async started so far has written its file; raise ``RuntimeError``
    (file and cause, the write's exception chained) if one of them failed."""
    _wait_quietly()
    _raise_failures()


# Registered at import, so that it runs after the handlers registered later (LIFO) and
# skips as few as possible when it has to end the process.
atexit.register(_report_at_exit)
