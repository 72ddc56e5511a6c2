"""npu_block_sparse_attention (+ npu_block_sparse_attention_backward): attention whose
(query block, key block) pairs are switched on and off by a block mask.

For batch b, query head n (key/value head ``n // (N1 / N2)``), query row i and key row j
of that batch (positions counted from the batch's own start)::

    keep(i, j) = block_sparse_mask[b, n, i // block_x, j // block_y] != 0
    x = scale_value * q_i . k_j   where keep, -inf elsewhere
    attention_out_i = softmax(x) @ v,   softmax_lse_i = log(sum_j exp(x_ij))

as documented for aclnnBlockSparseAttention (the op torch_npu calls) and its op-plugin
golden. ``scale_value`` is used as given (0.0, the schema default, makes every kept logit 0).
Rows that keep no key (and rows past ``actual_seq_lengths``, which the kernel never
writes) output zeros and softmax_lse -1e10, as the op-plugin golden does; softmax_lse is
all zeros when ``softmax_lse_flag`` is 0 (the kernel leaves it unwritten).

Layouts: TND ([T, N, D], ``actual_seq_lengths(_kv)`` are per-batch lengths summing to T,
required), BNSD and BSND ([B, N, S, D] / [B, S, N, D], optional lengths <= S). The work
runs on the chunked FlashAttention engine of ``attention.flash``: one (batch) segment at a
time, at most one block of query rows' logits and of the expanded element mask alive.
Computed in float32 for float16/bfloat16 (inner_precise 0 and 1 alike; 1 is fp16 softmax
on the NPU, only less precise), in float64 for float64.

Autograd runs through an ``autograd.Function`` whose backward is the same code as
npu_block_sparse_attention_backward (recomputation from the output and log-sum-exp);
as documented for aclnnBlockSparseAttentionGrad, that backward only supports BNSD with
num_heads == num_key_value_heads and head_dim <= 128.
"""
import torch
from torch.autograd.function import once_differentiable

from torch_npu.op_plugin._common import acc, check
from torch_npu.op_plugin._registry import impl
from torch_npu.op_plugin.attention import flash as flash

__all__ = []

_FWD = "npu_block_sparse_attention"
_BWD = "npu_block_sparse_attention_backward"
_LAYOUTS = ("TND", "BNSD", "BSND")
_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_MASK_DTYPES = (torch.int8, torch.uint8, torch.bool)
# softmax_lse of a row that keeps no key (the op-plugin golden's masked logit value)
_EMPTY_ROW_LSE = -1e10
# Atlas A2/A3 (the emulated device): the key block must be a multiple of the kernel's basic block
_KV_BLOCK_MULTIPLE = 128


def _ceil_div(a, b):
    return (a + b - 1) // b


def _lengths(op, values, what):
    if values is None:
        return None
    values = [int(v) for v in values]
    for v in values:
        check(v >= 0, op, "%s entries must be >= 0, got %d", (what, v))
    return values


