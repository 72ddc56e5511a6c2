"""Emulated: npu_grouped_matmul_add(_), npu_fused_matmul and npu_batch_gather_matmul(_).

* ``npu_grouped_matmul_add_(self, x, weight, group_list)``: ``self[g] += x[K_g].T @ weight[K_g]``
  where ``K_g`` is group ``g``'s slice of the K axis (the doc's ``self = self + x @ weight`` with
  ``transpose_x=True`` and ``group_type=2``, split along K): ``self (g, M, N)`` float32, ``x (K, M)``
  and ``weight (K, N)`` float16/bfloat16, ``group_list (g,)`` cumulative ends (``group_list_type``
  0) or per-group sizes (1); K rows past the last group are unused. The group membership of each
  K row is built with tensor comparisons (no host read), so Meta/FakeTensor work. Products are
  accumulated in float32. ``npu_grouped_matmul_add`` is the out-of-place form (a new tensor).
  Only the documented ``transpose_x=True``, ``transpose_weight=False``, ``group_type=2`` are
  supported; others raise NotImplementedError.
* ``npu_fused_matmul``: ``y = op(x1 @ x2 + bias, x3)`` with ``fused_op_type`` ``""`` (none),
  ``"16cast32"`` (none, float32 output), ``"add"`` (``+ x3``), ``"mul"`` (``* x3``), ``"relu"``,
  ``"gelu_erf"`` / ``"gelu_tanh"`` (of ``x1 @ x2``, no bias). Computed in float32, returned in the
  dtype of ``x1`` (float32 for ``"16cast32"``). float32 inputs are exact float32 here (the NPU runs
  them as HF32). The documented rank / dtype / bias / x3 rules are validated.
* ``npu_batch_gather_matmul(y, x, weight_b, indices, weight_a)`` (AddLora / BGMV):
  ``y[i, y_offset : y_offset + H2] += scale * (x[i] @ weight_a[indices[i], layer_idx].T) @
  weight_b[indices[i], layer_idx].T`` with ``weight_a (W, L, R, H1)`` (None: the first matmul is
  skipped and ``weight_b`` is ``(W, L, H2, H1)``), ``weight_b (W, L, H2, R)``; float16 as documented,
  float32 inside, rounded once. ``y_slice_size`` (-1: y's width) must equal H2, and indices must lie
  in ``[0, W)`` (checked on real tensors, a host read): other cases are not documented and raise.
  The ``_`` form updates ``y`` in place and returns it.
"""
import torch

from torch_npu.op_plugin._common import check, unsupported
from torch_npu.op_plugin._registry import impl

__all__ = []


def _grouped_products(op, self, x, weight, group_list, transpose_x, transpose_weight, group_type, group_list_type):
    """sum over each group's K rows of x[k, :, None] * weight[k, None, :] -> (g, M, N) float32."""
    if not transpose_x:
        unsupported(op, "transpose_x=False (only True)")
    if transpose_weight:
        unsupported(op, "transpose_weight=True (only False)")
    if group_type != 2:
        unsupported(op, "group_type=%r (only 2, split along K)" % (group_type,))
    if group_list_type not in (None, 0, 1):
        unsupported(op, "group_list_type=%r (only 0 cumsum, 1 counts)" % (group_list_type,))
    check(self.dim() == 3, op, "self must be 3-D (g, M, N), got %dD" % self.dim())
    check(x.dim() == 2 and weight.dim() == 2, op, "x (K, M) and weight (K, N) must be 2-D")
    check(x.shape[0] == weight.shape[0], op, "x and weight must have the same K, got %d and %d"
          % (x.shape[0], weight.shape[0]))
    check(group_list.dim() == 1 and group_list.shape[0] == self.shape[0], op,
          "group_list must be 1-D with g = %d entries" % self.shape[0])
    check(tuple(self.shape[1:]) == (x.shape[1], weight.shape[1]), op, "self must be (g, %d, %d), got %s"
          % (x.shape[1], weight.shape[1], tuple(self.shape)))
    sizes = group_list.long()
    ends = sizes if group_list_type in (None, 0) else torch.cumsum(sizes, 0)
    starts = ends - (sizes if group_list_type == 1 else torch.diff(sizes, prepend=sizes.new_zeros(1)))
    k = torch.arange(x.shape[0], device=x.device)
    member = ((k.unsqueeze(0) >= starts.unsqueeze(1)) & (k.unsqueeze(0) < ends.unsqueeze(1))).float()  # (g, K)
    xt = x.float().t()                                                                           # (M, K)
    return torch.matmul(xt.unsqueeze(0) * member.unsqueeze(1), weight.float())                   # (g, M, N)


