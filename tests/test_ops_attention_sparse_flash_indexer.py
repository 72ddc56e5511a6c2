"""Sparse attention ops: npu_lightning_indexer (+ npu_lightning_indexer_grad),
npu_dense_lightning_indexer_softmax_lse, npu_sparse_flash_attention (+ npu_sparse_flash_attention_grad).

References are written here from the documented formulas (per-token float64 loops that
never call the implementation): the indexer score ``sum_h w_h ReLU(q_h . k_j)`` and its
right-down causal mask; sparse attention over the listed key blocks with the -1e12 causal
mask and sinks. CPU and npu inputs,
float32/float16/bfloat16, paged (PA_BSND) keys, TND queries, FakeTensor shapes, gradcheck.
"""
import math

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import torch_npu

from _op_helpers import DEVICES, close_tol as _close, randn_scaled as rand, zeros as _r


# ---------------------------------------------------------------- lightning indexer

def ref_indexer(q, k, w, act_q, act_k, sparse_count, causal):
    """q [B,S1,N1,D], k [B,S2,1,D] (logical keys), w [B,S1,N1] -> int [B,S1,1,count], -1 padded."""
    b_, s1_, n1, _ = q.shape
    out = torch.full((b_, s1_, 1, sparse_count), -1, dtype=torch.int64)
    for b in range(b_):
        sq, sk = act_q[b], act_k[b]
        for i in range(sq):
            scores = []
            for j in range(sk):
                if causal and j > i + sk - sq:
                    continue
                s = sum(float(w[b, i, h]) * max(0.0, float(q[b, i, h].double() @ k[b, j, 0].double()))
                        for h in range(n1))
                scores.append((-s, j))  # descending score, then lower position
            scores.sort()
            for r, (_, j) in enumerate(scores[:sparse_count]):
                out[b, i, 0, r] = j
    return out


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode", [0, 3])
def test_lightning_indexer_bsnd(device, mode):
    b, s1, n1, d, s2 = 2, 3, 4, 8, 9
    q, k, w = rand((b, s1, n1, d), seed=1), rand((b, s2, 1, d), seed=2), rand((b, s1, n1), seed=3)
    act_k = [9, 5]
    act_q = [3, 2]
    idx, vals = torch_npu.npu_lightning_indexer(
        q.to(device), k.to(device), w.to(device), sparse_count=6, sparse_mode=mode,
        actual_seq_lengths_query=torch.tensor(act_q, dtype=torch.int32),
        actual_seq_lengths_key=torch.tensor(act_k, dtype=torch.int32))
    assert idx.dtype == torch.int32 and idx.device.type == device and vals.numel() == 0
    assert torch.equal(idx.cpu().long(), ref_indexer(q, k, w, act_q, act_k, 6, mode == 3))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_lightning_indexer_paged_tnd_low_precision(dtype):
    """TND query (cumulative lengths), paged keys through a shuffled block_table."""
    n1, d, bs = 2, 8, 4
    lens_q, lens_k = [1, 3], [7, 10]
    q = rand((4, n1, d), dtype, seed=4)
    w = rand((4, n1), dtype, seed=5)
    logical = rand((2, 12, 1, d), dtype, seed=6)
    table = torch.tensor([[5, 0, 3], [1, 4, 2]], dtype=torch.int32)
    cache = torch.zeros((6, bs, 1, d), dtype=dtype)
    for b in range(2):
        for j in range(12):
            cache[table[b, j // bs], j % bs] = logical[b, j]
    idx, _ = torch_npu.npu_lightning_indexer(
        q.npu(), cache.npu(), w.npu(), actual_seq_lengths_query=torch.tensor([1, 4], dtype=torch.int32),
        actual_seq_lengths_key=torch.tensor(lens_k, dtype=torch.int32), block_table=table.npu(),
        layout_query="TND", layout_key="PA_BSND", sparse_count=8)
    assert idx.shape == (4, 1, 8)
    qb = torch.zeros((2, 3, n1, d), dtype=dtype)
    wb = torch.zeros((2, 3, n1), dtype=dtype)
    qb[0, :1], qb[1, :3] = q[:1], q[1:]
    wb[0, :1], wb[1, :3] = w[:1], w[1:]
    expect = ref_indexer(qb.float(), logical.float(), wb.float(), lens_q, lens_k, 8, True)
    got = idx.cpu().long()
    assert torch.equal(got[:1], expect[0, :1, :])
    assert torch.equal(got[1:], expect[1, :3, :])


def test_lightning_indexer_fake_and_unsupported():
    with FakeTensorMode():
        idx, _ = torch_npu.npu_lightning_indexer(torch.empty(2, 5, 8, 16), torch.empty(2, 7, 1, 16),
                                                 torch.empty(2, 5, 8), sparse_count=32)
        assert idx.shape == (2, 5, 1, 32) and idx.dtype == torch.int32
    with pytest.raises(NotImplementedError, match="return_value"):
        torch_npu.npu_lightning_indexer(rand((1, 1, 2, 4)), rand((1, 3, 1, 4)), rand((1, 1, 2)), return_value=True)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", ["BSND", "TND"])
def test_dense_lightning_indexer_softmax_lse(device, layout):
    """max / sum(exp(score - max)) of the causal indexer score, per query row (float64 loops)."""
    b, s1, s2, n1, d = 2, 3, 5, 4, 8
    q, k, w = rand((b, s1, n1, d), seed=50), rand((b, s2, 1, d), seed=51), rand((b, s1, n1), seed=52)
    kw = {}
    qi, ki, wi = q, k, w
    if layout == "TND":
        qi, ki, wi = q.flatten(0, 1), k.flatten(0, 1), w.flatten(0, 1)
        kw = dict(actual_seq_qlen=[3, 6], actual_seq_klen=[5, 10])
    m, s = torch_npu.npu_dense_lightning_indexer_softmax_lse(qi.to(device), ki.to(device), wi.to(device),
                                                             layout=layout, **kw)
    em = torch.zeros(b, 1, s1, dtype=torch.float64)
    es = torch.zeros_like(em)
    for bi in range(b):
        for i in range(s1):
            sc = [sum(float(w[bi, i, h]) * max(0.0, float(q[bi, i, h].double() @ k[bi, j, 0].double()))
                      for h in range(n1)) for j in range(s2) if j <= i + s2 - s1]
            em[bi, 0, i] = max(sc)
            es[bi, 0, i] = sum(math.exp(x - max(sc)) for x in sc)
    if layout == "TND":
        em, es = em.permute(1, 0, 2).reshape(1, b * s1), es.permute(1, 0, 2).reshape(1, b * s1)
    assert m.dtype == torch.float32 and m.shape == em.shape and m.device.type == device
    torch.testing.assert_close(m.cpu().double(), em, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(s.cpu().double(), es, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------- sparse flash attention

def ref_sfa(q, k, v, indices, scale, block, act_q, act_k, causal, q_rope=None, k_rope=None, sinks=None):
    """BSND float64 loops. indices [B,S1,1,K] block ids. Returns out, max, sum ([B,1,S1,N1])."""
    b_, s1_, n1, _ = q.shape
    dv = v.shape[-1]
    out = torch.zeros((b_, s1_, n1, dv), dtype=torch.float64)
    mx = torch.zeros((b_, 1, s1_, n1), dtype=torch.float64)
    sm = torch.zeros_like(mx)
    for b in range(b_):
        sq, sk = act_q[b], act_k[b]
        for i in range(sq):
            pos = []
            for blk in indices[b, i, 0].tolist():
                if blk == -1:
                    break
                pos.extend(range(blk * block, min(blk * block + block, sk)))
            for h in range(n1):
                logits = []
                for j in pos:
                    qv, kv = q[b, i, h].double(), k[b, j, 0].double()
                    dot = float(qv @ kv)
                    if q_rope is not None:
                        dot += float(q_rope[b, i, h].double() @ k_rope[b, j, 0].double())
                    x = dot * scale
                    if causal and j >= sk - sq + i + 1:
                        x = -1e12
                    logits.append(x)
                cands = logits + ([float(sinks[h])] if sinks is not None else [])
                if not cands:
                    continue
                m = max(cands)
                e = [math.exp(x - m) for x in logits]
                tot = sum(e) + (math.exp(float(sinks[h]) - m) if sinks is not None else 0.0)
                for p, j in zip(e, pos):
                    out[b, i, h] += p / tot * v[b, j, 0].double()
                mx[b, 0, i, h], sm[b, 0, i, h] = m, tot
    return out, mx, sm


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.float16, 3e-3), (torch.bfloat16, 2e-2)])
def test_sparse_flash_attention_blocks_causal(device, dtype, tol):
    b, s1, n1, d, s2, block = 2, 3, 4, 16, 11, 2
    q, k = rand((b, s1, n1, d), dtype, 7), rand((b, s2, 1, d), dtype, 8)
    v = rand((b, s2, 1, 12), dtype, 9)
    act_q, act_k = [3, 2], [11, 6]
    indices = torch.tensor([[[[4, 0, 5, -1]], [[1, 3, -1, -1]], [[2, 5, 0, 1]]],
                            [[[0, 2, -1, -1]], [[1, -1, -1, -1]], [[-1, -1, -1, -1]]]], dtype=torch.int32)
    out, smax, ssum = torch_npu.npu_sparse_flash_attention(
        q.to(device), k.to(device), v.to(device), indices.to(device), 0.25, sparse_block_size=block,
        actual_seq_lengths_query=torch.tensor(act_q, dtype=torch.int32),
        actual_seq_lengths_kv=torch.tensor(act_k, dtype=torch.int32), return_softmax_lse=True)
    eo, em, es = ref_sfa(q, k, v, indices, 0.25, block, act_q, act_k, True)
    assert out.dtype == dtype and out.shape == (b, s1, n1, 12)
    torch.testing.assert_close(out.cpu().double(), eo, rtol=tol, atol=tol)
    assert smax.shape == (b, 1, s1, n1)
    valid = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.bool).view(b, 1, s1, 1).expand_as(em)
    torch.testing.assert_close(smax.cpu().double()[valid], em[valid], rtol=tol, atol=tol)
    torch.testing.assert_close(ssum.cpu().double()[valid], es[valid], rtol=tol, atol=tol)


