"""MoE token permute / unpermute (non-padded mode) and their backward ops, on one index math.

* ``npu_moe_token_permute``: replicate each token to its ``topK`` experts and sort the copies
  by expert (stable); returns the permuted tokens and ``sorted_indices``.
* ``npu_moe_token_unpermute``: the inverse, each token the (``probs``-weighted) sum of its
  ``topK`` permuted rows.

* ``npu_moe_token_permute_grad`` / ``_v2``: ``grad_tokens[t] = sum_k grad_permuted[sorted_indices[t*topK + k]]``
  (the MoeTokenPermuteGrad formula: index_select by ``sorted_indices``, reshape ``(-1, topK, H)``,
  sum over topK). Rows dropped by ``num_out_tokens`` (index >= rows of ``grad_permuted_tokens``)
  contribute zero, as they did not reach the forward output.
* ``npu_moe_token_unpermute_grad`` / ``_v2``: ``grad_permuted[sorted_indices[t*topK + k]] =
  grad_unpermuted[t] * probs[t, k]`` (no ``probs``: ``grad_unpermuted[t]``) and
  ``grad_probs[t, k] = sum_h permuted_tokens[sorted_indices[t*topK + k], h] * grad_unpermuted[t, h]``
  (the MoeTokenUnpermuteGrad formula). Permuted rows nobody reads get zero gradient.
* ``_npu_moe_token_unpermute``: the forward plus the tensor saved for backward (a copy of
  ``permuted_tokens``; the real op saves it when ``probs`` is given, and also without ``probs``
  on CANN < 9.1 / Ascend950, so it is always returned here).

Sums run in float32 for float16/bfloat16. ``padded_mode=True`` raises NotImplementedError (as
in the forwards). ``npu_moe_token_unpermute_grad`` without ``probs`` returns an undefined (None)
``grad_probs``, as the real meta kernel does; ``_v2`` without ``probs`` raises NotImplementedError
(the real op returns a placeholder whose shape is not documented).
"""
import torch

from torch_npu.op_plugin._common import acc, check, unsupported
from torch_npu.op_plugin._registry import impl

__all__ = []


def _gather_rows(op, rows, sorted_indices):
    """``rows[sorted_indices]`` in compute precision, with out-of-range (dropped) indices as zero rows."""
    check(sorted_indices.dim() == 1, op, "sorted_indices must be 1-D, got %dD", sorted_indices.dim())
    idx = sorted_indices.long()
    valid = idx < rows.shape[0]
    picked = acc(rows).index_select(0, torch.where(valid, idx, torch.zeros_like(idx)))
    return picked * valid.unsqueeze(-1).to(picked.dtype), idx, valid


def _permute_grad(op, grad_permuted_tokens, sorted_indices, tokens_num, topk, dtype, padded_mode):
    if padded_mode:
        unsupported(op, "padded_mode=True")
    check(grad_permuted_tokens.dim() == 2, op, "grad_permuted_tokens must be 2-D, got %dD", grad_permuted_tokens.dim())
    check(topk >= 1, op, "topK must be >= 1, got %d", topk)
    check(sorted_indices.numel() == tokens_num * topk, op, "sorted_indices has %d elements, expected tokens (%d) * topK (%d)",
          (sorted_indices.numel(), tokens_num, topk))
    picked, _, _ = _gather_rows(op, grad_permuted_tokens, sorted_indices)
    h = grad_permuted_tokens.shape[1]
    return picked.reshape(tokens_num, topk, h).sum(1).to(dtype)


@impl("npu_moe_token_permute_grad")
def npu_moe_token_permute_grad(tokens, grad_permuted_tokens, indices, sorted_indices, padded_mode=False):
    op = "npu_moe_token_permute_grad"
    check(tokens.dim() == 2, op, "tokens must be 2-D, got %dD", tokens.dim())
    check(indices.dim() in (1, 2) and indices.shape[0] == tokens.shape[0], op,
          "indices must be [T] or [T, topK] with T = tokens rows")
    check(grad_permuted_tokens.dim() == 2 and grad_permuted_tokens.shape[1] == tokens.shape[1], op,
          "grad_permuted_tokens must be [rows, %d]", tokens.shape[1])
    topk = 1 if indices.dim() == 1 else indices.shape[1]
    return _permute_grad(op, grad_permuted_tokens, sorted_indices, tokens.shape[0], topk, tokens.dtype, padded_mode)


