"""Matmul ops and the matmul backward ops.

* ``npu_linear(input, weight, bias)`` = ``input @ weight^T + bias``, with its backward
  ``npu_linear_backward``.
* ``npu_bmmV2(self, mat2, output_sizes)``: batched matmul, with ``npu_bmm_v2_mat1_backward`` /
  ``npu_bmm_v2_mat2_backward`` its gradients w.r.t. each operand.
* ``matmul_double_backward``: the gradients of ``matmul_backward(grad_out, self, other)`` =
  ``(grad_out @ other^T, self^T @ grad_out)``.
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
* ``npu_transpose_batchmatmul``: batched matmul with permuted operands and output.

``y = permute(permute(input, perm_x1) @ permute(weight, perm_x2), perm_y)``: dim 0 of each
permuted operand is the batch, the other two multiply. Documented values: ``perm_x1`` in
{[0,1,2], [1,0,2]} (input ``(B, M, K)`` or ``(M, B, K)``), ``perm_x2 = [0,1,2]`` (weight
``(B, K, N)``), ``perm_y = [1,0,2]`` (output ``(M, B, N)``). With an int64 ``scale`` of
``B * N`` values (from npu_trans_quant_param) the output is int8 of shape ``(M, 1, B * N)``:
``rint(y * scale)`` saturated. Accumulation is float32, the float output has the input dtype.

Not emulated (NotImplementedError): ``bias`` (documented as not supported yet),
``batch_split_factor > 1`` (the element order of the split output is not documented), other
permutations.

Meta-only: ``_npu_matmul_abft_verify`` (ABFT checksum verification of a matmul): FakeTensor /
torch.compile trace through it, a real call raises NotImplementedError naming the op.
"""
import torch
import torch.nn.functional as F

from torch_npu.op_plugin._common import check, new_empty, unsupported
from torch_npu.op_plugin._registry import impl, meta

__all__ = []


def _as_matrix_operands(self, other, grad_out):
    """Promote 1-D operands (and grad_out) to matrices as torch.matmul does."""
    a, b, g = self, other, grad_out
    if a.dim() == 1:
        a, g = a.unsqueeze(0), g.unsqueeze(-2)
    if b.dim() == 1:
        b, g = b.unsqueeze(-1), g.unsqueeze(-1)
    return a, b, g


@impl("matmul_double_backward")
def matmul_double_backward(grad_self, grad_other, grad_out, self, other, mask):
    """Gradients of ``matmul_backward(grad_out, self, other) = (grad_out @ other^T, self^T @ grad_out)``
    given the incoming ``grad_self`` / ``grad_other`` (either may be None = zero):
    ``(d grad_out, d self, d other) = (grad_self @ other + self @ grad_other,
    grad_out @ grad_other^T, grad_self^T @ grad_out)``, each summed over broadcast batch dims and
    returned where ``mask`` is True (None elsewhere)."""
    a, b, g = _as_matrix_operands(self, other, grad_out)
    gs = None if grad_self is None else grad_self.reshape(a.shape) if self.dim() == 1 else grad_self
    go = None if grad_other is None else grad_other.reshape(b.shape) if other.dim() == 1 else grad_other
    d_grad_out = d_self = d_other = None
    if mask[0]:
        d = torch.zeros_like(g) if gs is None and go is None else None
        if gs is not None:
            d = torch.matmul(gs, b)
        if go is not None:
            d = torch.matmul(a, go) if d is None else d + torch.matmul(a, go)
        d_grad_out = d.sum_to_size(g.shape).reshape(grad_out.shape)
    if mask[1]:
        d_self = (torch.zeros_like(self) if go is None
                  else torch.matmul(g, go.transpose(-1, -2)).sum_to_size(a.shape).reshape(self.shape))
    if mask[2]:
        d_other = (torch.zeros_like(other) if gs is None
                   else torch.matmul(gs.transpose(-1, -2), g).sum_to_size(b.shape).reshape(other.shape))
    return d_grad_out, d_self, d_other


@impl("npu_bmm_v2_mat1_backward")
def npu_bmm_v2_mat1_backward(grad, mat1, mat2, size):
    """Gradient of ``npu_bmmV2(mat1, mat2)`` w.r.t. ``mat1``: ``grad @ mat2^T`` summed to ``size``
    (mat1's shape)."""
    return torch.matmul(grad, mat2.transpose(-1, -2)).sum_to_size(list(size))


