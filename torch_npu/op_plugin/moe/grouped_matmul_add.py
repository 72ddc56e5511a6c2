"""npu_grouped_matmul_add(_): grouped matmuls along K accumulated into ``self``.

* ``npu_grouped_matmul_add_(self, x, weight, group_list)``: ``self[g] += x[K_g].T @ weight[K_g]``
  where ``K_g`` is group ``g``'s slice of the K axis (the doc's ``self = self + x @ weight`` with
  ``transpose_x=True`` and ``group_type=2``, split along K): ``self (g, M, N)`` float32, ``x (K, M)``
  and ``weight (K, N)`` float16/bfloat16, ``group_list (g,)`` cumulative ends (``group_list_type``
  0) or per-group sizes (1); K rows past the last group are unused. The group membership of each
  K row is built with tensor comparisons (no host read), so Meta/FakeTensor work. Products are
  accumulated in float32. ``npu_grouped_matmul_add`` is the out-of-place form (a new tensor).
  Only the documented ``transpose_x=True``, ``transpose_weight=False``, ``group_type=2`` are
  supported; others raise NotImplementedError.
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
    check(self.dim() == 3, op, "self must be 3-D (g, M, N), got %dD", self.dim())
    check(x.dim() == 2 and weight.dim() == 2, op, "x (K, M) and weight (K, N) must be 2-D")
    check(x.shape[0] == weight.shape[0], op, "x and weight must have the same K, got %d and %d",
          (x.shape[0], weight.shape[0]))
    check(group_list.dim() == 1 and group_list.shape[0] == self.shape[0], op,
          "group_list must be 1-D with g = %d entries", self.shape[0])
    check(tuple(self.shape[1:]) == (x.shape[1], weight.shape[1]), op, "self must be (g, %d, %d), got %s",
          (x.shape[1], weight.shape[1], tuple(self.shape)))
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