def test_sparse_flash_attention_rope_sinks_paged():
    """MLA absorb (value = key nope part), sinks, paged keys, sparse_mode 0."""
    b, s1, n1, d, dr, bs = 1, 2, 4, 8, 4, 4
    q, qr = rand((b, s1, n1, d), seed=10), rand((b, s1, n1, dr), seed=11)
    k, kr = rand((b, 8, 1, d), seed=12), rand((b, 8, 1, dr), seed=13)
    sinks = rand((n1,), seed=14)
    table = torch.tensor([[1, 0]], dtype=torch.int32)
    kc, krc = torch.zeros((2, bs, 1, d)), torch.zeros((2, bs, 1, dr))
    for j in range(8):
        kc[table[0, j // bs], j % bs], krc[table[0, j // bs], j % bs] = k[0, j], kr[0, j]
    indices = torch.tensor([[[[7, 1, 3, -1]], [[0, 6, -1, -1]]]], dtype=torch.int32)
    out, smax, _ = torch_npu.npu_sparse_flash_attention(
        q.npu(), kc.npu(), None, indices.npu(), 0.5, block_table=table.npu(),
        actual_seq_lengths_kv=torch.tensor([8], dtype=torch.int32), query_rope=qr.npu(), key_rope=krc.npu(),
        layout_kv="PA_BSND", sparse_mode=0, attention_mode=2, sinks=sinks.npu())
    eo, _, _ = ref_sfa(q, k, k, indices, 0.5, 1, [2], [8], False, qr, kr, sinks)
    torch.testing.assert_close(out.cpu().double(), eo, rtol=1e-5, atol=1e-5)
    assert smax.numel() == 0


def test_sparse_flash_attention_grad_and_fake():
    b, s1, n1, d, s2 = 1, 2, 2, 4, 5
    q = rand((b, s1, n1, d), torch.float64, 15).requires_grad_()
    k = rand((b, s2, 1, d), torch.float64, 16).requires_grad_()
    indices = torch.tensor([[[[0, 3, 4, -1]], [[2, 1, -1, -1]]]], dtype=torch.int32)
    torch.autograd.gradcheck(lambda a, c: torch_npu.npu_sparse_flash_attention(a, c, c, indices, 0.7)[0], (q, k))
    with FakeTensorMode():
        o, m, s = torch_npu.npu_sparse_flash_attention(torch.empty(6, 4, 32), torch.empty(9, 1, 32),
                                                       torch.empty(9, 1, 16), torch.empty(6, 1, 8, dtype=torch.int32),
                                                       0.1, layout_query="TND", layout_kv="TND",
                                                       return_softmax_lse=True)
        assert o.shape == (6, 4, 16) and m.shape == (1, 6, 4) and s.shape == (1, 6, 4)


# ---------------------------------------------------------------- gated delta rule


ops = torch.ops.npu


f16, bf16, f32, i32 = torch.float16, torch.bfloat16, torch.float32, torch.int32


def _indexer_grad_ref(q, k, dy, idx, w, key_start):
    """Loops of the op-plugin golden: per token, key head, selected slot and query head of the group."""
    tokens, n1, d = q.shape
    n2 = k.shape[1]
    grp = n1 // n2
    dq, dk, dw = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(w)
    for t in range(tokens):
        for n in range(n2):
            for s in range(idx.shape[-1]):
                j = int(idx[t, n, s])
                if j < 0:
                    continue
                row = key_start[t] + j
                for h in range(n * grp, (n + 1) * grp):
                    r = float(q[t, h] @ k[row, n])
                    if r > 0:
                        dq[t, h] += w[t, h] * dy[t, n, s] * k[row, n]
                        dk[row, n] += w[t, h] * dy[t, n, s] * q[t, h]
                        dw[t, h] += r * dy[t, n, s]
    return dq, dk, dw


@pytest.mark.parametrize("device", DEVICES)
def test_lightning_indexer_grad_bsnd(device):
    gen = torch.Generator().manual_seed(20)
    b, s1, s2, n1, n2, d, kk = 2, 3, 6, 4, 2, 8, 3
    q, k = torch.randn(b, s1, n1, d, generator=gen), torch.randn(b, s2, n2, d, generator=gen)
    w = torch.randn(b, s1, n1, generator=gen)
    idx = torch.randint(0, s2, (b, s1, n2, kk), generator=gen, dtype=torch.int32)
    idx[0, 1, 1, 2] = -1
    idx[1, 2, 0, 0] = idx[1, 2, 0, 1]          # a key picked twice accumulates
    dy = torch.randn(b, s1, n2, kk, generator=gen)
    got = torch_npu.npu_lightning_indexer_grad(q.to(device), k.to(device), dy.to(device), idx.to(device),
                                               w.to(device))
    ref = _indexer_grad_ref(q.double().reshape(b * s1, n1, d), k.double().reshape(b * s2, n2, d),
                            dy.double().reshape(b * s1, n2, kk), idx.reshape(b * s1, n2, kk),
                            w.double().reshape(b * s1, n1), [bi * s2 for bi in range(b) for _ in range(s1)])
    for g_, r_, shape in zip(got, ref, (q.shape, k.shape, w.shape)):
        assert g_.shape == shape
        _close(g_, r_.reshape(shape), 1e-5, 1e-5)


@pytest.mark.parametrize("dtype,atol", [(torch.bfloat16, 6e-2), (torch.float16, 1e-2)])
def test_lightning_indexer_grad_tnd_low_precision(dtype, atol):
    gen = torch.Generator().manual_seed(21)
    q, k = torch.randn(5, 4, 16, generator=gen).to(dtype), torch.randn(7, 1, 16, generator=gen).to(dtype)
    w = torch.randn(5, 4, generator=gen).to(dtype)
    idx = torch.tensor([[0, 1], [1, -1], [0, 2], [3, 1], [2, 2]], dtype=torch.int32)   # batches: q 2|3, k 3|4
    dy = torch.randn(5, 2, generator=gen).to(dtype)
    got = torch_npu.npu_lightning_indexer_grad(q.npu(), k.npu(), dy.npu(), idx.npu(), w.npu(),
                                               torch.tensor([2, 5]), torch.tensor([3, 7]), layout="TND")
    ref = _indexer_grad_ref(q.double(), k.double(), dy.double().unsqueeze(1), idx.unsqueeze(1), w.double(),
                            [0, 0, 3, 3, 3])
    assert [g_.dtype for g_ in got] == [dtype] * 3
    for g_, r_ in zip(got, ref):
        _close(g_, r_, atol, 2e-2)


def test_lightning_indexer_grad_fake_and_errors():
    with FakeTensorMode():
        got = ops.npu_lightning_indexer_grad(torch.randn(1, 4, 8, 64).bfloat16(), torch.randn(1, 6, 1, 64).bfloat16(),
                                             torch.randn(1, 4, 1, 2).bfloat16(),
                                             torch.zeros(1, 4, 1, 2, dtype=torch.int32), torch.randn(1, 4, 8).bfloat16())
    assert [tuple(t.shape) for t in got] == [(1, 4, 8, 64), (1, 6, 1, 64), (1, 4, 8)]
    assert all(t.dtype == torch.bfloat16 for t in got)
    with pytest.raises(RuntimeError, match="dy shape"):
        torch_npu.npu_lightning_indexer_grad(torch.randn(1, 2, 2, 8), torch.randn(1, 3, 1, 8), torch.randn(1, 2, 3),
                                             torch.zeros(1, 2, 2, dtype=torch.int32), torch.randn(1, 2, 2))
    with pytest.raises(RuntimeError, match="actual_seq_lengths_query is required"):
        torch_npu.npu_lightning_indexer_grad(torch.randn(2, 2, 8), torch.randn(3, 1, 8), torch.randn(2, 2),
                                             torch.zeros(2, 2, dtype=torch.int32), torch.randn(2, 2), layout="TND")


def _sfa_ref(q, k, v, qr, kr, idx, scale, block, sparse_mode, q_lens, kv_lens, q_starts, kv_starts):
    """Documented sparse attention, float64 torch ops per (batch, key head, query row): positions of
    the listed blocks up to the first -1 and below the key length; sparse_mode 3 fills positions
    after the right-down causal limit with -1e12."""
    rows, n1, _ = q.shape
    n2 = k.shape[1]
    grp = n1 // n2
    qa = torch.cat([q, qr], -1) if qr is not None else q
    ka = torch.cat([k, kr], -1) if kr is not None else k
    out = [None] * rows
    for b, (s1, s2) in enumerate(zip(q_lens, kv_lens)):
        for i in range(s1):
            r = q_starts[b] + i
            heads_out = []
            for h in range(n2):
                pos = []
                for blk in idx[r, h].tolist():
                    if blk < 0:
                        break
                    pos += [blk * block + j for j in range(block) if blk * block + j < s2]
                rows_k = [kv_starts[b] + j for j in pos]
                logit = qa[r, h * grp:(h + 1) * grp] @ ka[rows_k, h].t() * scale
                if sparse_mode == 3:
                    late = torch.tensor([j >= s2 - s1 + i + 1 for j in pos])
                    logit = torch.where(late, torch.full_like(logit, -1e12), logit)
                heads_out.append(torch.softmax(logit, -1) @ v[rows_k, h])
            out[r] = torch.cat(heads_out)
    return torch.stack(out)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout,sparse_mode,rope", [("BSND", 3, True), ("TND", 0, False), ("TND", 3, True)])
def test_sparse_flash_attention_grad(device, layout, sparse_mode, rope):
    gen = torch.Generator().manual_seed(27)
    n1, n2, d, dr, dv, block = 4, 2, 8, 4, 6, 2
    q_lens, kv_lens = [3, 2], [7, 5]
    rnd = lambda *s: torch.randn(*s, generator=gen, dtype=torch.float64)  # noqa: E731
    if layout == "BSND":
        q, qr = rnd(2, 3, n1, d), rnd(2, 3, n1, dr)
        k, kr, v = rnd(2, 7, n2, d), rnd(2, 7, n2, dr), rnd(2, 7, n2, dv)
        idx = torch.tensor([[[[0, 2, -1], [3, 1, 0]], [[1, -1, 2], [2, 0, 3]], [[3, 0, 1], [1, 1, -1]]],
                            [[[0, 1, 2], [2, -1, -1]], [[1, 0, -1], [0, 2, 1]], [[0, 0, 0], [0, 0, 0]]]],
                           dtype=torch.int32)
        lens = dict(actual_seq_qlen=None, actual_seq_kvlen=torch.tensor([7, 5]))
        fwd_lens = dict(actual_seq_lengths_query=None, actual_seq_lengths_kv=torch.tensor([7, 5]))
        flat = lambda t: t.flatten(0, 1)  # noqa: E731
        q_starts, kv_starts, ref_q_lens = [0, 3], [0, 7], [3, 3]
    else:
        q, qr = rnd(5, n1, d), rnd(5, n1, dr)
        k, kr, v = rnd(12, n2, d), rnd(12, n2, dr), rnd(12, n2, dv)
        idx = torch.tensor([[[0, 2, -1], [3, 1, 0]], [[1, -1, 2], [2, 0, 3]], [[3, 0, 1], [1, 1, -1]],
                            [[0, 1, 2], [2, -1, -1]], [[1, 0, -1], [0, 2, 1]]], dtype=torch.int32)
        lens = dict(actual_seq_qlen=torch.tensor([3, 5]), actual_seq_kvlen=torch.tensor([7, 12]))
        fwd_lens = dict(actual_seq_lengths_query=lens["actual_seq_qlen"], actual_seq_lengths_kv=lens["actual_seq_kvlen"])
        flat = lambda t: t  # noqa: E731
        q_starts, kv_starts, ref_q_lens = [0, 3], [0, 7], q_lens
    if not rope:
        qr = kr = None
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v) + ((qr, kr) if rope else ())]
    lq, lk, lv = leaves[:3]
    lqr, lkr = (leaves[3], leaves[4]) if rope else (None, None)
    ref = _sfa_ref(flat(lq), flat(lk), flat(lv), None if lqr is None else flat(lqr),
                   None if lkr is None else flat(lkr), flat(idx), 0.3, block, sparse_mode, ref_q_lens, kv_lens,
                   q_starts, kv_starts)
    d_out = rnd(*ref.shape)
    r_grads = torch.autograd.grad(ref, leaves, d_out)
    dv_ = lambda t: None if t is None else t.to(device)  # noqa: E731
    layout_kw = dict(layout_query=layout, layout_kv=layout)
    out, smax, ssum = torch_npu.npu_sparse_flash_attention(
        dv_(q), dv_(k), dv_(v), dv_(idx), 0.3, query_rope=dv_(qr), key_rope=dv_(kr), sparse_block_size=block,
        sparse_mode=sparse_mode, return_softmax_lse=True, attention_mode=2 if rope else 0,
        **{kk: dv_(vv) for kk, vv in fwd_lens.items()}, **layout_kw)
    d_out_shaped = d_out.reshape(out.shape)
    got = torch_npu.npu_sparse_flash_attention_grad(
        dv_(q), dv_(k), dv_(v), dv_(idx), dv_(d_out_shaped), out, smax, ssum, 0.3, block, query_rope=dv_(qr),
        key_rope=dv_(kr), layout=layout, sparse_mode=sparse_mode, attention_mode=2 if rope else 0,
        **{kk: dv_(vv) for kk, vv in lens.items()})
    expected = list(r_grads[:3]) + (list(r_grads[3:]) if rope else [None, None])
    for g_, r_ in zip(got, expected):
        if r_ is None:
            assert g_.shape == (0,)
        else:
            _close(g_, r_, 1e-6, 1e-6)


