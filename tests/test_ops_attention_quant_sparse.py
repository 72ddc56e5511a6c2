"""npu_quant_lightning_indexer and npu_kv_quant_sparse_flash_attention against
float64 loops of the documented formulas (torch_npu docs; dequant of the combined per-tile cache as
in the op-plugin golden), on CPU and npu tensors, plus FakeTensor shapes and error cases."""
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import torch_npu

from _op_helpers import DEVICES, generator as gen


# ----------------------------------------------------------------------------- indexer

def indexer_reference(q, k, w, qs, ks, act_q, act_k, sparse_count, causal):
    """Per batch: q [S1, N1, D], k [S2, N2, D] (valid rows), w/qs [S1, N1], ks [S2, N2].
    Returns [B][S1][N2] of (top-k key indices, -1 padded; float64 score of every key)."""
    out = []
    for b in range(len(q)):
        qb, kb, wb, qsb, ksb = (t.double() for t in (q[b], k[b], w[b], qs[b], ks[b]))
        s1, n1, _ = qb.shape
        s2, n2 = kb.shape[0], kb.shape[1]
        g = n1 // n2
        rows = []
        for i in range(s1):
            heads = []
            for h2 in range(n2):
                scores = []
                for j in range(s2):
                    if causal and j > i + s2 - s1:
                        scores.append(float("-inf"))
                        continue
                    total = 0.0
                    for h in range(h2 * g, (h2 + 1) * g):
                        dot = float((qb[i, h] * kb[j, h2]).sum())
                        total += float(wb[i, h]) * max(0.0, float(qsb[i, h]) * float(ksb[j, h2]) * dot)
                    scores.append(total)
                order = sorted(range(s2), key=lambda j: (-scores[j], j))
                picked = [j if scores[j] != float("-inf") else -1 for j in order][:sparse_count]
                heads.append((picked + [-1] * (sparse_count - len(picked)), scores))
            rows.append(heads)
        out.append(rows)
    return out


def assert_topk(got_rows, ref_rows):
    """got_rows [S1, N2, K] int32 for one batch's valid rows. The -1 slots must match exactly and
    the float64 scores at the returned positions must equal the reference's sorted top-k scores
    (a valid descending top-k); the indices themselves must match in >= 99% of slots."""
    same = total = 0
    for i, heads in enumerate(ref_rows):
        for h2, (ref_idx, scores) in enumerate(heads):
            got = got_rows[i, h2].tolist()
            assert [x == -1 for x in got] == [x == -1 for x in ref_idx], (i, h2, got, ref_idx)
            got_scores = torch.tensor([scores[j] for j in got if j >= 0], dtype=torch.float64)
            ref_scores = torch.tensor([scores[j] for j in ref_idx if j >= 0], dtype=torch.float64)
            scale = max(1e-30, max((abs(s) for s in scores if s != float("-inf")), default=0.0))
            torch.testing.assert_close(got_scores, ref_scores, rtol=1e-5, atol=1e-5 * scale)
            assert len(set(x for x in got if x >= 0)) == len(got_scores)  # no repeated key
            same += sum(int(a == r) for a, r in zip(got, ref_idx))
            total += len(got)
    assert same >= 0.99 * total, "%d of %d indices equal" % (same, total)


def int8(shape, g):
    return torch.randint(-100, 101, shape, generator=g).to(torch.int8)


def fp8(shape, g):
    return (torch.randn(shape, generator=g) * 8).to(torch.float8_e4m3fn)


