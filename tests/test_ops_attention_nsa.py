"""Native Sparse Attention ops (npu_nsa_*) against float64 references, and the meta-only attention
ops (shapes, and a real call still raising)."""
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import torch_npu  # noqa: F401
from torch_npu.op_plugin._registry import not_emulated_message

from _op_helpers import DEVICES, close_tol as _close, zeros as _r

ops = torch.ops.npu
f16, bf16, f32, i32 = torch.float16, torch.bfloat16, torch.float32, torch.int32


def _compress_ref(inp, w, block, stride, cum):
    rows, prev = [], 0
    for end in cum:
        length = end - prev
        i = 0
        while length >= block and i * stride + block <= length:
            start = prev + i * stride
            acc = torch.zeros(inp.shape[1], inp.shape[2], dtype=torch.float64)
            for j in range(block):
                acc += inp[start + j].double() * w[j].double().unsqueeze(-1)
            rows.append(acc)
            i += 1
        prev = end
    return torch.stack(rows)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype,atol", [(torch.float16, 2e-2), (torch.bfloat16, 1.5e-1)])
def test_nsa_compress(device, dtype, atol):
    torch.manual_seed(8)
    cum, block, stride = [20, 20, 70], 32, 16     # batch 1 (20 < 32) has no window, batch 2 has 50 -> 2
    inp, w = torch.randn(70, 2, 16).to(dtype), torch.randn(block, 2).to(dtype)
    out = torch_npu.npu_nsa_compress(inp.to(device), w.to(device), block, stride, actual_seq_len=cum)
    ref = _compress_ref(inp, w, block, stride, cum)
    assert out.shape == (2, 2, 16) and out.dtype == dtype
    _close(out, ref, atol, 1e-2)


def test_nsa_compress_grad_matches_loop_adjoint_and_gradcheck():
    torch.manual_seed(9)
    cum, block, stride = [40, 72], 16, 16
    inp, w = torch.randn(72, 2, 16, dtype=torch.float64), torch.randn(block, 2, dtype=torch.float64)
    out = torch_npu.npu_nsa_compress(inp, w, block, stride, actual_seq_len=cum)
    g = torch.randn_like(out)
    gi, gw = torch_npu.npu_nsa_compress_grad(g, inp, w, block, stride, actual_seq_len=cum)
    # adjoint by loops: <compress(inp, w), g> differentiated by hand
    ri, rw = torch.zeros_like(inp), torch.zeros_like(w)
    r, prev = 0, 0
    for end in cum:
        length, i = end - prev, 0
        while i * stride + block <= length:
            start = prev + i * stride
            for j in range(block):
                ri[start + j] += w[j].unsqueeze(-1) * g[r]
                rw[j] += (inp[start + j] * g[r]).sum(-1)
            i, r = i + 1, r + 1
        prev = end
    _close(gi, ri, 1e-10, 1e-10)
    _close(gw, rw, 1e-10, 1e-10)
    inp_small, w_small = inp[:40, :1].clone().requires_grad_(True), w[:, :1].clone().requires_grad_(True)
    assert torch.autograd.gradcheck(lambda a, b: torch_npu.npu_nsa_compress(a, b, 16, 16, actual_seq_len=[40]),
                                    (inp_small, w_small), fast_mode=True)


def test_nsa_compress_errors_and_fake():
    with pytest.raises(RuntimeError, match="actual_seq_len\\[-1\\]"):
        torch_npu.npu_nsa_compress(torch.randn(32, 1, 16).half(), torch.randn(16, 1).half(), 16, 16,
                                   actual_seq_len=[30])
    with pytest.raises(RuntimeError, match="compress_stride must be"):
        torch_npu.npu_nsa_compress(torch.randn(32, 1, 16).half(), torch.randn(16, 1).half(), 16, 32,
                                   actual_seq_len=[32])
    with FakeTensorMode():
        out = ops.npu_nsa_compress(torch.randn(100, 4, 128).half(), torch.randn(32, 4).half(), 32, 16,
                                   actual_seq_len=[60, 100])
        gi, gw = ops.npu_nsa_compress_grad(torch.randn(3, 4, 128).half(), torch.randn(100, 4, 128).half(),
                                           torch.randn(32, 4).half(), 32, 16, actual_seq_len=[60, 100])
    assert out.shape == (3, 4, 128)           # windows: (60-32)//16+1 = 2 and (40-32)//16+1 = 1
    assert gi.shape == (100, 4, 128) and gw.shape == (32, 4)


