"""MoE permute / unpermute driven by a (tokens, experts) ``routing_map``, and their grad ops.

Semantics from the torch_npu doc of ``npu_moe_token_permute_with_routing_map`` and op-plugin's
goldens for both ops (T = routing_map rows, E = its columns):

* permute, ``drop_and_pad=False``: the selected (expert, token) pairs in expert-major order give
  ``first`` (their token ids, ``topK * T`` of them, ``topK = num_out_tokens // T``);
  ``permuted_tokens = tokens[first]``, ``sorted_indices = stable_argsort(first)`` (int32),
  ``permuted_probs = probs.T[routing_map.T]``. Every row of ``routing_map`` must select exactly
  ``topK`` experts (checked on real tensors; a host read).
* permute, ``drop_and_pad=True``: ``capacity = num_out_tokens // E``; per expert, the token ids
  sorted by ``routing_map.T`` descending (stable: selected tokens first, then padding tokens, each
  ascending) cut to ``capacity`` give ``sorted_indices`` (E * capacity); ``permuted_tokens =
  tokens[sorted_indices]``, ``permuted_probs[e*cap + c] = probs[sorted_indices[e*cap + c], e]``.
* unpermute, ``drop_and_pad=False``: ``out[t] = sum_k permuted[sorted_indices[t*topK + k]] * w[t, k]``
  with ``topK = permuted rows // T`` and ``w = probs[routing_map]`` in token-major order (1 without
  probs). ``drop_and_pad=True``: ``out = index_add(sorted_indices, permuted * permuted_probs)``
  (padding slots included, as in the golden). The private ``_npu_moe_token_unpermute_with_routing_map``
  also returns ``out_index = stable_argsort(sorted_indices)``, ``permuted_token_id =
  sort(sorted_indices)`` and ``permuted_probs`` (None without probs) -- drop_and_pad mode only:
  without it the real op's index outputs are not documented (NotImplementedError).
* the ``*_grad`` ops are the adjoints of these forwards (the unpermute grad in drop_and_pad mode
  only, since it consumes those index outputs).

All are compositions of ATen ops with static output shapes (no masked_select), so Meta/FakeTensor
work and autograd flows to tokens/permuted_tokens and probs. Sums run in float32 for float16/bfloat16.
"""
import torch

from torch_npu.op_plugin._common import acc, check, symbolic, unsupported
from torch_npu.op_plugin._registry import impl

__all__ = []


def _selected_positions(mask, count):
    """flat positions of the first ``count`` True entries of ``mask`` (row-major), without a host read."""
    unselected = torch.logical_not(mask.reshape(-1)).to(torch.int8)
    return torch.sort(unselected, stable=True)[1][:count]


def _check_topk(op, routing_map, topk):
    if symbolic(routing_map):
        return
    per_row = routing_map.bool().sum(1)
    check(bool((per_row == topk).all()), op, "every row of routing_map must select topK = num_out_tokens // "
          "tokens_num = %d experts, got counts %s", (topk, per_row.tolist()))


def _drop_pad_indices(routing_map, capacity):
    """(E, capacity) token ids per expert: selected first, then padding, each ascending."""
    return torch.sort(routing_map.t().to(torch.int8), dim=-1, descending=True, stable=True)[1][:, :capacity]


def _expert_major_probs(probs, token_ids):
    """probs[token_ids[e, c], e] flattened, for token_ids (E, C)."""
    e, _ = token_ids.shape
    t = probs.shape[0]
    flat = (torch.arange(e, device=token_ids.device).unsqueeze(1) * t + token_ids).reshape(-1)
    return probs.t().reshape(-1).index_select(0, flat)


