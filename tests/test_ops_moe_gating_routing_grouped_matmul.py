"""MoE ops on the CPU-emulated NPU (torch_npu/op_plugin/moe/: gating_softmax, routing, token_permute, grouped_matmul).

Each op is checked against an independent float64 reference written here with plain
Python loops over tokens / experts from the documented formulas (never calling the
implementation): CPU and npu inputs, float32/float16, Meta shapes where the output
shape is static, autograd of grouped_matmul / token_unpermute vs the reference, and
NotImplementedError for unsupported argument values.
"""
import pytest
import torch

import torch_npu

from _op_helpers import DEVICES, close_to as close, uniform as rand

DTYPES = [torch.float32, torch.float16]
TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.float16: dict(rtol=2e-3, atol=2e-3)}
GTOL = {torch.float32: dict(rtol=1e-4, atol=1e-4), torch.float16: dict(rtol=5e-3, atol=5e-3)}
params = pytest.mark.parametrize("device,dtype", [(d, t) for d in DEVICES for t in DTYPES],
                                 ids=lambda v: str(v).replace("torch.", ""))


def randint(high, shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, high, shape, generator=g)


def distinct_experts(n, k, e, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(n)]).to(torch.int32)


def exact(actual, expected, dtype=torch.int32, device=None):
    assert actual.dtype == dtype, actual.dtype
    if device is not None:
        assert actual.device.type == device
    assert actual.cpu().tolist() == expected, (actual.cpu().tolist(), expected)


# ------------------------------------------------------------------ gating top-k softmax


def ref_gating(x, k, finished=None):
    """x: 2D float64 list-of-rows; returns y, expert_idx, row_idx as nested lists."""
    n, e = x.shape
    ys, idxs, rows = [], [], []
    for i in range(n):
        m = max(float(v) for v in x[i])
        ex = [float(torch.exp(torch.tensor(float(v) - m, dtype=torch.float64))) for v in x[i]]
        s = sum(ex)
        p = [v / s for v in ex]
        order = sorted(range(e), key=lambda j: (-p[j], j))[:k]
        ys.append([p[j] for j in order])
        done = finished is not None and bool(finished[i])
        idxs.append([e if done else j for j in order])
        rows.append([j * n + i for j in range(k)])
    return torch.tensor(ys, dtype=torch.float64), idxs, rows


@params
@pytest.mark.parametrize("k", [1, 3])
def test_gating_top_k_softmax(device, dtype, k):
    x = rand((7, 6), dtype, device)
    y, idx, row = torch_npu.npu_moe_gating_top_k_softmax(x, None, k)
    ry, ridx, rrow = ref_gating(x.cpu().double(), k)
    close(y, ry, TOL[dtype], dtype, device)
    exact(idx, ridx, device=device)
    exact(row, rrow, device=device)


@pytest.mark.parametrize("device", DEVICES)
def test_gating_finished_3d_and_ties(device):
    x = rand((2, 3, 5), device=device, seed=3)
    finished = torch.tensor([[True, False, False], [False, True, False]], device=device)
    y, idx, row = torch_npu.npu_moe_gating_top_k_softmax(x, finished, k=2)
    assert y.shape == idx.shape == row.shape == (2, 3, 2)
    ry, ridx, rrow = ref_gating(x.cpu().double().reshape(6, 5), 2, finished.cpu().reshape(6))
    close(y.reshape(6, 2), ry, TOL[torch.float32])
    exact(idx.reshape(6, 2), ridx)
    exact(row.reshape(6, 2), rrow)
    # ties: equal logits go to the lower expert index first
    y, idx, _ = torch_npu.npu_moe_gating_top_k_softmax(torch.zeros(2, 4, device=device), k=3)
    exact(idx, [[0, 1, 2], [0, 1, 2]])
    close(y, torch.full((2, 3), 0.25, dtype=torch.float64), TOL[torch.float32])


def test_gating_meta():
    y, idx, row = torch_npu.npu_moe_gating_top_k_softmax(torch.empty(5, 8, device="meta", dtype=torch.float16), k=2)
    assert y.shape == idx.shape == row.shape == (5, 2)
    assert y.dtype == torch.float16 and idx.dtype == row.dtype == torch.int32


# ------------------------------------------------------------------ init routing