META_CASES = [
    ("npu_nsa_compress_attention_infer",
     lambda: ops.npu_nsa_compress_attention_infer(_r(20, 8, 192, dtype=bf16), _r(160, 128, 384, dtype=bf16),
                                                  _r(160, 128, 256, dtype=bf16), 1.0, 8, 2, 64, 16, 128, 32, 16,
                                                  block_table=_r(20, 8, dtype=i32),
                                                  actual_cmp_seq_kvlen=[1024] * 20),
     [((20, 8, 128), bf16), ((20, 2, 16), i32)]),
    ("npu_nsa_select_attention_infer",
     lambda: ops.npu_nsa_select_attention_infer(_r(17, 1, 126, 192, dtype=f16), _r(187, 128, 9, 192, dtype=f16),
                                                _r(187, 128, 9, 128, dtype=f16), _r(17, 9, 21, dtype=i32), 2.0,
                                                126, 9, 64, 21, 128, block_table=_r(17, 11, dtype=i32),
                                                actual_seq_kvlen=[1328] * 17),
     [((17, 1, 126, 128), f16)]),
    ("npu_nsa_select_attention_infer",
     lambda: ops.npu_nsa_select_attention_infer(_r(123, 4, 192, dtype=f16), _r(246, 64, 384, dtype=f16),
                                                _r(246, 64, 256, dtype=f16), _r(123, 2, 2, dtype=i32), 2.0, 4, 2,
                                                64, 2, 64, layout="TND", block_table=_r(123, 2, dtype=i32),
                                                actual_seq_kvlen=[82] * 123),
     [((123, 4, 128), f16)]),
    ("npu_quant_fusion_attention",
     lambda: ops.npu_quant_fusion_attention(_r(2, 4, 6, 64, dtype=torch.float8_e4m3fn),
                                            _r(2, 4, 9, 64, dtype=torch.float8_e4m3fn),
                                            _r(2, 4, 9, 64, dtype=torch.float8_e4m3fn), 4, "BNSD",
                                            d_scale_q=_r(2, 4, 1, 1), d_scale_k=_r(2, 4, 1, 1),
                                            d_scale_v=_r(2, 4, 1, 1)),
     [((2, 4, 6, 64), f16), ((2, 4, 6, 8), f32), ((2, 4, 6, 8), f32), ((0,), f16)]),
]


@pytest.mark.parametrize("name,call,expected", META_CASES, ids=[c[0] for c in META_CASES])
def test_meta_only_ops_shapes_and_not_emulated(name, call, expected):
    with FakeTensorMode():
        res = call()
    res = res if isinstance(res, (tuple, list)) else (res,)
    tensors = [t for t in res if isinstance(t, torch.Tensor)]
    assert [(tuple(t.shape), t.dtype) for t in tensors] == expected
    with pytest.raises(NotImplementedError) as info:
        call()
    assert str(info.value) == not_emulated_message(name)


def test_meta_validation_errors():
    with FakeTensorMode():
        with pytest.raises(RuntimeError, match="beta cannot be empty"):
            ops.npu_chunk_gated_delta_rule(_r(4, 2, 16), _r(4, 2, 16), _r(4, 2, 16), initial_state=_r(1, 2, 16, 16),
                                           actual_seq_lengths=_r(1, dtype=i32), scale=1.0)
        with pytest.raises(RuntimeError, match="align to 16"):
            ops.npu_multi_head_attention_backward(*([_r(8, 8)] * 7), None, None, None, None, *([_r(8, 8)] * 7),
                                                  _r(0), 2, 4, 8, 8, 0.0, True)
    # dtype codes are not modelled: NotImplementedError on meta tensors (FakeTensorMode reports it as an
    # unsupported operator)
    meta_q = torch.empty(2, 3, 32, device="meta")
    with pytest.raises(NotImplementedError, match="query_dtype"):
        ops.npu_fused_infer_attention_score_v2(meta_q, meta_q, meta_q, query_dtype=1)