@impl("npu_moe_token_permute_with_routing_map")
def npu_moe_token_permute_with_routing_map(tokens, routing_map, *, probs=None, num_out_tokens=None,
                                           drop_and_pad=False):
    op = "npu_moe_token_permute_with_routing_map"
    check(tokens.dim() == 2, op, "tokens must be 2-D (tokens_num, hidden_size), got %dD", tokens.dim())
    check(routing_map.dim() == 2 and routing_map.shape[0] == tokens.shape[0], op,
          "routing_map must be (tokens_num=%d, experts_num)", tokens.shape[0])
    t, e = routing_map.shape
    if probs is not None:
        check(tuple(probs.shape) == (t, e), op, "probs must have the shape of routing_map %s", ((t, e),))
    n_out = t if num_out_tokens is None else num_out_tokens
    check(0 <= n_out <= t * e, op, "num_out_tokens must be in [0, %d], got %d", (t * e, n_out))
    if drop_and_pad:
        capacity = n_out // e
        token_ids = _drop_pad_indices(routing_map, capacity)
        sorted_indices = token_ids.reshape(-1)
        permuted_probs = None if probs is None else _expert_major_probs(probs, token_ids)
        return tokens.index_select(0, sorted_indices), permuted_probs, sorted_indices.to(torch.int32)
    check(t > 0, op, "routing_map needs tokens when drop_and_pad is False")
    topk = n_out // t
    _check_topk(op, routing_map, topk)
    positions = _selected_positions(routing_map.t(), topk * t)         # expert-major
    first = torch.remainder(positions, t)
    sorted_indices = torch.sort(first, stable=True)[1].to(torch.int32)
    permuted_probs = None if probs is None else probs.t().reshape(-1).index_select(0, positions)
    return tokens.index_select(0, first), permuted_probs, sorted_indices


