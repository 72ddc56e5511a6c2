"""Shape and encoding ops: npu_transpose(.out), npu_confusion_transpose (+ backward), npu_slice(.out),
npu_broadcast(.out) and npu_one_hot.
"""
import torch

from torch_npu.op_plugin._common import check, fresh, write_out
from torch_npu.op_plugin._registry import impl

__all__ = []


def _check_perm(op, perm, ndim):
    check(sorted(int(p) % ndim if ndim else int(p) for p in perm) == list(range(ndim)) and len(perm) == ndim, op,
          "perm %s is not a permutation of %d dims", (list(perm), ndim))


def _inverse(perm):
    inv = [0] * len(perm)
    for i, p in enumerate(perm):
        inv[p % len(perm)] = i
    return inv


# ----------------------------------------------------------------- transpose


@impl("npu_transpose")
def npu_transpose(self, perm, require_contiguous=True):
    """``y = x.permute(perm)``, materialised as a new contiguous tensor
    (``require_contiguous`` only selects the kernel on hardware; the values are the same)."""
    _check_perm("npu_transpose", perm, self.dim())
    return self.permute(list(perm)).clone(memory_format=torch.contiguous_format)


@impl("npu_transpose.out")
def npu_transpose_out(self, perm, require_contiguous=True, *, out):
    """``out = x.permute(perm)`` (resized if needed)."""
    _check_perm("npu_transpose", perm, self.dim())
    return write_out(out, self.permute(list(perm)))


@impl("npu_confusion_transpose")
def npu_confusion_transpose(self, perm, shape, transpose_first):
    """Fused reshape + permute.
    ``transpose_first=True``: ``y = x.permute(perm).reshape(shape)``;
    ``transpose_first=False``: ``y = x.reshape(shape).permute(perm)``. A new contiguous tensor."""
    op = "npu_confusion_transpose"
    if transpose_first:
        _check_perm(op, perm, self.dim())
        y = self.permute(list(perm)).reshape(list(shape))
    else:
        _check_perm(op, perm, len(shape))
        y = self.reshape(list(shape)).permute(list(perm))
    return fresh(y.contiguous())


@impl("npu_confusion_transpose_backward")
def npu_confusion_transpose_backward(grad, perm, shape, transpose_first):
    """Gradient of :func:`npu_confusion_transpose`; ``shape`` is the forward **input's** shape.
    ``transpose_first=True``: ``dx = grad.reshape([shape[p] for p in perm]).permute(inverse(perm))``;
    ``transpose_first=False``: ``dx = grad.permute(inverse(perm)).reshape(shape)``."""
    op = "npu_confusion_transpose_backward"
    shape = list(shape)
    if transpose_first:
        _check_perm(op, perm, len(shape))
        dx = grad.reshape([shape[p] for p in perm]).permute(_inverse(list(perm)))
    else:
        _check_perm(op, perm, grad.dim())
        dx = grad.permute(_inverse(list(perm))).reshape(shape)
    return fresh(dx.contiguous())


# ------------------------------------------------------------ slice, broadcast


def _slice(op, x, offsets, size):
    check(len(offsets) == x.dim() and len(size) == x.dim(), op,
          "offsets and size need one entry per dim (%d), got %d and %d", (x.dim(), len(offsets), len(size)))
    y = x
    for d, (o, s) in enumerate(zip(offsets, size)):
        n = x.shape[d]
        s = n - o if s == -1 else s
        check(0 <= o and 0 <= s and o + s <= n, op,
              "dim %d: offset %s + size %s out of range for size %s", (d, o, s, n))
        y = y.narrow(d, o, s)
    return y


@impl("npu_slice")
def npu_slice(self, offsets, size):
    """``y = x[o0:o0+s0, o1:o1+s1, ...]`` as a new tensor (``size[d] = -1`` takes the rest of dim d)."""
    return _slice("npu_slice", self, offsets, size).clone(memory_format=torch.contiguous_format)


@impl("npu_slice.out")
def npu_slice_out(self, offsets, size, *, out):
    """``out = x[o0:o0+s0, ...]`` (resized if needed)."""
    return write_out(out, _slice("npu_slice", self, offsets, size))


@impl("npu_broadcast")
def npu_broadcast(self, size):
    """``y = x.expand(size)`` materialised (broadcasting rules of ``expand``, -1 keeps a dim)."""
    return self.expand(list(size)).clone(memory_format=torch.contiguous_format)


@impl("npu_broadcast.out")
def npu_broadcast_out(self, size, *, out):
    """``out = x.expand(size)`` (resized if needed)."""
    return write_out(out, self.expand(list(size)))


# ----------------------------------------------------------------- matmuls


# ----------------------------------------------------------------- one_hot


@impl("npu_one_hot")
def npu_one_hot(self, num_classes=-1, depth=1, on_value=1, off_value=0):
    """One-hot encoding with ``depth`` classes inserted as a new axis at position
    ``num_classes`` (the axis; -1 = last): ``y[..., i, ...] = on_value if self[...] == i
    else off_value`` for ``0 <= i < depth``. Indices outside ``[0, depth)`` give an all
    ``off_value`` row. The output is float32 with ``self.dim() + 1`` dims."""
    op = "npu_one_hot"
    check(depth >= 1, op, "depth must be >= 1, got %d", depth)
    ndim = self.dim() + 1
    axis = num_classes
    check(-ndim <= axis < ndim, op, "axis (num_classes) %d out of range for %d output dims", (axis, ndim))
    classes = torch.arange(depth, device=self.device)
    hit = self.unsqueeze(-1) == classes
    y = torch.where(hit, float(on_value), float(off_value)).to(torch.float32)
    axis = axis % ndim
    return y if axis == ndim - 1 else fresh(y.movedim(-1, axis).contiguous())