@impl("npu_bmm_v2_mat2_backward")
def npu_bmm_v2_mat2_backward(grad, mat1, mat2, size):
    """Gradient of ``npu_bmmV2(mat1, mat2)`` w.r.t. ``mat2``: ``mat1^T @ grad`` summed to ``size``
    (mat2's shape)."""
    return torch.matmul(mat1.transpose(-1, -2), grad).sum_to_size(list(size))


@impl("npu_linear")
def npu_linear(input, weight, bias=None):
    """``y = input @ weight^T + bias`` (``torch.nn.functional.linear``)."""
    return F.linear(input, weight, bias)


@impl("npu_linear_backward")
def npu_linear_backward(grad, input, weight):
    """Gradients of :func:`npu_linear` (without bias):
    ``d_input = grad @ weight``, ``d_weight = grad^T @ input`` (leading dims flattened).
    Returns ``(d_input, d_weight)``."""
    d_input = grad.matmul(weight)
    g2 = grad.reshape(-1, grad.shape[-1])
    x2 = input.reshape(-1, input.shape[-1])
    return d_input, g2.t().matmul(x2)


@impl("npu_bmmV2")
def npu_bmmV2(self, mat2, output_sizes):
    """Batched matmul ``y = self @ mat2`` (``torch.matmul`` broadcasting);
    ``output_sizes`` is a shape hint for the hardware kernel and does not change the result."""
    return torch.matmul(self, mat2)


_FUSED_MATMUL_RANKS = {"": (2, 6), "relu": (2, 6), "add": (2, 3), "mul": (2, 3), "16cast32": (2, 2),
                       "gelu_erf": (2, 2), "gelu_tanh": (2, 2)}


_MATMUL_FLOATS = (torch.float16, torch.bfloat16, torch.float32)


@impl("npu_fused_matmul")
def npu_fused_matmul(x1, x2, *, bias=None, x3=None, fused_op_type=''):
    op = "npu_fused_matmul"
    kind = fused_op_type
    check(kind in _FUSED_MATMUL_RANKS, op, "fused_op_type must be one of %s, got %r",
          (sorted(_FUSED_MATMUL_RANKS), kind))
    lo, hi = _FUSED_MATMUL_RANKS[kind]
    for name, t in (("x1", x1), ("x2", x2)):
        check(lo <= t.dim() <= hi, op, "%s must have %d to %d dims for fused_op_type %r, got %dD",
              (name, lo, hi, kind, t.dim()))
    check(x1.dtype == x2.dtype, op, "x2 dtype %s must equal x1 dtype %s", (x2.dtype, x1.dtype))
    gelu = kind in ("gelu_erf", "gelu_tanh")
    allowed = (torch.float16, torch.bfloat16) if gelu else _MATMUL_FLOATS
    check(x1.dtype in allowed, op, "x1 dtype %s is not supported for fused_op_type %r", (x1.dtype, kind))
    check(x1.shape[-1] == x2.shape[-2], op, "the k of x1 and x2 should be equal, got %d and %d",
          (x1.shape[-1], x2.shape[-2]))
    check(bias is None or kind in ("", "relu", "add", "mul"), op,
          "bias must be None for fused_op_type %r", kind)
    if kind in ("add", "mul"):
        check(x3 is not None, op, "x3 is required for fused_op_type %r", kind)
    else:
        check(x3 is None, op, "x3 must be None for fused_op_type %r", kind)
    y = torch.matmul(x1.float(), x2.float())
    if bias is not None:
        check(bias.dim() in (1, 2) and bias.shape[-1] == y.shape[-1] and bias.numel() == y.shape[-1], op,
              "bias must be (N,) or (1, N) with N = %d", y.shape[-1])
        y = y + bias.float().reshape(-1)
    if x3 is not None:
        check(x3.dtype == x1.dtype, op, "x3 dtype %s must equal x1 dtype %s", (x3.dtype, x1.dtype))
        out_mn = tuple(y.shape[-2:])
        ok = tuple(x3.shape) == tuple(y.shape) or (
            y.dim() == 3 and (tuple(x3.shape) == out_mn or tuple(x3.shape) == (1,) + out_mn))
        check(ok, op, "x3 shape %s must be the output shape %s (or broadcast along batch only)",
              (tuple(x3.shape), tuple(y.shape)))
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
        check(t.dtype == torch.float16, op, "%s must be float16, got %s", (name, t.dtype))
    check(indices.dim() == 1 and indices.shape[0] == x.shape[0], op, "indices must be 1-D with B = %d entries",
          x.shape[0])
    check(indices.dtype == torch.int32, op, "indices must be int32, got %s", indices.dtype)
    check(weight_b.dim() == 4, op, "weight_b must be 4-D (W, L, H2, R)")
    w, layers, h2 = weight_b.shape[:3]
    check(0 <= layer_idx < layers, op, "layer_idx must be in [0, %d), got %d", (layers, layer_idx))
    width = y.shape[1] if y_slice_size == -1 else y_slice_size
    if width != h2:
        unsupported(op, "y_slice_size=%d different from weight_b's H2=%d (undocumented)" % (width, h2))
    check(0 <= y_offset and y_offset + h2 <= y.shape[1], op, "y_offset + H2 (%d + %d) exceeds y's width %d",
          (y_offset, h2, y.shape[1]))
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