def _select_ref(q, k, v, topk, scale, block, cum_q, cum_kv):
    """Per token, per key head: gather the chosen blocks of the token's batch, softmax attention
    (float64 torch ops, so autograd gives the reference gradients)."""
    t1, n1, d1 = q.shape
    n2 = v.shape[1]
    grp = n1 // n2
    outs, maxes, sums = [], [], []
    b, q_prev, kv_start = 0, 0, 0
    for t in range(t1):
        while t >= cum_q[b]:
            b += 1
        kv_start = 0 if b == 0 else cum_kv[b - 1]
        row_out, row_max, row_sum = [], [], []
        for n in range(n2):
            rows = [kv_start + int(c) * block + j for c in topk[t, n] for j in range(block)]
            ks, vs = k[rows, n], v[rows, n]
            sc = q[t, n * grp:(n + 1) * grp] @ ks.t() * scale
            m = sc.max(-1, keepdim=True).values
            e = torch.exp(sc - m)
            row_out.append((e / e.sum(-1, keepdim=True)) @ vs)
            row_max.append(m)
            row_sum.append(e.sum(-1, keepdim=True))
        outs.append(torch.cat(row_out))
        maxes.append(torch.cat(row_max))
        sums.append(torch.cat(row_sum))
    return torch.stack(outs), torch.stack(maxes), torch.stack(sums)


def _select_inputs(dtype, seed=15):
    g = torch.Generator().manual_seed(seed)
    cum_q, cum_kv, block, count = [2, 5], [128, 320], 64, 2   # batch 0: 2 blocks, batch 1: 3 blocks
    q = torch.randn(5, 4, 32, generator=g).to(dtype)
    k = torch.randn(320, 2, 32, generator=g).to(dtype)
    v = torch.randn(320, 2, 16, generator=g).to(dtype)
    topk = torch.tensor([[[0, 1], [1, 0]], [[1, 1], [0, 0]], [[2, 0], [1, 2]], [[0, 1], [2, 2]], [[1, 2], [0, 1]]],
                        dtype=torch.int32)
    return q, k, v, topk, block, count, cum_q, cum_kv


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype,atol", [(torch.float16, 3e-3), (torch.bfloat16, 3e-2)])
def test_nsa_select_attention_forward(device, dtype, atol):
    q, k, v, topk, block, count, cum_q, cum_kv = _select_inputs(dtype)
    out, mx, sm = torch_npu.npu_nsa_select_attention(q.to(device), k.to(device), v.to(device), topk.to(device),
                                                     0.2, 4, block, count, actual_seq_qlen=cum_q,
                                                     actual_seq_kvlen=cum_kv)
    r_out, r_mx, r_sm = _select_ref(q.double(), k.double(), v.double(), topk, 0.2, block, cum_q, cum_kv)
    assert out.shape == (5, 4, 16) and out.dtype == dtype and mx.shape == (5, 4, 8) and mx.dtype == torch.float32
    _close(out, r_out, atol, 1e-2)
    _close(mx, r_mx.expand(5, 4, 8), 1e-2, 1e-2)
    _close(sm, r_sm.expand(5, 4, 8), 2e-2, 1e-2)


@pytest.mark.parametrize("device", DEVICES)
def test_nsa_select_attention_grad_matches_reference_autograd(device):
    q, k, v, topk, block, count, cum_q, cum_kv = _select_inputs(torch.float64, seed=16)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    r_out, _, _ = _select_ref(*leaves, topk, 0.3, block, cum_q, cum_kv)
    g = torch.randn_like(r_out)
    r_grads = torch.autograd.grad(r_out, leaves, g)
    dev = [t.to(device) for t in (q, k, v)]
    out, mx, sm = torch_npu.npu_nsa_select_attention(*dev, topk.to(device), 0.3, 4, block, count,
                                                     actual_seq_qlen=cum_q, actual_seq_kvlen=cum_kv)
    grads = torch_npu.npu_nsa_select_attention_grad(g.to(device), *dev, out, mx, sm, topk.to(device), 0.3, 4, block,
                                                    count, actual_seq_qlen=cum_q, actual_seq_kvlen=cum_kv)
    for got, ref in zip(grads, r_grads):
        _close(got, ref, 1e-9, 1e-9)
    fwd = [t.clone().requires_grad_(True) for t in (q, k, v)]
    out = torch_npu.npu_nsa_select_attention(*fwd, topk, 0.3, 4, block, count, actual_seq_qlen=cum_q,
                                             actual_seq_kvlen=cum_kv)[0]
    for got, ref in zip(torch.autograd.grad(out, fwd, g), r_grads):
        _close(got, ref, 1e-9, 1e-9)


