"""Stand-alone int8 quantisers: npu_group_quant and npu_gelu_quant.

* npu_group_quant (torch_npu doc): ``y = round(x * scale[g] + offset)`` where row ``r`` of the
  2-D ``x`` belongs to group ``g`` with ``group_index[g-1] <= r < group_index[g]``
  (``group_index`` is the non-decreasing cumulative row count, its last value = rows; the
  documented example maps rows this way). ``offset`` is a single number (shape (1,)).
* npu_gelu_quant (CANN GeluQuant doc): ``g = gelu(x)`` (``approximate`` 'none' = erf form,
  'tanh'); static mode ``y = round(g * input_scale + input_offset)``; dynamic mode
  ``g' = g * input_scale`` (when given), per row ``scale = max|g'| / 127``,
  ``y = round(g' / scale)``. The static mode has no scale output (None).

``round`` is round-half-to-even with saturation to int8; arithmetic in float32. Only int8
results are emulated (quint4x2 / float8 / hifloat8 destinations and other round modes raise
NotImplementedError naming the argument). An all-zero row in the dynamic mode gets scale 0
and zeros.
"""
import torch
import torch.nn.functional as F

from torch_npu.op_plugin._common import check, unsupported
from torch_npu.op_plugin._registry import impl

__all__ = []

_FLOATS = (torch.float16, torch.bfloat16, torch.float32)


def _to_int8(v):
    return torch.round(v).clamp(-128, 127).to(torch.int8)


@impl("npu_group_quant")
def npu_group_quant(x, scale, group_index, *, offset=None, dst_dtype=None):
    """int8 ``round(x * scale[group of the row] + offset)``, x's shape. See the module doc."""
    op = "npu_group_quant"
    if dst_dtype not in (None, torch.int8, torch.qint8):
        unsupported(op, "dst_dtype=%s (only int8)" % dst_dtype)
    check(x.dim() == 2, op, "x must be 2-D, got %d-D", x.dim())
    check(x.dtype in _FLOATS, op, "x must be float32, float16 or bfloat16, got %s", x.dtype)
    check(scale.dim() == 2 and scale.shape[0] > 0 and scale.shape[1] == x.shape[1], op,
          "scale must be 2-D [G, %d], got %s", (x.shape[1], tuple(scale.shape)))
    check(group_index.dim() == 1 and group_index.shape[0] == scale.shape[0], op,
          "group_index must be 1-D of length %d, got %s", (scale.shape[0], tuple(group_index.shape)))
    check(group_index.dtype in (torch.int32, torch.int64), op,
          "group_index must be int32 or int64, got %s", group_index.dtype)
    if offset is not None:
        check(offset.numel() == 1, op, "offset must be a single number, got shape %s", (tuple(offset.shape),))
    rows = torch.arange(x.shape[0], device=x.device, dtype=group_index.dtype)
    # group of row r: how many cumulative ends are <= r (clamped so a short group_index stays in range)
    gid = torch.searchsorted(group_index.contiguous(), rows, right=True).clamp(max=scale.shape[0] - 1)
    v = x.float() * scale.float().index_select(0, gid)
    if offset is not None:
        v = v + offset.float().reshape(())
    return _to_int8(v)


@impl("npu_gelu_quant")
def npu_gelu_quant(self, *, input_scale=None, input_offset=None, approximate='none', quant_mode='dynamic',
                   dst_type=None, round_mode='rint'):
    """``(y int8, scale)`` of GELU followed by static or per-row dynamic quantisation."""
    op = "npu_gelu_quant"
    check(quant_mode in ("dynamic", "static"), op,
          "Parameter quant_mode must be 'dynamic' or 'static', got: %s", quant_mode)
    check(approximate in ("none", "tanh"), op, "approximate must be 'none' or 'tanh', got %r", (approximate,))
    if dst_type not in (None, 1, torch.int8):
        unsupported(op, "dst_type=%r (only int8)" % (dst_type,))
    if round_mode != "rint":
        unsupported(op, "round_mode=%r (only 'rint' for int8)" % (round_mode,))
    check(self.dtype in _FLOATS, op, "self must be float32, float16 or bfloat16, got %s", self.dtype)
    g = F.gelu(self.float(), approximate=approximate)
    if quant_mode == "static":
        check(input_scale is not None, op, "input_scale is required when quant_mode is 'static'")
        v = g * input_scale.float()
        if input_offset is not None:
            v = v + input_offset.float()
        return _to_int8(v), None
    if input_scale is not None:
        g = g * input_scale.float()
    scale = g.abs().amax(-1) / 127.0
    safe = torch.where(scale == 0, torch.ones_like(scale), scale)
    return _to_int8(g / safe.unsqueeze(-1)), scale
