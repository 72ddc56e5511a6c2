"""npu_attention_update(lse[], out[], update_type): merges partial attentions (e.g. the chunks of a
context-parallel attention):

    lse = max_i lse_i + log(sum_i exp(lse_i - max)),   out = sum_i out_i * exp(lse_i - lse).

Low-precision inputs are computed in float32 and returned in their dtype.
"""
import torch

from torch_npu.op_plugin._common import acc, check
from torch_npu.op_plugin._registry import impl

__all__ = []


@impl("npu_attention_update")
def npu_attention_update(lse, local_out, update_type):
    """Merge K partial attentions: lse_i [N] float32, out_i [N, H] -> (out [N, H] in out dtype,
    lse [N] float32). The merged lse is returned for update_type 0 too (update_type 1 asks for it)."""
    op = "npu_attention_update"
    check(len(lse) > 0 and len(lse) == len(local_out), op, "lse and local_out must be non-empty lists of the "
          "same length, got %d and %d", (len(lse), len(local_out)))
    check(update_type in (0, 1), op, "update_type must be 0 or 1, got %s", update_type)
    n, h = local_out[0].shape[0], local_out[0].shape[-1]
    out_dtype = local_out[0].dtype
    for i, (l_i, o_i) in enumerate(zip(lse, local_out)):
        check(l_i.dtype in (torch.float32, torch.float64), op, "lse[%d] must be float32, got %s", (i, l_i.dtype))
        check(l_i.dim() == 1 and l_i.shape[0] == n, op, "lse[%d] must be [N=%d], got %s", (i, n, tuple(l_i.shape)))
        check(o_i.dim() == 2 and tuple(o_i.shape) == (n, h), op, "local_out[%d] must be [N=%d, H=%d], got %s", (i, n, h, tuple(o_i.shape)))
        check(o_i.dtype == out_dtype, op, "local_out[%d] dtype %s differs from %s", (i, o_i.dtype, out_dtype))
    lses = torch.stack([acc(t) for t in lse])
    outs = torch.stack([acc(t) for t in local_out])
    top = lses.amax(dim=0)
    merged = top + torch.log(torch.exp(lses - top).sum(dim=0))
    out = (outs * torch.exp(lses - merged).unsqueeze(-1)).sum(dim=0)
    return out.to(out_dtype), merged.to(lse[0].dtype)
