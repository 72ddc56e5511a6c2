"""Vocabulary-parallel cross entropy (Megatron style), three ops used in sequence:

1. ``npu_fused_linear_online_max_sum(input, weight, target, vocab_start_index, vocab_end_index)``:
   ``logits = input @ weight.T`` (float32), per row ``logits_max``, ``sum_exp_logits =
   Σ exp(logits - logits_max)``, ``target_mask = (target < start) | (target > end)``,
   ``masked_target = target - start`` (0 where masked), ``predicted_logits = (logits -
   logits_max)[masked_target]`` (0 where masked), the mask packed 8 rows per uint8 (row ``8k + j``
   is bit ``j``, least significant first, as op-plugin's golden packs it; rows past the end of
   the last byte are 1, as the doc says) and, with ``return_logits``, ``logits`` in input's dtype
   (else None).
2. ``npu_fused_cross_entropy_loss_with_max_sum``: ``loss = log(sum_exp_logits) - predicted_logits``;
   with ``vocab_parallel_logits``: ``softmax = exp(logits - logits_max) / sum_exp_logits``.
3. ``npu_fused_linear_cross_entropy_loss_with_max_sum_backward``: ``g = softmax`` (given) or
   recomputed from ``logits_max``/``sum_exp_logits``; ``g[b, masked_target[b]] -= 1 - mask[b]``;
   ``g *= grad[:, None]``; ``input_grad = g @ weight``, ``weight_grad = g.T @ input`` (input's dtype).

Between 1 and 2 a multi-rank job all-reduces the statistics; on one rank with ``start = 0``,
``end = V - 1`` the loss is the plain cross entropy. ``label_smoothing`` other than 0 and the
``input``/``weight`` arguments of op 2 raise NotImplementedError (the docs: "currently only 0.0 /
None"). Sources: the three torch_npu docs and op-plugin/ops-nn's goldens.
"""
import torch

from torch_npu.op_plugin._common import check, unsupported
from torch_npu.op_plugin._registry import impl

__all__ = []

_BITS = 8