def ref_init_routing(x, row_idx, expert_idx, active_num):
    n, k = expert_idx.shape
    flat = [(int(expert_idx[i][j]), i * k + j, int(row_idx[i][j])) for i in range(n) for j in range(k)]
    flat.sort(key=lambda t: (t[0], t[1]))  # stable by expert: ties keep flattened order
    sorted_rows = [t[2] for t in flat]
    expanded_row_idx = [0] * (n * k)
    for d, src in enumerate(sorted_rows):
        expanded_row_idx[src] = d
    rows = [x[sorted_rows[d] % n] for d in range(min(n, active_num) * k)]
    ex = torch.stack(rows) if rows else torch.empty(0, x.shape[1], dtype=x.dtype)
    return ex, expanded_row_idx, [t[0] for t in flat]


def test_init_routing_doc_example():
    x = torch.tensor([[0.1] * 4, [0.2] * 4, [0.3] * 4])
    row_idx = torch.tensor([[0, 3], [1, 4], [2, 5]], dtype=torch.int32)
    expert_idx = torch.tensor([[1, 2], [0, 1], [0, 2]], dtype=torch.int32)
    ex, er, ee = torch_npu.npu_moe_init_routing(x, row_idx, expert_idx, 3)
    assert ex[:, 0].tolist() == pytest.approx([0.2, 0.3, 0.1, 0.2, 0.1, 0.3])
    exact(er, [2, 0, 1, 4, 3, 5])
    exact(ee, [0, 0, 1, 1, 2, 2])


@params
@pytest.mark.parametrize("active_num", [9, 4, 0])
def test_init_routing(device, dtype, active_num):
    n, k, e, h = 9, 3, 4, 5
    x = rand((n, h), dtype, device)
    expert_idx = distinct_experts(n, k, e, seed=1).to(device)
    row_idx = torch.arange(n * k, dtype=torch.int32).reshape(k, n).t().contiguous().to(device)
    ex, er, ee = torch_npu.npu_moe_init_routing(x, row_idx, expert_idx, active_num)
    rx, rr, re = ref_init_routing(x.cpu().double(), row_idx.cpu(), expert_idx.cpu(), active_num)
    close(ex, rx, dict(rtol=0, atol=0), dtype, device)
    exact(er, rr, device=device)
    exact(ee, re, device=device)


def test_init_routing_meta():
    m = lambda *s, dtype=torch.float32: torch.empty(*s, device="meta", dtype=dtype)  # noqa: E731
    ex, er, ee = torch_npu.npu_moe_init_routing(m(6, 8), m(6, 2, dtype=torch.int32), m(6, 2, dtype=torch.int32), 4)
    assert ex.shape == (8, 8) and er.shape == (12,) and ee.shape == (12,)
    assert er.dtype == ee.dtype == torch.int32


# ------------------------------------------------------------------ finalize routing


def ref_finalize(rows, skip1, skip2, bias, scales, src_to_dst, experts, k):
    n = src_to_dst.numel() // k
    h = rows.shape[1]
    out = torch.zeros(n, h, dtype=torch.float64)
    for i in range(n):
        acc = torch.zeros(h, dtype=torch.float64)
        if skip1 is not None:
            acc += skip1[i]
        if skip2 is not None:
            acc += skip2[i]
        for j in range(k):
            r = rows[int(src_to_dst[j * n + i])].clone()
            if bias is not None:
                r += bias[int(experts[i][j])]
            acc += (scales[i][j] if scales is not None else 1.0) * r
        out[i] = acc
    return out


@params
@pytest.mark.parametrize("optional", ["all", "none"])
def test_finalize_routing(device, dtype, optional):
    n, k, e, h = 6, 2, 4, 5
    rows = rand((n * k, h), dtype, device, seed=1)
    experts = distinct_experts(n, k, e, seed=2).to(device)
    g = torch.Generator().manual_seed(5)
    src_to_dst = torch.randperm(n * k, generator=g).to(torch.int32).to(device)
    if optional == "all":
        skip1, skip2 = rand((n, h), dtype, device, seed=3), rand((n, h), dtype, device, seed=4)
        bias, scales = rand((e, h), dtype, device, seed=6), rand((n, k), dtype, device, seed=7)
        out = torch_npu.npu_moe_finalize_routing(rows, skip1, skip2, bias, scales, src_to_dst, experts)
    else:
        skip1 = skip2 = bias = scales = None
        out = torch_npu.npu_moe_finalize_routing(rows, None, None, None, None, src_to_dst, None,
                                                 drop_pad_mode=0, k=k)
    c = lambda t: None if t is None else t.cpu().double()  # noqa: E731
    ref = ref_finalize(c(rows), c(skip1), c(skip2), c(bias), c(scales), src_to_dst.cpu(), experts.cpu(), k)
    close(out, ref, TOL[dtype], dtype, device)


