"""BERT's ``dropout(softmax(mask + scores / sqrt(head_size)))`` in one call."""
import math

import torch

import torch_npu

__all__ = ["fuse_add_softmax_dropout"]

# Shapes the fused kernel serves on hardware; other shapes take the unfused path (same math).
_FUSED_LAST_DIMS = (128, 256, 384, 512)


def fuse_add_softmax_dropout(training, dropout, attn_mask, attn_scores, attn_head_size, p=0.5, dim=-1):
    """Attention probabilities ``dropout(softmax(attn_mask + attn_scores / sqrt(attn_head_size), -1))``.

    Fused path (scores (n, c, h, w) with h in 128/256/384/512 and n*c a multiple of 32):
    ``npu_dropout_with_add_softmax`` with drop probability ``p`` when ``training`` (0 otherwise).
    Other shapes: the same formula with the ``dropout`` module given. As in torch_npu the
    softmax is always over the last dim (``dim`` is accepted for compatibility).
    """
    n, c, h, _ = attn_scores.size()
    scale = 1 / math.sqrt(attn_head_size)
    if h in _FUSED_LAST_DIMS and (n * c) % 32 == 0:
        drop_p = p if training else 0.
        _, _, attn_probs = torch_npu.npu_dropout_with_add_softmax(attn_scores, attn_mask, scale, drop_p, -1)
        return attn_probs
    attn_scores = torch.add(attn_mask, attn_scores, alpha=scale)
    attn_probs = torch.nn.functional.softmax(attn_scores, dim=-1)
    return dropout(attn_probs)
