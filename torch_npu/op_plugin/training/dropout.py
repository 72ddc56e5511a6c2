"""Dropout ops.

* ``_npu_dropout`` (+ ``npu_dropout_backward``), ``npu_dropout_gen_mask`` and
  ``npu_dropout_do_mask``: dropout whose keep mask is bit-packed (one bit per element, the
  byte count padded to a multiple of 16 per 128 elements, as the NPU stores it); kept values
  are scaled by ``1 / (1 - p)``.
* ``_dropout_with_byte_mask`` (+ ``_backward``): the same with one byte per element.
* dropout_with_byte_mask (non-public ``torch.ops.npu`` op behind
``torch_npu.contrib.function.dropout_with_byte_mask``).

Dropout: each element is zeroed with probability ``p`` and the others are scaled by
``1 / (1 - p)`` when ``train``; identity otherwise. On hardware the keep mask is stored as
one byte per element; that storage is invisible in the result, whose distribution is the
ordinary dropout's, so the emulator draws it with ``torch.nn.functional.dropout`` from the
tensor's device generator (masks are not bit-identical to hardware). Differentiable (the
gradient is the same mask and scale).

Masks are drawn from the generator of the input's device; the bits are not the NPU's Philox
stream. Meta-only: ``_npu_dropout_gen_mask.Tensor`` (its mask layout is not documented precisely
enough to emulate).
"""
import torch

from torch_npu.op_plugin._common import check, unsupported
from torch_npu.op_plugin._registry import impl, meta

__all__ = []


def _mask_bytes(numel):
    return (numel + 127) // 128 * 16


def _pack(keep):
    n = keep.numel()
    bits = torch.zeros(_mask_bytes(n) * 8, dtype=torch.uint8, device=keep.device)
    bits[:n] = keep.reshape(-1).to(torch.uint8)
    weights = torch.tensor([1, 2, 4, 8, 16, 32, 64, 128], dtype=torch.uint8, device=keep.device)
    return (bits.reshape(-1, 8) * weights).sum(-1, dtype=torch.uint8)


def _unpack(op, mask, numel):
    check(mask.dtype == torch.uint8, op, "mask must be uint8, got %s", mask.dtype)
    check(mask.numel() == _mask_bytes(numel), op,
          "mask must have ceil(%d/128)*16 = %d bytes, got %d", (numel, _mask_bytes(numel), mask.numel()))
    shifts = torch.arange(8, dtype=torch.uint8, device=mask.device)
    bits = (mask.reshape(-1, 1) >> shifts) & 1
    return bits.reshape(-1)[:numel]


def _check_p(op, p):
    if not 0.0 <= p <= 1.0:
        unsupported(op, "p=%r (must be in [0, 1])" % (p,))


def _gen_keep(numel, p, device):
    if p == 0.0:
        return torch.ones(numel, dtype=torch.bool, device=device)
    return torch.rand(numel, device=device) >= p


def _apply_mask(x, keep, p):
    if p == 1.0:
        return x * 0
    return x * keep.reshape(x.shape).to(x.dtype) * (1.0 / (1.0 - p))


@impl("_npu_dropout")
def _npu_dropout(self, p):
    """Dropout with drop probability ``p``: each element is kept with probability ``1 - p``
    (uniform draws from the device's generator, ``torch.npu.manual_seed``),
    ``out = self * keep / (1 - p)`` (zeros for ``p = 1``).

    ``mask`` is the bit-packed uint8 keep mask: element i is bit ``i % 8`` (LSB first) of
    byte ``i // 8``, padded with zero bits to a multiple of 128 elements, so
    ``mask.numel() == ceil(self.numel() / 128) * 16``. Returns ``(out, mask)``.
    """
    op = "_npu_dropout"
    _check_p(op, p)
    keep = _gen_keep(self.numel(), p, self.device)
    return _apply_mask(self, keep, p), _pack(keep)


@impl("npu_dropout_backward")
def npu_dropout_backward(grad_output, mask, p):
    """Gradient of :func:`_npu_dropout`: ``grad_output * keep / (1 - p)`` with ``keep``
    unpacked from the bit-packed ``mask`` (zeros for ``p = 1``)."""
    op = "npu_dropout_backward"
    _check_p(op, p)
    keep = _unpack(op, mask, grad_output.numel())
    return _apply_mask(grad_output, keep, p)


