"""Tensor-level ops: npu_pad, npu_indexing (strided slice), npu_sim_exponential_,
npu_prefetch, empty_with_swapped_memory.
"""
import torch
import torch.nn.functional as F

from torch_npu.op_plugin._common import check, write_out
from torch_npu.op_plugin._registry import impl

__all__ = []


# ----------------------------------------------------------------- pad


@impl("npu_pad")
def npu_pad(input, paddings):
    """Zero padding with ``paddings = [before_0, after_0, before_1, after_1, ...]`` in dim order
    (first dim first, the Pad kernel's (ndim, 2) layout): dim d grows by
    ``before_d + after_d``. Fewer pairs than dims pad the leading dims only."""
    op = "npu_pad"
    paddings = list(paddings)
    check(len(paddings) % 2 == 0 and len(paddings) // 2 <= input.dim(), op,
          "paddings needs one (before, after) pair per dim (at most %d pairs), got %s", (input.dim(), paddings))
    check(all(p >= 0 for p in paddings), op, "paddings must be >= 0, got %s", paddings)
    pairs = [paddings[i:i + 2] for i in range(0, len(paddings), 2)]
    pairs += [[0, 0]] * (input.dim() - len(pairs))
    torch_order = [p for pair in reversed(pairs) for p in pair]  # F.pad wants the last dim first
    return F.pad(input, torch_order)


# ----------------------------------------------------------------- strided slice


def _bit(mask, i):
    return (mask >> i) & 1


def _strided_slice(op, x, begin, end, strides, begin_mask, end_mask, ellipsis_mask, new_axis_mask,
                   shrink_axis_mask):
    """TensorFlow StridedSlice semantics (the kernel behind npu_indexing)."""
    n = len(begin)
    check(len(end) == n and len(strides) == n, op, "begin, end and strides must have the same length")
    check(all(s != 0 for s in strides), op, "strides must be non-zero, got %s", list(strides))
    check(bin(ellipsis_mask).count("1") <= 1, op, "at most one ellipsis is allowed")
    consumed = sum(1 for i in range(n) if not _bit(ellipsis_mask, i) and not _bit(new_axis_mask, i))
    dim = 0
    out = x
    out_dim = 0  # position in ``out`` of the dim being processed
    for i in range(n):
        if _bit(ellipsis_mask, i):
            span = x.dim() - consumed
            check(span >= 0, op, "slice spec covers %d dims of a %d-D tensor", (consumed, x.dim()))
            dim += span
            out_dim += span
            continue
        if _bit(new_axis_mask, i):
            out = out.unsqueeze(out_dim)
            out_dim += 1
            continue
        check(dim < x.dim(), op, "slice spec covers more dims than the %d of the input", x.dim())
        size = x.shape[dim]
        if _bit(shrink_axis_mask, i):
            idx = begin[i] + size if begin[i] < 0 else begin[i]
            check(0 <= idx < size, op, "index %d out of range for dim %d of size %d", (begin[i], dim, size))
            out = out.select(out_dim, idx)
        else:
            b = None if _bit(begin_mask, i) else begin[i]
            e = None if _bit(end_mask, i) else end[i]
            start, stop, step = slice(b, e, strides[i]).indices(size)
            out = out.index_select(out_dim, torch.arange(start, stop, step, device=x.device))
            out_dim += 1
        dim += 1
    return out


@impl("npu_indexing")
def npu_indexing(self, begin, end, strides, begin_mask=0, end_mask=0, ellipsis_mask=0, new_axis_mask=0,
                 shrink_axis_mask=0):
    """Strided slice (TensorFlow StridedSlice): entry i of ``begin/end/strides`` slices
    ``begin[i]:end[i]:strides[i]`` of the next input dim (negative indices count from the end,
    bounds clamped as Python slices, negative strides walk backwards). Bit i of ``begin_mask``
    / ``end_mask`` ignores ``begin[i]`` / ``end[i]`` (full range); of ``ellipsis_mask`` makes
    entry i an ellipsis over the unspecified dims; of ``new_axis_mask`` inserts a size-1 dim;
    of ``shrink_axis_mask`` takes index ``begin[i]`` and drops the dim. Dims after the spec are
    kept whole. Returns a new tensor."""
    y = _strided_slice("npu_indexing", self, list(begin), list(end), list(strides), begin_mask, end_mask,
                       ellipsis_mask, new_axis_mask, shrink_axis_mask)
    return y.clone(memory_format=torch.contiguous_format)


@impl("npu_indexing.out")
def npu_indexing_out(self, begin, end, strides, begin_mask=0, end_mask=0, ellipsis_mask=0, new_axis_mask=0,
                     shrink_axis_mask=0, *, out):
    """:func:`npu_indexing` written into ``out`` (resized if needed)."""
    y = _strided_slice("npu_indexing", self, list(begin), list(end), list(strides), begin_mask, end_mask,
                       ellipsis_mask, new_axis_mask, shrink_axis_mask)
    return write_out(out, y)


# ----------------------------------------------------------------- conv3d


# ----------------------------------------------------------------- random, memory


@impl("npu_sim_exponential_")
def npu_sim_exponential_(self, lambd=1, *, generator=None):
    """Fills ``self`` in place with exponential samples of rate ``lambd``,
    ``x = -ln(1 - u) / lambd`` with ``u`` uniform, drawn from ``generator`` (the device's
    default generator when None). Returns ``self``."""
    op = "npu_sim_exponential_"
    check(self.is_floating_point(), op, "self must be a floating tensor, got %s", self.dtype)
    check(lambd > 0, op, "lambd must be > 0, got %s", lambd)
    return self.exponential_(lambd, generator=generator)


@impl("npu_prefetch")
def npu_prefetch(self, dependency, max_size, offset=0):
    """Hint to prefetch up to ``max_size`` bytes of ``self`` from ``offset`` into the L2 cache
    once ``dependency`` is computed. It changes no value; the emulated device has no L2 cache,
    so only the arguments are checked."""
    op = "npu_prefetch"
    check(max_size > 0, op, "max_size must be > 0, got %d", max_size)
    check(0 <= offset < max(1, self.numel() * self.element_size()), op,
          "offset %d must be inside self (%d bytes)", (offset, self.numel() * self.element_size()))


@impl("empty_with_swapped_memory")
def empty_with_swapped_memory(size, *, dtype=None, device=None):
    """Uninitialised npu tensor whose memory is host memory mapped for the device. On the
    emulated NPU all device memory is host memory, so this is an ordinary npu tensor of
    ``size``/``dtype`` on ``device`` (the current npu device when None)."""
    op = "empty_with_swapped_memory"
    if device is None:
        device = torch.device("npu", torch.npu.current_device())
    device = torch.device(device)
    check(device.type == "npu", op, "device must be an npu device, got %s", device)
    return torch.empty(list(size), dtype=dtype, device=device)


# ----------------------------------------------------------------- sparse row gather
