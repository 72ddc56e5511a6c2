"""Private formats: torch_npu.Format, npu_format_cast(_), get_npu_format, empty_with_format.

On the NPU a tensor's storage can hold its data in a private layout (NZ, NC1HWC0, ...)
that kernels prefer. The emulated device keeps the data in the ordinary (ND) layout and
records the format as metadata on the storage (a tag on the device allocation, C++
allocator), so every view of a storage reports it, a fresh result starts in its base format,
and torch.save / torch.load carry it. ``torch.npu.config.allow_internal_format = False``
stops private formats from being created: a cast to one keeps the base format.

Graph mode: a FakeTensor has no storage, so its format is unknown while torch.compile traces.
Casts then become the opaque ``_npu_format_cast`` node, whose kernel reads and tags the real
tensor at run time (always a new tensor: a compiled graph cannot choose at run time to return
its input); format queries (``get_npu_format``, the ``.Tensor`` cast, the in-place casts) refuse
graph building, so Dynamo runs them eagerly (a graph break). See docs/graph_mode.md.
"""
import enum
import warnings

import torch

import torch_npu
from torch_npu.op_plugin._common import building_graph, check, symbolic
from torch_npu.op_plugin._registry import impl, opaque

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
        check(False, op, "acl_format %s is not a torch_npu.Format value", (acl_format,))


def _storage_view(t):
    """An npu tensor over ``t``'s whole storage (no copy, no ownership), whose allocation carries
    the format tag; None for FakeTensors and empty storages. A CPU tensor is viewed through its
    data pointer: compiled graphs (torch_npu._inductor) run their kernels on CPU aliases of
    device memory, so the opaque cast sees CPU tensors there. Host memory that is not a device
    allocation has no tag (reads give -1, writes are ignored by the allocator)."""
    if isinstance(t, torch._subclasses.FakeTensor) or t.device.type not in ("npu", "cpu"):
        return None
    if t.device.type == "npu":
        return t
    storage = t.untyped_storage()
    if storage.nbytes() == 0 or storage.data_ptr() == 0:
        return None
    npu = torch.device("npu", torch.npu.current_device())
    borrowed = torch._C._construct_storage_from_data_pointer(storage.data_ptr(), npu, storage.nbytes())
    return torch.empty(0, dtype=torch.uint8, device=npu).set_(borrowed)


def _stored(t):
    view = _storage_view(t)
    return -1 if view is None else torch_npu._C._npu_storage_format(view)


def _tag(t, fmt, op):
    """Record ``fmt`` on t's storage (tensors with device memory only)."""
    if fmt not in _BASE_FORMATS and not torch.npu.config.allow_internal_format:
        if op not in _warned:
            _warned.add(op)
            warnings.warn("%s: torch.npu.config.allow_internal_format is False, so no private format is "
                          "created; the tensor keeps its base format." % op)
        fmt = _base_format(t)
    view = _storage_view(t) if t.numel() > 0 else None
    if view is not None:
        torch_npu._C._npu_set_storage_format(view, fmt)
    return t


def _refuse_graph_building(op):
    """Formats live on storages, which FakeTensors lack: a value read while a graph is built would
    be baked into it. Raised as a data-dependent operator, Dynamo runs the call eagerly."""
    if building_graph():
        from torch._subclasses.fake_tensor import DataDependentOutputException

        class FormatNotTraceable(DataDependentOutputException, NotImplementedError):
            """A storage format read met graph building."""
        raise FormatNotTraceable("%s reads the storage format of a tensor, which is only known at run time: "
                                 "torch.compile runs this call eagerly (a graph break)" % op)


def _format_of(t):
    stored = _stored(t)
    return stored if stored >= 0 else _base_format(t)


@impl("get_npu_format")
def get_npu_format(self):
    """The tensor's torch_npu format (int): the one it was cast to, else its base format
    (NCHW for 4-D, NCDHW for 5-D, ND otherwise). Views share their storage's format."""
    if symbolic(self):
        _refuse_graph_building("get_npu_format")
    return _format_of(self)


def _cast(self, acl_format, op):
    fmt = _checked_format(acl_format, op)
    if symbolic(self):  # tracing: the run-time kernel decides (and always copies)
        return torch.ops.npu._npu_format_cast(self, fmt)
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
    if symbolic(dst):
        _refuse_graph_building("npu_format_cast(self, dst)")
    return _cast(self, _format_of(dst), "npu_format_cast")


def _npu_format_cast_fake(self, acl_format):
    _checked_format(acl_format, "_npu_format_cast")
    return torch.empty_like(self, memory_format=torch.contiguous_format)


@opaque("_npu_format_cast", _npu_format_cast_fake)
def _npu_format_cast(self, acl_format):
    """A new tensor holding ``self`` in format ``acl_format``: the graph node of every cast (see
    the module doc). Unlike the real op it copies even when ``self`` already has the format."""
    fmt = _checked_format(acl_format, "_npu_format_cast")
    return _tag(self.clone(memory_format=torch.contiguous_format), fmt, "_npu_format_cast")


def _npu_format_cast_backward(ctx, grad):
    return grad, None  # a format is a layout: the gradient passes through (op-plugin derivatives.yaml)


torch.library.register_autograd("npu::_npu_format_cast", _npu_format_cast_backward)


@impl("_npu_format_cast.aclnn")
def _npu_format_cast_aclnn(self, acl_format, customize_dtype):
    return _cast(self, acl_format, "_npu_format_cast")


@impl("_npu_format_cast.input_dtype")
def _npu_format_cast_input_dtype(self, acl_format, customize_dtype, input_dtype):
    return _cast(self, acl_format, "_npu_format_cast")


@impl("npu_format_cast_.acl_format")
def npu_format_cast_inplace(self, acl_format, customize_dtype=None, input_dtype=None):
    """Sets ``self``'s format to ``acl_format`` in place (the storage's tag: every view sees it)."""
    if symbolic(self):
        _refuse_graph_building("npu_format_cast_")
    return _tag(self, _checked_format(acl_format, "npu_format_cast_"), "npu_format_cast_")


@impl("npu_format_cast_")
def npu_format_cast_inplace_tensor(self, src, customize_dtype=None, input_dtype=None):
    """Sets ``self``'s format to ``src``'s format in place."""
    if symbolic(self):
        _refuse_graph_building("npu_format_cast_")
    return _tag(self, _format_of(src), "npu_format_cast_")


def _empty(size, dtype, layout, device, pin_memory, acl_format, op):
    fmt = _checked_format(acl_format, op)
    out = torch.empty(size, dtype=dtype, layout=layout, device=device, pin_memory=pin_memory)
    if out.device.type != "npu":
        return out
    if symbolic(out):  # tracing: tag at run time (a copy of uninitialised memory costs nothing observable)
        return torch.ops.npu._npu_format_cast(out, fmt)
    return _tag(out, fmt, op)


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
