"""MoE ops: token permute / unpermute gradients, the routing-map permutes, npu_moe_gating_top_k,
npu_moe_init_routing_v2, npu_grouped_matmul_swiglu_quant, npu_moe_re_routing,
npu_grouped_matmul_add, and the meta-only matmul / MoE ops.

Emulated ops are checked against float64 loops written here from the documented formulas, on CPU
and npu tensors, in float32 and the documented low-precision dtypes; the not-emulated ones against
the output shapes/dtypes the docs give (FakeTensorMode), and their real calls must still raise
NotImplementedError naming the op.
"""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import torch_npu  # noqa: F401
from torch_npu.op_plugin._registry import IMPLEMENTED, META, not_emulated_message

from _op_helpers import DEVICES

npu = torch.ops.npu
I8, I32, I64, F32, BF16, U8 = torch.int8, torch.int32, torch.int64, torch.float32, torch.bfloat16, torch.uint8


@pytest.fixture(autouse=True)
def _seeded():
    """every test draws the same inputs on every run"""
    torch.manual_seed(0)


def _perm(t, k, e, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, e, (t, k), generator=g)


def _sorted_indices(indices):
    """destination row of each flattened (token, k) slot: rank of the slot in a stable sort by expert."""
    flat = indices.reshape(-1).tolist()
    order = sorted(range(len(flat)), key=lambda i: (flat[i], i))
    dest = [0] * len(flat)
    for d, i in enumerate(order):
        dest[i] = d
    return torch.tensor(dest, dtype=torch.int32)


# ----------------------------------------------------------------- permute / unpermute grads

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-6), (torch.float16, 2e-3), (torch.bfloat16, 2e-2)])
def test_permute_grad_matches_loop(device, dtype, tol):
    t, k, h, e = 6, 3, 5, 4
    indices = _perm(t, k, e)
    sorted_idx = _sorted_indices(indices)
    drop = 15                                           # num_out_tokens < t * k: last rows dropped
    grad_perm = torch.randn(drop, h, dtype=torch.float64)
    tokens = torch.randn(t, h).to(dtype)
    expected = torch.zeros(t, h, dtype=torch.float64)
    for i in range(t):
        for j in range(k):
            d = int(sorted_idx[i * k + j])
            if d < drop:
                expected[i] += grad_perm[d].to(dtype).double()
    out = npu.npu_moe_token_permute_grad(tokens.to(device), grad_perm.to(dtype).to(device), indices.to(device),
                                         sorted_idx.to(device))
    assert out.device.type == device and out.dtype == dtype and out.shape == (t, h)
    torch.testing.assert_close(out.cpu().double(), expected, atol=tol * 4, rtol=tol)
    out2 = npu.npu_moe_token_permute_grad_v2(grad_perm.to(dtype).to(device), sorted_idx.to(device), t, dtype, k)
    torch.testing.assert_close(out2.cpu().double(), expected, atol=tol * 4, rtol=tol)


def test_permute_grad_is_the_adjoint_of_the_emulated_permute():
    t, k, h = 5, 2, 3
    tokens = torch.randn(t, h, dtype=torch.float64, requires_grad=True)
    indices = _perm(t, k, 3, seed=1)
    permuted, sorted_idx = torch_npu.npu_moe_token_permute(tokens, indices)
    g = torch.randn_like(permuted)
    (auto,) = torch.autograd.grad(permuted, tokens, g)
    out = npu.npu_moe_token_permute_grad(tokens.detach(), g, indices, sorted_idx)
    torch.testing.assert_close(out, auto)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-6), (torch.float16, 2e-3), (torch.bfloat16, 2e-2)])
def test_unpermute_grad_matches_loop(device, dtype, tol):
    t, k, h = 4, 2, 6
    indices = _perm(t, k, 3, seed=2)
    sorted_idx = _sorted_indices(indices)
    rows = 7                                            # one destination dropped
    permuted = torch.randn(rows, h).to(dtype)
    grad_unp = torch.randn(t, h).to(dtype)
    probs = torch.rand(t, k).to(dtype)
    exp_perm = torch.zeros(rows, h, dtype=torch.float64)
    exp_probs = torch.zeros(t, k, dtype=torch.float64)
    for i in range(t):
        for j in range(k):
            d = int(sorted_idx[i * k + j])
            if d < rows:
                exp_perm[d] += grad_unp[i].double() * probs[i, j].double()
                exp_probs[i, j] = (permuted[d].double() * grad_unp[i].double()).sum()
    args = [x.to(device) for x in (permuted, grad_unp, sorted_idx, probs)]
    gp, gprobs = npu.npu_moe_token_unpermute_grad(*args)
    assert gp.dtype == dtype and gp.shape == (rows, h) and gprobs.shape == (t, k) and gp.device.type == device
    torch.testing.assert_close(gp.cpu().double(), exp_perm, atol=tol * 8, rtol=tol)
    torch.testing.assert_close(gprobs.cpu().double(), exp_probs, atol=tol * 16, rtol=tol * 2)
    gp2, gprobs2 = npu.npu_moe_token_unpermute_grad_v2(args[1], args[2], rows, dtype, probs=args[3],
                                                       permuted_tokens=args[0])
    torch.testing.assert_close(gp2.cpu().double(), exp_perm, atol=tol * 8, rtol=tol)
    torch.testing.assert_close(gprobs2.cpu().double(), exp_probs, atol=tol * 16, rtol=tol * 2)