def test_finalize_routing_roundtrip_and_meta():
    # init_routing -> identity experts -> finalize gives sum_k scales * x
    n, k, e, h = 5, 2, 3, 4
    x = rand((n, h), torch.float64)
    y, experts, row_idx = torch_npu.npu_moe_gating_top_k_softmax(rand((n, e), seed=9), k=k)
    ex, er, _ = torch_npu.npu_moe_init_routing(x, row_idx, experts, n)
    out = torch_npu.npu_moe_finalize_routing(ex, None, None, None, y.double(), er, experts)
    torch.testing.assert_close(out, x * y.double().sum(1, keepdim=True))
    m = lambda *s, dtype=torch.float16: torch.empty(*s, device="meta", dtype=dtype)  # noqa: E731
    out = torch_npu.npu_moe_finalize_routing(m(8, 3), m(4, 3), None, m(5, 3), m(4, 2),
                                             m(8, dtype=torch.int32), m(4, 2, dtype=torch.int32))
    assert out.shape == (4, 3) and out.dtype == torch.float16


# ------------------------------------------------------------------ token permute / unpermute


def ref_permute(tokens, indices, num_out):
    flat = indices.reshape(-1).tolist()
    topk = 1 if indices.dim() == 1 else indices.shape[1]
    first = sorted(range(len(flat)), key=lambda i: (flat[i], i))
    sorted_indices = [0] * len(flat)
    for d, i in enumerate(first):
        sorted_indices[i] = d
    n_out = len(flat) if num_out is None else min(num_out, len(flat))
    out = torch.zeros(n_out, tokens.shape[1], dtype=tokens.dtype)
    for i in range(len(flat)):
        if sorted_indices[i] < n_out:
            out[sorted_indices[i]] = tokens[i // topk]
    return out, sorted_indices


def ref_unpermute(permuted, sorted_indices, probs, t, topk):
    out = []
    for tok in range(t):
        acc = torch.zeros(permuted.shape[1], dtype=torch.float64)
        for j in range(topk):
            d = int(sorted_indices[tok * topk + j])
            if d < permuted.shape[0]:
                acc = acc + (probs[tok, j] if probs is not None else 1.0) * permuted[d]
        out.append(acc)
    return torch.stack(out)


@params
@pytest.mark.parametrize("num_out,topk", [(None, 2), (5, 2), (None, 1)])
def test_token_permute(device, dtype, num_out, topk):
    t, e, h = 6, 4, 3
    tokens = rand((t, h), dtype, device)
    indices = randint(e, (t, topk) if topk > 1 else (t,), seed=4).to(device)
    p, s = torch_npu.npu_moe_token_permute(tokens, indices, num_out)
    rp, rs = ref_permute(tokens.cpu().double(), indices.cpu(), num_out)
    close(p, rp, dict(rtol=0, atol=0), dtype, device)
    exact(s, rs, device=device)


@params
@pytest.mark.parametrize("with_probs,dropped", [(True, False), (False, False), (True, True)])
def test_token_unpermute_and_grad(device, dtype, with_probs, dropped):
    t, topk, h = 5, 2 if with_probs else 1, 4
    g = torch.Generator().manual_seed(11)
    sorted_indices = torch.randperm(t * topk, generator=g).to(torch.int32).to(device)
    rows = t * topk - 3 if dropped else t * topk
    permuted = rand((rows, h), dtype, device, seed=1, grad=True)
    probs = rand((t, topk), dtype, device, seed=2, grad=True) if with_probs else None
    out = torch_npu.npu_moe_token_unpermute(permuted, sorted_indices, probs)
    rperm = permuted.detach().cpu().double().requires_grad_()
    rprobs = probs.detach().cpu().double().requires_grad_() if with_probs else None
    ref = ref_unpermute(rperm, sorted_indices.cpu(), rprobs, t, topk)
    close(out, ref, TOL[dtype], dtype, device)
    cot = rand(out.shape, dtype, device, seed=3)
    wrt = [permuted] + ([probs] if with_probs else [])
    rwrt = [rperm] + ([rprobs] if with_probs else [])
    grads = torch.autograd.grad(out, wrt, cot)
    rgrads = torch.autograd.grad(ref, rwrt, cot.cpu().double())
    for gr, rg, w in zip(grads, rgrads, wrt):
        assert gr.device == w.device
        close(gr, rg, GTOL[dtype], dtype)


def test_permute_unpermute_roundtrip_and_meta():
    tokens = rand((6, 3), torch.float64)
    indices = randint(4, (6, 3), seed=2)
    p, s = torch_npu.npu_moe_token_permute(tokens, indices)
    back = torch_npu.npu_moe_token_unpermute(p, s, torch.full((6, 3), 1.0 / 3, dtype=torch.float64))
    torch.testing.assert_close(back, tokens)
    out = torch_npu.npu_moe_token_unpermute(torch.empty(8, 4, device="meta"),
                                            torch.empty(8, dtype=torch.int32, device="meta"),
                                            torch.empty(4, 2, device="meta"))
    assert out.shape == (4, 4)
    p, s = torch_npu.npu_moe_token_permute(torch.empty(4, 3, device="meta"),
                                           torch.empty(4, 2, dtype=torch.int64, device="meta"), 5)
    assert p.shape == (5, 3) and s.shape == (8,) and s.dtype == torch.int32


# ------------------------------------------------------------------ grouped matmul


def ref_gmm_rows(x, w, b):
    m, kdim = x.shape
    n = w.shape[1]
    out = []
    for r in range(m):
        row = []
        for c in range(n):
            s = b[c] if b is not None else torch.zeros((), dtype=torch.float64)
            for q in range(kdim):
                s = s + x[r, q] * w[q, c]
            row.append(s)
        out.append(torch.stack(row))
    return torch.stack(out) if out else torch.zeros(0, n, dtype=torch.float64)


@params
@pytest.mark.parametrize("group_list_type", [0, 1])
def test_grouped_matmul_split_m(device, dtype, group_list_type):
    counts = [2, 0, 3, 1]
    m, kdim, n = sum(counts), 3, 2
    x = rand((m, kdim), dtype, device, grad=True)
    ws = [rand((kdim, n), dtype, device, seed=10 + i, grad=True) for i in range(4)]
    bs = [rand((n,), dtype, device, seed=20 + i, grad=True) for i in range(4)]
    cum = [sum(counts[:i + 1]) for i in range(4)]
    gl = torch.tensor(cum if group_list_type == 0 else counts, dtype=torch.int64, device=device)
    (y,) = torch_npu.npu_grouped_matmul([x], ws, bias=bs, group_list=gl, split_item=3, group_type=0,
                                        group_list_type=group_list_type)
    rx = x.detach().cpu().double().requires_grad_()
    rws = [w.detach().cpu().double().requires_grad_() for w in ws]
    rbs = [b.detach().cpu().double().requires_grad_() for b in bs]
    parts, start = [], 0
    for i, c in enumerate(counts):
        parts.append(ref_gmm_rows(rx[start:start + c], rws[i], rbs[i]))
        start += c
    ref = torch.cat(parts)
    close(y, ref, TOL[dtype] if dtype == torch.float32 else dict(rtol=4e-3, atol=4e-3), dtype, device)
    cot = rand(y.shape, dtype, device, seed=5)
    grads = torch.autograd.grad(y, [x] + ws + bs, cot)
    # the empty group's weight/bias get zero gradients
    rgrads = torch.autograd.grad(ref, [rx] + rws + rbs, cot.cpu().double(), allow_unused=True,
                                 materialize_grads=True)
    for g, rg in zip(grads, rgrads):
        close(g, rg, GTOL[dtype] if dtype == torch.float32 else dict(rtol=1e-2, atol=1e-2), dtype, device)


@params
def test_grouped_matmul_multi_list(device, dtype):
    shapes = [(2, 3, 4), (3, 2, 2)]
    xs = [rand((m, k), dtype, device, seed=i) for i, (m, k, _) in enumerate(shapes)]
    ws = [rand((k, n), dtype, device, seed=5 + i) for i, (_, k, n) in enumerate(shapes)]
    ys = torch_npu.npu_grouped_matmul(xs, ws, split_item=0)
    assert len(ys) == 2
    for y, xx, w in zip(ys, xs, ws):
        ref = ref_gmm_rows(xx.cpu().double(), w.cpu().double(), None)
        close(y, ref, TOL[dtype] if dtype == torch.float32 else dict(rtol=4e-3, atol=4e-3), dtype, device)


def test_grouped_matmul_list_overload_and_meta():
    x = rand((5, 3))
    ws = [rand((3, 2), seed=1), rand((3, 2), seed=2)]
    (y,) = torch.ops.npu.npu_grouped_matmul.List([x], ws, group_list=[2, 5], split_item=3, group_type=0)
    ref = torch.cat([ref_gmm_rows(x[:2].double(), ws[0].double(), None),
                     ref_gmm_rows(x[2:].double(), ws[1].double(), None)])
    close(y, ref, TOL[torch.float32])
    m = lambda *s: torch.empty(*s, device="meta", dtype=torch.float16)  # noqa: E731
    (y,) = torch.ops.npu.npu_grouped_matmul.List([m(5, 3)], [m(3, 2), m(3, 2)], group_list=[2, 5],
                                                 split_item=3, group_type=0)
    assert y.shape == (5, 2) and y.dtype == torch.float16
    ys = torch_npu.npu_grouped_matmul([m(4, 3), m(2, 5)], [m(3, 7), m(5, 1)], split_item=0)
    assert [tuple(t.shape) for t in ys] == [(4, 7), (2, 1)]


# ------------------------------------------------------------------ unsupported


def test_unsupported_arguments_raise():
    x = rand((4, 3))
    w = [rand((3, 2)), rand((3, 2))]
    gl = torch.tensor([1, 4])
    with pytest.raises(NotImplementedError, match="scale"):
        torch_npu.npu_grouped_matmul([x], w, scale=[torch.ones(2)], group_list=gl, split_item=3, group_type=0)
    with pytest.raises(NotImplementedError, match="act_type"):
        torch_npu.npu_grouped_matmul([x], w, group_list=gl, split_item=3, group_type=0, act_type=1)
    with pytest.raises(NotImplementedError, match="group_type=2"):
        torch_npu.npu_grouped_matmul([x], w, group_list=gl, split_item=3, group_type=2)
    with pytest.raises(NotImplementedError, match="group_list_type=2"):
        torch_npu.npu_grouped_matmul([x], w, group_list=gl, split_item=3, group_type=0, group_list_type=2)
    with pytest.raises(NotImplementedError, match="group_list covering"):
        torch_npu.npu_grouped_matmul([x], w, group_list=torch.tensor([1, 3]), split_item=3, group_type=0)
    with pytest.raises(NotImplementedError, match="output_dtype"):
        torch_npu.npu_grouped_matmul([x], w, group_list=gl, split_item=3, group_type=0, output_dtype=1)
    with pytest.raises(NotImplementedError, match="padded_mode"):
        torch_npu.npu_moe_token_permute(x, torch.zeros(4, dtype=torch.int64), None, True)
    with pytest.raises(NotImplementedError, match="padded_mode"):
        torch_npu.npu_moe_token_unpermute(x, torch.arange(4, dtype=torch.int32), None, True)
    with pytest.raises(NotImplementedError, match="drop_pad_mode"):
        torch_npu.npu_moe_finalize_routing(x, None, None, None, None, torch.arange(4, dtype=torch.int32),
                                           None, drop_pad_mode=1)


# ------------------------------------------------------------------ npu_moe_compute_expert_tokens


@pytest.mark.parametrize("device", ["cpu", "npu"])
def test_moe_compute_expert_tokens(device):
    import torch_npu as tn
    sorted_experts = torch.tensor([3, 3, 4, 5, 6, 7], dtype=torch.int32)  # documented example
    out = tn.npu_moe_compute_expert_tokens(sorted_experts.to(device), 5)
    assert out.dtype == torch.int32 and out.device.type == device
    # expert e's rows end where the first id > e starts
    assert out.cpu().tolist() == [0, 0, 0, 2, 3]
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 8, (50,), generator=g).sort().values.to(torch.int32)
    out = tn.npu_moe_compute_expert_tokens(ids.to(device), 8).cpu().tolist()
    assert out == [sum(1 for v in ids.tolist() if v <= e) for e in range(8)]
    assert tn.npu_moe_compute_expert_tokens(torch.empty(9, dtype=torch.int32, device="meta"), 4).shape == (4,)
