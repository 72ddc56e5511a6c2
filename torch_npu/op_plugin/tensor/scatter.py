"""Scatter and index-update ops.

* ``npu_scatter`` (the ArgMaxGrad kernel: scatter along ``dim`` with one index per position of
  the other dims) and ``npu_masked_fill_range`` (semantics from the op-plugin test goldens);
* ``npu_scatter_nd_update(_)`` (TensorFlow ``ScatterNdUpdate``: ``self[indices[i]] = updates[i]``)
  and ``scatter_update(_)`` (per-batch slab update, KV-cache style: for each ``b`` the slab of
  ``updates[b]`` is written along ``axis`` from ``indices[b]``).

Meta-only (the computation is not documented precisely enough to emulate): ``_npu_index_add(_)``.
"""
import torch

from torch_npu.op_plugin._common import check, unsupported
from torch_npu.op_plugin._registry import impl, meta

__all__ = []


@impl("npu_scatter")
def npu_scatter(self, indices, updates, dim):
    """``self`` with one element per position of the other dims replaced along ``dim``:
    ``out[..., indices[p], ...] = updates[p]`` where ``p`` runs over ``self``'s shape without
    ``dim`` (the hardware ArgMaxGrad kernel; the documented example has ``self`` [2, 2],
    ``dim`` 0, ``indices`` [0, 1] and replaces ``out[0, 0]`` and ``out[1, 1]``)."""
    op = "npu_scatter"
    d = dim % self.dim()
    expected = list(self.shape[:d]) + list(self.shape[d + 1:])
    check(list(indices.shape) == expected, op,
          "indices shape %s must be self's shape without dim %d, %s", (list(indices.shape), dim, expected))
    check(list(updates.shape) == expected, op,
          "updates shape %s must be self's shape without dim %d, %s", (list(updates.shape), dim, expected))
    return self.scatter(d, indices.long().unsqueeze(d), updates.to(self.dtype).unsqueeze(d))


@impl("npu_masked_fill_range")
def npu_masked_fill_range(self, start, end, value, axis=-1):
    """Fills index ranges along ``axis`` with ``value[i]``, as the op-plugin golden defines it:
    for each ``i < num`` and ``j < N`` every ``k`` in ``[start[i, j], end[i, j])`` is filled -
    at ``out[j, k]`` (2-D, axis 1) or ``out[j, :, k]`` (3-D, axis 2), i.e. row ``j`` when
    ``axis`` is the last dim of a 2-D/3-D ``self``, and across the whole slice ``k`` of
    ``axis`` otherwise (1-D ``self``, or a leading axis). Later ``i`` overwrite earlier ones.
    ``start``/``end`` int32 ``[num, N]``, ``value`` ``[num]``."""
    op = "npu_masked_fill_range"
    nd = self.dim()
    check(1 <= nd <= 3, op, "self must be 1-D, 2-D or 3-D, got %d-D", nd)
    ax = axis % nd
    check(start.dim() == 2 and tuple(start.shape) == tuple(end.shape), op,
          "start and end must be 2-D [num, N] of the same shape, got %s and %s",
          (tuple(start.shape), tuple(end.shape)))
    num, n = start.shape
    check(value.numel() == num, op, "value must have num=%d elements, got %d", (num, value.numel()))
    per_row = nd >= 2 and ax == nd - 1
    if per_row:
        check(n <= self.shape[0], op, "N=%d must not exceed self.shape[0]=%d", (n, self.shape[0]))
    positions = torch.arange(self.shape[ax], device=self.device)
    out = self
    values = value.reshape(-1).to(self.dtype)
    for i in range(num):
        inside = (positions >= start[i].unsqueeze(-1)) & (positions < end[i].unsqueeze(-1))  # [N, D_axis]
        if per_row:
            mask = torch.zeros((self.shape[0], self.shape[ax]), dtype=torch.bool, device=self.device)
            mask[:n] = inside
            mask = mask.reshape([self.shape[0]] + [1] * (nd - 2) + [self.shape[ax]])
        else:
            shape = [1] * nd
            shape[ax] = self.shape[ax]
            mask = inside.any(0).reshape(shape)
        out = torch.where(mask, values[i], out)
    return out


