"""dtype casts: ``_npu_dtype_cast``, ``npu_dtype_cast`` (``dtype`` a ScalarType code or a
``torch_npu.<dtype>`` constant), ``npu_dtype_cast_`` and their backward ops (the cast back to
the input's dtype). A dtype code with no torch dtype raises NotImplementedError naming it.
"""

from torch_npu.op_plugin._common import check
from torch_npu.op_plugin._registry import impl
from torch_npu.op_plugin.quant.quantize import _decode_dtype, _dtype_name

__all__ = []


# ----------------------------------------------------------------- dtype casts


def _dtype_of(op, value):
    dt = _decode_dtype(value)
    if dt is None:
        raise NotImplementedError("%s: dtype %s has no torch dtype on the CPU-emulated NPU" % (op, _dtype_name(value)))
    return dt


@impl("_npu_dtype_cast")
def _npu_dtype_cast(self, dtype):
    """``self`` converted to ``dtype`` (as ``Tensor.to(dtype)``; a copy even for the same dtype)."""
    return self.to(dtype, copy=True)


@impl("_npu_dtype_cast_backward")
def _npu_dtype_cast_backward(grad, dtype):
    """Gradient of a cast: ``grad`` converted back to the input's ``dtype``."""
    return grad.to(dtype, copy=True)


@impl("npu_dtype_cast")
def npu_dtype_cast(self, dtype, input_dtype=None):
    """``self`` converted to ``dtype`` (a ScalarType code, as a ``torch.dtype`` argument
    arrives, or a ``torch_npu.<dtype>`` constant with a torch equivalent). ``input_dtype`` (how
    to read ``self``'s bytes, for types torch lacks) must be None."""
    if input_dtype is not None:
        raise NotImplementedError("npu_dtype_cast: input_dtype=%r is not supported" % (input_dtype,))
    return self.to(_dtype_of("npu_dtype_cast", dtype), copy=True)


@impl("npu_dtype_cast_backward")
def npu_dtype_cast_backward(grad, dtype, grad_dtype=None, input_dtype=None):
    """Gradient of :func:`npu_dtype_cast`: ``grad`` converted to ``dtype``; ``grad_dtype`` and
    ``input_dtype`` must be None."""
    for name, v in (("grad_dtype", grad_dtype), ("input_dtype", input_dtype)):
        if v is not None:
            raise NotImplementedError("npu_dtype_cast_backward: %s=%r is not supported" % (name, v))
    return grad.to(dtype, copy=True)


@impl("npu_dtype_cast_")
def npu_dtype_cast_(self, src):
    """Writes ``src`` converted to ``self``'s dtype into ``self`` (shapes must match)."""
    check(tuple(self.shape) == tuple(src.shape), "npu_dtype_cast_",
          "self %s and src %s must have the same shape", (tuple(self.shape), tuple(src.shape)))
    return self.copy_(src)


# ----------------------------------------------------------------- copies, views, fills


# ----------------------------------------------------------------- scatter / sort / fill


# ----------------------------------------------------------------- loss gradients


# ----------------------------------------------------------------- dropout with a byte mask


# ----------------------------------------------------------------- AMP, SyncBatchNorm, Adam, quantize


# ----------------------------------------------------------------- Meta kernels only