class _Geometry:
    """Batches of one call: per batch b the query/key row counts, and views of any
    query-shaped (or key-shaped) tensor as that batch's [1, N, rows, D] slice."""

    def __init__(self, op, query, key, layout, actual_q, actual_kv):
        check(layout in _LAYOUTS, op, "input layout must be one of TND, BNSD, BSND, got %r", (layout,))
        self.layout, self.device = layout, query.device
        want = 3 if layout == "TND" else 4
        check(query.dim() == want and key.dim() == want, op, "query and key must be %d-D for layout %s, got %d-D "
              "and %d-D", (want, layout, query.dim(), key.dim()))
        q_lens = _lengths(op, actual_q, "actual_seq_lengths")
        kv_lens = _lengths(op, actual_kv, "actual_seq_lengths_kv")
        check((q_lens is None) == (kv_lens is None), op,
              "actual_seq_lengths and actual_seq_lengths_kv must be given together")
        if layout == "TND":
            check(q_lens is not None and len(q_lens) > 0, op,
                  "actual_seq_lengths must be specified when q_input_layout is TND")
            check(len(kv_lens) == len(q_lens), op, "actual_seq_lengths_kv has %d entries, actual_seq_lengths %d", (len(kv_lens), len(q_lens)))
            check(sum(q_lens) == query.shape[0], op, "sum of actual_seq_lengths (%d) != query T (%d)", (sum(q_lens), query.shape[0]))
            check(sum(kv_lens) == key.shape[0], op, "sum of actual_seq_lengths_kv (%d) != key T (%d)", (sum(kv_lens), key.shape[0]))
            self.batch = len(q_lens)
            self.q_starts = [sum(q_lens[:b]) for b in range(self.batch)]
            self.kv_starts = [sum(kv_lens[:b]) for b in range(self.batch)]
            self.q_max, self.kv_max = None, None
        else:
            seq = 2 if layout == "BNSD" else 1
            self.batch = query.shape[0]
            check(key.shape[0] == self.batch, op, "key batch %d differs from the query's %d", (key.shape[0], self.batch))
            self.q_max, self.kv_max = query.shape[seq], key.shape[seq]
            if q_lens is None:
                q_lens, kv_lens = [self.q_max] * self.batch, [self.kv_max] * self.batch
            check(len(q_lens) == self.batch and len(kv_lens) == self.batch, op,
                  "actual_seq_lengths / actual_seq_lengths_kv need B=%d entries, got %d / %d", (self.batch, len(q_lens), len(kv_lens)))
            for v in q_lens:
                check(v <= self.q_max, op, "actual_seq_lengths entry %d exceeds the query S %d", (v, self.q_max))
            for v in kv_lens:
                check(v <= self.kv_max, op, "actual_seq_lengths_kv entry %d exceeds the key S %d", (v, self.kv_max))
        self.q_lens, self.kv_lens = q_lens, kv_lens

    def heads(self, t):
        return t.shape[1] if self.layout in ("TND", "BNSD") else t.shape[2]

    def _part(self, x, b, start, rows):
        if self.layout == "TND":
            return x[start:start + rows].transpose(0, 1).unsqueeze(0)
        if self.layout == "BNSD":
            return x[b:b + 1, :, :rows]
        return x[b:b + 1, :rows].transpose(1, 2)

    def q_part(self, x, b):
        """Batch b's valid query rows of a query-shaped tensor (any last dim): a [1, N, S1_b, .] view."""
        return self._part(x, b, self.q_starts[b] if self.layout == "TND" else 0, self.q_lens[b])

    def kv_part(self, x, b):
        return self._part(x, b, self.kv_starts[b] if self.layout == "TND" else 0, self.kv_lens[b])

    def merge(self, parts, like, dtype, fill, key_side=False):
        """A tensor shaped like ``like`` (``dtype``) holding each batch's part, ``fill`` elsewhere."""
        full = like.new_full(like.shape, fill, dtype=dtype)
        for b, p in enumerate(parts):
            view = self.kv_part(full, b) if key_side else self.q_part(full, b)
            view.copy_(p)
        return full


class _BlockRule:
    """The mask of one batch for attention.flash: True where the logit is dropped."""

    def __init__(self, dropped, block_x, block_y, s2):
        self.dropped, self.block_x, self.block_y, self.s2 = dropped, block_x, block_y, s2

    def rows(self, i0, i1, device):
        qi = torch.arange(i0, i1, device=device) // self.block_x
        kj = torch.arange(self.s2, device=device) // self.block_y
        return self.dropped.index_select(2, qi).index_select(3, kj)  # [1, N, rows, S2]


