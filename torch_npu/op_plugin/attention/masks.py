"""Which logits FlashAttention masks, per ``sparse_mode`` (npu_fusion_attention / _v2).

A mask is built for a block of query rows ``[i0, i1)`` of one segment (all batches of a
fixed-length call, or one batch of a TND varlen call), so a score matrix is never masked
by a tensor larger than the block. True = masked (the logit does not take part).

Documented semantics (torch_npu ``npu_fusion_attention``; ``d = j - i`` for query row i,
key column j, ``S1``/``S2`` the segment's query/key lengths):

* ``atten_mask`` None: no mask at all, whatever ``sparse_mode``/``pre``/``next`` say
  ("fixed to full computation").
* 0 defaultMask: ``atten_mask`` as given, plus the band ``-pre <= d <= next`` (origin top-left).
* 1 allMask: ``atten_mask`` as given; pre/next ignored.
* 2 leftUpCausal: ``d > 0`` masked. 3 rightDownCausal: ``d > S2 - S1`` masked.
* 4 band, origin bottom-right: keep ``-pre <= d - (S2 - S1) <= next``.
* 5 / 6 prefix: rightDownCausal, plus the first ``prefix[b]`` key columns of batch b kept.
* 7 (TND only): rightDownCausal for every batch but the last, which is band (mode 4).
* 8 (TND only): leftUpCausal for every batch but the first, which is band (mode 4).

For modes 2-4 and 6-8 the mask passed is the compressed 2048x2048 (3072x2048) template
and is not read; modes 0/1 use the given mask; mode 5 is built from ``prefix`` (the full
mask passed must agree with it, as the spec requires).
"""
import torch

__all__ = []


def _rel(i0, i1, s2, device):
    """``j - i`` for rows [i0, i1) and all key columns: [rows, S2] int64."""
    i = torch.arange(i0, i1, device=device).unsqueeze(1)
    j = torch.arange(s2, device=device).unsqueeze(0)
    return j - i


def _outside(rel, lo, hi):
    """Masked where ``j - i`` lies outside [lo, hi]."""
    return (rel > hi) | (rel < lo)


class SegmentMask:
    """Mask rule of one segment. ``user`` is the bool atten_mask already shaped to
    broadcast against [b, N, S1, S2] (4-D) or None; ``prefix`` a [b] int64 tensor or None."""

    def __init__(self, sparse_mode, s1, s2, user, pre, nxt, prefix=None, position="only"):
        self.mode = sparse_mode
        self.s1, self.s2 = s1, s2
        self.user = user
        self.pre, self.nxt = pre, nxt
        self.prefix = prefix
        self.position = position  # for modes 7/8: "first", "last", "only", "middle"

    def rows(self, i0, i1, device):
        """bool mask broadcastable to [b, N, i1 - i0, S2], or None (nothing masked)."""
        mode, s1, s2 = self.mode, self.s1, self.s2
        if self.user is None:
            return None
        shift = s2 - s1
        if mode in (0, 1):
            user = self.user
            if user.shape[-2] != 1:
                user = user[..., i0:i1, :]
            if mode == 1 or (self.pre >= s1 and self.nxt >= s2):
                return user
            return user | _outside(_rel(i0, i1, s2, device), -self.pre, self.nxt)
        rel = _rel(i0, i1, s2, device)
        if mode == 2:
            return rel > 0
        if mode == 3:
            return rel > shift
        if mode == 4:
            return _outside(rel - shift, -self.pre, self.nxt)
        if mode in (5, 6):
            causal = rel > shift
            j = torch.arange(s2, device=device)
            beyond_prefix = j.view(1, 1, 1, s2) >= self.prefix.to(device).view(-1, 1, 1, 1)
            return causal & beyond_prefix
        if mode == 7:
            if self.position in ("last", "only"):
                return _outside(rel - shift, -self.pre, self.nxt)
            return rel > shift
        if mode == 8:
            if self.position in ("first", "only"):
                return _outside(rel - shift, -self.pre, self.nxt)
            return rel > 0
        raise AssertionError("sparse_mode %d" % mode)
