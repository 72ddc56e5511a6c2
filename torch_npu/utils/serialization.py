"""torch_npu.utils.serialization: ``load`` (installed as ``torch.load``) and ``save_async``.

``load`` is PyTorch's own ``torch.load`` (same signature, same
``weights_only`` default and checks, npu locations restored by PyTorch's
PrivateUse1 path); what it adds is a clear error when a checkpoint file is
truncated or corrupt.  PyTorch reports such files with messages that do not
name the file and can mislead (a damaged pickle record shows up as "Weights
only load failed", a truncated one as "[Errno 22] Invalid argument").  When
``torch.load`` fails, the file is checked as a zip archive (central directory,
record headers, CRC-32 of each record); if it is damaged, a RuntimeError names
the file and the damage, with PyTorch's error chained as the cause.  Files
that are intact keep PyTorch's error unchanged (a refused pickle stays a
``pickle.UnpicklingError``).
"""
import io
import os
import pickle
import struct
import zipfile
from typing import Any, Optional

import torch
import torch.serialization

from torch_npu.utils._save_async import save_async

__all__ = ["load", "save_async"]

_torch_load = torch.serialization.load
_ZIP_MAGIC = b"PK\x03\x04"


# Zip local file header: signature, version, flags, method, time, date, crc, sizes, name and extra lengths.
_LOCAL_HEADER = struct.Struct("<4sHHHHHIIIHH")
_MAX_RECORD_NAME = 1024


def _first_record_damage(head, size) -> Optional[str]:
    """What is wrong with the first zip record header in ``head``, or None when it is plausible.

    A truncated checkpoint still starts with a valid record (``<archive>/data.pkl``, stored
    or deflated, a UTF-8 name); bytes that merely start with the zip signature do not.
    """
    if len(head) < _LOCAL_HEADER.size:
        return None  # too short to tell: a truncation
    _, version, _, method, _, _, _, _, _, name_len, _ = _LOCAL_HEADER.unpack_from(head)
    if method not in (0, 8):
        return f"its first record has an unknown compression method {method}"
    if version > 63:
        return f"its first record needs zip version {version / 10:.1f}, which does not exist"
    if name_len == 0 or name_len > _MAX_RECORD_NAME or _LOCAL_HEADER.size + name_len > size:
        return f"its first record has an impossible name length {name_len}"
    name = head[_LOCAL_HEADER.size:_LOCAL_HEADER.size + name_len]
    try:
        text = name.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is None or not text.isprintable():
        return f"the name of its first record is not text ({name[:24]!r})"
    return None


def _describe_damage(opened) -> Optional[str]:
    """What is wrong with the checkpoint bytes in ``opened`` (a seekable binary file), or None."""
    opened.seek(0, io.SEEK_END)
    size = opened.tell()
    opened.seek(0)
    if size == 0:
        return "the file is empty"
    head = opened.read(4)
    opened.seek(0)
    if head != _ZIP_MAGIC:
        if _ZIP_MAGIC.startswith(head):
            return f"the file is {size} bytes, shorter than any checkpoint"
        if not head.startswith(b"\x80"):  # neither a zip nor a legacy (pickle) checkpoint
            return f"it does not start like a PyTorch checkpoint (first bytes {head!r})"
        return None  # legacy (pre-1.6) format: PyTorch's own error says more
    try:
        with zipfile.ZipFile(opened) as archive:
            bad_record = archive.testzip()
    except zipfile.BadZipFile as e:
        opened.seek(0)
        header_damage = _first_record_damage(opened.read(_LOCAL_HEADER.size + _MAX_RECORD_NAME), size)
        if header_damage is not None:
            return f"it is not a zip archive written by torch.save: {header_damage}; the file is {size} bytes, corrupt"
        return f"it is not a complete zip archive ({e}); the file is {size} bytes, probably truncated"
    except (EOFError, OSError, ValueError, zipfile.LargeZipFile) as e:
        return f"reading its zip records failed ({type(e).__name__}: {e}); the file is {size} bytes"
    if bad_record is not None:
        return f"record '{bad_record}' fails its CRC-32 check"
    return None


def _damage_of(f) -> Optional[str]:
    try:
        if isinstance(f, (str, os.PathLike)):
            if not os.path.isfile(f):
                return None
            with open(f, "rb") as opened:
                return _describe_damage(opened)
        if hasattr(f, "seek") and hasattr(f, "read"):
            position = f.tell()
            try:
                return _describe_damage(f)
            finally:
                f.seek(position)
    except Exception:  # the diagnosis must never hide PyTorch's own error
        return None
    return None


def _file_label(f) -> str:
    if isinstance(f, (str, os.PathLike)):
        return os.fspath(f)
    return getattr(f, "name", None) or f"<{type(f).__name__}>"


def load(
    f,
    map_location=None,
    pickle_module: Any = None,
    *,
    weights_only: Optional[bool] = None,
    mmap: Optional[bool] = None,
    **pickle_load_args: Any,
) -> Any:
    """``torch.load``, with an error naming the file when the checkpoint is truncated or corrupt."""
    try:
        return _torch_load(f, map_location, pickle_module, weights_only=weights_only, mmap=mmap,
                           **pickle_load_args)
    except (RuntimeError, EOFError, OSError, pickle.UnpicklingError, ValueError, KeyError) as error:
        damage = _damage_of(f)
        if damage is None:
            raise
        raise RuntimeError(f"torch.load: the checkpoint file {_file_label(f)!r} is truncated or corrupt: "
                           f"{damage}. It cannot be loaded; load an earlier checkpoint or save it again. "
                           f"(PyTorch reported {type(error).__name__}: {error})") from error


load.__doc__ = (_torch_load.__doc__ or "") + "\n" + load.__doc__


def _install():
    """Make ``torch.load`` this ``load``, as the real torch_npu does at import."""
    torch.load = load