@impl("npu_transpose_batchmatmul")
def npu_transpose_batchmatmul(input, weight, *, bias=None, scale=None, perm_x1=None, perm_x2=None, perm_y=None,
                              batch_split_factor=1):
    """See the module doc."""
    op = "npu_transpose_batchmatmul"
    perm_x1 = [0, 1, 2] if perm_x1 is None else list(perm_x1)
    perm_x2 = [0, 1, 2] if perm_x2 is None else list(perm_x2)
    perm_y = [1, 0, 2] if perm_y is None else list(perm_y)
    if bias is not None:
        raise NotImplementedError("%s: bias is not supported (not supported by the real op either)" % op)
    if batch_split_factor not in (None, 1):
        raise NotImplementedError("%s: batch_split_factor=%r is not supported (only 1)" % (op, batch_split_factor))
    if perm_x1 not in ([0, 1, 2], [1, 0, 2]) or perm_x2 != [0, 1, 2] or perm_y != [1, 0, 2]:
        raise NotImplementedError("%s: perm_x1=%s perm_x2=%s perm_y=%s is not supported" % (op, perm_x1, perm_x2, perm_y))
    # float64 is beyond the real op; accepted so gradcheck can run at full precision
    check(input.dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64) and weight.dtype == input.dtype,
          op, "input and weight must share a float16/bfloat16/float32 dtype, got %s and %s", (input.dtype, weight.dtype))
    check(input.dim() == 3 and weight.dim() == 3, op, "input and weight must be 3-d")
    a = input.permute(perm_x1)
    b = weight.permute(perm_x2)
    check(a.shape[0] == b.shape[0], op, "batch sizes differ: %d vs %d", (a.shape[0], b.shape[0]))
    check(a.shape[2] == b.shape[1], op, "reduce dims differ: %d vs %d", (a.shape[2], b.shape[1]))
    compute = torch.float64 if input.dtype == torch.float64 else torch.float32
    y = torch.matmul(a.to(compute), b.to(compute)).permute(perm_y)          # (M, B, N)
    if scale is None:
        return y.to(input.dtype)
    from torch_npu.op_plugin.quant.trans_quant_param import decode_packed_scale, _has_values
    check(scale.dtype == torch.int64, op, "scale must be int64 (npu_trans_quant_param), got %s", scale.dtype)
    m, bsz, n = y.shape
    check(scale.numel() == bsz * n, op, "scale must have B * N = %d elements", (bsz * n))
    s, packed_offset = decode_packed_scale(scale.reshape(-1))
    if _has_values(scale) and bool((packed_offset != 0).any()):
        raise NotImplementedError("%s: an int64 scale carrying a packed offset is not supported" % op)
    q = torch.round(y.reshape(m, 1, bsz * n) * s.to(compute)).clamp(-128, 127)
    return q.to(torch.int8)


@meta("_npu_matmul_abft_verify")
def _npu_matmul_abft_verify(a, b, c, checksum_weight, *, e_max=0.001):
    op = "_npu_matmul_abft_verify"
    check(a.dim() == 2 and b.dim() == 2 and c.dim() == 2, op, "a, b and c must be 2-D")
    check(checksum_weight.dim() == 1, op, "checksum_weight must be a 1D tensor")
    check(a.shape[1] == b.shape[0], op, "the K dim of a (%d) must be equal to the K dim of b (%d)",
           (a.shape[1], b.shape[0]))
    check(tuple(c.shape) == (a.shape[0], b.shape[1]), op, "c must have shape [M, N] = [%d, %d]",
           (a.shape[0], b.shape[1]))
    check(e_max >= 0, op, "e_max must be non-negative, got %r", e_max)
    # one verdict bit per row and 256-column segment, 8 rows per byte
    row_bytes = (a.shape[0] + 7) // 8
    segments = (b.shape[1] + 255) // 256
    return new_empty((row_bytes * segments,), torch.uint8, a)
