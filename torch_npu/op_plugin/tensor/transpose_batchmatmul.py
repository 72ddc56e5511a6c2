"""npu_transpose_batchmatmul: batched matmul with permuted operands and output.

``y = permute(permute(input, perm_x1) @ permute(weight, perm_x2), perm_y)``: dim 0 of each
permuted operand is the batch, the other two multiply. Documented values: ``perm_x1`` in
{[0,1,2], [1,0,2]} (input ``(B, M, K)`` or ``(M, B, K)``), ``perm_x2 = [0,1,2]`` (weight
``(B, K, N)``), ``perm_y = [1,0,2]`` (output ``(M, B, N)``). With an int64 ``scale`` of
``B * N`` values (from npu_trans_quant_param) the output is int8 of shape ``(M, 1, B * N)``:
``rint(y * scale)`` saturated. Accumulation is float32, the float output has the input dtype.

Not emulated (NotImplementedError): ``bias`` (documented as not supported yet),
``batch_split_factor > 1`` (the element order of the split output is not documented), other
permutations.
"""
import torch

from torch_npu.op_plugin._common import check
from torch_npu.op_plugin._registry import impl

__all__ = []


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
          op, "input and weight must share a float16/bfloat16/float32 dtype, got %s and %s" % (input.dtype, weight.dtype))
    check(input.dim() == 3 and weight.dim() == 3, op, "input and weight must be 3-d")
    a = input.permute(perm_x1)
    b = weight.permute(perm_x2)
    check(a.shape[0] == b.shape[0], op, "batch sizes differ: %d vs %d" % (a.shape[0], b.shape[0]))
    check(a.shape[2] == b.shape[1], op, "reduce dims differ: %d vs %d" % (a.shape[2], b.shape[1]))
    compute = torch.float64 if input.dtype == torch.float64 else torch.float32
    y = torch.matmul(a.to(compute), b.to(compute)).permute(perm_y)          # (M, B, N)
    if scale is None:
        return y.to(input.dtype)
    from torch_npu.op_plugin.quant.trans_quant_param import decode_packed_scale, _has_values
    check(scale.dtype == torch.int64, op, "scale must be int64 (npu_trans_quant_param), got %s" % scale.dtype)
    m, bsz, n = y.shape
    check(scale.numel() == bsz * n, op, "scale must have B * N = %d elements" % (bsz * n))
    s, packed_offset = decode_packed_scale(scale.reshape(-1))
    if _has_values(scale) and bool((packed_offset != 0).any()):
        raise NotImplementedError("%s: an int64 scale carrying a packed offset is not supported" % op)
    q = torch.round(y.reshape(m, 1, bsz * n) * s.to(compute)).clamp(-128, 127)
    return q.to(torch.int8)