def test_unpermute_grad_without_probs_and_unpermute_pair():
    t, h = 6, 3
    indices = _perm(t, 1, 4, seed=3)
    sorted_idx = _sorted_indices(indices)
    permuted = torch.randn(t, h)
    grad_unp = torch.randn(t, h)
    gp, gprobs = npu.npu_moe_token_unpermute_grad(permuted, grad_unp, sorted_idx)
    assert gprobs is None
    expected = torch.zeros(t, h)
    for i in range(t):
        expected[int(sorted_idx[i])] = grad_unp[i]
    torch.testing.assert_close(gp, expected)
    out, saved = npu._npu_moe_token_unpermute(permuted.npu(), sorted_idx.npu())
    torch.testing.assert_close(out.cpu(), permuted[sorted_idx.long()])
    torch.testing.assert_close(saved.cpu(), permuted)
    assert saved.data_ptr() != permuted.data_ptr()


def test_token_grad_errors():
    t = torch.randn(4, 2)
    idx = torch.arange(4, dtype=torch.int32)
    with pytest.raises(NotImplementedError, match="padded_mode=True"):
        npu.npu_moe_token_permute_grad(t, t, idx, idx, True)
    with pytest.raises(NotImplementedError, match="probs=None"):
        npu.npu_moe_token_unpermute_grad_v2(t, idx, 4, torch.float32)
    with pytest.raises(RuntimeError, match="sorted_indices has 3 elements"):
        npu.npu_moe_token_permute_grad_v2(t, idx[:3], 4, torch.float32, 1)


def test_token_grads_fake_shapes():
    with FakeTensorMode():
        gp = torch.empty(10, 8, dtype=torch.bfloat16)
        si = torch.empty(12, dtype=torch.int32)
        out = npu.npu_moe_token_permute_grad_v2(gp, si, 6, torch.bfloat16, 2)
        assert out.shape == (6, 8) and out.dtype == torch.bfloat16
        a, b = npu.npu_moe_token_unpermute_grad(torch.empty(10, 8), torch.empty(6, 8), si,
                                                torch.empty(6, 2))
        assert a.shape == (10, 8) and b.shape == (6, 2)


# ----------------------------------------------------------------- routing-map permute / unpermute

def test_permute_with_routing_map_doc_example():
    tokens = torch.tensor([[0.1] * 4, [0.2] * 4, [0.3] * 4], dtype=torch.float16).npu()
    routing_map = torch.ones((3, 2), dtype=torch.int8).npu()
    permuted, _, sorted_indices = torch_npu.npu_moe_token_permute_with_routing_map(tokens, routing_map,
                                                                                   num_out_tokens=6)
    assert sorted_indices.cpu().tolist() == [0, 3, 1, 4, 2, 5] and sorted_indices.dtype == torch.int32
    torch.testing.assert_close(permuted[sorted_indices.long()].cpu(), tokens.cpu().repeat_interleave(2, 0))
    probs = torch.tensor([[0.5, 0.3], [0.4, 0.6], [0.2, 0.8]], dtype=torch.float16).npu()
    _, permuted_probs, _ = torch_npu.npu_moe_token_permute_with_routing_map(tokens, routing_map, probs=probs,
                                                                            num_out_tokens=6)
    torch.testing.assert_close(permuted_probs.cpu(), torch.tensor([0.5, 0.4, 0.2, 0.3, 0.6, 0.8]).half())
    permuted, _, sorted_indices = torch_npu.npu_moe_token_permute_with_routing_map(
        tokens, routing_map, num_out_tokens=4, drop_and_pad=True)
    assert permuted.shape == (4, 4) and sorted_indices.shape == (4,)


def _routing_map(t, e, k, seed):
    g = torch.Generator().manual_seed(seed)
    rm = torch.zeros(t, e, dtype=torch.bool)
    for i in range(t):
        rm[i, torch.randperm(e, generator=g)[:k]] = True
    return rm


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_permute_unpermute_with_routing_map_no_pad(device, dtype):
    t, e, k, h = 5, 4, 2, 3
    rm = _routing_map(t, e, k, seed=4)
    tokens = torch.randn(t, h).to(dtype)
    probs = torch.rand(t, e).to(dtype)
    # reference: the selected (expert, token) pairs in expert-major order
    pairs = [(ex, tk) for ex in range(e) for tk in range(t) if rm[tk, ex]]
    first = [tk for _, tk in pairs]
    slots = sorted(range(len(first)), key=lambda i: (first[i], i))          # token-major slot order
    exp_sorted = [0] * len(first)
    for rank, pos in enumerate(slots):
        exp_sorted[rank] = pos
    permuted, permuted_probs, sorted_indices = torch_npu.npu_moe_token_permute_with_routing_map(
        tokens.to(device), rm.to(torch.int8).to(device), probs=probs.to(device), num_out_tokens=t * k)
    assert permuted.device.type == device and permuted.dtype == dtype
    torch.testing.assert_close(permuted.cpu(), tokens[first])
    assert sorted_indices.cpu().tolist() == exp_sorted
    torch.testing.assert_close(permuted_probs.cpu(), torch.stack([probs[tk, ex] for ex, tk in pairs]))
    # unpermute: out[t] = sum_k permuted[sorted_indices[t*k + j]] * probs[t, k-th selected expert]
    out = torch_npu.npu_moe_token_unpermute_with_routing_map(permuted, sorted_indices, [t, h],
                                                             probs=probs.to(device), routing_map=rm.to(device))
    expected = torch.zeros(t, h, dtype=torch.float64)
    for tk in range(t):
        experts = [ex for ex in range(e) if rm[tk, ex]]
        for j, ex in enumerate(experts):
            expected[tk] += permuted.cpu()[exp_sorted[tk * k + j]].double() * probs[tk, ex].double()
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out.cpu().double(), expected, atol=tol, rtol=tol)
    # the grad op is the adjoint: tokens get the sum of their copies, probs the gradient at their slot
    g = torch.randn(t * k, h).to(dtype)
    pg = torch.randn(t * k).to(dtype)
    tg, probs_g = npu.npu_moe_token_permute_with_routing_map_grad(g.to(device), pg.to(device), sorted_indices,
                                                                  rm.to(device), e, t, False)
    exp_tg = torch.zeros(t, h, dtype=torch.float64)
    exp_pg = torch.zeros(t, e, dtype=torch.float64)
    for row, tk in enumerate(first):
        exp_tg[tk] += g[row].double()
        exp_pg[tk, pairs[row][0]] = pg[row].double()
    torch.testing.assert_close(tg.cpu().double(), exp_tg, atol=tol, rtol=tol)
    torch.testing.assert_close(probs_g.cpu().double(), exp_pg)


