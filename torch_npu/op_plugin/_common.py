"""Small helpers shared by the emulated op families."""
import torch

__all__ = []

_LOW_PRECISION = (torch.float16, torch.bfloat16)


def acc(t):
    """``t`` in its compute precision: float16/bfloat16 are upcast to float32
    (as the NPU vector units accumulate), other dtypes are kept (float64 stays
    float64, so gradcheck sees full precision)."""
    return t.float() if t.dtype in _LOW_PRECISION else t


def stat_dtype(t):
    """dtype of float32 statistics outputs (rstd, ...): float32, or float64 for float64 inputs."""
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def fresh(t):
    """A result that owns its memory: views are copied (contiguously), so an op whose
    schema promises a new tensor never returns an alias of its input."""
    return t.clone(memory_format=torch.contiguous_format) if t._is_view() else t


def check(cond, op, message, args=None):
    """Raise RuntimeError ``"<op>: <message>"`` unless ``cond``; ``message % args`` when
    ``args`` is given, formatted only on failure (a passing check costs no formatting)."""
    if cond is True:  # the common case, without torch._check's per-call cost
        return
    torch._check(cond, lambda: "%s: %s" % (op, message if args is None else message % args))


def write_out(out, result):
    """Copy ``result`` into the ``out=`` tensor (resized to its shape first, as ATen's out
    overloads do) and return ``out``."""
    if tuple(out.shape) != tuple(result.shape):
        out.resize_(result.shape)
    out.copy_(result)
    return out


def new_empty(shape, dtype, like):
    """An uninitialised tensor of ``shape`` and ``dtype`` on ``like``'s device (Meta kernels' outputs)."""
    return like.new_empty(tuple(shape), dtype=dtype)


def symbolic(t):
    """True for tensors that carry shapes only (meta, FakeTensor, functional tracing)."""
    if t.device.type == "meta":
        return True
    from torch._subclasses.fake_tensor import is_fake
    return is_fake(t)


def building_graph():
    """True while a graph is recorded: a TracingContext (Dynamo, AOTAutograd, export) or a proxy mode (make_fx)."""
    from torch._guards import TracingContext
    from torch.fx.experimental.proxy_tensor import get_proxy_mode
    return TracingContext.try_get() is not None or get_proxy_mode() is not None


def unsupported(op, arg):
    """Raise NotImplementedError for an argument value (or combination) ``arg`` that op ``op``
    accepts on hardware but the CPU-emulated NPU does not emulate: one wording for every op."""
    raise NotImplementedError("%s: %s is not supported by the CPU-emulated NPU" % (op, arg))


def reject_given(op, **kwargs):
    """:func:`unsupported` for the first keyword argument that is given (not None): arguments the
    real op takes whose effect is not emulated."""
    for arg, val in kwargs.items():
        if val is not None:
            unsupported(op, "argument %s" % arg)