def test_sparse_flash_attention_grad_fake_and_errors():
    with FakeTensorMode():
        got = ops.npu_sparse_flash_attention_grad(
            _r(1, 4, 8, 512, dtype=bf16), _r(1, 6, 1, 512, dtype=bf16), _r(1, 6, 1, 512, dtype=bf16),
            _r(1, 4, 1, 2, dtype=i32), _r(1, 4, 8, 512, dtype=bf16), _r(1, 4, 8, 512, dtype=bf16), _r(1, 1, 4, 8),
            _r(1, 1, 4, 8), 0.1, 1, query_rope=_r(1, 4, 8, 64, dtype=bf16), key_rope=_r(1, 6, 1, 64, dtype=bf16),
            attention_mode=2)
    assert [(tuple(t.shape), t.dtype) for t in got] == [((1, 4, 8, 512), bf16), ((1, 6, 1, 512), bf16),
                                                        ((1, 6, 1, 512), bf16), ((1, 4, 8, 64), bf16),
                                                        ((1, 6, 1, 64), bf16)]
    with pytest.raises(RuntimeError, match="query_rope and key_rope go together"):
        torch_npu.npu_sparse_flash_attention_grad(_r(1, 2, 2, 8), _r(1, 3, 1, 8), _r(1, 3, 1, 8),
                                                  _r(1, 2, 1, 1, dtype=i32), _r(1, 2, 2, 8), _r(1, 2, 2, 8),
                                                  _r(1, 1, 2, 2), _r(1, 1, 2, 2), 1.0, 1, query_rope=_r(1, 2, 2, 4))
