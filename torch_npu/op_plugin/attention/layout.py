"""From npu_fusion_attention's arguments to engine segments, and back to its layouts.

``Plan`` validates the arguments (with torch_npu's own error texts where known), then
cuts query / key / value (and dy, out, gradients) into ``attention.flash.Segment`` views:

* BSH / SBH / BSND / BNSD: one segment [B, N, S, D] for the whole batch;
* TND (varlen): one segment [1, N, S_b, D] per batch b, rows ``[ends[b-1], ends[b])`` of
  the packed T axis, from the cumulative ``actual_seq_qlen`` / ``actual_seq_kvlen`` (trailing
  zeros = batches that take no part, as documented). Rows of T past the last end get zeros.
"""
import torch

from torch_npu.op_plugin._common import check, unsupported
from torch_npu.op_plugin.attention.flash import from_bnsd, Segment, to_bnsd
from torch_npu.op_plugin.attention.masks import SegmentMask

__all__ = []

LAYOUTS = ("BSH", "SBH", "BSND", "BNSD", "TND")


def _ranges(op, ends, what, total):
    ends = [int(e) for e in ends]
    while len(ends) > 1 and ends[-1] == 0:  # trailing batches that do not take part
        ends.pop()
    out, start = [], 0
    for e in ends:
        check(e >= start, op, "%s must be non-decreasing cumulative lengths, got %s", (what, ends))
        out.append((start, e))
        start = e
    check(start <= total, op, "%s ends at %d but the tensor has only %d tokens", (what, start, total))
    return out


def _bool(mask):
    return mask if mask.dtype == torch.bool else mask != 0