def scales(shape, g, dtype, lo=0.05, hi=2.0):
    return (lo + (hi - lo) * torch.rand(shape, generator=g)).to(dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("sparse_mode", [0, 3])
def test_quant_indexer_int8_bsnd(device, sparse_mode):
    g = gen(1)
    b, s1, s2, n1, n2, d, k = 2, 3, 9, 4, 1, 16, 6
    q, key = int8((b, s1, n1, d), g), int8((b, s2, n2, d), g)
    w = (torch.rand((b, s1, n1), generator=g) - 0.3).half()     # some negative weights
    qs, ks = scales((b, s1, n1), g, torch.float16), scales((b, s2, n2), g, torch.float16)
    act_q, act_k = [3, 2], [9, 5]
    out = torch_npu.npu_quant_lightning_indexer(
        q.to(device), key.to(device), w.to(device), qs.to(device), ks.to(device), 0, 0,
        actual_seq_lengths_query=torch.tensor(act_q, dtype=torch.int32).to(device),
        actual_seq_lengths_key=torch.tensor(act_k, dtype=torch.int32).to(device),
        sparse_count=k, sparse_mode=sparse_mode)
    assert out.device.type == device and out.dtype == torch.int32 and out.shape == (b, s1, n2, k)
    ref = indexer_reference([q[i, :act_q[i]] for i in range(b)], [key[i, :act_k[i]] for i in range(b)],
                            [w[i, :act_q[i]] for i in range(b)], [qs[i, :act_q[i]] for i in range(b)],
                            [ks[i, :act_k[i]] for i in range(b)], act_q, act_k, k, sparse_mode == 3)
    out = out.cpu()
    for i in range(b):
        assert_topk(out[i, :act_q[i]], ref[i])
        assert (out[i, act_q[i]:] == -1).all()      # rows past actual_seq_lengths_query


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("combo", [(torch.bfloat16, torch.float32), (torch.float16, torch.float16)])
def test_quant_indexer_fp8_paged_tnd(device, combo):
    """TND query, PA_BSND key through a shuffled block_table, float8_e4m3fn with both documented
    (weights, scales) dtype combinations, two key heads (group size 2)."""
    wdt, sdt = combo
    g = gen(2)
    n1, n2, d, bs, k = 4, 2, 16, 4, 5
    act_q, act_k = [2, 5], [7, 10]                    # cumulative for TND; key lengths per batch
    t1 = act_q[-1]
    q = fp8((t1, n1, d), g)
    w = (torch.rand((t1, n1), generator=g) + 0.1).to(wdt)
    qs = scales((t1, n1), g, sdt)
    blocks = 6
    key, ks = fp8((blocks, bs, n2, d), g), scales((blocks, bs, n2), g, sdt)
    table = torch.tensor([[4, 1, -1], [0, 5, 2]], dtype=torch.int32)
    out = torch_npu.npu_quant_lightning_indexer(
        q.to(device), key.to(device), w.to(device), qs.to(device), ks.to(device), 0, 0,
        actual_seq_lengths_query=torch.tensor(act_q, dtype=torch.int32).to(device),
        actual_seq_lengths_key=torch.tensor(act_k, dtype=torch.int32).to(device), block_table=table.to(device),
        layout_query="TND", layout_key="PA_BSND", sparse_count=k, sparse_mode=3).cpu()
    assert out.shape == (t1, n2, k) and out.dtype == torch.int32

    def logical(x, b, n):   # written independently of the op: block table walk, row by row
        return torch.stack([x[int(table[b, j // bs]), j % bs] for j in range(n)])

    starts = [0, act_q[0]]
    lens = [act_q[0], act_q[1] - act_q[0]]
    ref = indexer_reference([q[starts[i]:starts[i] + lens[i]] for i in range(2)],
                            [logical(key, i, act_k[i]) for i in range(2)],
                            [w[starts[i]:starts[i] + lens[i]] for i in range(2)],
                            [qs[starts[i]:starts[i] + lens[i]] for i in range(2)],
                            [logical(ks, i, act_k[i]) for i in range(2)], lens, act_k, k, True)
    for i in range(2):
        assert_topk(out[starts[i]:starts[i] + lens[i]], ref[i])


def test_quant_indexer_fake_shapes_and_errors():
    g = gen(3)
    q, key = int8((1, 2, 4, 8), g), int8((1, 5, 1, 8), g)
    w, qs, ks = torch.rand(1, 2, 4).half(), torch.rand(1, 2, 4).half(), torch.rand(1, 5, 1).half()
    with FakeTensorMode() as mode:
        fq, fk, fw, fqs, fks = (mode.from_tensor(t) for t in (q, key, w, qs, ks))
        out = torch_npu.npu_quant_lightning_indexer(fq, fk, fw, fqs, fks, 0, 0, sparse_count=7)
        assert out.shape == (1, 2, 1, 7) and out.dtype == torch.int32
    call = torch_npu.npu_quant_lightning_indexer
    with pytest.raises(NotImplementedError, match="query_quant_mode=1"):
        call(q, key, w, qs, ks, 1, 0)
    with pytest.raises(NotImplementedError, match="key_quant_mode=2"):
        call(q, key, w, qs, ks, 0, 2)
    with pytest.raises(NotImplementedError, match="query_dtype"):
        call(q, key, w, qs, ks, 0, 0, query_dtype=1)
    with pytest.raises(NotImplementedError, match="key_dtype"):
        call(q, key, w, qs, ks, 0, 0, key_dtype=1)
    with pytest.raises(RuntimeError, match="must be one of"):      # int8 needs float16 everywhere
        call(q, key, w.bfloat16(), qs, ks, 0, 0)
    with pytest.raises(RuntimeError, match="query must be int8 or float8_e4m3fn"):
        call(q.half(), key.half(), w, qs, ks, 0, 0)
    with pytest.raises(RuntimeError, match="key dtype"):
        call(q, key.to(torch.float8_e4m3fn), w, qs, ks, 0, 0)
    with pytest.raises(RuntimeError, match="key_dequant_scale shape"):
        call(q, key, w, qs, ks[:, :4], 0, 0)
    with pytest.raises(RuntimeError, match="query_dequant_scale shape"):
        call(q, key, w, qs[..., :2], ks, 0, 0)
    with pytest.raises(RuntimeError, match=r"sparse_count must be in \[1, 2048\]"):
        call(q, key, w, qs, ks, 0, 0, sparse_count=4096)
    with pytest.raises(RuntimeError, match="layout_key"):
        call(q, key, w, qs, ks, 0, 0, layout_key="TND", actual_seq_lengths_key=torch.tensor([5]))


# ----------------------------------------------------------------------------- kv quant SFA

DN, DR, TILE = 128, 64, 128


def combined_key(shape_prefix, g, qdtype, dn=DN):
    """(key int8 [..., dn + rope bytes + 4 * tiles], k_nope int8, k_rope, scales float32)."""
    kn = torch.randint(-120, 121, shape_prefix + (dn,), generator=g).to(torch.int8)
    kr = torch.randn(shape_prefix + (DR,), generator=g).to(qdtype)
    sc = (0.002 + 0.02 * torch.rand(shape_prefix + (dn // TILE,), generator=g)).float()
    packed = torch.cat([kn, kr.view(torch.int8), sc.view(torch.int8)], -1)
    return packed, kn, kr, sc


def sfa_reference(q, kn, kr, sc, indices, scale, block, act_q, act_k, causal, qdtype):
    """One batch, float64 loops: q [S1, N1, dn+DR], kn/kr/sc [S2, N2, ...] valid key rows,
    indices [S1, N2, K]. K_nope = (k_nope * scale per 128-tile) rounded to the query dtype (golden)."""
    s1, n1, _ = q.shape
    n2 = kn.shape[1]
    g = n1 // n2
    tile_scale = sc.double().repeat_interleave(TILE, dim=-1)
    k_nope = (kn.double() * tile_scale).to(qdtype).double()
    k_all = torch.cat([k_nope, kr.double()], -1)
    out = torch.zeros(s1, n1, kn.shape[-1], dtype=torch.float64)
    for i in range(act_q):
        for h in range(n1):
            h2 = h // g
            pos = []
            for blk in indices[i, h2].tolist():
                if blk < 0:
                    break
                pos.extend(p for p in range(blk * block, (blk + 1) * block) if p < act_k)
            if not pos:
                continue
            logits = []
            for p in pos:
                x = scale * float((q[i, h].double() * k_all[p, h2]).sum())
                if causal and p >= act_k - act_q + i + 1:
                    x = -1e12
                logits.append(x)
            m = max(logits)
            e = [pow(2.718281828459045, x - m) for x in logits]
            total = sum(e)
            for c, p in enumerate(pos):
                out[i, h] += (e[c] / total) * k_nope[p, h2]
    return out


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("qdtype,rtol", [(torch.bfloat16, 1.6e-2), (torch.float16, 2e-3)])
def test_kv_quant_sfa_bsnd(device, qdtype, rtol):
    g = gen(4)
    b, s1, s2, n1, n2, kcount = 2, 3, 10, 4, 1, 5
    q = torch.randn((b, s1, n1, DN + DR), generator=g).to(qdtype)
    key, kn, kr, sc = combined_key((b, s2, n2), g, qdtype)
    act_q, act_k = [3, 2], [10, 6]
    idx = torch.full((b, s1, n2, kcount), -1, dtype=torch.int32)
    for bi in range(b):
        for i in range(s1):
            pick = torch.randperm(act_k[bi], generator=g)[:kcount - (i % 2)]   # some rows end with -1
            idx[bi, i, 0, :len(pick)] = pick.to(torch.int32)
    scale = 0.07
    out = torch_npu.npu_kv_quant_sparse_flash_attention(
        q.to(device), key.to(device), key.to(device), idx.to(device), scale, 2, 2,
        actual_seq_lengths_query=torch.tensor(act_q, dtype=torch.int32).to(device),
        actual_seq_lengths_kv=torch.tensor(act_k, dtype=torch.int32).to(device),
        attention_mode=2, sparse_mode=3)
    assert out.device.type == device and out.dtype == qdtype and out.shape == (b, s1, n1, DN)
    for bi in range(b):
        ref = sfa_reference(q[bi], kn[bi, :act_k[bi]], kr[bi, :act_k[bi]], sc[bi, :act_k[bi]], idx[bi], scale, 1,
                            act_q[bi], act_k[bi], True, qdtype)
        torch.testing.assert_close(out[bi].cpu().double(), ref, rtol=rtol, atol=rtol * float(ref.abs().max()))


@pytest.mark.parametrize("device", DEVICES)
def test_kv_quant_sfa_paged_tnd_blocks(device):
    """TND query, PA_BSND combined cache through a shuffled block_table, sparse_block_size 2, sparse_mode 0,
    two 128-tiles per row (dn 256), value passed as a different int8 tensor of the same shape (not read:
    K and V are one copy)."""
    qdtype = torch.bfloat16
    g = gen(5)
    n1, n2, bs, blk, kcount = 2, 1, 4, 2, 3
    act_q, act_k = [2, 5], [7, 11]
    t1 = act_q[-1] + 1                                # one trailing row past the last batch
    dn = 2 * TILE
    q = torch.randn((t1, n1, dn + DR), generator=g).to(qdtype)
    key, kn, kr, sc = combined_key((6, bs, n2), g, qdtype, dn)
    value = torch.zeros_like(key)
    table = torch.tensor([[3, 0, -1], [5, 1, 4]], dtype=torch.int32)
    idx = torch.tensor([[[0, 3, -1]], [[2, 1, 0]], [[5, 0, -1]], [[4, 2, 3]], [[1, -1, -1]], [[0, 1, 2]]],
                       dtype=torch.int32)
    out = torch_npu.npu_kv_quant_sparse_flash_attention(
        q.to(device), key.to(device), value.to(device), idx.to(device), 0.05, 2, 2, block_table=table.to(device),
        actual_seq_lengths_query=torch.tensor(act_q, dtype=torch.int32).to(device),
        actual_seq_lengths_kv=torch.tensor(act_k, dtype=torch.int32).to(device), sparse_block_size=blk,
        layout_query="TND", layout_kv="PA_BSND", sparse_mode=0, attention_mode=2).cpu()
    assert out.shape == (t1, n1, dn) and out.dtype == qdtype

    def logical(x, b, n):
        return torch.stack([x[int(table[b, j // bs]), j % bs] for j in range(n)])

    starts, lens = [0, 2], [2, 3]
    for bi in range(2):
        rows = slice(starts[bi], starts[bi] + lens[bi])
        ref = sfa_reference(q[rows], logical(kn, bi, act_k[bi]), logical(kr, bi, act_k[bi]),
                            logical(sc, bi, act_k[bi]), idx[rows], 0.05, blk, lens[bi], act_k[bi], False, qdtype)
        torch.testing.assert_close(out[rows].double(), ref, rtol=1.6e-2, atol=1.6e-2 * float(ref.abs().max()))
    assert (out[act_q[-1]:] == 0).all()


def test_kv_quant_sfa_fake_shapes_and_errors():
    g = gen(6)
    q = torch.randn(1, 2, 2, DN + DR).half()
    key, _, _, _ = combined_key((1, 4, 1), g, torch.float16)
    idx = torch.tensor([[[[0, 1]], [[1, -1]]]], dtype=torch.int32)
    with FakeTensorMode() as mode:
        fq, fk, fi = mode.from_tensor(q), mode.from_tensor(key), mode.from_tensor(idx)
        out = torch_npu.npu_kv_quant_sparse_flash_attention(fq, fk, fk, fi, 0.1, 2, 2, attention_mode=2)
        assert out.shape == (1, 2, 2, DN) and out.dtype == torch.float16
    call = torch_npu.npu_kv_quant_sparse_flash_attention
    with pytest.raises(NotImplementedError, match="attention_mode=0"):
        call(q, key, key, idx, 0.1, 2, 2)                          # the schema default is not documented
    with pytest.raises(NotImplementedError, match="key_quant_mode=1"):
        call(q, key, key, idx, 0.1, 1, 2, attention_mode=2)
    with pytest.raises(NotImplementedError, match="value_quant_mode=0"):
        call(q, key, key, idx, 0.1, 2, 0, attention_mode=2)
    with pytest.raises(NotImplementedError, match="quant_scale_repo_mode=0"):
        call(q, key, key, idx, 0.1, 2, 2, attention_mode=2, quant_scale_repo_mode=0)
    with pytest.raises(NotImplementedError, match="key_dequant_scale"):
        call(q, key, key, idx, 0.1, 2, 2, attention_mode=2, key_dequant_scale=torch.ones(1))
    with pytest.raises(NotImplementedError, match="value_dtype"):
        call(q, key, key, idx, 0.1, 2, 2, attention_mode=2, value_dtype=1)
    with pytest.raises(RuntimeError, match="tile_size only supports 128"):
        call(q, key, key, idx, 0.1, 2, 2, attention_mode=2, tile_size=64)
    with pytest.raises(RuntimeError, match="rope_head_dim only supports 64"):
        call(q, key, key, idx, 0.1, 2, 2, attention_mode=2, rope_head_dim=32)
    with pytest.raises(RuntimeError, match="key D must be"):
        call(q, key[..., :-4], key[..., :-4], idx, 0.1, 2, 2, attention_mode=2)
    with pytest.raises(RuntimeError, match="query must be float16 or bfloat16"):
        call(q.float(), key, key, idx, 0.1, 2, 2, attention_mode=2)
    with pytest.raises(RuntimeError, match="key and value must be int8"):
        call(q, key, key.half(), idx, 0.1, 2, 2, attention_mode=2)
    with pytest.raises(RuntimeError, match="sparse_indices shape"):
        call(q, key, key, idx[:, :1], 0.1, 2, 2, attention_mode=2)
    with pytest.raises(RuntimeError, match=r"sparse_block_size must be in \[1, 16\]"):
        call(q, key, key, idx, 0.1, 2, 2, attention_mode=2, sparse_block_size=32)


def test_documented_shapes_paged_bsnd():
    """The documented hardware shapes on a small scale: indexer N1 64 / N2 1 / D 128 int8 with a
    PA_BSND cache of block_size 16; attention dn 512 (query D 576, key D 656) with block_size 16."""
    g = gen(7)
    b, s1, s2, bs = 2, 2, 24, 16
    table = torch.tensor([[2, 0], [3, 1]], dtype=torch.int32)
    act_k = [24, 17]

    def logical(x, bi, n):
        return torch.stack([x[int(table[bi, j // bs]), j % bs] for j in range(n)])

    q, key = int8((b, s1, 64, 128), g), int8((4, bs, 1, 128), g)
    w = (torch.rand((b, s1, 64), generator=g) * 0.01).half()
    qs, ks = scales((b, s1, 64), g, torch.float16), scales((4, bs, 1), g, torch.float16)
    out = torch_npu.npu_quant_lightning_indexer(
        q.npu(), key.npu(), w.npu(), qs.npu(), ks.npu(), 0, 0,
        actual_seq_lengths_key=torch.tensor(act_k, dtype=torch.int32).npu(), block_table=table.npu(),
        layout_key="PA_BSND", sparse_count=20, sparse_mode=3).cpu()
    assert out.shape == (b, s1, 1, 20)
    ref = indexer_reference(list(q), [logical(key, i, act_k[i]) for i in range(b)], list(w), list(qs),
                            [logical(ks, i, act_k[i]) for i in range(b)], [s1] * b, act_k, 20, True)
    for i in range(b):
        assert_topk(out[i], ref[i])

    dn = 512
    qry = torch.randn((b, s1, 8, dn + DR), generator=g).to(torch.bfloat16)
    ckey, kn, kr, sc = combined_key((4, bs, 1), g, torch.bfloat16, dn)
    assert ckey.shape[-1] == 656
    idx = torch.stack([torch.randperm(act_k[i] - s1 + 1, generator=g)[:6] for i in range(b) for _ in range(s1)])
    idx = idx.reshape(b, s1, 1, 6).to(torch.int32)
    att = torch_npu.npu_kv_quant_sparse_flash_attention(
        qry.npu(), ckey.npu(), ckey.npu(), idx.npu(), 0.0416, 2, 2, block_table=table.npu(),
        actual_seq_lengths_kv=torch.tensor(act_k, dtype=torch.int32).npu(), layout_kv="PA_BSND",
        attention_mode=2, quant_scale_repo_mode=1, tile_size=128, rope_head_dim=64).cpu()
    assert att.shape == (b, s1, 8, dn) and att.dtype == torch.bfloat16
    for i in range(b):
        ref = sfa_reference(qry[i], logical(kn, i, act_k[i]), logical(kr, i, act_k[i]), logical(sc, i, act_k[i]),
                            idx[i], 0.0416, 1, s1, act_k[i], True, torch.bfloat16)
        torch.testing.assert_close(att[i].double(), ref, rtol=1.6e-2, atol=1.6e-2 * float(ref.abs().max()))
