"""Round-4 attention-family ops: npu_lightning_indexer, npu_dense_lightning_indexer_softmax_lse,
npu_sparse_flash_attention,
npu_recurrent_gated_delta_rule(_functional).

References are written here from the documented formulas (per-token float64 loops that
never call the implementation): the indexer score ``sum_h w_h ReLU(q_h . k_j)`` and its
right-down causal mask; sparse attention over the listed key blocks with the -1e12 causal
mask and sinks; the gated delta rule recurrence of the op-plugin golden. CPU and npu inputs,
float32/float16/bfloat16, paged (PA_BSND) keys, TND queries, FakeTensor shapes, gradcheck.
"""
import math

import pytest
import torch

import torch_npu
from torch._subclasses.fake_tensor import FakeTensorMode

DEVICES = ["cpu", "npu"]


def rand(shape, dtype=torch.float32, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g, dtype=torch.float64) * scale).to(dtype)


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

def ref_delta_rule(q, k, v, state, beta, scale, lengths, slots, g, accepted):
    q, k, v = q.double(), k.double(), v.double()
    st = state.double().clone()
    t_, nk, dk = q.shape
    nv = v.shape[1]
    o = torch.zeros(v.shape, dtype=torch.float64)
    start = 0
    for i, n in enumerate(lengths):
        first = start if accepted is None else start + accepted[i] - 1
        for h in range(nv):
            hk = h // (nv // nk)
            s = st[slots[first], h].clone()
            for t in range(start, start + n):
                s = s * (math.exp(float(g[t, h])) if g is not None else 1.0)
                pred = s @ k[t, hk]
                bt = float(beta[t, h]) if beta is not None else 1.0
                s = s + torch.outer((v[t, h] - pred) * bt, k[t, hk])
                st[slots[t], h] = s
                o[t, h] = s @ (q[t, hk] * scale)
        start += n
    return o, st


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 3e-2)])
def test_recurrent_gated_delta_rule(device, dtype, tol):
    lengths, nk, nv, dk, dv = [2, 3, 1], 2, 4, 8, 6
    t = sum(lengths)
    q = torch.nn.functional.normalize(rand((t, nk, dk), seed=20), dim=-1).to(dtype)
    k = torch.nn.functional.normalize(rand((t, nk, dk), seed=21), dim=-1).to(dtype)
    v = rand((t, nv, dv), dtype, 22)
    state = rand((t + 2, nv, dv, dk), dtype, 23, 0.5)
    g = -rand((t, nv), seed=24).abs() * 0.3
    beta = rand((t, nv), seed=25).sigmoid().to(dtype)
    slots = [3, 0, 7, 1, 2, 5]
    accepted = [2, 1, 1]
    args = dict(beta=beta.to(device), scale=0.5, actual_seq_lengths=torch.tensor(lengths, dtype=torch.int32).to(device),
                ssm_state_indices=torch.tensor(slots, dtype=torch.int32).to(device), g=g.to(device),
                num_accepted_tokens=torch.tensor(accepted, dtype=torch.int32).to(device))
    eo, es = ref_delta_rule(q, k, v, state, beta, 0.5, lengths, slots, g, accepted)
    st = state.to(device).clone()
    o = torch_npu.npu_recurrent_gated_delta_rule(q.to(device), k.to(device), v.to(device), st, **args)
    assert o.dtype == dtype and o.device.type == device
    torch.testing.assert_close(o.cpu().double(), eo, rtol=tol, atol=tol)
    torch.testing.assert_close(st.cpu().double(), es, rtol=tol, atol=tol)
    st2 = state.to(device).clone()
    o2, s2 = torch_npu.npu_recurrent_gated_delta_rule_functional(q.to(device), k.to(device), v.to(device), st2, **args)
    assert torch.equal(st2.cpu(), state)  # functional leaves its input alone
    torch.testing.assert_close(o2.cpu().double(), eo, rtol=tol, atol=tol)
    torch.testing.assert_close(s2.cpu().double(), es, rtol=tol, atol=tol)


def test_recurrent_gated_delta_rule_defaults_grad_fake():
    t, nk, nv, dk, dv = 3, 1, 2, 4, 3
    q = rand((t, nk, dk), torch.float64, 30).requires_grad_()
    k = torch.nn.functional.normalize(rand((t, nk, dk), torch.float64, 31), dim=-1).requires_grad_()
    v = rand((t, nv, dv), torch.float64, 32).requires_grad_()
    state = rand((t, nv, dv, dk), torch.float64, 33)
    o, _ = torch_npu.npu_recurrent_gated_delta_rule_functional(q, k, v, state)
    eo, _ = ref_delta_rule(q.detach(), k.detach(), v.detach(), state, None, dk ** -0.5, [t], list(range(t)), None, None)
    torch.testing.assert_close(o.detach(), eo)
    torch.autograd.gradcheck(lambda a, b, c: torch_npu.npu_recurrent_gated_delta_rule_functional(a, b, c, state)[0],
                             (q, k, v))
    with FakeTensorMode():
        o, s = torch_npu.npu_recurrent_gated_delta_rule_functional(
            torch.empty(5, 2, 8), torch.empty(5, 2, 8), torch.empty(5, 4, 6), torch.empty(9, 4, 6, 8))
        assert o.shape == (5, 4, 6) and s.shape == (9, 4, 6, 8)
    with pytest.raises(NotImplementedError, match="gk"):
        torch_npu.npu_recurrent_gated_delta_rule_functional(q.detach(), k.detach(), v.detach(), state,
                                                            gk=torch.zeros(t, nv, dk, dtype=torch.float64))
