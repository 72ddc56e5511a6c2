"""Logits sampling.

* ``npu_top_k_top_p(logits, p, k)`` (aclnnApplyTopKTopP): per row b, sort ascending (stable);
  top-k keeps the values >= the k[b]-th largest (``k[b] <= 0`` or ``k[b] >= V`` skips top-k);
  top-p takes the softmax of the surviving sorted values, its cumulative sum from the smallest,
  and drops the positions whose cumulative probability is <= 1 - p[b], always keeping the
  largest; dropped positions become -inf, the rest keep their logit, in the original order.
  ``k=None`` or ``p=None`` skips that filter (both None is an error, as aclnn's null check).
  The softmax and cumulative sum run in float32 for float16/bfloat16 logits.
* ``npu_top_k_top_p_sample``: meta-only (not emulated, a real call raises NotImplementedError
  naming the op); its Meta kernel gives the documented output shapes and dtypes.
"""
import torch

from torch_npu.op_plugin._common import acc, check
from torch_npu.op_plugin._registry import impl, meta

__all__ = []


_LOGIT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@impl("npu_top_k_top_p")
def npu_top_k_top_p(logits, p=None, k=None):
    """Top-k then top-p filtering of 2-D ``logits`` (see the module docstring)."""
    op = "npu_top_k_top_p"
    check(p is not None or k is not None, op, "p and k must not both be None")
    check(logits.dim() == 2, op, "logits must be 2-D [batch, vocab], got %d-D", logits.dim())
    check(logits.dtype in _LOGIT_DTYPES, op, "logits must be float32, float16 or bfloat16, got %s", logits.dtype)
    batch, vocab = logits.shape
    values, order = torch.sort(logits, dim=-1, stable=True)
    neg_inf = torch.tensor(float("-inf"), dtype=logits.dtype, device=logits.device)
    if k is not None:
        check(k.dim() == 1 and k.size(0) == batch, op, "k must be 1-D of logits.size(0)=%d, got %s",
              (batch, tuple(k.shape)))
        check(k.dtype == torch.int32, op, "k must be int32, got %s", k.dtype)
        kk = k.long()
        active = (kk > 0) & (kk < vocab)
        position = (vocab - kk).clamp(0, vocab - 1).unsqueeze(-1)   # the k-th largest, ascending order
        threshold = values.gather(-1, position)
        values = torch.where((values < threshold) & active.unsqueeze(-1), neg_inf, values)
    if p is not None:
        check(p.dim() == 1 and p.size(0) == batch, op, "p must be 1-D of logits.size(0)=%d, got %s",
              (batch, tuple(p.shape)))
        check(p.dtype == logits.dtype, op, "p must have logits' dtype %s, got %s", (logits.dtype, p.dtype))
        cumulative = torch.softmax(acc(values), dim=-1).cumsum(dim=-1)
        drop = cumulative <= (1 - acc(p)).unsqueeze(-1)
        keep_largest = torch.arange(vocab, device=logits.device) == vocab - 1
        values = torch.where(drop & ~keep_largest, neg_inf, values)
    return torch.empty_like(logits).scatter(-1, order, values)


@meta("npu_top_k_top_p_sample")
def npu_top_k_top_p_sample(logits, top_k, top_p, q=None, eps=1e-8, is_need_logits=False, top_k_guess=32, min_ps=None,
                           ks_max=1024, input_is_logits=True, post_sample="qSample", generator=None):
    """logits_select_idx: int64 [batch]; logits_top_kp_select: float32 of logits' shape."""
    op = "npu_top_k_top_p_sample"
    check(logits.dim() == 2, op, "logits must be 2-D [batch, voc_size], got %d-D", logits.dim())
    check(top_k.dim() == 1 and top_p.dim() == 1, op, "top_k and top_p must be 1-D")
    if q is not None:
        check(tuple(q.shape) == tuple(logits.shape), op, "q must have logits' shape %s, got %s",
               (tuple(logits.shape), tuple(q.shape)))
    return (logits.new_empty((logits.size(0),), dtype=torch.int64),
            logits.new_empty(tuple(logits.shape), dtype=torch.float32))
