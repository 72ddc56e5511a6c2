"""Layouts shared by the sparse flash attention and lightning indexer ops (no op of its own).

Queries come as BSND [B, S1, N, D] or TND [T1, N, D] (``actual_seq_lengths_query`` then holds
cumulative token counts and gives B); keys as BSND, TND (cumulative
``actual_seq_lengths_kv``) or PA_BSND [block_num, block_size, N, D] read through
``block_table[b]`` (logical key j of batch b is row ``j % block_size`` of block
``block_table[b, j // block_size]``), as documented for npu_lightning_indexer /
npu_sparse_flash_attention. Lengths are read on the host.
"""
import torch

from torch_npu.op_plugin._common import check

__all__ = []


def host_list(op, t, what):
    if t is None:
        return None
    if isinstance(t, (list, tuple)):
        return [int(x) for x in t]
    check(t.dim() == 1, op, "%s must be 1-D, got %d-D", (what, t.dim()))
    return [int(x) for x in t.tolist()]


def _diffs(cum):
    return [c - p for p, c in zip([0] + cum[:-1], cum)]


class QueryRows:
    """Per batch: (start row in the flattened [rows, N, D] query, valid rows)."""

    def __init__(self, op, query, layout, actual_seq_lengths_query):
        self.layout = layout
        lengths = host_list(op, actual_seq_lengths_query, "actual_seq_lengths_query")
        if layout == "BSND":
            check(query.dim() == 4, op, "query must be 4-D for layout BSND, got %d-D", query.dim())
            b, s1 = query.shape[0], query.shape[1]
            if lengths is None:
                lengths = [s1] * b
            check(len(lengths) == b, op, "actual_seq_lengths_query needs B=%d entries, got %d", (b, len(lengths)))
            for n in lengths:
                check(0 <= n <= s1, op, "actual_seq_lengths_query entries must be in [0, %d], got %d", (s1, n))
            self.starts = [i * s1 for i in range(b)]
            self.lengths = lengths
        elif layout == "TND":
            check(query.dim() == 3, op, "query must be 3-D for layout TND, got %d-D", query.dim())
            check(lengths is not None, op, "actual_seq_lengths_query is required for layout TND")
            check(all(x <= y for x, y in zip(lengths, lengths[1:])) and (not lengths or lengths[-1] <= query.shape[0]),
                  op, "actual_seq_lengths_query must be non-decreasing cumulative counts <= T1=%d", query.shape[0])
            self.starts = [0] + lengths[:-1]
            self.lengths = _diffs(lengths)
        else:
            raise NotImplementedError("%s: layout_query %r is not emulated (supported: BSND, TND)" % (op, layout))
        self.batch = len(self.lengths)

    def flat(self, x):
        """[B, S, ...] or [T, ...] -> [rows, ...] (a view)."""
        return x.flatten(0, 1) if self.layout == "BSND" else x


class KeyRows:
    """Per batch b: ``keys(x, b)`` -> the valid [S2_b, N, D] rows of a key-shaped tensor ``x``."""

    def __init__(self, op, key, layout, actual_seq_lengths_kv, block_table, batch):
        self.op, self.layout = op, layout
        lengths = host_list(op, actual_seq_lengths_kv, "actual_seq_lengths_kv")
        if layout == "BSND":
            check(key.dim() == 4, op, "key must be 4-D for layout BSND, got %d-D", key.dim())
            check(key.shape[0] == batch, op, "key batch %d differs from the query's %d", (key.shape[0], batch))
            s2 = key.shape[1]
            lengths = [s2] * batch if lengths is None else lengths
            for n in lengths:
                check(0 <= n <= s2, op, "actual_seq_lengths_kv entries must be in [0, %d], got %d", (s2, n))
            self.starts = [0] * batch
        elif layout == "TND":
            check(key.dim() == 3, op, "key must be 3-D for layout TND, got %d-D", key.dim())
            check(lengths is not None, op, "actual_seq_lengths_kv is required for layout TND")
            self.starts = [0] + lengths[:-1]
            lengths = _diffs(lengths)
        elif layout == "PA_BSND":
            check(key.dim() == 4, op, "key must be 4-D [block_num, block_size, N, D] for PA_BSND, got %d-D", key.dim())
            check(lengths is not None and block_table is not None, op,
                  "PA_BSND needs actual_seq_lengths_kv and block_table")
            check(block_table.dim() == 2 and block_table.shape[0] == batch, op,
                  "block_table must be 2-D with B=%d rows", batch)
            bs = key.shape[1]
            need = max([(n + bs - 1) // bs for n in lengths] + [0])
            check(block_table.shape[1] >= need, op, "block_table has %d columns, the longest sequence needs %d", (block_table.shape[1], need))
            self.table = block_table.tolist()
            self.starts = [0] * batch
        else:
            raise NotImplementedError("%s: key layout %r is not emulated (supported: BSND, TND, PA_BSND)" % (op, layout))
        check(len(lengths) == batch, op, "actual_seq_lengths_kv needs B=%d entries, got %d", (batch, len(lengths)))
        self.lengths = lengths

    def keys(self, x, b):
        n = self.lengths[b]
        if self.layout == "BSND":
            return x[b, :n]
        if self.layout == "TND":
            return x[self.starts[b]:self.starts[b] + n]
        bs = x.shape[1]
        blocks = self.table[b][:(n + bs - 1) // bs]
        idx = torch.tensor(blocks, dtype=torch.long, device=x.device)
        return x.index_select(0, idx).flatten(0, 1)[:n]