@impl("npu_dropout_do_mask")
def npu_dropout_do_mask(self, mask, p):
    """Applies a bit-packed keep ``mask`` (format of :func:`_npu_dropout`):
    ``out = self * keep / (1 - p)``. Returns ``(out, mask)``."""
    op = "npu_dropout_do_mask"
    _check_p(op, p)
    keep = _unpack(op, mask, self.numel())
    return _apply_mask(self, keep, p), mask.clone()


@impl("npu_dropout_gen_mask")
def npu_dropout_gen_mask(size, p, *, dtype=None, layout=None, device=None, pin_memory=None):
    """Keep mask of a dropout over a tensor of shape ``size``, without applying it: the
    bit-packed uint8 mask of :func:`_npu_dropout` (element i kept with probability
    ``1 - p``, bit ``i % 8`` of byte ``i // 8``, ``ceil(numel / 128) * 16`` bytes).
    Draws from the generator of ``device`` (the current npu device when None), so the same
    seed gives the same mask as ``_npu_dropout`` on a tensor of that shape.
    ``dtype``/``layout``/``pin_memory`` describe the tensor the mask is for; the mask is uint8."""
    op = "npu_dropout_gen_mask"
    _check_p(op, p)
    if device is None:
        device = torch.device("npu", torch.npu.current_device())
    numel = 1
    for s in size:
        check(s >= 0, op, "size %s has a negative dim", (list(size),))
        numel *= s
    return _pack(_gen_keep(numel, p, device))


@impl("dropout_with_byte_mask")
def dropout_with_byte_mask(self, p, train):
    """Dropout (zero with probability ``p``, scale the rest by ``1 / (1 - p)``) when ``train``;
    mask drawn from the device generator (not bit-identical to hardware)."""
    check(0.0 <= p <= 1.0, "dropout_with_byte_mask", "p must be in [0, 1], got %r", (p,))
    return torch.nn.functional.dropout(self, p, train)


def _check_byte_mask_p(op, p):
    check(0.0 <= p <= 1.0, op, "dropout probability has to be between 0 and 1, but got %r", (p,))


@impl("_dropout_with_byte_mask")
def _dropout_with_byte_mask(self, p):
    """Dropout keeping each element with probability ``1 - p``: returns ``(self * mask / (1 - p),
    mask)`` with ``mask`` uint8 of ``self``'s shape (1 = kept), drawn from the device's
    generator. ``p = 1`` gives zeros."""
    op = "_dropout_with_byte_mask"
    _check_byte_mask_p(op, p)
    check(self.is_floating_point(), op, "dropout only supports floating-point dtypes")
    mask = (torch.rand(self.shape, device=self.device) >= p).to(torch.uint8)
    if p == 1.0:
        return self * 0, mask
    return self * mask.to(self.dtype) * (1.0 / (1.0 - p)), mask


@impl("_dropout_with_byte_mask_backward")
def _dropout_with_byte_mask_backward(grad_output, mask, p):
    """Gradient of :func:`_dropout_with_byte_mask`: ``grad_output * mask / (1 - p)``."""
    op = "_dropout_with_byte_mask_backward"
    _check_byte_mask_p(op, p)
    check(grad_output.is_floating_point(), op, "dropoutbackward only supports floating-point dtypes")
    check(mask.dtype == torch.uint8, op, "mask should be torch.uint8 dtype")
    if p == 1.0:
        return grad_output * 0
    return grad_output * mask.to(grad_output.dtype) * (1.0 / (1.0 - p))


@meta("_npu_dropout_gen_mask.Tensor")
def _npu_dropout_gen_mask_tensor_meta(self, size, p, seed, offset, *, parallel=True, sync=None):
    """The bit-packed keep mask of ``size`` (one bit per element, padded to 128):
    ``ceil(numel / 128) * 16`` uint8 bytes."""
    numel = 1
    for s in size:
        numel *= s
    return self.new_empty(((numel + 127) // 128 * 16,), dtype=torch.uint8)