@impl("npu_grouped_matmul_add")
def npu_grouped_matmul_add(self, x, weight, group_list, *, transpose_x=True, transpose_weight=False, group_type=2,
                           group_list_type=0):
    products = _grouped_products("npu_grouped_matmul_add", self, x, weight, group_list, transpose_x,
                                 transpose_weight, group_type, group_list_type)
    return (self.float() + products).to(self.dtype)


@impl("npu_grouped_matmul_add_")
def npu_grouped_matmul_add_(self, x, weight, group_list, *, transpose_x=True, transpose_weight=False, group_type=2,
                            group_list_type=0):
    products = _grouped_products("npu_grouped_matmul_add_", self, x, weight, group_list, transpose_x,
                                 transpose_weight, group_type, group_list_type)
    return self.add_(products.to(self.dtype))


_FUSED_MATMUL_RANKS = {"": (2, 6), "relu": (2, 6), "add": (2, 3), "mul": (2, 3), "16cast32": (2, 2),
                       "gelu_erf": (2, 2), "gelu_tanh": (2, 2)}
_MATMUL_FLOATS = (torch.float16, torch.bfloat16, torch.float32)


@impl("npu_fused_matmul")
def npu_fused_matmul(x1, x2, *, bias=None, x3=None, fused_op_type=''):
    op = "npu_fused_matmul"
    kind = fused_op_type
    check(kind in _FUSED_MATMUL_RANKS, op, "fused_op_type must be one of %s, got %r"
          % (sorted(_FUSED_MATMUL_RANKS), kind))
    lo, hi = _FUSED_MATMUL_RANKS[kind]
    for name, t in (("x1", x1), ("x2", x2)):
        check(lo <= t.dim() <= hi, op, "%s must have %d to %d dims for fused_op_type %r, got %dD"
              % (name, lo, hi, kind, t.dim()))
    check(x1.dtype == x2.dtype, op, "x2 dtype %s must equal x1 dtype %s" % (x2.dtype, x1.dtype))
    gelu = kind in ("gelu_erf", "gelu_tanh")
    allowed = (torch.float16, torch.bfloat16) if gelu else _MATMUL_FLOATS
    check(x1.dtype in allowed, op, "x1 dtype %s is not supported for fused_op_type %r" % (x1.dtype, kind))
    check(x1.shape[-1] == x2.shape[-2], op, "the k of x1 and x2 should be equal, got %d and %d"
          % (x1.shape[-1], x2.shape[-2]))
    check(bias is None or kind in ("", "relu", "add", "mul"), op,
          "bias must be None for fused_op_type %r" % kind)
    if kind in ("add", "mul"):
        check(x3 is not None, op, "x3 is required for fused_op_type %r" % kind)
    else:
        check(x3 is None, op, "x3 must be None for fused_op_type %r" % kind)
    y = torch.matmul(x1.float(), x2.float())
    if bias is not None:
        check(bias.dim() in (1, 2) and bias.shape[-1] == y.shape[-1] and bias.numel() == y.shape[-1], op,
              "bias must be (N,) or (1, N) with N = %d" % y.shape[-1])
        y = y + bias.float().reshape(-1)
    if x3 is not None:
        check(x3.dtype == x1.dtype, op, "x3 dtype %s must equal x1 dtype %s" % (x3.dtype, x1.dtype))
        out_mn = tuple(y.shape[-2:])
        ok = tuple(x3.shape) == tuple(y.shape) or (
            y.dim() == 3 and (tuple(x3.shape) == out_mn or tuple(x3.shape) == (1,) + out_mn))
        check(ok, op, "x3 shape %s must be the output shape %s (or broadcast along batch only)"
              % (tuple(x3.shape), tuple(y.shape)))
        y = y + x3.float() if kind == "add" else y * x3.float()
    if kind == "relu":
        y = torch.relu(y)
    elif gelu:
        y = torch.nn.functional.gelu(y, approximate="tanh" if kind == "gelu_tanh" else "none")
    return y if kind == "16cast32" else y.to(x1.dtype)


