"""npu_transpose_quant_batchmatmul: float8 batched matmul with permuted operands, dequantised output.

Documented (aclnnTransposeQuantBatchMatMul / the TransposeQuantBatchMatMul README and kernel
golden of CANN ops-nn): ``x1`` float8_e4m3fn/float8_e5m2 of shape ``(M, B, K)`` read through
``perm_x1 = [1, 0, 2]`` as ``(B, M, K)``; ``x2`` float8 ``(B, K, N)`` (``perm_x2 = [0, 1, 2]``) or,
in MX mode, ``(B, N, K)`` (``perm_x2 = [0, 2, 1]``); the product ``(B, M, N)`` is permuted by
``perm_y = [1, 0, 2]`` to ``(M, B, N)`` and cast to ``dtype`` (float16 or bfloat16).

* K-C mode (float32 scales): ``y = (x1 @ x2) * x2_scale[n] * x1_scale[m]``, ``x1_scale (M,)``,
  ``x2_scale (N,)``, accumulation and scaling in float32.
* MX mode (both scales float8_e8m0fnu, ``2 ** (raw - 127)``, raw 255 is NaN): every 32-element
  K group is scaled before accumulation. ``x1_scale (M, B, K/64, 2)``, ``x2_scale (B, K/64, N, 2)``
  (``perm_x2 = [0, 1, 2]``) or ``(B, N, K/64, 2)`` (``[0, 2, 1]``); element ``[.., g, p]`` covers
  K indices ``64 g + 32 p .. 64 g + 32 p + 31``.

The hardware's size limits (K-C: K == 512, N == 128; MX: K % 64 == 0) are not enforced beyond
what the formula needs (MX: K % 64 == 0). Not emulated (NotImplementedError): ``bias`` (a reserved
parameter the kernel never reads), ``batch_split_factor != 1``, ``x1_dtype``/``x2_dtype`` (the
HiFloat8 mode), any other permutation.
"""
import torch

from torch_npu.op_plugin._common import check
from torch_npu.op_plugin._registry import impl
from torch_npu.op_plugin.quant.quantize import _dtype_arg

__all__ = []

_FLOAT8 = (torch.float8_e4m3fn, torch.float8_e5m2)
_MX_GROUP = 32


def _e8m0_values(scale):
    """float32 values of a float8_e8m0fnu tensor: 2 ** (raw - 127), raw 255 is NaN."""
    raw = scale.view(torch.uint8).to(torch.float32)
    return torch.where(raw == 255, torch.full_like(raw, float("nan")), torch.exp2(raw - 127))


def _mx_expand_x1(x1_scale, b, m, k):
    """(M, B, K/64, 2) e8m0 -> (B, M, K) float32: one value per 32 K elements."""
    s = _e8m0_values(x1_scale).reshape(m, b, k // _MX_GROUP).permute(1, 0, 2)
    return s.repeat_interleave(_MX_GROUP, dim=-1)


def _mx_expand_x2(x2_scale, b, k, n, weight_transposed):
    """(B, K/64, N, 2) or (B, N, K/64, 2) e8m0 -> (B, K, N) float32."""
    s = _e8m0_values(x2_scale)
    if weight_transposed:
        s = s.permute(0, 2, 1, 3)                                     # -> (B, K/64, N, 2)
    s = s.permute(0, 1, 3, 2).reshape(b, k // _MX_GROUP, n)           # groups in K order
    return s.repeat_interleave(_MX_GROUP, dim=1)


@impl("npu_transpose_quant_batchmatmul")
def npu_transpose_quant_batchmatmul(x1, x2, dtype, *, bias=None, x1_scale=None, x2_scale=None, group_sizes=None,
                                    perm_x1=None, perm_x2=None, perm_y=None, batch_split_factor=1, x1_dtype=None,
                                    x2_dtype=None):
    """See the module doc."""
    op = "npu_transpose_quant_batchmatmul"
    out_dtype = _dtype_arg(op, "dtype", dtype, (torch.float16, torch.bfloat16))
    perm_x1 = [1, 0, 2] if perm_x1 is None else list(perm_x1)
    perm_x2 = [0, 1, 2] if perm_x2 is None else list(perm_x2)
    perm_y = [1, 0, 2] if perm_y is None else list(perm_y)
    if bias is not None:
        raise NotImplementedError("%s: bias is a reserved parameter, not supported" % op)
    if batch_split_factor not in (None, 1):
        raise NotImplementedError("%s: batch_split_factor=%r is not supported (only 1)" % (op, batch_split_factor))
    if x1_dtype is not None or x2_dtype is not None:
        raise NotImplementedError("%s: x1_dtype/x2_dtype (HiFloat8 inputs) are not emulated" % op)
    check(x1_scale is not None and x2_scale is not None, op, "x1_scale and x2_scale are required")
    mx = x1_scale.dtype == torch.float8_e8m0fnu and x2_scale.dtype == torch.float8_e8m0fnu
    if perm_x1 != [1, 0, 2] or perm_y != [1, 0, 2] or perm_x2 not in ([0, 1, 2], [0, 2, 1]) or \
            (perm_x2 == [0, 2, 1] and not mx):
        raise NotImplementedError("%s: perm_x1=%s perm_x2=%s perm_y=%s is not supported" % (op, perm_x1, perm_x2, perm_y))
    check(x1.dtype in _FLOAT8, op, "x1's type supported for float8_e5m2 or float8_e4m3fn, got %s", x1.dtype)
    check(x2.dtype in _FLOAT8, op, "x2's type supported for float8_e5m2 or float8_e4m3fn, got %s", x2.dtype)
    check(x1.dim() == 3 and x2.dim() == 3, op, "x1 and x2 must be 3-d")
    a = x1.to(torch.float32).permute(perm_x1)                          # (B, M, K)
    w = x2.to(torch.float32).permute(perm_x2)                          # (B, K, N)
    b, m, k = a.shape
    check(w.shape[0] == b, op, "batch sizes differ: %d vs %d", (b, w.shape[0]))
    check(w.shape[1] == k, op, "reduce dims differ: %d vs %d", (k, w.shape[1]))
    n = w.shape[2]
    if mx:
        check(k % 64 == 0, op, "MX mode needs K to be a multiple of 64, got %d", k)
        check(tuple(x1_scale.shape) == (m, b, k // 64, 2), op, "x1_scale must be (M, B, K/64, 2) = %s, got %s",
              ((m, b, k // 64, 2), tuple(x1_scale.shape)))
        want = (b, n, k // 64, 2) if perm_x2 == [0, 2, 1] else (b, k // 64, n, 2)
        check(tuple(x2_scale.shape) == want, op, "x2_scale must be %s, got %s", (want, tuple(x2_scale.shape)))
        y = torch.matmul(a * _mx_expand_x1(x1_scale, b, m, k),
                         w * _mx_expand_x2(x2_scale, b, k, n, perm_x2 == [0, 2, 1]))
    else:
        check(x1_scale.dtype == torch.float32 and x2_scale.dtype == torch.float32, op,
              "x1_scale and x2_scale must both be float32 (K-C) or both float8_e8m0fnu (MX)")
        check(tuple(x1_scale.shape) == (m,), op, "x1_scale must be (M,) = (%d,)", m)
        check(tuple(x2_scale.shape) == (n,), op, "x2_scale must be (N,) = (%d,)", n)
        # the kernel's dequant order: accumulator * x2_scale, then * x1_scale
        y = torch.matmul(a, w) * x2_scale.reshape(1, 1, n) * x1_scale.reshape(1, m, 1)
    return y.permute(perm_y).contiguous().to(out_dtype)