def _check_mask(op, mask, geo, n1, block_x, block_y):
    """block_sparse_mask [B, N1, qBlockNum, kvBlockNum]: qBlockNum = ceil(S/block_x) with S the
    query shape's S (BNSD/BSND) or the longest actual length; likewise for keys."""
    check(mask.device == geo.device, op, "block_sparse_mask is on %s, query on %s", (mask.device, geo.device))
    check(mask.dim() == 4, op, "block_sparse_mask must be 4-D [B, N, qBlockNum, kvBlockNum], got %d-D", mask.dim())
    check(mask.dtype in _MASK_DTYPES, op, "block_sparse_mask must be int8 (or uint8/bool), got %s", mask.dtype)
    q_ok = {_ceil_div(max(geo.q_lens + [0]), block_x)}
    kv_ok = {_ceil_div(max(geo.kv_lens + [0]), block_y)}
    if geo.q_max is not None:
        q_ok.add(_ceil_div(geo.q_max, block_x))
        kv_ok.add(_ceil_div(geo.kv_max, block_y))
    b, n, qb, kb = mask.shape
    check(b == geo.batch and n == n1 and qb in q_ok and kb in kv_ok, op,
          "block_sparse_mask shape %s does not match [B=%d, N=%d, qBlockNum in %s, kvBlockNum in %s]", (tuple(mask.shape), geo.batch, n1, sorted(q_ok), sorted(kv_ok)))


class _Config:
    """Everything about a call but the differentiable tensors."""

    def __init__(self, geo, mask, block_x, block_y, scale, dtype):
        self.geo, self.block_x, self.block_y, self.scale, self.dtype = geo, block_x, block_y, scale, dtype
        self.dropped = mask == 0

    def segments(self, query, key, value):
        geo = self.geo
        return [flash.Segment(geo.q_part(query, b), geo.kv_part(key, b), geo.kv_part(value, b), None,
                              _BlockRule(self.dropped[b:b + 1], self.block_x, self.block_y, geo.kv_lens[b]), b)
                for b in range(geo.batch)]


def _forward(cfg, query, key, value):
    """-> (attention_out in query's dtype, softmax_lse float32 [.., 1], per-batch lse in cfg.dtype)."""
    geo = cfg.geo
    outs, lses = [], []
    for seg in cfg.segments(query, key, value):
        out, _, _, lse = flash.forward(seg, cfg.scale, 1, None, cfg.dtype)
        outs.append(out)
        lses.append(lse)
    attention_out = geo.merge(outs, query, query.dtype, 0.0)
    lse_like = query.new_empty(tuple(query.shape[:-1]) + (1,), dtype=torch.float32)
    # rows that keep no key carry +inf inside the engine; the op reports the golden's -1e10
    shown = [torch.where(torch.isinf(x), torch.full_like(x, _EMPTY_ROW_LSE), x) for x in lses]
    softmax_lse = geo.merge(shown, lse_like, torch.float32, _EMPTY_ROW_LSE)
    return attention_out, softmax_lse, lses


def _check_backward_support(op, cfg, n1, n2, head_dim):
    check(head_dim <= 128, op, "head_dim must be <= 128, but got %d", head_dim)
    check(cfg.geo.layout == "BNSD" and n1 == n2, op,
          "only the BNSD layout with num_heads == num_key_value_heads (MHA) is supported, got layout %s with "
          "%d query heads and %d key/value heads", (cfg.geo.layout, n1, n2))


def _backward(cfg, query, key, value, attention_out, lses, d_out):
    """(dq, dk, dv) shaped and typed like query, key, value; ``lses`` per batch [1, N, S1_b, 1]."""
    geo = cfg.geo
    dqs, dks, dvs = [], [], []
    for b, seg in enumerate(cfg.segments(query, key, value)):
        out = acc(geo.q_part(attention_out, b)).to(cfg.dtype)
        dout = acc(geo.q_part(d_out, b)).to(cfg.dtype)
        dq, dk, dv, _ = flash.backward(seg, cfg.scale, 1, None, cfg.dtype, out, lses[b], dout, False)
        dqs.append(dq)
        dks.append(dk)
        dvs.append(dv)
    return (geo.merge(dqs, query, query.dtype, 0.0), geo.merge(dks, key, key.dtype, 0.0, key_side=True),
            geo.merge(dvs, value, value.dtype, 0.0, key_side=True))


