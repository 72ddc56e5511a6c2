"""Private formats: torch_npu.Format, npu_format_cast(_), get_npu_format, empty_with_format.

On the NPU a tensor's storage can hold its data in a private layout (NZ, NC1HWC0, ...)
that kernels prefer. The emulated device keeps the data in the ordinary (ND) layout and
records the format as metadata on the storage (a tag on the device allocation, C++
allocator), so every view of a storage reports it, a fresh result starts in its base format,
and torch.save / torch.load carry it. ``torch.npu.config.allow_internal_format = False``
stops private formats from being created: a cast to one keeps the base format.
"""
import enum
import warnings

import torch

import torch_npu
from torch_npu.op_plugin._common import check
from torch_npu.op_plugin._registry import impl

__all__ = ["Format"]


class Format(enum.IntEnum):
    UNDEFINED = -1
    NCHW = 0
    NHWC = 1
    ND = 2
    NC1HWC0 = 3
    FRACTAL_Z = 4
    NC1HWC0_C04 = 12
    HWCN = 16
    NDHWC = 27
    FRACTAL_NZ = 29
    NCDHW = 30
    NDC1HWC0 = 32
    FRACTAL_Z_3D = 33
    NC = 35
    NCL = 47
    FRACTAL_NZ_C0_16 = 50
    FRACTAL_NZ_C0_32 = 51
    FRACTAL_NZ_C0_2 = 52
    FRACTAL_NZ_C0_4 = 53
    FRACTAL_NZ_C0_8 = 54


# Formats that only describe the logical axes (no private data layout).
_BASE_FORMATS = {Format.NCHW, Format.NHWC, Format.ND, Format.HWCN, Format.NDHWC, Format.NCDHW, Format.NC,
                 Format.NCL}
_warned = set()


def _base_format(t):
    """The format a tensor has unless cast: NCHW for 4-D, NCDHW for 5-D, ND otherwise."""
    return int(Format.NCHW) if t.dim() == 4 else int(Format.NCDHW) if t.dim() == 5 else int(Format.ND)


def _checked_format(acl_format, op):
    try:
        return int(Format(int(acl_format)))
    except ValueError:
        check(False, op, "acl_format %s is not a torch_npu.Format value" % (acl_format,))


def _stored(t):
    if t.device.type != "npu" or isinstance(t, torch._subclasses.FakeTensor):
        return -1
    return torch_npu._C._npu_storage_format(t)


def _tag(t, fmt, op):
    """Record ``fmt`` on t's storage (npu tensors with memory only)."""
    if fmt not in _BASE_FORMATS and not torch.npu.config.allow_internal_format:
        if op not in _warned:
            _warned.add(op)
            warnings.warn("%s: torch.npu.config.allow_internal_format is False, so no private format is "
                          "created; the tensor keeps its base format." % op)
        fmt = _base_format(t)
    if t.device.type == "npu" and not isinstance(t, torch._subclasses.FakeTensor) and t.numel() > 0:
        torch_npu._C._npu_set_storage_format(t, fmt)
    return t


def _format_of(t):
    stored = _stored(t)
    return stored if stored >= 0 else _base_format(t)


@impl("get_npu_format")
def get_npu_format(self):
    """The tensor's torch_npu format (int): the one it was cast to, else its base format
    (NCHW for 4-D, NCDHW for 5-D, ND otherwise). Views share their storage's format."""
    return _format_of(self)


def _cast(self, acl_format, op):
    fmt = _checked_format(acl_format, op)
    if _format_of(self) == fmt:
        return self
    out = self.clone(memory_format=torch.contiguous_format)
    return _tag(out, fmt, op)


@impl("npu_format_cast")
def npu_format_cast(self, acl_format, customize_dtype=None, input_dtype=None):
    """A copy of ``self`` in format ``acl_format`` (``self`` itself when it already has it)."""
    return _cast(self, acl_format, "npu_format_cast")


@impl("npu_format_cast.Tensor")
def npu_format_cast_tensor(self, dst, customize_dtype=None, input_dtype=None):
    """``npu_format_cast(self, get_npu_format(dst))``."""
    return _cast(self, _format_of(dst), "npu_format_cast")


@impl("_npu_format_cast")
def _npu_format_cast(self, acl_format):
    return _cast(self, acl_format, "_npu_format_cast")


@impl("_npu_format_cast.aclnn")
def _npu_format_cast_aclnn(self, acl_format, customize_dtype):
    return _cast(self, acl_format, "_npu_format_cast")


@impl("_npu_format_cast.input_dtype")
def _npu_format_cast_input_dtype(self, acl_format, customize_dtype, input_dtype):
    return _cast(self, acl_format, "_npu_format_cast")


@impl("npu_format_cast_.acl_format")
def npu_format_cast_inplace(self, acl_format, customize_dtype=None, input_dtype=None):
    """Sets ``self``'s format to ``acl_format`` in place (the storage's tag: every view sees it)."""
    return _tag(self, _checked_format(acl_format, "npu_format_cast_"), "npu_format_cast_")


@impl("npu_format_cast_")
def npu_format_cast_inplace_tensor(self, src, customize_dtype=None, input_dtype=None):
    """Sets ``self``'s format to ``src``'s format in place."""
    return _tag(self, _format_of(src), "npu_format_cast_")


def _empty(size, dtype, layout, device, pin_memory, acl_format, op):
    fmt = _checked_format(acl_format, op)
    out = torch.empty(size, dtype=dtype, layout=layout, device=device, pin_memory=pin_memory)
    return _tag(out, fmt, op) if out.device.type == "npu" else out


@impl("empty_with_format")
def empty_with_format(size, dtype=None, layout=None, device=None, pin_memory=None, acl_format=2,
                      base_addr_aligned_kb=None):
    """An uninitialised tensor whose storage has format ``acl_format``."""
    return _empty(size, dtype, layout, device, pin_memory, acl_format, "empty_with_format")


@impl("unsafe_empty_with_format")
def unsafe_empty_with_format(size, dtype=None, layout=None, device=None, pin_memory=None, acl_format=2,
                             keep_format=False):
    """As empty_with_format."""
    return _empty(size, dtype, layout, device, pin_memory, acl_format, "unsafe_empty_with_format")