@impl("npu_moe_token_permute_grad_v2")
def npu_moe_token_permute_grad_v2(grad_permuted_tokens, sorted_indices, tokens_size_0, tokens_dtype, num_topK,
                                  padded_mode=False):
    return _permute_grad("npu_moe_token_permute_grad_v2", grad_permuted_tokens, sorted_indices, tokens_size_0,
                         num_topK, tokens_dtype, padded_mode)


def _unpermute_grad(op, permuted_tokens, grad_unpermuted_tokens, sorted_indices, probs, rows, dtype, probs_dtype,
                    padded_mode):
    if padded_mode:
        unsupported(op, "padded_mode=True")
    check(grad_unpermuted_tokens.dim() == 2, op, "grad_unpermuted_tokens must be 2-D, got %dD",
          grad_unpermuted_tokens.dim())
    check(sorted_indices.dim() == 1, op, "sorted_indices must be 1-D, got %dD", sorted_indices.dim())
    t, h = grad_unpermuted_tokens.shape
    topk = 1 if probs is None else probs.shape[-1]
    check(sorted_indices.numel() == t * topk, op, "sorted_indices has %d elements, expected tokens (%d) * topK (%d)",
          (sorted_indices.numel(), t, topk))
    grad = acc(grad_unpermuted_tokens)
    contrib = grad.unsqueeze(1).expand(t, topk, h)
    if probs is not None:
        check(probs.dim() == 2 and tuple(probs.shape) == (t, topk), op, "probs must be [%d, %d]", (t, topk))
        contrib = contrib * acc(probs).to(grad.dtype).unsqueeze(-1)
    idx = sorted_indices.long()
    valid = idx < rows
    # dropped destinations go to a scratch row that is cut off afterwards
    dest = torch.where(valid, idx, torch.full_like(idx, rows))
    grad_permuted = grad.new_zeros((rows + 1, h)).index_put((dest,), contrib.reshape(-1, h), accumulate=True)
    grad_permuted = grad_permuted[:rows].to(dtype)
    if probs is None:
        return grad_permuted, None
    check(permuted_tokens is not None, op, "permuted_tokens is needed to compute the gradient of probs")
    check(permuted_tokens.dim() == 2 and permuted_tokens.shape[1] == h, op, "permuted_tokens must be [rows, %d]", h)
    picked, _, _ = _gather_rows(op, permuted_tokens, sorted_indices)
    grad_probs = (picked.to(grad.dtype).reshape(t, topk, h) * grad.unsqueeze(1)).sum(-1)
    return grad_permuted, grad_probs.to(probs_dtype)


@impl("npu_moe_token_unpermute_grad")
def npu_moe_token_unpermute_grad(permuted_tokens, grad_unpermuted_tokens, sorted_indices, probs=None,
                                 padded_mode=False, restore_shape=None):
    op = "npu_moe_token_unpermute_grad"
    check(permuted_tokens.dim() == 2, op, "permuted_tokens must be 2-D, got %dD", permuted_tokens.dim())
    return _unpermute_grad(op, permuted_tokens, grad_unpermuted_tokens, sorted_indices, probs,
                           permuted_tokens.shape[0], permuted_tokens.dtype, grad_unpermuted_tokens.dtype, padded_mode)


@impl("npu_moe_token_unpermute_grad_v2")
def npu_moe_token_unpermute_grad_v2(grad_unpermuted_tokens, sorted_indices, permuted_tokens_size_0,
                                    permuted_tokens_dtype, probs=None, padded_mode=False, restore_shape=None,
                                    permuted_tokens=None):
    op = "npu_moe_token_unpermute_grad_v2"
    if probs is None:
        unsupported(op, "probs=None (the real op returns a placeholder grad_probs of undocumented shape)")
    return _unpermute_grad(op, permuted_tokens, grad_unpermuted_tokens, sorted_indices, probs,
                           permuted_tokens_size_0, permuted_tokens_dtype, probs.dtype, padded_mode)