@impl("npu_moe_token_permute_with_routing_map_grad")
def npu_moe_token_permute_with_routing_map_grad(permuted_token_out_grad, probs_grad, sorted_indices, routing_map,
                                                experts_num, tokens_num, drop_and_pad):
    op = "npu_moe_token_permute_with_routing_map_grad"
    g = permuted_token_out_grad
    check(g.dim() == 2, op, "permuted_token_out_grad must be 2-D")
    check(tuple(routing_map.shape) == (tokens_num, experts_num), op, "routing_map must be (%d, %d)",
          (tokens_num, experts_num))
    t, e, h = tokens_num, experts_num, g.shape[1]
    idx = sorted_indices.long()
    if drop_and_pad:
        tokens_grad = acc(g).new_zeros((t, h)).index_add(0, idx, acc(g))
        flat = (torch.div(torch.arange(idx.numel(), device=idx.device), max(idx.numel() // e, 1),
                          rounding_mode="floor") * t + idx)
    else:
        check(t > 0 and idx.numel() % t == 0, op, "sorted_indices size %d is not a multiple of tokens_num %d",
              (idx.numel(), t))
        topk = idx.numel() // t
        tokens_grad = acc(g).index_select(0, idx).reshape(t, topk, h).sum(1)
        flat = _selected_positions(routing_map.t(), idx.numel())
    probs_out = None
    if probs_grad is not None:
        probs_out = probs_grad.new_zeros((e * t,)).index_put((flat,), probs_grad.reshape(-1), accumulate=True)
        probs_out = probs_out.reshape(e, t).t().contiguous()
    return tokens_grad.to(g.dtype), probs_out


def _unpermute(op, permuted_tokens, sorted_indices, restore_shape, probs, routing_map, drop_and_pad):
    check(permuted_tokens.dim() == 2, op, "permuted_tokens must be 2-D")
    check(sorted_indices.dim() == 1, op, "sorted_indices must be 1-D")
    check(len(restore_shape) == 2 and restore_shape[1] == permuted_tokens.shape[1], op,
          "restore_shape must be (tokens_num, %d), got %s", (permuted_tokens.shape[1], list(restore_shape)))
    t, h = restore_shape
    idx = sorted_indices.long()
    rows = acc(permuted_tokens)
    if drop_and_pad:
        permuted_probs = None
        if probs is not None:
            check(probs.dim() == 2 and probs.shape[0] == t, op, "probs must be (%d, experts_num)", t)
            e = probs.shape[1]
            check(idx.numel() % e == 0, op, "sorted_indices size %d is not experts_num (%d) * capacity",
                  (idx.numel(), e))
            permuted_probs = _expert_major_probs(probs, idx.reshape(e, -1))
            rows = rows * acc(permuted_probs).to(rows.dtype).unsqueeze(-1)
        out = rows.new_zeros((t, h)).index_add(0, idx, rows)
        return out.to(permuted_tokens.dtype), permuted_probs
    check(t > 0 and permuted_tokens.shape[0] % t == 0, op, "permuted_tokens rows %d are not a multiple of "
          "tokens_num %d", (permuted_tokens.shape[0], t))
    topk = permuted_tokens.shape[0] // t
    check(idx.numel() == t * topk, op, "sorted_indices must have %d elements", (t * topk))
    picked = rows.index_select(0, idx).reshape(t, topk, h)
    permuted_probs = None
    if probs is not None:
        check(routing_map is not None, op, "routing_map is needed with probs when drop_and_pad is False")
        check(tuple(probs.shape) == tuple(routing_map.shape) and probs.shape[0] == t, op,
              "probs and routing_map must both be (%d, experts_num)", t)
        _check_topk(op, routing_map, topk)
        permuted_probs = probs.reshape(-1).index_select(0, _selected_positions(routing_map, t * topk))  # token-major
        picked = picked * acc(permuted_probs).to(picked.dtype).reshape(t, topk, 1)
    return picked.sum(1).to(permuted_tokens.dtype), permuted_probs


@impl("npu_moe_token_unpermute_with_routing_map")
def npu_moe_token_unpermute_with_routing_map(permuted_tokens, sorted_indices, restore_shape, *, probs=None,
                                             routing_map=None, drop_and_pad=False):
    return _unpermute("npu_moe_token_unpermute_with_routing_map", permuted_tokens, sorted_indices, restore_shape,
                      probs, routing_map, drop_and_pad)[0]


@impl("_npu_moe_token_unpermute_with_routing_map")
def _npu_moe_token_unpermute_with_routing_map(permuted_tokens, sorted_indices, restore_shape, *, probs=None,
                                              routing_map=None, drop_and_pad=False):
    op = "_npu_moe_token_unpermute_with_routing_map"
    if not drop_and_pad:
        unsupported(op, "drop_and_pad=False (its out_index / permuted_token_id outputs are not documented)")
    out, permuted_probs = _unpermute(op, permuted_tokens, sorted_indices, restore_shape, probs, routing_map, True)
    token_ids, out_index = torch.sort(sorted_indices, stable=True)
    return out, out_index.to(sorted_indices.dtype), token_ids, permuted_probs


@impl("npu_moe_token_unpermute_with_routing_map_grad")
def npu_moe_token_unpermute_with_routing_map_grad(unpermuted_tokens_grad, out_index, permuted_token_id, routing_map,
                                                  permuted_tokens, probs, drop_and_pad, restore_shape):
    op = "npu_moe_token_unpermute_with_routing_map_grad"
    if not drop_and_pad:
        unsupported(op, "drop_and_pad=False (it consumes the undocumented index outputs of that mode)")
    g = unpermuted_tokens_grad
    check(g.dim() == 2 and tuple(g.shape) == tuple(restore_shape), op, "unpermuted_tokens_grad must be %s",
          (list(restore_shape),))
    slots = out_index.numel()
    check(permuted_token_id.numel() == slots, op, "out_index and permuted_token_id must have the same size")
    # token of each permuted slot
    token_of_slot = torch.zeros(slots, dtype=torch.long, device=g.device).index_put(
        (out_index.long(),), permuted_token_id.long())
    grad_rows = acc(g).index_select(0, token_of_slot)
    if probs is None:
        return grad_rows.to(g.dtype), None
    t, e = probs.shape
    check(slots % e == 0, op, "out_index size %d is not experts_num (%d) * capacity", (slots, e))
    expert_of_slot = torch.div(torch.arange(slots, device=g.device), slots // e, rounding_mode="floor")
    flat = expert_of_slot * t + token_of_slot                     # index into probs.T flattened
    slot_probs = probs.t().reshape(-1).index_select(0, flat)
    check(permuted_tokens is not None, op, "permuted_tokens is needed to compute the gradient of probs")
    dots = (acc(permuted_tokens).to(grad_rows.dtype) * grad_rows).sum(-1)
    probs_grad = dots.new_zeros((e * t,)).index_put((flat,), dots, accumulate=True).reshape(e, t).t()
    permuted_grad = grad_rows * acc(slot_probs).to(grad_rows.dtype).unsqueeze(-1)
    return permuted_grad.to(g.dtype), probs_grad.to(g.dtype).contiguous()