def _pack_mask(mask):
    """bool (n,) -> uint8 (ceil(n/8),), element 8k+j in bit j; padding elements are 1."""
    n = mask.shape[0]
    padded = torch.ones(((n + _BITS - 1) // _BITS) * _BITS, dtype=torch.int32, device=mask.device)
    padded = torch.cat([mask.to(torch.int32), padded[n:]])
    weights = torch.tensor([1 << j for j in range(_BITS)], dtype=torch.int32, device=mask.device)
    return (padded.reshape(-1, _BITS) * weights).sum(-1).to(torch.uint8)


def _unpack_mask(packed, n):
    """uint8 (m,) -> int (n,) bits, element 8k+j from bit j."""
    shifts = torch.arange(_BITS, dtype=torch.int32, device=packed.device)
    bits = torch.bitwise_and(torch.bitwise_right_shift(packed.to(torch.int32).unsqueeze(-1), shifts), 1)
    return bits.reshape(-1)[:n]


@impl("npu_fused_linear_online_max_sum")
def npu_fused_linear_online_max_sum(input, weight, target, vocab_start_index, vocab_end_index, return_logits=False):
    op = "npu_fused_linear_online_max_sum"
    check(input.dim() == 2 and weight.dim() == 2, op, "input and weight must be 2-D")
    check(target.dim() == 1 and target.shape[0] == input.shape[0], op, "target must be 1-D with input.size(0) rows")
    check(input.dtype in (torch.float16, torch.bfloat16), op, "input must be float16 or bfloat16, got %s", input.dtype)
    check(weight.dtype == input.dtype, op, "weight dtype %s must equal input dtype %s", (weight.dtype, input.dtype))
    check(target.dtype in (torch.int32, torch.int64), op, "target must be int32 or int64, got %s", target.dtype)
    check(weight.shape[1] == input.shape[1], op, "weight.size(1) must equal input.size(1)")
    check(vocab_start_index >= 0, op, "vocab_start_index must not be negative")
    check(vocab_end_index >= vocab_start_index, op, "vocab_end_index must not be less than vocab_start_index")
    logits = torch.matmul(input.float(), weight.float().t())
    logits_max = logits.max(-1).values
    shifted = logits - logits_max.unsqueeze(-1)
    sum_exp = torch.exp(shifted).sum(-1)
    mask = (target < vocab_start_index) | (target > vocab_end_index)
    masked_target = torch.where(mask, torch.zeros_like(target), target - vocab_start_index)
    predicted = shifted.gather(1, masked_target.long().unsqueeze(1)).squeeze(1)
    predicted = torch.where(mask, torch.zeros_like(predicted), predicted)
    vocab_logits = logits.to(input.dtype) if return_logits else None
    return logits_max, sum_exp, predicted, _pack_mask(mask), masked_target, vocab_logits


@impl("npu_fused_cross_entropy_loss_with_max_sum")
def npu_fused_cross_entropy_loss_with_max_sum(logits_max, sum_exp_logits, predicted_logits, *, label_smoothing=0.0,
                                              input=None, weight=None, vocab_parallel_logits=None):
    op = "npu_fused_cross_entropy_loss_with_max_sum"
    if label_smoothing not in (None, 0.0):
        unsupported(op, "label_smoothing=%r (only 0.0)" % (label_smoothing,))
    for name, value in (("input", input), ("weight", weight)):
        if value is not None:
            unsupported(op, "%s (only None)" % name)
    check(logits_max.dim() == 1, op, "logits_max must be 1-D, got %dD", logits_max.dim())
    for name, t in (("sum_exp_logits", sum_exp_logits), ("predicted_logits", predicted_logits)):
        check(t.shape == logits_max.shape, op, "%s shape %s must equal logits_max shape %s", (name, tuple(t.shape), tuple(logits_max.shape)))
    loss = torch.log(sum_exp_logits.float()) - predicted_logits.float()
    if vocab_parallel_logits is None:
        return loss, None
    check(vocab_parallel_logits.dim() == 2 and vocab_parallel_logits.shape[0] == logits_max.shape[0], op,
          "vocab_parallel_logits must be 2-D with %d rows", logits_max.shape[0])
    softmax = torch.exp(vocab_parallel_logits.float() - logits_max.float().unsqueeze(-1)) \
        / sum_exp_logits.float().unsqueeze(-1)
    return loss, softmax


@impl("npu_fused_linear_cross_entropy_loss_with_max_sum_backward")
def npu_fused_linear_cross_entropy_loss_with_max_sum_backward(grad, input, weight, target_mask, masked_target,
                                                              label_smoothing=0.0, logits_max=None,
                                                              sum_exp_logits=None, softmax=None):
    op = "npu_fused_linear_cross_entropy_loss_with_max_sum_backward"
    if label_smoothing != 0.0:
        unsupported(op, "label_smoothing=%r (only 0.0)" % (label_smoothing,))
    check(input.dim() == 2 and weight.dim() == 2, op, "input and weight must be 2-D")
    check(input.dtype in (torch.float16, torch.bfloat16) and weight.dtype == input.dtype, op,
          "input and weight must be float16 or bfloat16 of the same dtype")
    check(weight.shape[1] == input.shape[1], op, "weight.size(1) must equal input.size(1)")
    bt = input.shape[0]
    check(grad.dim() == 1 and grad.shape[0] == bt, op, "grad must be 1-D with input.size(0) = %d rows", bt)
    check(masked_target.dim() == 1 and masked_target.shape[0] == bt, op, "masked_target must have %d rows", bt)
    check(target_mask.dim() == 1 and target_mask.dtype == torch.uint8 and target_mask.shape[0] * _BITS >= bt, op,
          "target_mask must be 1-D uint8 holding at least %d bits", bt)
    if softmax is not None:
        check(tuple(softmax.shape) == (bt, weight.shape[0]), op, "softmax must be (%d, %d)", (bt, weight.shape[0]))
        g = softmax.float()
    else:
        check(logits_max is not None and sum_exp_logits is not None, op,
              "logits_max and sum_exp_logits are required when softmax is None")
        logits = torch.matmul(input.float(), weight.float().t())
        g = torch.exp(logits - logits_max.float().unsqueeze(-1)) / sum_exp_logits.float().unsqueeze(-1)
    update = 1 - _unpack_mask(target_mask, bt).to(g.dtype)
    one_hot = torch.zeros_like(g).scatter(1, masked_target.long().unsqueeze(1), update.unsqueeze(1))
    g = (g - one_hot) * grad.float().unsqueeze(-1)
    input_grad = torch.matmul(g, weight.float())
    weight_grad = torch.matmul(g.t(), input.float())
    return input_grad.to(input.dtype), weight_grad.to(input.dtype)