class Plan:
    def __init__(self, op, query, key, value, head_num, input_layout, pse, atten_mask, pre_tokens,
                 next_tokens, prefix, actual_seq_qlen, actual_seq_kvlen, sparse_mode):
        layout = input_layout.upper()
        check(layout in LAYOUTS, op, "The input_layout should be BSH/SBH/BNSD/BSND/TND(case-insensitive), "
              "but got %s", input_layout)
        for name, t in (("query", query), ("key", key), ("value", value)):
            check(t.dim() in (3, 4), op, "The shapes of the input %s should be 3 or 4 dimensional, but got "
                  "%d-dimensional", (name, t.dim()))
        check(head_num > 0, op, "head_num must be positive, got %d", head_num)
        check(query.dtype == key.dtype == value.dtype, op, "query, key and value must have one dtype")
        check(tuple(key.shape) == tuple(value.shape), op, "key %s and value %s shapes differ", (tuple(key.shape), tuple(value.shape)))
        if layout == "TND":
            check(0 <= sparse_mode < 5 or 5 < sparse_mode <= 8, op,
                  "The sparse_mode value must be in range of [0,5) or (5,8], but got %d", sparse_mode)
            check(actual_seq_qlen is not None and actual_seq_kvlen is not None and len(actual_seq_qlen) > 0
                  and len(actual_seq_qlen) == len(actual_seq_kvlen), op,
                  "the size of actual_seq_qlen and actual_seq_kvlen must be the same and cannot be empty.")
        else:
            check(0 <= sparse_mode <= 6, op, "The sparse_mode value must be in range of [0,6], but got %d", sparse_mode)
        self.op, self.layout, self.head_num = op, layout, head_num
        self.sparse_mode, self.pre, self.next = sparse_mode, pre_tokens, next_tokens
        self.prefix = None if prefix is None else [int(p) for p in prefix]
        self.atten_mask = None if atten_mask is None else _bool(atten_mask)
        if layout == "TND":
            self._init_tnd(query, key, pse, actual_seq_qlen, actual_seq_kvlen)
        else:
            self._init_fixed(query, key, pse)

    # ------------------------------------------------------------------ shapes

    def _init_fixed(self, query, key, pse):
        op, layout, n = self.op, self.layout, self.head_num
        if layout in ("BSH", "SBH"):
            check(query.dim() == 3, op, "query must be 3-D for layout %s", layout)
            check(query.shape[2] % n == 0, op, "query hidden size %d is not divisible by head_num %d", (query.shape[2], n))
            self.head_dim = query.shape[2] // n
        else:
            check(query.dim() == 4, op, "query must be 4-D for layout %s", layout)
            self.head_dim = query.shape[3]
        q = to_bnsd(op, query, layout, self.head_dim, "query")
        k = to_bnsd(op, key, layout, self.head_dim, "key")
        b, nq, s1, _ = q.shape
        n_kv, s2 = k.shape[1], k.shape[2]
        check(nq == n, op, "query has %d heads but head_num is %d", (nq, n))
        check(k.shape[0] == b, op, "key batch %d differs from the query's %d", (k.shape[0], b))
        check(n_kv > 0 and n % n_kv == 0, op, "head_num %d is not divisible by the key/value heads %d", (n, n_kv))
        self.b, self.s1, self.s2, self.n_kv = b, s1, s2, n_kv
        self.numels = b * n * s1 * s2
        if pse is not None:
            check(1 <= pse.dim() <= 4, op, "pse must be 1-D to 4-D, got %d-D", pse.dim())
            shape = (1,) * (4 - pse.dim()) + tuple(pse.shape)
            if shape[2] not in (1, s1):
                unsupported(op, "the compressed alibi pse (%d rows for S1 = %d)" % (shape[2], s1))
            try:
                torch.broadcast_shapes(shape, (b, n, s1, s2))
            except RuntimeError:
                check(False, op, "pse shape %s does not broadcast to [B, N, S1, S2] = [%d, %d, %d, %d]", (tuple(pse.shape), b, n, s1, s2))
            check(shape[3] == s2, op, "pse last dim %d differs from S2 = %d", (shape[3], s2))
        user = self.atten_mask
        if user is not None:
            check(user.dim() in (2, 4), op, "atten_mask must be 2-D (SS) or 4-D (BNSS/B1SS/11SS), got %d-D", user.dim())
            user = user.view(1, 1, *user.shape) if user.dim() == 2 else user
            if self.sparse_mode in (0, 1):
                try:
                    torch.broadcast_shapes(tuple(user.shape), (b, n, s1, s2))
                except RuntimeError:
                    check(False, op, "atten_mask shape %s does not broadcast to [B, N, S1, S2] = [%d, %d, %d, %d]", (tuple(self.atten_mask.shape), b, n, s1, s2))
        prefix = None
        if self.sparse_mode in (5, 6) and user is not None:
            check(self.prefix is not None and len(self.prefix) == b, op,
                  "sparse_mode %d needs prefix with one entry per batch (B = %d)", (self.sparse_mode, b))
            prefix = torch.tensor(self.prefix, dtype=torch.long)
        self.masks = [SegmentMask(self.sparse_mode, s1, s2, user, self.pre, self.next, prefix)]

    def _init_tnd(self, query, key, pse, qlen, kvlen):
        op, n = self.op, self.head_num
        check(query.dim() == 3 and key.dim() == 3, op, "query, key and value must be 3-D [T, N, D] for layout TND")
        check(query.shape[1] == n, op, "query has %d heads but head_num is %d", (query.shape[1], n))
        check(key.shape[2] == query.shape[2], op, "key head dim %d differs from the query's %d", (key.shape[2], query.shape[2]))
        n_kv = key.shape[1]
        check(n_kv > 0 and n % n_kv == 0, op, "head_num %d is not divisible by the key/value heads %d", (n, n_kv))
        if pse is not None:
            unsupported(op, "pse with input_layout TND (only the compressed alibi form is allowed there)")
        self.head_dim, self.n_kv = query.shape[2], n_kv
        self.q_ranges = _ranges(op, qlen, "actual_seq_qlen", query.shape[0])
        self.kv_ranges = _ranges(op, kvlen, "actual_seq_kvlen", key.shape[0])
        check(len(self.q_ranges) == len(self.kv_ranges), op,
              "actual_seq_qlen and actual_seq_kvlen describe %d and %d batches", (len(self.q_ranges), len(self.kv_ranges)))
        self.numels = n * sum((qe - qs) * (ke - ks) for (qs, qe), (ks, ke) in zip(self.q_ranges, self.kv_ranges))
        user = self.atten_mask
        if user is not None and self.sparse_mode in (0, 1):
            check(user.dim() == 2, op, "atten_mask must be 2-D [maxSq, maxSkv] for layout TND, got %d-D", user.dim())
            max_q = max(qe - qs for qs, qe in self.q_ranges)
            max_kv = max(ke - ks for ks, ke in self.kv_ranges)
            check(user.shape[0] >= max_q and user.shape[1] >= max_kv, op,
                  "atten_mask shape %s is smaller than [maxSq, maxSkv] = [%d, %d]", (tuple(user.shape), max_q, max_kv))
        if self.sparse_mode == 6 and user is not None:
            check(self.prefix is not None and len(self.prefix) >= len(self.q_ranges), op,
                  "sparse_mode 6 needs prefix with one entry per batch (B = %d)", len(self.q_ranges))
        count = len(self.q_ranges)
        self.masks = []
        for i, ((qs, qe), (ks, ke)) in enumerate(zip(self.q_ranges, self.kv_ranges)):
            sq, skv = qe - qs, ke - ks
            seg_user = user
            if user is not None and self.sparse_mode in (0, 1):
                seg_user = user[:sq, :skv].view(1, 1, sq, skv)
            position = "only" if count == 1 else ("first" if i == 0 else ("last" if i == count - 1 else "middle"))
            prefix = torch.tensor([self.prefix[i]], dtype=torch.long) if (self.sparse_mode == 6 and user is not None) \
                else None
            self.masks.append(SegmentMask(self.sparse_mode, sq, skv, seg_user, self.pre, self.next, prefix, position))

    # ------------------------------------------------------------- splitting

    def split_q(self, x):
        """query-shaped tensor (query, dy, out) -> per-segment [b, N, S1, D] views."""
        if self.layout == "TND":
            return [x[s:e].transpose(0, 1).unsqueeze(0) for s, e in self.q_ranges]
        return [to_bnsd(self.op, x, self.layout, x.shape[-1] if x.dim() == 4 else x.shape[-1] // self.head_num,
                        "query")]

    def split_kv(self, x):
        if self.layout == "TND":
            return [x[s:e].transpose(0, 1).unsqueeze(0) for s, e in self.kv_ranges]
        return [to_bnsd(self.op, x, self.layout, self.head_dim, "key")]

    def segments(self, query, key, value, pse):
        pse4 = None if pse is None else pse.view((1,) * (4 - pse.dim()) + tuple(pse.shape))
        return [Segment(q, k, v, pse4, mask, i) for i, (q, k, v, mask) in
                enumerate(zip(self.split_q(query), self.split_kv(key), self.split_kv(value), self.masks))]

    # --------------------------------------------------------------- merging

    def _merge(self, parts, ranges, total, like):
        if self.layout != "TND":
            return from_bnsd(parts[0], self.layout)
        n, d = parts[0].shape[1], parts[0].shape[3]
        out = torch.zeros(total, n, d, dtype=parts[0].dtype, device=like.device)
        for (s, e), part in zip(ranges, parts):
            out[s:e] = part[0].transpose(0, 1)
        return out

    def merge_q(self, parts, query):
        return self._merge(parts, getattr(self, "q_ranges", None), query.shape[0], query)

    def merge_kv(self, parts, key):
        return self._merge(parts, getattr(self, "kv_ranges", None), key.shape[0], key)

    def merge_stats(self, parts, query):
        """per-segment [b, N, S1] row statistics -> float32 (float64 for float64 inputs)
        [B, N, S1, 8] (or [T, N, 8] for TND), repeated over the last dim as the NPU stores them."""
        sdt = torch.float64 if query.dtype == torch.float64 else torch.float32
        if self.layout != "TND":
            st = parts[0]
        else:
            st = torch.zeros(query.shape[0], self.head_num, dtype=parts[0].dtype, device=query.device)
            for (s, e), part in zip(self.q_ranges, parts):
                st[s:e] = part[0].transpose(0, 1)
        return st.to(sdt).unsqueeze(-1).expand(*st.shape, 8).contiguous()