class _BlockSparseAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, query, key, value, cfg):
        attention_out, softmax_lse, lses = _forward(cfg, query, key, value)
        ctx.cfg, ctx.lses = cfg, lses
        ctx.save_for_backward(query, key, value, attention_out)
        ctx.mark_non_differentiable(softmax_lse)
        return attention_out, softmax_lse

    @staticmethod
    @once_differentiable
    def backward(ctx, d_out, _d_lse):
        query, key, value, attention_out = ctx.saved_tensors
        cfg = ctx.cfg
        _check_backward_support(_BWD, cfg, cfg.geo.heads(query), cfg.geo.heads(key), query.shape[-1])
        dq, dk, dv = _backward(cfg, query, key, value, attention_out, ctx.lses, d_out)
        return dq, dk, dv, None


def _check_qkv(op, query, key, value):
    check(query.dtype == key.dtype == value.dtype, op, "query, key, value must have the same dtype, got query=%s, "
          "key=%s, value=%s", (query.dtype, key.dtype, value.dtype))
    check(query.dtype in _DTYPES, op, "query/key/value must be float16 or bfloat16 (float32/float64 are accepted "
          "by the emulator), got %s", query.dtype)
    check(tuple(key.shape) == tuple(value.shape), op, "key shape %s differs from value shape %s", (tuple(key.shape), tuple(value.shape)))
    check(query.shape[-1] == key.shape[-1], op, "query head_dim %d differs from key head_dim %d", (query.shape[-1], key.shape[-1]))


def _check_heads(op, n1, n2, num_key_value_heads):
    check(n2 == num_key_value_heads, op, "key/value have %d heads but num_key_value_heads is %d", (n2, num_key_value_heads))
    check(n2 > 0 and n1 >= n2 and n1 % n2 == 0, op, "query heads N1=%d and key/value heads N2=%d need N1 >= N2 and "
          "N1 %% N2 == 0", (n1, n2))


@impl(_FWD)
def npu_block_sparse_attention(query, key, value, block_sparse_mask, block_shape, *, q_input_layout="TND",
                               kv_input_layout="TND", num_key_value_heads=1, scale_value=0.0, inner_precise=1,
                               actual_seq_lengths=None, actual_seq_lengths_kv=None, softmax_lse_flag=0):
    """Block-sparse attention ``softmax(scale_value * q k^T) @ v`` over the key rows j whose
    ``block_sparse_mask[b, n, i // block_x, j // block_y]`` is nonzero (rows counted per batch;
    key/value head ``n // (N1 / N2)``; ``scale_value`` used as given). Layouts TND (per-batch
    ``actual_seq_lengths(_kv)``, required), BNSD, BSND. Returns ``(attention_out`` like query,
    ``softmax_lse`` float32 [T, N, 1] / [B, N, S, 1] / [B, S, N, 1], zeros when
    ``softmax_lse_flag`` is 0``)``; rows that keep no key give 0 and lse -1e10. float16/bfloat16
    are computed in float32 (inner_precise 0 and 1); autograd as npu_block_sparse_attention_backward."""
    op = _FWD
    _check_qkv(op, query, key, value)
    if query.dtype == torch.bfloat16:
        check(inner_precise == 0, op, "when query/key/value are bfloat16, inner_precise must be 0, got %d", inner_precise)
    check(inner_precise in (0, 1, 4), op, "inner_precise must be 0, 1 or 4, got %d", inner_precise)
    check(inner_precise != 4, op, "inner_precise 4 is only supported on Ascend 950PR/950DT; Atlas A2/A3 support 0 "
          "or 1")
    check(q_input_layout == kv_input_layout, op, "q_input_layout (%s) and kv_input_layout (%s) must be the same", (q_input_layout, kv_input_layout))
    flag = 0 if softmax_lse_flag is None else softmax_lse_flag
    check(flag in (0, 1), op, "softmax_lse_flag must be 0 or 1, got %d", flag)
    check(len(block_shape) == 2, op, "block_shape must hold two elements [block_x, block_y], got %d", len(block_shape))
    block_x, block_y = int(block_shape[0]), int(block_shape[1])
    check(block_x > 0 and block_y > 0, op, "block_shape values must be > 0, got %s", [block_x, block_y])
    check(block_y % _KV_BLOCK_MULTIPLE == 0, op, "block_y must be a multiple of %d on Atlas A2/A3, got %d", (_KV_BLOCK_MULTIPLE, block_y))
    check(query.shape[-1] in (64, 128), op, "head_dim D must be 64 or 128, got %d", query.shape[-1])
    geo = _Geometry(op, query, key, q_input_layout, actual_seq_lengths, actual_seq_lengths_kv)
    n1, n2 = geo.heads(query), geo.heads(key)
    _check_heads(op, n1, n2, num_key_value_heads)
    _check_mask(op, block_sparse_mask, geo, n1, block_x, block_y)
    cfg = _Config(geo, block_sparse_mask, block_x, block_y, float(scale_value), acc(query).dtype)
    attention_out, softmax_lse = _BlockSparseAttention.apply(query, key, value, cfg)
    if flag == 0:
        softmax_lse = torch.zeros_like(softmax_lse)
    return attention_out, softmax_lse


