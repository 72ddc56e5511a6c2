"""``torch_npu.HiFloat8Tensor``: a tensor that stores HiFloat8 codes and presents a wider dtype.

The object is a wrapper subclass: its dtype is the nominal one (float32 by
default) while ``_data`` holds the HiF8 codes as a uint8 npu tensor. View-like
methods (``view``, ``reshape``, ``transpose``, slicing, ``detach``) act on the
codes and stay HiF8; every other op decodes to the nominal dtype first and
returns plain tensors; in-place ops write their result back as codes
(re-encoded). Conversions go through ``_hifloat8_codec`` (bit-exact HiF8
encoding, round to nearest, ties away from zero) instead of the device's cast
kernel.
"""
from typing import Optional, Tuple

import torch
from torch.utils._pytree import tree_map

from torch_npu.utils import _hifloat8_codec as codec
from torch_npu.utils._error_code import ErrCode, pta_error

__all__ = []

aten = torch.ops.aten
_NOMINAL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


class _Decode(torch.autograd.Function):
    """HiF8 -> nominal dtype; the gradient passes through unchanged (full precision)."""

    @staticmethod
    def forward(ctx, tensor, dtype):
        return codec.decode(tensor._data, dtype or tensor.dtype)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class _Encode(torch.autograd.Function):
    """Float -> HiF8 (rounded); straight-through gradient."""

    @staticmethod
    def forward(ctx, tensor):
        if tensor.dtype not in _NOMINAL_DTYPES:
            tensor = tensor.float()
        data = codec.encode(tensor.detach().contiguous().npu())
        return _HiFloat8Tensor(data=data, dtype=tensor.dtype)

    @staticmethod
    def backward(ctx, grad):
        return grad


class _Rewrap(torch.autograd.Function):
    """Apply a view-like function to the codes; the same function (or its inverse) on the gradient."""

    @staticmethod
    def forward(ctx, tensor, on_data, on_grad):
        ctx.on_grad = on_grad
        return _HiFloat8Tensor.make_like(tensor, data=on_data(tensor._data))

    @staticmethod
    def backward(ctx, grad):
        return ctx.on_grad(grad), None, None


class _HiFloat8Tensor(torch.Tensor):
    """Tensor whose values are HiFloat8 codes, presented in a nominal higher-precision dtype."""

    def __new__(cls, *, data: torch.Tensor, dtype: torch.dtype = torch.float32):
        if data.element_size() != 1:
            raise ValueError(f"HiFloat8Tensor requires data buffer with 8-bit dtype (got dtype={data.dtype})"
                             + pta_error(ErrCode.VALUE))
        if data.requires_grad:
            raise ValueError("HiFloat8Tensor requires non-differentiable data buffer" + pta_error(ErrCode.VALUE))
        if data.device.type != "npu":
            data = data.npu()
        self = torch.Tensor._make_wrapper_subclass(
            cls, data.size(), strides=data.stride(), storage_offset=data.storage_offset(),
            dtype=dtype, layout=data.layout, requires_grad=False, device=data.device)
        self._data = data
        return self

    @classmethod
    def make_like(cls, tensor, *, data: torch.Tensor, **kwargs):
        kwargs.setdefault("dtype", tensor.dtype)
        return _HiFloat8Tensor(data=data, **kwargs)

    def __repr__(self, *, tensor_contents=None):
        return f"HiFloat8Tensor(data={self.from_hifloat8(dtype=self.dtype)})"

    def from_hifloat8(self, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
        """The values as a plain tensor of ``dtype`` (default: the nominal dtype)."""
        return _Decode.apply(self, dtype)

    @classmethod
    def to_hifloat8(cls, tensor: torch.Tensor):
        """Round ``tensor`` to HiF8; the result's nominal dtype is the input's (float32 for others)."""
        return _Encode.apply(tensor)

    def float(self) -> torch.Tensor:
        return self.from_hifloat8(dtype=torch.float32)

    def bfloat16(self) -> torch.Tensor:
        return self.from_hifloat8(dtype=torch.bfloat16)

    def half(self) -> torch.Tensor:
        return self.from_hifloat8(dtype=torch.float16)

    def cpu(self) -> torch.Tensor:
        return self.from_hifloat8().cpu()

    def clone(self):
        return _HiFloat8Tensor.make_like(self, data=self._data.detach().clone())

    def view(self, *shape: Tuple[int]):
        old = self.shape
        return _Rewrap.apply(self, lambda d: d.view(*shape), lambda g: g.reshape(old))

    def reshape(self, *shape: Tuple[int]):
        old = self.shape
        return _Rewrap.apply(self, lambda d: d.reshape(*shape), lambda g: g.reshape(old))

    def transpose(self, dim0, dim1):
        return _Rewrap.apply(self, lambda d: d.transpose(dim0, dim1), lambda g: g.transpose(dim0, dim1))

    def contiguous(self, *, memory_format: torch.memory_format = torch.contiguous_format):
        if self._data.is_contiguous(memory_format=memory_format):
            return self
        return _HiFloat8Tensor.make_like(self, data=self._data.detach().contiguous(memory_format=memory_format))

    def to_dtype(self, dtype: torch.dtype):
        """The same HiF8 codes under another nominal dtype."""
        return _HiFloat8Tensor.make_like(self, data=self._data, dtype=dtype)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is aten.copy_.default:
            dst, src = args[0], args[1]
            if isinstance(dst, _HiFloat8Tensor) and isinstance(src, _HiFloat8Tensor):
                dst._data.copy_(src._data)
            elif isinstance(dst, _HiFloat8Tensor):
                dst._data.copy_(codec.encode(src.expand(dst.shape).to(dst._data.device)))
            else:
                dst.copy_(src.from_hifloat8())
            return dst
        if func in (aten.view.default, aten._unsafe_view.default, aten.slice.Tensor, aten.select.int,
                    aten.t.default, aten.transpose.int, aten.detach.default, aten.alias.default):
            return _HiFloat8Tensor.make_like(args[0], data=func(args[0]._data, *args[1:], **kwargs))

        def unwrap(t):
            return codec.decode(t._data, t.dtype) if isinstance(t, _HiFloat8Tensor) else t

        if func._schema.is_mutable:
            plain_args, plain_kwargs = tree_map(unwrap, args), tree_map(unwrap, kwargs)
            func(*plain_args, **plain_kwargs)
            # Written arguments go back into their HiF8 codes (re-rounded).
            for schema_arg, arg, plain in zip(func._schema.arguments, args, plain_args):
                if isinstance(arg, _HiFloat8Tensor) and schema_arg.alias_info is not None \
                        and schema_arg.alias_info.is_write:
                    arg._data.copy_(codec.encode(plain))
            for name, arg in kwargs.items():
                if isinstance(arg, _HiFloat8Tensor):
                    arg._data.copy_(codec.encode(plain_kwargs[name]))
            return args[0]
        return func(*tree_map(unwrap, args), **tree_map(unwrap, kwargs))


HiFloat8Tensor = _HiFloat8Tensor
