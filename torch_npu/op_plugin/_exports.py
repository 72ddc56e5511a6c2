"""What ``torch_npu`` exports from the op library, and the three extra public names.

* every ``torch.ops.npu.<name>`` becomes ``torch_npu.<name>`` (the OpOverloadPacket
  itself: schema defaults, keyword arguments and overload resolution as on hardware);
* ``torch_npu.__all__`` gains ``HiFloat8Tensor``, ``erase_stream``, ``matmul_checksum``
  and the 119 public op names (sorted), as the real 2.13.0 package lists them;
* the legacy ``torch.<name>`` attributes exist and raise the real deprecation error.
"""
import sys

import torch

import torch_npu
from torch_npu.op_plugin import _registry
from torch_npu.utils._error_code import ErrCode, pta_error

__all__ = ["erase_stream", "matmul_checksum"]

EXTRA_PUBLIC = ("HiFloat8Tensor", "erase_stream", "matmul_checksum")


def erase_stream(tensor, stream):
    """Remove the ``record_stream(stream)`` mark of ``tensor``'s memory block.

    This lets the caching allocator give the block back to its allocation
    stream at free time without waiting for ``stream`` (the trace hooks report it
    as ``npu_erase_stream``). Memory that is not a caching-allocator block is
    left alone. Returns ``None``.
    """
    if not isinstance(tensor, torch.Tensor):
        raise TypeError("erase_stream(): argument 'tensor' must be Tensor, not %s" % type(tensor).__name__
                        + pta_error(ErrCode.TYPE))
    if not isinstance(stream, torch.Stream):
        raise TypeError("erase_stream(): argument 'stream' must be torch_npu.npu.Stream, not %s"
                        % type(stream).__name__ + pta_error(ErrCode.TYPE))
    if tensor.device.type == "npu" and stream.device.type == "npu":
        torch_npu._C._npu_eraseStream(tensor, stream.stream_id, stream.device_index)
    return None


def matmul_checksum(a, b, c):
    """Check ``c == a @ b`` against silent hardware (AI core) errors.

    Row checksums: ``e = |c.sum(-1) - (a @ b.sum(-1, keepdim=True)).squeeze(-1)|`` is
    compared with the rounding bound of a correct result,
    ``eps(c.dtype) * |c|.sum(-1) + 2 * k * eps(acc) * (|a| @ |b|.sum(-1, keepdim=True)).squeeze(-1)``
    (storing ``c`` in its dtype, plus accumulating ``k`` = inner-dim products in ``acc`` =
    float32, or float64 for float64 inputs). Returns a 0-dim bool tensor on ``c``'s
    device: True when some row exceeds its bound (or is not finite), i.e. an error
    was detected.
    """
    for name, t in (("a", a), ("b", b), ("c", c)):
        if not isinstance(t, torch.Tensor):
            raise TypeError("matmul_checksum(): argument '%s' must be Tensor, not %s" % (name, type(t).__name__)
                            + pta_error(ErrCode.TYPE))
    torch._check(a.dim() >= 2 and b.dim() >= 2,
                 lambda: "matmul_checksum(): a and b must be matrices (or batches of them)" + pta_error(ErrCode.PARAM))
    expected = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2]) + (a.shape[-2], b.shape[-1])
    torch._check(a.shape[-1] == b.shape[-2] and tuple(c.shape) == tuple(expected),
                 lambda: "matmul_checksum(): c %s is not the shape of a %s @ b %s"
                 % (tuple(c.shape), tuple(a.shape), tuple(b.shape)) + pta_error(ErrCode.PARAM))
    acc = torch.float64 if torch.float64 in (a.dtype, b.dtype, c.dtype) else torch.float32
    af, bf, cf = a.to(acc), b.to(acc), c.to(acc)
    reference = af.matmul(bf.sum(-1, keepdim=True)).squeeze(-1)
    bound = af.abs().matmul(bf.abs().sum(-1, keepdim=True)).squeeze(-1)
    c_eps = torch.finfo(c.dtype).eps if c.dtype.is_floating_point else 0.0
    limit = c_eps * cf.abs().sum(-1) + 2 * a.shape[-1] * torch.finfo(acc).eps * bound
    err = (cf.sum(-1) - reference).abs()
    ok = err <= limit + torch.finfo(acc).tiny
    return (~ok).any()


def _deprecated_torch_attr(name):
    def deprecated(*args, **kwargs):
        raise RuntimeError("torch.%s is deprecated and will be removed in future version. "
                           "Use torch_npu.%s instead." % (name, name) + pta_error(ErrCode.NOT_SUPPORT))

    deprecated.__name__ = deprecated.__qualname__ = name
    deprecated.__doc__ = "Deprecated alias of torch_npu.%s: calling it raises RuntimeError." % name
    return deprecated


def base_names():
    """Op base names in schema order, and the public ones."""
    names, public = [], set()
    for name, entry in _registry.DEFINED.items():
        is_public = entry[0]
        base = _registry.base_name(name)
        if base not in names:
            names.append(base)
        if is_public:
            public.add(base)
    return names, public


def export():
    torch_npu = sys.modules["torch_npu"]
    names, public = base_names()
    ops = torch.ops.npu
    for base in names:
        packet = getattr(ops, base)
        fn = _registry.IMPLEMENTED.get(base)
        if fn is not None and fn.__doc__:
            packet.__doc__ = fn.__doc__
        setattr(torch_npu, base, packet)
        if not hasattr(torch, base):
            setattr(torch, base, _deprecated_torch_attr(base))
    # HiFloat8Tensor comes from torch_npu.utils.hif8_tensor (set by torch_npu/__init__.py).
    for extra in __all__:
        if not hasattr(torch_npu, extra):
            setattr(torch_npu, extra, globals()[extra])
    exported = torch_npu.__dict__.setdefault("__all__", [])
    for name in list(EXTRA_PUBLIC) + sorted(public):
        if name not in exported:
            exported.append(name)