@pytest.mark.parametrize("device", DEVICES)
def test_permute_unpermute_with_routing_map_drop_and_pad(device):
    t, e, cap, h = 5, 3, 2, 4
    rm = _routing_map(t, e, 1, seed=5)
    rm[0, :] = True                                       # expert load 3 > capacity 2: one token dropped
    tokens = torch.randn(t, h, dtype=torch.float64)
    probs = torch.rand(t, e, dtype=torch.float64)
    ids = []
    for ex in range(e):
        chosen = [tk for tk in range(t) if rm[tk, ex]] + [tk for tk in range(t) if not rm[tk, ex]]
        ids += chosen[:cap]
    permuted, permuted_probs, sorted_indices = torch_npu.npu_moe_token_permute_with_routing_map(
        tokens.to(device), rm.to(device), probs=probs.to(device), num_out_tokens=e * cap, drop_and_pad=True)
    assert sorted_indices.cpu().tolist() == ids
    torch.testing.assert_close(permuted.cpu(), tokens[ids])
    exp_probs = torch.tensor([probs[ids[i], i // cap] for i in range(e * cap)], dtype=torch.float64)
    torch.testing.assert_close(permuted_probs.cpu(), exp_probs)
    expected = torch.zeros(t, h, dtype=torch.float64)
    for i, tk in enumerate(ids):
        expected[tk] += permuted.cpu()[i] * exp_probs[i]
    out, out_index, token_ids, pp = npu._npu_moe_token_unpermute_with_routing_map(
        permuted, sorted_indices, [t, h], probs=probs.to(device), routing_map=rm.to(device), drop_and_pad=True)
    torch.testing.assert_close(out.cpu(), expected)
    order = sorted(range(len(ids)), key=lambda i: (ids[i], i))
    assert out_index.cpu().tolist() == order and token_ids.cpu().tolist() == sorted(ids)
    torch.testing.assert_close(pp.cpu(), exp_probs)
    public = torch_npu.npu_moe_token_unpermute_with_routing_map(permuted, sorted_indices, [t, h],
                                                                probs=probs.to(device), drop_and_pad=True)
    torch.testing.assert_close(public.cpu(), expected)
    # unpermute grad: each slot gets its token's gradient times its prob; probs get <grad, slot row>
    g = torch.randn(t, h, dtype=torch.float64)
    pgrad, probs_grad = npu.npu_moe_token_unpermute_with_routing_map_grad(
        g.to(device), out_index, token_ids, rm.to(device), permuted, probs.to(device), True, [t, h])
    exp_pgrad = torch.stack([g[tk] * exp_probs[i] for i, tk in enumerate(ids)])
    exp_probs_grad = torch.zeros(t, e, dtype=torch.float64)
    for i, tk in enumerate(ids):
        exp_probs_grad[tk, i // cap] += (g[tk] * permuted.cpu()[i]).sum()
    torch.testing.assert_close(pgrad.cpu(), exp_pgrad)
    torch.testing.assert_close(probs_grad.cpu(), exp_probs_grad)
    # permute grad in drop_and_pad mode: scatter-add back to the tokens / (token, expert)
    gp = torch.randn(e * cap, h, dtype=torch.float64)
    pg = torch.randn(e * cap, dtype=torch.float64)
    tg, probs_g = npu.npu_moe_token_permute_with_routing_map_grad(gp.to(device), pg.to(device), sorted_indices,
                                                                  rm.to(device), e, t, True)
    exp_tg = torch.zeros(t, h, dtype=torch.float64)
    exp_pg = torch.zeros(t, e, dtype=torch.float64)
    for i, tk in enumerate(ids):
        exp_tg[tk] += gp[i]
        exp_pg[tk, i // cap] += pg[i]
    torch.testing.assert_close(tg.cpu(), exp_tg)
    torch.testing.assert_close(probs_g.cpu(), exp_pg)


def test_routing_map_ops_autograd_fake_and_errors():
    t, e, k, h = 4, 3, 2, 2
    rm = _routing_map(t, e, k, seed=6)
    tokens = torch.randn(t, h, dtype=torch.float64, requires_grad=True)
    probs = torch.rand(t, e, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda a, b: torch_npu.npu_moe_token_permute_with_routing_map(a, rm, probs=b, num_out_tokens=t * k)[:2],
        (tokens, probs))
    with FakeTensorMode():
        p, pp, si = torch_npu.npu_moe_token_permute_with_routing_map(
            torch.empty(6, 4, dtype=BF16), torch.empty(6, 3, dtype=torch.bool), probs=torch.empty(6, 3, dtype=F32),
            num_out_tokens=14)
        assert (p.shape, pp.shape, pp.dtype, si.shape, si.dtype) == ((12, 4), (12,), F32, (12,), I32)
        p, _, si = torch_npu.npu_moe_token_permute_with_routing_map(
            torch.empty(6, 4), torch.empty(6, 3, dtype=torch.bool), num_out_tokens=7, drop_and_pad=True)
        assert p.shape == (6, 4) and si.shape == (6,)
        out = torch_npu.npu_moe_token_unpermute_with_routing_map(torch.empty(12, 4), torch.empty(12, dtype=I32),
                                                                 [6, 4])
        assert out.shape == (6, 4)
    with pytest.raises(RuntimeError, match="must select topK = num_out_tokens // tokens_num = 3"):
        torch_npu.npu_moe_token_permute_with_routing_map(tokens.detach(), rm, num_out_tokens=t * 3)
    with pytest.raises(NotImplementedError, match="drop_and_pad=False"):
        npu._npu_moe_token_unpermute_with_routing_map(torch.randn(8, 2), torch.arange(8, dtype=I32), [4, 2])
    with pytest.raises(NotImplementedError, match="drop_and_pad=False"):
        npu.npu_moe_token_unpermute_with_routing_map_grad(torch.randn(4, 2), torch.arange(8, dtype=I32),
                                                          torch.arange(8, dtype=I32), None, None, None, False, [4, 2])


# ----------------------------------------------------------------- grouped top-k gating

def _gating_reference(x, k, bias, k_group, group_count, mode, norm_type, scale, eps):
    """per-row float64 loops of the doc's equivalent computation"""
    ys, idxs, norms = [], [], []
    for row in x.double():
        if norm_type == 0:
            ex = [float(torch.exp(v)) for v in row]
            norm = [v / sum(ex) for v in ex]
        else:
            norm = [1 / (1 + float(torch.exp(-v))) for v in row]
        score = [v + (0.0 if bias is None else float(bias[j])) for j, v in enumerate(norm)]
        per = len(score) // group_count
        if group_count > 1:
            groups = [score[g * per:(g + 1) * per] for g in range(group_count)]
            gscore = [max(gv) if mode == 0 else sum(sorted(gv)[-2:]) for gv in groups]
            kept = sorted(range(group_count), key=lambda g: (-gscore[g], g))[:k_group]
            score = [v if j // per in kept else float("-inf") for j, v in enumerate(score)]
        idx = sorted(range(len(score)), key=lambda j: (-score[j], j))[:k]
        y = [norm[j] for j in idx]
        if norm_type == 1:
            y = [v / (sum(y) + eps) for v in y]
        ys.append([v * scale for v in y])
        idxs.append(idx)
        norms.append(norm)
    return torch.tensor(ys, dtype=torch.float64), idxs, torch.tensor(norms, dtype=torch.float64)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-6), (torch.float16, 1e-3), (torch.bfloat16, 8e-3)])
@pytest.mark.parametrize("norm_type,mode,group_count,k_group", [(1, 1, 4, 2), (0, 0, 4, 3), (1, 0, 1, 1)])
def test_moe_gating_top_k(device, dtype, tol, norm_type, mode, group_count, k_group):
    n, e, k = 6, 16, 3
    x = (torch.rand(n, e) * 4 - 2).to(dtype)
    bias = (torch.rand(e) * 0.5).to(dtype)
    y, idx, norm = torch_npu.npu_moe_gating_top_k(x.to(device), k, bias=bias.to(device), k_group=k_group,
                                                  group_count=group_count, group_select_mode=mode,
                                                  norm_type=norm_type, out_flag=True, routed_scaling_factor=2.5)
    ey, eidx, enorm = _gating_reference(x, k, bias, k_group, group_count, mode, norm_type, 2.5, 1e-20)
    assert y.dtype == dtype and idx.dtype == torch.int32 and norm.dtype == torch.float32
    assert y.device.type == device
    assert idx.cpu().tolist() == eidx
    torch.testing.assert_close(y.cpu().double(), ey, atol=tol * 3, rtol=tol)
    torch.testing.assert_close(norm.cpu().double(), enorm, atol=1e-6, rtol=1e-6)


def test_moe_gating_top_k_fake_grad_and_errors():
    with FakeTensorMode():
        y, idx, norm = torch_npu.npu_moe_gating_top_k(torch.empty(5, 16, dtype=BF16), 3, group_count=4, k_group=2)
        assert (y.shape, y.dtype, idx.shape, idx.dtype, norm.shape, norm.dtype) == \
            ((5, 3), BF16, (5, 3), I32, (5, 16), F32)
    x = torch.randn(4, 12, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: torch_npu.npu_moe_gating_top_k(t, 2, norm_type=1)[0], (x,))
    with pytest.raises(NotImplementedError, match="renorm=1"):
        torch_npu.npu_moe_gating_top_k(torch.randn(2, 12), 2, renorm=1)
    with pytest.raises(NotImplementedError, match="tid2eid"):
        torch_npu.npu_moe_gating_top_k(torch.randn(2, 12), 2, tid2eid=torch.zeros(4, dtype=I32))
    with pytest.raises(RuntimeError, match="k must be in"):
        torch_npu.npu_moe_gating_top_k(torch.randn(2, 12), 7, group_count=4, k_group=2)
    with pytest.raises(RuntimeError, match="divisible by group_count"):
        torch_npu.npu_moe_gating_top_k(torch.randn(2, 12), 2, group_count=5)


# ----------------------------------------------------------------- init routing v2

def _init_routing_reference(x, expert_idx, start, end, active_num, row_idx_type, kind, expert_num, quant, scale):
    """loops over the doc's equivalent computation (dropless/active mode)"""
    n, k = expert_idx.shape
    flat = expert_idx.reshape(-1).tolist()
    key = [2 ** 31 - 1 if e < start else e for e in flat]
    order = sorted(range(n * k), key=lambda i: (key[i], i))
    available = sum(1 for e in flat if start <= e < end)
    if row_idx_type == 0:
        row_idx = [-1] * (n * k)
        for i in range(available):
            row_idx[order[i]] = i
    else:
        row_idx = order
    hist = [sum(1 for e in flat if e == ex) for ex in range(start, end)]
    if kind == 1:
        counts = hist
    elif kind == 0:
        counts = [sum(hist[:i + 1]) for i in range(len(hist))]
    else:
        counts = [[start + i, c] for i, c in enumerate(hist) if c > 0]
        counts += [[0, 0]] * (expert_num - len(counts))
    rows = n * k if active_num <= 0 else min(active_num, n * k)
    out_x, out_scale = [], []
    for i in range(rows):
        if i >= available:
            out_x.append(torch.zeros(x.shape[1], dtype=x.dtype if quant == -1 else torch.int8))
            out_scale.append(0.0)
            continue
        row = x[order[i] // k]
        if quant == -1:
            out_x.append(row)
            out_scale.append(0.0 if scale is None else float(scale[order[i] // k]))
        else:
            xs = row.float() * (1 if scale is None else scale[key[order[i]] - start].float())
            s = xs.abs().max() / 127
            out_x.append(torch.round(xs / s).to(torch.int8))
            out_scale.append(float(s))
    return torch.stack(out_x), row_idx, counts, torch.tensor(out_scale, dtype=torch.float32)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("quant,row_idx_type,kind,erange,active_num",
                         [(-1, 0, 0, [0, 8], -1), (-1, 1, 1, [2, 6], 0), (-1, 0, 2, [1, 7], 9),
                          (1, 0, 1, [0, 8], -1), (1, 1, 2, [2, 6], 7)])
def test_moe_init_routing_v2(device, dtype, quant, row_idx_type, kind, erange, active_num):
    n, k, h, expert_num = 5, 3, 6, 8
    x = torch.randn(n, h).to(dtype)
    expert_idx = torch.randint(0, expert_num, (n, k), dtype=torch.int32)
    start, end = erange
    if quant == -1:
        scale = torch.rand(n)
    else:
        scale = torch.rand(end - start, h) + 0.5 if kind == 2 else None
    outs = torch_npu.npu_moe_init_routing_v2(
        x.to(device), expert_idx.to(device), scale=None if scale is None else scale.to(device), active_num=active_num,
        expert_num=expert_num, expert_tokens_num_type=kind, expert_tokens_num_flag=True, quant_mode=quant,
        active_expert_range=erange, row_idx_type=row_idx_type)
    ex, rid, counts, es = _init_routing_reference(x, expert_idx, start, end, active_num, row_idx_type, kind,
                                                  expert_num, quant, scale)
    assert all(o.device.type == device for o in outs)
    assert outs[0].dtype == (dtype if quant == -1 else torch.int8) and outs[1].dtype == torch.int32
    assert outs[2].dtype == torch.int64 and outs[3].dtype == torch.float32
    assert torch.equal(outs[0].cpu(), ex)
    assert outs[1].cpu().tolist() == rid
    assert outs[2].cpu().tolist() == counts
    torch.testing.assert_close(outs[3].cpu(), es)


def test_moe_init_routing_v2_fake_and_errors():
    with FakeTensorMode():
        outs = torch_npu.npu_moe_init_routing_v2(torch.empty(6, 4, dtype=BF16), torch.empty(6, 2, dtype=I32),
                                                 active_num=10, expert_num=8, quant_mode=1, expert_tokens_num_type=2)
        assert [(tuple(o.shape), o.dtype) for o in outs] == [((10, 4), I8), ((12,), I32), ((8, 2), I64), ((10,), F32)]
    x, idx = torch.randn(4, 2), torch.zeros(4, 2, dtype=I32)
    with pytest.raises(NotImplementedError, match="drop_pad_mode=1"):
        torch_npu.npu_moe_init_routing_v2(x, idx, expert_num=4, drop_pad_mode=1, expert_capacity=2)
    with pytest.raises(NotImplementedError, match="quant_mode=0"):
        torch_npu.npu_moe_init_routing_v2(x, idx, expert_num=4, quant_mode=0)
    with pytest.raises(RuntimeError, match="expert_num must be given"):
        torch_npu.npu_moe_init_routing_v2(x, idx)


# ----------------------------------------------------------------- AlltoAll + matmul on two ranks


# ----------------------------------------------------------------- grouped matmul + swiglu + quant

def _gmm_swiglu_reference(x, w, w_scale, x_scale, ends):
    m, n = x.shape[0], w.shape[2]
    q = torch.zeros(m, n // 2, dtype=torch.int8)
    qs = torch.zeros(m)
    start = 0
    for e, end in enumerate(ends):
        for r in range(start, end):
            acc = (x[r].long().unsqueeze(1) * w[e].long()).sum(0).float()     # exact int products
            c = acc * w_scale[e].float() * x_scale[r]
            act, gate = c[:n // 2], c[n // 2:]
            s = act / (1 + torch.exp(-act)) * gate
            qs[r] = s.abs().max() / 127
            q[r] = torch.round(s / qs[r]).to(torch.int8)
        start = end
    return q, qs


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("nz_view", [False, True])
def test_grouped_matmul_swiglu_quant(device, nz_view):
    e, m, k, n = 3, 9, 32, 64
    x = torch.randint(-20, 20, (m, k), dtype=torch.int8)
    w = torch.randint(-20, 20, (e, k, n), dtype=torch.int8)
    w_scale = torch.rand(e, n) * 0.01
    x_scale = torch.rand(m) * 0.1
    ends = [3, 3, 7]                                      # an empty group; rows 7, 8 are outside every group
    gl = torch.tensor(ends)
    weight = w.reshape(e, n // 32, k // 16, 16, 32) if nz_view else w
    q, qs, offset = torch_npu.npu_grouped_matmul_swiglu_quant(x.to(device), weight.to(device), gl.to(device),
                                                              w_scale.to(device), x_scale.to(device))
    eq, eqs = _gmm_swiglu_reference(x, w, w_scale, x_scale, ends)
    assert q.dtype == torch.int8 and q.shape == (m, n // 2) and q.device.type == device
    assert offset.shape == () and offset.dtype == torch.float32
    torch.testing.assert_close(qs.cpu(), eqs, rtol=1e-5, atol=1e-7)
    assert (q.cpu().int() - eq.int()).abs().max() <= 1      # float32 rounding may move a tie by one step
    counts = torch.tensor([3, 0, 4])
    q2, qs2 = torch_npu.npu_grouped_matmul_swiglu_quant_v2(x.to(device), [weight.to(device)], [w_scale.to(device)],
                                                           x_scale.to(device), counts.to(device), group_list_type=1)
    assert torch.equal(q2.cpu(), q.cpu()) and torch.equal(qs2.cpu(), qs.cpu())


def test_grouped_matmul_swiglu_quant_fake_and_errors():
    with FakeTensorMode():
        q, qs, off = torch_npu.npu_grouped_matmul_swiglu_quant(
            torch.empty(10, 32, dtype=I8), torch.empty(2, 2, 2, 16, 32, dtype=I8), torch.empty(2, dtype=I64),
            torch.empty(2, 64), torch.empty(10))
        assert (q.shape, q.dtype, qs.shape, off.shape) == ((10, 32), I8, (10,), ())
        q, qs = torch_npu.npu_grouped_matmul_swiglu_quant_v2(torch.empty(10, 8, dtype=I8),
                                                            [torch.empty(2, 8, 12, dtype=I8)], [torch.empty(2, 12)],
                                                            torch.empty(10), torch.empty(2, dtype=I64))
        assert (q.shape, qs.shape) == ((10, 6), (10,))
    x, w = torch.zeros(4, 16, dtype=I8), torch.zeros(2, 16, 8, dtype=I8)
    ws, xs, gl = torch.ones(2, 8), torch.ones(4), torch.tensor([2, 4])
    with pytest.raises(NotImplementedError, match="int32 weight"):
        torch_npu.npu_grouped_matmul_swiglu_quant(x, w.int(), gl, ws, xs)
    with pytest.raises(NotImplementedError, match="int64 weight_scale"):
        torch_npu.npu_grouped_matmul_swiglu_quant(x, w, gl, ws.long(), xs)
    with pytest.raises(NotImplementedError, match="smooth_scale"):
        torch_npu.npu_grouped_matmul_swiglu_quant_v2(x, [w], [ws], xs, gl, smooth_scale=torch.ones(2))
    with pytest.raises(RuntimeError, match="weight_scale must be"):
        torch_npu.npu_grouped_matmul_swiglu_quant(x, w, gl, torch.ones(2, 6), xs)


# ----------------------------------------------------------------- re-routing after the AlltoAll

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.int8, torch.float16, torch.bfloat16])
def test_moe_re_routing(device, dtype):
    counts = torch.tensor([[2, 0, 1], [1, 3, 2]], dtype=torch.int32)       # (rank, expert)
    a, h = int(counts.sum()), 4
    tokens = torch.randint(-50, 50, (a, h)).to(dtype)
    scales = torch.rand(a)
    # rank-major blocks -> expert-major blocks, each block keeping its order
    src, start = {}, 0
    for i in range(2):
        for j in range(3):
            src[(i, j)] = list(range(start, start + int(counts[i, j])))
            start += int(counts[i, j])
    order = [row for j in range(3) for i in range(2) for row in src[(i, j)]]
    pt, ps, idx, num = torch_npu.npu_moe_re_routing(tokens.to(device), counts.to(device),
                                                    per_token_scales=scales.to(device))
    assert idx.dtype == torch.int32 and idx.cpu().tolist() == order
    assert torch.equal(pt.cpu(), tokens[order]) and torch.equal(ps.cpu(), scales[order])
    assert num.dtype == torch.int32 and num.cpu().tolist() == [3, 3, 3]
    with FakeTensorMode():
        outs = torch_npu.npu_moe_re_routing(torch.empty(9, 4, dtype=I8), torch.empty(2, 3, dtype=I32))
        assert [(tuple(o.shape), o.dtype) for o in outs] == [((9, 4), I8), ((9,), F32), ((9,), I32), ((3,), I32)]
    with pytest.raises(NotImplementedError, match="idx_type=1"):
        torch_npu.npu_moe_re_routing(tokens, counts, idx_type=1)


# ----------------------------------------------------------------- grouped matmul add

def _gmm_add_loop(y, x, w, ends):
    out = y.double().clone()
    start = 0
    for g, end in enumerate(ends):
        for kk in range(start, end):
            out[g] += torch.outer(x[kk].double(), w[kk].double())
        start = end
    return out


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("group_list_type", [0, 1])
def test_grouped_matmul_add(device, dtype, group_list_type):
    g, m, n, k = 3, 4, 5, 11
    y = torch.randn(g, m, n)
    x = torch.randn(k, m).to(dtype)
    w = torch.randn(k, n).to(dtype)
    ends = [2, 2, 9]                                    # an empty group; K rows 9, 10 unused
    gl = torch.tensor(ends if group_list_type == 0 else [2, 0, 7], dtype=torch.int64)
    expected = _gmm_add_loop(y, x, w, ends)
    out = npu.npu_grouped_matmul_add(y.to(device), x.to(device), w.to(device), gl.to(device),
                                     group_list_type=group_list_type)
    torch.testing.assert_close(out.cpu().double(), expected, atol=1e-4, rtol=1e-5)
    target = y.clone().to(device)
    ret = torch_npu.npu_grouped_matmul_add_(target, x.to(device), w.to(device), gl.to(device),
                                            group_list_type=group_list_type)
    assert ret is target
    torch.testing.assert_close(target.cpu().double(), expected, atol=1e-4, rtol=1e-5)


def test_grouped_matmul_add_fake_and_errors():
    with FakeTensorMode():
        out = npu.npu_grouped_matmul_add(torch.empty(2, 3, 4), torch.empty(8, 3, dtype=torch.float16),
                                         torch.empty(8, 4, dtype=torch.float16), torch.empty(2, dtype=torch.int64))
        assert out.shape == (2, 3, 4) and out.dtype == torch.float32
    y, x, w = torch.zeros(2, 3, 4), torch.zeros(8, 3, dtype=torch.float16), torch.zeros(8, 4, dtype=torch.float16)
    gl = torch.tensor([4, 8])
    with pytest.raises(NotImplementedError, match="transpose_x=False"):
        npu.npu_grouped_matmul_add(y, x, w, gl, transpose_x=False)
    with pytest.raises(NotImplementedError, match="group_type=0"):
        npu.npu_grouped_matmul_add(y, x, w, gl, group_type=0)
    with pytest.raises(RuntimeError, match="self must be"):
        npu.npu_grouped_matmul_add(torch.zeros(2, 4, 3), x, w, gl)


# ----------------------------------------------------------------- batch gather matmul (AddLora)


# ----------------------------------------------------------------- fused matmul


# ----------------------------------------------------------------- fused cross entropy with max/sum


# ----------------------------------------------------------------- Meta kernels of not-emulated ops

def E(*shape, dtype=torch.float16):
    return torch.empty(shape, dtype=dtype)


# (overload, builder of (args, kwargs) under FakeTensorMode, expected [(shape, dtype) or None per output])
META_CASES = [
    ("npu_add_quant_gmm", lambda: ((E(2, 8, 16, dtype=F32), E(32, 8, dtype=I8), E(32, 16, dtype=I8),
                                    E(2, 16, dtype=F32), E(2, dtype=I64)), {}), [((2, 8, 16), F32)]),
    ("npu_add_quant_matmul", lambda: ((E(8, 16, dtype=F32), E(8, 4, dtype=I8), E(4, 16, dtype=I8),
                                       E(16, dtype=F32)), {}), [((8, 16), F32)]),
    ("npu_dual_level_quant_matmul", lambda: ((E(16, 64, dtype=I8), E(32, 64, dtype=I8), E(16, 1, dtype=F32),
                                              E(1, 32, dtype=F32), E(16, 2, 2, dtype=U8), E(32, 2, 2, dtype=U8)),
                                             {}), [((16, 32), BF16)]),
    ("npu_matmul_compress_dequant", lambda: ((E(4, 32, dtype=I8), E(100, dtype=I8), E(8, dtype=I8),
                                              E(1, 24, dtype=I32), E(1, 24, dtype=F32)), {}),
     [((4, 24), torch.float16)]),
    ("_npu_matmul_abft_verify", lambda: ((E(17, 8), E(8, 300), E(17, 300, dtype=F32), E(300)), {}),
     [((3 * 2,), U8)]),
    ("npu_quant_matmul_all_to_all", lambda: ((E(4, 8, dtype=I8), E(8, 6, dtype=I8), "g", 2), {}),
     [((8, 3), F32)]),
    ("npu_all_to_all_quant_matmul", lambda: ((E(8, 4), E(8, 6, dtype=I8), "g", 2),
                                             {"all2all_out_flag": False, "y_dtype": torch.bfloat16}),
     [((4, 6), BF16), None]),
    ("npu_moe_init_routing_quant", lambda: ((E(6, 4), E(6, 2, dtype=I32)),
                                            {"active_num": 10, "expert_num": 4, "expert_tokens_num_mode": 1}),
     [((10, 4), I8), ((12,), I32), ((4,), I32), None, ((10,), F32)]),
    ("npu_moe_init_routing_quant", lambda: ((E(6, 4), E(6, 2, dtype=I32)),
                                            {"drop_pad_mode": 1, "expert_capacity": 3, "expert_num": 4,
                                             "expert_tokens_before_capacity_flag": True, "quant_mode": 0}),
     [((4, 3, 4), I8), ((12,), I32), None, ((4,), I32), None]),
    ("npu_moe_distribute_dispatch", lambda: ((E(3, 16, dtype=BF16), E(3, 2, dtype=I32), "ep", 4, 1, 8), {}),
     [((24, 16), BF16), ((24,), F32), ((6,), I32), ((2,), I64), ((8,), I32), ((0,), I32), ((0,), F32)]),
    # one shared-expert rank (rank 0): it receives global_bs / 1 = 12 rows, one local expert
    ("npu_moe_distribute_dispatch", lambda: ((E(3, 16, dtype=BF16), E(3, 2, dtype=I32), "ep", 4, 0, 6),
                                             {"shared_expert_rank_num": 1, "quant_mode": 2}),
     [((12, 16), I8), ((12,), F32), ((6,), I32), ((1,), I64), ((4,), I32), ((0,), I32), ((0,), F32)]),
    ("npu_moe_distribute_dispatch_v2", lambda: ((E(3, 16, dtype=BF16), E(3, 2, dtype=I32), "ep", 4, 1, 8),
                                                {"tp_world_size": 2}),
     [((48, 16), BF16), ((48,), F32), ((24 * 128,), I32), ((2,), I64), ((16,), I32), ((2,), I32), ((0,), F32)]),
    ("npu_moe_distribute_combine", lambda: ((E(24, 16), E(3, 2, dtype=I32), E(6, dtype=I32), E(8, dtype=I32),
                                             E(3, 2, dtype=F32), "ep", 4, 1, 8), {}), [((3, 16), torch.float16)]),
    ("npu_moe_distribute_combine_v2", lambda: ((E(24, 16), E(3, 2, dtype=I32), E(6, dtype=I32), E(8, dtype=I32),
                                                E(3, 2, dtype=F32), "ep", 4, 1, 8), {}), [((3, 16), torch.float16)]),
    ("npu_moe_distribute_combine_add_rms_norm", lambda: ((E(24, 16), E(3, 2, dtype=I32), E(6, dtype=I32),
                                                          E(8, dtype=I32), E(3, 2, dtype=F32), E(3, 1, 16), E(16),
                                                          "ep", 4, 1, 8), {}),
     [((3, 1, 16), torch.float16), ((3, 1, 1), F32), ((3, 1, 16), torch.float16)]),
]


def _outputs(result):
    return list(result) if isinstance(result, (tuple, list)) else [result]


@pytest.mark.parametrize("name,build,expected", META_CASES, ids=[c[0] + "-%d" % i for i, c in enumerate(META_CASES)])
def test_meta_shapes(name, build, expected):
    assert name in META and name not in IMPLEMENTED
    with FakeTensorMode():
        args, kwargs = build()
        result = getattr(npu, name)(*args, **kwargs)
    outs = _outputs(result)
    assert len(outs) == len(expected)
    for out, exp in zip(outs, expected):
        if exp is None:
            assert out is None
        else:
            assert (tuple(out.shape), out.dtype) == exp


@pytest.mark.parametrize("name", ["npu_add_quant_gmm_", "npu_add_quant_matmul_"])
def test_meta_inplace_returns_self(name):
    with FakeTensorMode():
        self = torch.empty(2, 8, 16, dtype=F32)
        if name == "npu_add_quant_gmm_":
            args = (torch.empty(32, 8, dtype=I8), torch.empty(32, 16, dtype=I8), torch.empty(2, 16),
                    torch.empty(2, dtype=I64))
        else:
            args = (torch.empty(8, 4, dtype=I8), torch.empty(4, 16, dtype=I8), torch.empty(16))
        assert getattr(npu, name)(self, *args) is self


def test_meta_checks_and_unmapped_dtypes():
    with FakeTensorMode():
        with pytest.raises(RuntimeError, match="world_size should be in"):
            npu.npu_all_to_all_quant_matmul(E(8, 4), E(8, 6, dtype=I8), "g", 3)
        with pytest.raises(RuntimeError, match="K dim of a"):
            npu._npu_matmul_abft_verify(E(4, 8), E(7, 3), E(4, 3), E(3))
    # on plain meta tensors the NotImplementedError itself surfaces (FakeTensor wraps it)
    with pytest.raises(NotImplementedError, match="y_dtype=torch_npu.hifloat8 has no torch dtype"):
        npu.npu_quant_matmul_all_to_all(torch.empty(4, 8, dtype=I8, device="meta"),
                                        torch.empty(8, 6, dtype=I8, device="meta"), "g", 2,
                                        y_dtype=torch_npu.hifloat8)


@pytest.mark.parametrize("name,build,expected", META_CASES, ids=[c[0] + "-%d" % i for i, c in enumerate(META_CASES)])
def test_real_calls_still_raise(name, build, expected):
    args, kwargs = build()
    with pytest.raises(NotImplementedError) as info:
        getattr(npu, name)(*args, **kwargs)
    assert str(info.value) == not_emulated_message(name)
    npu_args = [a.npu() if isinstance(a, torch.Tensor) else a for a in args]
    with pytest.raises(NotImplementedError, match="is not emulated yet"):
        getattr(npu, name)(*npu_args, **kwargs)