@meta("_npu_index_add")
def _npu_index_add_meta(self, index, source, *, alpha=1):
    return torch.empty_like(self)


@meta("_npu_index_add_")
def _npu_index_add__meta(self, index, source, *, alpha=1):
    return self


def _nd_index(op, self, indices, updates):
    check(not indices.is_floating_point() and not indices.is_complex(), op, "indices must be an integer tensor")
    check(indices.dim() >= 1, op, "indices must have at least 1 dim")
    k = indices.size(-1)
    check(1 <= k <= self.dim(), op, "indices.size(-1)=%d must be in [1, %d]", (k, self.dim()))
    want = tuple(indices.shape[:-1]) + tuple(self.shape[k:])
    check(tuple(updates.shape) == want, op, "updates must have shape %s, got %s", (want, tuple(updates.shape)))
    return tuple(indices.long().unbind(-1))


@impl("npu_scatter_nd_update")
def npu_scatter_nd_update(self, indices, updates):
    """TensorFlow ScatterNdUpdate on a copy: ``indices`` is (..., K); each index row
    selects the slice ``self[i0, ..., iK-1]`` which is replaced by the matching slice of
    ``updates`` (shape ``indices.shape[:-1] + self.shape[K:]``)."""
    idx = _nd_index("npu_scatter_nd_update", self, indices, updates)
    return self.index_put(idx, updates.to(self.dtype))


@impl("npu_scatter_nd_update_")
def npu_scatter_nd_update_(self, indices, updates):
    """In-place :func:`npu_scatter_nd_update`; returns ``self``."""
    idx = _nd_index("npu_scatter_nd_update_", self, indices, updates)
    return self.index_put_(idx, updates.to(self.dtype))


def _scatter_update_index(op, self, indices, updates, axis):
    check(self.dim() >= 2, op, "self must have at least 2 dims")
    ax = axis + self.dim() if axis < 0 else axis
    check(0 <= ax < self.dim(), op, "axis %d out of range", axis)
    if ax == 0:
        unsupported(op, "axis=0 (indices select along axis per batch row of dim 0)")
    if indices.dim() != 1:
        unsupported(op, "indices of shape %s (only 1-D (batch,) start offsets)" % (tuple(indices.shape),))
    check(not indices.is_floating_point(), op, "indices must be an integer tensor")
    check(indices.size(0) == self.size(0), op, "indices must have self.size(0)=%d entries", self.size(0))
    check(updates.dim() == self.dim(), op, "updates must have self's rank")
    for d in range(self.dim()):
        if d != ax:
            check(updates.size(d) == self.size(d), op, "updates.size(%d) must equal self.size(%d)", (d, d))
    u = updates.size(ax)
    check(u <= self.size(ax), op, "updates.size(axis) must not exceed self.size(axis)")
    # positions along ax: indices[b] + j, j < u (shape broadcast over dims 0 and ax)
    shape = [1] * self.dim()
    shape[0] = self.size(0)
    shape[ax] = u
    pos = (indices.long().view([-1] + [1] * (self.dim() - 1))
           + torch.arange(u, device=indices.device).view([u if d == ax else 1 for d in range(self.dim())]))
    return ax, pos.expand(updates.shape)


@impl("scatter_update")
def scatter_update(self, indices, updates, axis):
    """Per-batch slab update (KV-cache style): for each ``b``,
    ``self[b, ..., indices[b] : indices[b] + updates.size(axis), ...] = updates[b]`` along
    ``axis``, on a copy. ``indices`` is 1-D of length ``self.size(0)``; other dims of
    ``updates`` equal ``self``'s. 2-D indices and ``axis=0`` raise NotImplementedError."""
    ax, pos = _scatter_update_index("scatter_update", self, indices, updates, axis)
    return self.scatter(ax, pos, updates.to(self.dtype))


@impl("scatter_update_")
def scatter_update_(self, indices, updates, axis):
    """In-place :func:`scatter_update`; returns ``self``."""
    ax, pos = _scatter_update_index("scatter_update_", self, indices, updates, axis)
    return self.scatter_(ax, pos, updates.to(self.dtype))