@impl("_npu_moe_token_unpermute")
def _npu_moe_token_unpermute(permuted_tokens, sorted_indices, probs=None, padded_mode=False, restore_shape=None):
    out = torch.ops.npu.npu_moe_token_unpermute(permuted_tokens, sorted_indices, probs, padded_mode, restore_shape)
    return out, permuted_tokens.clone()


def _topk_of(indices):
    return 1 if indices.dim() == 1 else indices.shape[1]


@impl("npu_moe_token_permute")
def npu_moe_token_permute(tokens, indices, num_out_tokens=None, padded_mode=False):
    """MoE permute (non-padded mode): replicate each token to its ``topK`` experts and sort by expert.

    ``tokens`` [T, H]; ``indices`` [T, topK] or [T] (topK = 1) expert ids.
    ``first = stable_argsort(flatten(indices))``, ``sorted_indices = argsort(first)``
    (source slot -> destination row, int32), ``permuted[sorted_indices[i]] = tokens[i // topK]``.
    ``num_out_tokens`` (None or <= 0: all ``T * topK``; larger values are clamped) keeps
    the first rows. Returns ``(permuted_tokens, sorted_indices)``. ``padded_mode=True``
    is not supported.
    """
    op = "npu_moe_token_permute"
    if padded_mode:
        unsupported(op, "padded_mode=True")
    check(tokens.dim() == 2, op, "tokens must be 2D")
    check(indices.dim() in (1, 2) and indices.shape[0] == tokens.shape[0], op,
          "indices must be [T] or [T, topK] with T = tokens rows")
    topk = _topk_of(indices)
    total = indices.numel()
    out_n = total if num_out_tokens is None or num_out_tokens <= 0 else min(num_out_tokens, total)
    first = torch.sort(indices.reshape(-1), stable=True)[1]
    sorted_indices = torch.empty_like(first).index_put(
        (first,), torch.arange(total, dtype=first.dtype, device=first.device))
    permuted = tokens.index_select(0, torch.div(first[:out_n], topk, rounding_mode="floor"))
    return permuted, sorted_indices.to(torch.int32)


@impl("npu_moe_token_unpermute")
def npu_moe_token_unpermute(permuted_tokens, sorted_indices, probs=None, padded_mode=False, restore_shape=None):
    """MoE unpermute (non-padded mode), the inverse of :func:`npu_moe_token_permute`.

    With topK = ``probs.shape[1]`` (1 without ``probs``) and ``T = sorted_indices.numel() / topK``:
    ``out[t] = sum_k probs[t, k] * permuted_tokens[sorted_indices[t * topK + k]]``;
    destinations ``>= permuted_tokens.shape[0]`` (dropped by ``num_out_tokens``) count
    as zero. Computed in float32 for float16/bfloat16; output [T, H] in the dtype of
    ``permuted_tokens``. ``padded_mode=True`` is not supported; ``restore_shape`` is
    only used in padded mode and ignored otherwise.
    """
    op = "npu_moe_token_unpermute"
    if padded_mode:
        unsupported(op, "padded_mode=True")
    check(permuted_tokens.dim() == 2, op, "permuted_tokens must be 2D")
    topk = 1 if probs is None else probs.shape[-1]
    total = sorted_indices.numel()
    check(total % topk == 0, op, "sorted_indices size %d is not a multiple of topK %d", (total, topk))
    t = total // topk
    p, h = permuted_tokens.shape
    idx = sorted_indices.reshape(-1).long()
    valid = idx < p
    rows = acc(permuted_tokens).index_select(0, torch.where(valid, idx, torch.zeros_like(idx)))
    rows = (rows * valid.unsqueeze(-1).to(rows.dtype)).reshape(t, topk, h)
    if probs is not None:
        check(probs.numel() == total, op, "probs must have %d elements", total)
        rows = rows * acc(probs).reshape(t, topk, 1).to(rows.dtype)
    return rows.sum(1).to(permuted_tokens.dtype)