def test_nsa_select_attention_errors_and_fake():
    q, k, v, topk, block, count, cum_q, cum_kv = _select_inputs(torch.float16)
    with pytest.raises(NotImplementedError, match="atten_mask"):
        torch_npu.npu_nsa_select_attention(q, k, v, topk, 1.0, 4, block, count, atten_mask=torch.zeros(5, 320).bool(),
                                           actual_seq_qlen=cum_q, actual_seq_kvlen=cum_kv)
    with pytest.raises(RuntimeError, match="topk_indices must be int32"):
        torch_npu.npu_nsa_select_attention(q, k, v, topk.long(), 1.0, 4, block, count, actual_seq_qlen=cum_q,
                                           actual_seq_kvlen=cum_kv)
    with FakeTensorMode():
        fq, fk, fv = torch.randn(256, 16, 192).half(), torch.randn(3072, 4, 192).half(), torch.randn(3072, 4, 128).half()
        ft = torch.zeros(256, 4, 16, dtype=torch.int32)
        out, mx, sm = ops.npu_nsa_select_attention(fq, fk, fv, ft, 1.0, 16, 64, 16, actual_seq_qlen=[128, 256],
                                                   actual_seq_kvlen=[2048, 3072])
        grads = ops.npu_nsa_select_attention_grad(out, fq, fk, fv, out, mx, sm, ft, 1.0, 16, 64, 16,
                                                  actual_seq_qlen=[128, 256], actual_seq_kvlen=[2048, 3072])
    assert out.shape == (256, 16, 128) and mx.shape == (256, 16, 8) and mx.dtype == torch.float32
    assert [g.shape for g in grads] == [fq.shape, fk.shape, fv.shape]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype,atol", [(torch.float16, 2e-2), (torch.bfloat16, 1.5e-1)])
