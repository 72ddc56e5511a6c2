"""npu_quant_scatter / npu_quant_scatter_: quantise ``updates`` to int8, then write them into
``self`` along ``axis`` at the positions given by ``indices`` (CANN QuantUpdateScatter).

Semantics from the op documentation and the CANN golden model:

* ``q = clamp(rint(updates / quant_scales + quant_zero_points), -128, 127)`` in float32,
  ``quant_scales``/``quant_zero_points`` holding one value per element of the last dim
  (``quant_axis`` must be the last dim);
* ``self`` is viewed as ``(d0, prod(d1 .. axis-1), d_axis, prod(axis+1 ..))`` (``axis`` is
  neither the first nor the last dim) and ``updates`` likewise; for each ``i`` of
  ``updates.shape[0]`` the block ``updates[i]`` is written at
  ``self[i, :, idx : idx + updates.shape[axis], :]`` with ``idx = indices[i]`` (1-d
  indices), or at ``self[indices[i, 0], :, indices[i, 1] : ..., :]`` (2-d ``(n, 2)``).

Only ``reduce='update'``, ``round_mode='rint'``, ``dst_type`` None/int8 are documented for
an int8 ``self``; other values raise NotImplementedError. Overlapping target blocks are
non-deterministic on hardware; here the last write wins.
"""
import torch

from torch_npu.op_plugin._common import check
from torch_npu.op_plugin._registry import impl

__all__ = []


def _quantised_blocks(op, self, indices, updates, quant_scales, quant_zero_points, axis, quant_axis,
                      reduce, dst_type, round_mode):
    if reduce != "update":
        raise NotImplementedError("%s: reduce=%r is not supported (only 'update')" % (op, reduce))
    if round_mode not in (None, "rint"):
        raise NotImplementedError("%s: round_mode=%r is not supported (only 'rint')" % (op, round_mode))
    if dst_type is not None and dst_type not in (torch.int8, 1):
        raise NotImplementedError("%s: dst_type=%r is not supported (only int8)" % (op, dst_type))
    if self.dtype != torch.int8:
        raise NotImplementedError("%s: self dtype %s is not supported (only int8)" % (op, self.dtype))
    check(updates.dtype in (torch.float16, torch.bfloat16), op,
          "updates must be float16 or bfloat16, got %s", updates.dtype)
    nd = self.dim()
    check(3 <= nd <= 8, op, "self must have 3 to 8 dims, got %d", nd)
    check(updates.dim() == nd, op, "updates must have as many dims as self (%d)", nd)
    check(-nd <= axis < nd and -nd <= quant_axis < nd, op, "axis/quant_axis out of range")
    ax = axis % nd
    check(0 < ax < nd - 1, op, "axis must be neither the first nor the last dim, got %d", axis)
    check(quant_axis % nd == nd - 1, op, "quant_axis must be the last dim, got %d", quant_axis)
    check(indices.dtype in (torch.int32, torch.int64), op, "indices must be int32 or int64")
    check(indices.dim() == 1 or (indices.dim() == 2 and indices.shape[1] == 2), op,
          "indices must be 1-d or (n, 2), got shape %s", (tuple(indices.shape),))
    n = updates.shape[0]
    check(indices.shape[0] == n and n <= self.shape[0], op,
          "updates.shape[0] (%d) must equal indices.shape[0] (%d) and not exceed self.shape[0] (%d)",
          (n, indices.shape[0], self.shape[0]))
    check(updates.shape[ax] <= self.shape[ax], op, "updates.shape[axis] exceeds self.shape[axis]")
    for d in range(1, nd):
        if d != ax:
            check(updates.shape[d] == self.shape[d], op,
                  "updates dim %d (%d) must equal self dim %d (%d)", (d, updates.shape[d], d, self.shape[d]))
    h = updates.shape[-1]
    check(quant_scales.numel() == h, op, "quant_scales must have %d (updates.shape[-1]) elements", h)
    v = updates.float() / quant_scales.float().reshape(-1)
    if quant_zero_points is not None:
        check(quant_zero_points.numel() == h, op, "quant_zero_points must have %d elements", h)
        v = v + quant_zero_points.float().reshape(-1)
    q = torch.round(v).clamp(-128, 127).to(torch.int8)

    def merged(t):
        mid = 1
        for d in range(1, ax):
            mid *= t.shape[d]
        tail = 1
        for d in range(ax + 1, nd):
            tail *= t.shape[d]
        return t.reshape(t.shape[0], mid, t.shape[ax], tail)

    q4 = merged(q)
    span = torch.arange(q4.shape[2], device=indices.device, dtype=torch.int64)
    idx = indices.to(torch.int64)
    if indices.dim() == 1:
        rows = torch.arange(n, device=indices.device, dtype=torch.int64)
        starts = idx
    else:
        rows, starts = idx[:, 0], idx[:, 1]
    positions = starts[:, None] + span[None, :]               # (n, U)
    # advanced indices split by a slice: the indexed dims come first -> (n, U, mid, tail)
    values = q4.permute(0, 2, 1, 3)
    return merged, rows[:, None].to(self.device), positions.to(self.device), values


@impl("npu_quant_scatter")
def npu_quant_scatter(self, indices, updates, quant_scales, quant_zero_points=None, axis=-2, quant_axis=-1,
                      reduce="update", dst_type=None, round_mode="rint"):
    """Out-of-place quantised scatter: returns a copy of ``self`` with the quantised
    ``updates`` written in (see the module doc for the exact rule)."""
    merged, rows, positions, values = _quantised_blocks(
        "npu_quant_scatter", self, indices, updates, quant_scales, quant_zero_points, axis, quant_axis,
        reduce, dst_type, round_mode)
    out = self.clone(memory_format=torch.contiguous_format)
    merged(out)[rows, :, positions] = values
    return out


@impl("npu_quant_scatter_")
def npu_quant_scatter_(self, indices, updates, quant_scales, quant_zero_points=None, axis=-2, quant_axis=-1,
                       reduce="update", dst_type=None, round_mode="rint"):
    """In-place form of npu_quant_scatter: writes into ``self`` and returns it."""
    merged, rows, positions, values = _quantised_blocks(
        "npu_quant_scatter_", self, indices, updates, quant_scales, quant_zero_points, axis, quant_axis,
        reduce, dst_type, round_mode)
    if self.is_contiguous():
        merged(self)[rows, :, positions] = values
    else:
        # reshape of a non-contiguous tensor may copy: scatter into a copy and write it back
        tmp = self.contiguous()
        merged(tmp)[rows, :, positions] = values
        self.copy_(tmp)
    return self