@impl(_BWD)
def npu_block_sparse_attention_backward(d_out, query, key, value, attention_out, softmax_lse, block_sparse_mask,
                                        block_shape=None, actual_seq_lengths=None, actual_seq_lengths_kv=None,
                                        q_input_layout="BNSD", kv_input_layout="BNSD", num_key_value_heads=1,
                                        scale_value=1.0):
    """Explicit backward: ``(dq, dk, dv)`` for upstream ``d_out``, recomputing the probabilities
    as ``exp(scale * q k^T - softmax_lse)`` on the kept blocks (``attention_out`` gives the
    softmax-gradient term ``sum(d_out * attention_out)``). ``block_shape`` None (or fewer than two
    values) means [128, 128]. Only BNSD with num_heads == num_key_value_heads, head_dim <= 128."""
    op = _BWD
    _check_qkv(op, query, key, value)
    check(q_input_layout == kv_input_layout, op, "q_input_layout (%s) and kv_input_layout (%s) must be the same", (q_input_layout, kv_input_layout))
    if block_shape is None or len(block_shape) < 2:
        block_shape = [128, 128]
    block_x, block_y = int(block_shape[0]), int(block_shape[1])
    check(block_x > 0 and block_y > 0, op, "block_shape values must be > 0, got %s", [block_x, block_y])
    geo = _Geometry(op, query, key, q_input_layout, actual_seq_lengths, actual_seq_lengths_kv)
    n1, n2 = geo.heads(query), geo.heads(key)
    _check_heads(op, n1, n2, num_key_value_heads)
    _check_mask(op, block_sparse_mask, geo, n1, block_x, block_y)
    for name, t in (("d_out", d_out), ("attention_out", attention_out)):
        check(tuple(t.shape) == tuple(query.shape), op, "%s shape %s differs from the query's %s", (name, tuple(t.shape), tuple(query.shape)))
    lse_shape = tuple(query.shape[:-1])
    check(tuple(softmax_lse.shape) in (lse_shape, lse_shape + (1,)), op, "softmax_lse must be %s (or without the "
          "trailing 1), got %s", (lse_shape + (1,), tuple(softmax_lse.shape)))
    cfg = _Config(geo, block_sparse_mask, block_x, block_y, float(scale_value), acc(query).dtype)
    _check_backward_support(op, cfg, n1, n2, query.shape[-1])
    lse = softmax_lse.reshape(lse_shape + (1,))
    lses = [geo.q_part(lse, b).to(cfg.dtype) for b in range(geo.batch)]
    with torch.no_grad():
        return _backward(cfg, query, key, value, attention_out, lses, d_out)