def test_nsa_compress_infer_cache(device, dtype, atol):
    gen = torch.Generator().manual_seed(31)
    page, n, d, block, stride = 16, 2, 16, 32, 16
    kv = torch.randn(6, page, n, d, generator=gen).to(dtype)
    w = torch.randn(block, n, generator=gen).to(dtype)
    table = torch.tensor([[4, 1, 3], [0, 5, 2], [2, 0, 1]], dtype=torch.int32)
    lens = [48, 40, 32]            # batch 1: (40-32) % 16 != 0 -> untouched
    slots = torch.tensor([3, 0, 1], dtype=torch.int32)
    cache = torch.full((5, n, d), 7.0).to(dtype)
    expected = cache.double().clone()
    for b, s in enumerate(lens):
        if s >= block and (s - block) % stride == 0:
            acc_ = torch.zeros(n, d, dtype=torch.float64)
            for j in range(block):
                t = s - block + j
                acc_ += kv[int(table[b, t // page]), t % page].double() * w[j].double().unsqueeze(-1)
            expected[int(slots[b])] = acc_
    c = cache.to(device)
    out = torch.ops.npu.npu_nsa_compress_infer.cache(kv.to(device), w.to(device), slots.to(device), block, stride,
                                                     page, block_table=table.to(device), actual_seq_len=lens, cache=c)
    assert out is c and out.dtype == dtype
    _close(out, expected, atol, 1e-2)


def test_nsa_compress_infer_cache_fake_and_errors():
    with FakeTensorMode():
        c = _r(8, 2, 16, dtype=f16)
        out = ops.npu_nsa_compress_infer.cache(_r(4, 128, 2, 16, dtype=f16), _r(32, 2, dtype=f16), _r(2, dtype=i32),
                                               32, 16, 128, block_table=_r(2, 2, dtype=i32), actual_seq_len=[48, 70],
                                               cache=c)
    assert out is c
    with pytest.raises(RuntimeError, match="weight must be"):
        torch.ops.npu.npu_nsa_compress_infer.cache(torch.zeros(2, 16, 1, 16), torch.zeros(16, 2), torch.zeros(1).int(),
                                                   16, 16, 16, block_table=torch.zeros(1, 2).int(),
                                                   actual_seq_len=[16], cache=torch.zeros(2, 1, 16))


def _compress_attention_ref(q, k, v, scale, cblock, stride, sblock, count, topk_mask, mask, cum_q, cum_k, cum_s):
    """The op-plugin golden's formula as float64 loops."""
    n1, n2 = q.shape[1], v.shape[1]
    grp = n1 // n2
    m, n = sblock // stride, cblock // stride
    inner = m + n - 1
    times = [min(j + 1 if j < inner / 2 else inner - j, n) for j in range(inner)]
    outs, maxes, sums, tops = [], [], [], []
    for b in range(len(cum_q)):
        q0, k0, s_0 = (0, 0, 0) if b == 0 else (cum_q[b - 1], cum_k[b - 1], cum_s[b - 1])
        s1, s2, nsel = cum_q[b] - q0, cum_k[b] - k0, cum_s[b] - s_0
        p = torch.zeros(n1, s1, s2, dtype=torch.float64)
        for h in range(n1):
            logit = q[q0:q0 + s1, h].double() @ k[k0:k0 + s2, h // grp].double().t() * scale
            if mask is not None:
                logit = logit - 40000.0 * mask[:s1, :s2].double()
            mx = logit.max(-1, keepdim=True).values
            e = torch.exp(logit - mx)
            p[h] = e / e.sum(-1, keepdim=True)
            maxes.append(mx.squeeze(-1))
            sums.append(e.sum(-1))
        outs.append(torch.einsum("hst,thd->shd", p, v[k0:k0 + s2].double().repeat_interleave(grp, dim=1)))
        top = torch.zeros(s1, n2, count, dtype=torch.int64)
        for g2 in range(n2):
            for s in range(s1):
                scores = []
                for jb in range(nsel):
                    val = 0.0
                    for j in range(inner):
                        t = m * (jb + 1) - j
                        if 0 <= t < s2:
                            val += times[j] * float(p[g2 * grp:(g2 + 1) * grp, s, t].sum())
                    if topk_mask is not None and bool(topk_mask[s, jb]):
                        val = 23333.0
                    scores.append(val)
                order = sorted(range(nsel), key=lambda j: (-scores[j], j))
                top[s, g2] = torch.tensor(order[:count])
        tops.append(top)
    mx = torch.cat([torch.stack(maxes[i * n1:(i + 1) * n1], 1) for i in range(len(cum_q))])
    sm = torch.cat([torch.stack(sums[i * n1:(i + 1) * n1], 1) for i in range(len(cum_q))])
    return torch.cat(outs), torch.cat(tops), mx, sm


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("masks", [False, True])
def test_nsa_compress_attention(device, masks):
    gen = torch.Generator().manual_seed(32)
    cum_q, cum_k, cum_s = [3, 8], [10, 21], [3, 6]
    q = torch.randn(8, 4, 16, generator=gen).half()
    k = torch.randn(21, 2, 16, generator=gen).half()
    v = torch.randn(21, 2, 8, generator=gen).half()
    topk_mask = torch.eye(5, 3, dtype=torch.bool) if masks else None
    mask = torch.ones(5, 11).triu(4).to(torch.uint8) if masks else None
    out, top, mx, sm = torch_npu.npu_nsa_compress_attention(
        q.to(device), k.to(device), v.to(device), 0.3, 4, 32, 16, 64, 2,
        topk_mask=None if topk_mask is None else topk_mask.to(device), atten_mask=None if mask is None else
        mask.to(device), actual_seq_qlen=cum_q, actual_cmp_seq_kvlen=cum_k, actual_sel_seq_kvlen=cum_s)
    r_out, r_top, r_mx, r_sm = _compress_attention_ref(q, k, v, 0.3, 32, 16, 64, 2, topk_mask, mask, cum_q, cum_k,
                                                       cum_s)
    assert out.shape == (8, 4, 8) and out.dtype == torch.float16
    assert top.dtype == torch.int32 and torch.equal(top.cpu().long(), r_top)
    assert mx.shape == (8, 4, 8) and mx.dtype == torch.float32
    _close(out, r_out, 3e-3, 1e-2)
    _close(mx, r_mx.unsqueeze(-1).expand(8, 4, 8), 1e-3, 1e-3)
    _close(sm, r_sm.unsqueeze(-1).expand(8, 4, 8), 1e-3, 1e-3)


def test_nsa_compress_attention_fake_and_errors():
    with FakeTensorMode():
        res = ops.npu_nsa_compress_attention(_r(6, 4, 192, dtype=bf16), _r(5, 2, 192, dtype=bf16),
                                             _r(5, 2, 128, dtype=bf16), 0.1, 4, 32, 16, 64, 2, actual_seq_qlen=[6],
                                             actual_cmp_seq_kvlen=[5], actual_sel_seq_kvlen=[2])
    assert [(tuple(t.shape), t.dtype) for t in res] == [((6, 4, 128), bf16), ((6, 2, 2), i32), ((6, 4, 8), f32),
                                                        ((6, 4, 8), f32)]
    with pytest.raises(NotImplementedError, match="select_block_count 3 exceeds"):
        torch_npu.npu_nsa_compress_attention(torch.zeros(2, 2, 16).half(), torch.zeros(4, 2, 16).half(),
                                             torch.zeros(4, 2, 16).half(), 1.0, 2, 32, 16, 64, 3, actual_seq_qlen=[2],
                                             actual_cmp_seq_kvlen=[4], actual_sel_seq_kvlen=[2])