def _lora_delta(op, y, x, weight_b, indices, weight_a, layer_idx, scale, y_offset, y_slice_size):
    """(B, H2) float32 update and the column offset it goes to."""
    check(y.dim() == 2 and x.dim() == 2 and y.shape[0] == x.shape[0], op, "y (B, H3) and x (B, H1) must be 2-D "
          "with the same B")
    for name, t in (("y", y), ("x", x), ("weight_b", weight_b)) + ((("weight_a", weight_a),) if weight_a is not None
                                                                   else ()):
        check(t.dtype == torch.float16, op, "%s must be float16, got %s" % (name, t.dtype))
    check(indices.dim() == 1 and indices.shape[0] == x.shape[0], op, "indices must be 1-D with B = %d entries"
          % x.shape[0])
    check(indices.dtype == torch.int32, op, "indices must be int32, got %s" % indices.dtype)
    check(weight_b.dim() == 4, op, "weight_b must be 4-D (W, L, H2, R)")
    w, layers, h2 = weight_b.shape[:3]
    check(0 <= layer_idx < layers, op, "layer_idx must be in [0, %d), got %d" % (layers, layer_idx))
    width = y.shape[1] if y_slice_size == -1 else y_slice_size
    if width != h2:
        unsupported(op, "y_slice_size=%d different from weight_b's H2=%d (undocumented)" % (width, h2))
    check(0 <= y_offset and y_offset + h2 <= y.shape[1], op, "y_offset + H2 (%d + %d) exceeds y's width %d"
          % (y_offset, h2, y.shape[1]))
    from torch_npu.op_plugin._common import symbolic
    if not symbolic(indices) and bool(((indices < 0) | (indices >= w)).any()):
        unsupported(op, "indices outside [0, %d) (rows without an adapter are not documented)" % w)
    idx = indices.long()
    rows = x.float()
    if weight_a is not None:
        check(weight_a.dim() == 4 and tuple(weight_a.shape[:2]) == (w, layers), op,
              "weight_a must be (W, L, R, H1) with W, L of weight_b")
        check(weight_a.shape[2] == weight_b.shape[3] and weight_a.shape[3] == x.shape[1], op,
              "weight_a (W, L, R, H1) must match weight_b's R and x's H1")
        a = weight_a[:, layer_idx].float().index_select(0, idx)                # (B, R, H1)
        rows = torch.matmul(a, rows.unsqueeze(-1)).squeeze(-1)                  # (B, R)
    else:
        check(weight_b.shape[3] == x.shape[1], op, "without weight_a, weight_b must be (W, L, H2, H1)")
    b = weight_b[:, layer_idx].float().index_select(0, idx)                    # (B, H2, R)
    return torch.matmul(b, rows.unsqueeze(-1)).squeeze(-1) * scale, y_offset, h2


def _lora_apply(y, delta, offset, width):
    out = y.float()
    left, mid, right = out[:, :offset], out[:, offset:offset + width] + delta, out[:, offset + width:]
    return torch.cat([left, mid, right], dim=1).to(y.dtype)


@impl("npu_batch_gather_matmul")
def npu_batch_gather_matmul(self, x, weight_b, indices, weight_a=None, layer_idx=0, scale=1e-3, y_offset=0,
                            y_slice_size=-1):
    delta, offset, width = _lora_delta("npu_batch_gather_matmul", self, x, weight_b, indices, weight_a, layer_idx,
                                       scale, y_offset, y_slice_size)
    return _lora_apply(self, delta, offset, width)


@impl("npu_batch_gather_matmul_")
def npu_batch_gather_matmul_(self, x, weight_b, indices, weight_a=None, layer_idx=0, scale=1e-3, y_offset=0,
                             y_slice_size=-1):
    delta, offset, width = _lora_delta("npu_batch_gather_matmul_", self, x, weight_b, indices, weight_a, layer_idx,
                                       scale, y_offset, y_slice_size)
    return self.copy_(_lora_apply(self, delta, offset, width))
