"""MoE ops against the documented formulas, written here as float64 / integer Python
loops (never calling the implementation): npu_moe_gating_top_k_backward,
npu_moe_update_expert, npu_grouped_matmul_finalize_routing."""
import math

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import torch_npu

from _op_helpers import DEVICES


# ---- npu_moe_gating_top_k_backward -------------------------------------------------------

def gating_backward_ref(x_norm, grad_y, idx, rsf, eps):
    x, g, ix = x_norm.double().tolist(), grad_y.double().tolist(), idx.tolist()
    out = []
    for xr, gr, ir in zip(x, g, ix):
        gs = [rsf * v for v in gr]
        sel = [xr[j] for j in ir]
        d = sum(sel) + eps
        beta = sum(s / d * v for s, v in zip(sel, gs))
        gn = [0.0] * len(xr)
        for j, v in zip(ir, gs):
            gn[j] += (v - beta) / d
        out.append([xv * (1 - xv) * gv for xv, gv in zip(xr, gn)])
    return torch.tensor(out, dtype=torch.float64)


def sigmoid_renorm_forward(logits, idx, rsf, eps):
    """The forward this op differentiates: y = rsf * s_sel / (sum s_sel + eps), s = sigmoid."""
    s = torch.sigmoid(logits)
    sel = torch.gather(s, 1, idx)
    return rsf * sel / (sel.sum(1, keepdim=True) + eps)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("gdtype,tol", [(torch.float32, 1e-5), (torch.float16, 2e-3), (torch.bfloat16, 1.6e-2)])
def test_gating_top_k_backward(device, gdtype, tol):
    gen = torch.Generator().manual_seed(1)
    m, n, k = 6, 10, 3
    logits = torch.randn(m, n, generator=gen)
    idx = torch.stack([torch.randperm(n, generator=gen)[:k] for _ in range(m)]).int()
    x_norm = torch.sigmoid(logits)
    grad_y = torch.randn(m, k, generator=gen).to(gdtype)
    out = torch_npu.npu_moe_gating_top_k_backward(x_norm.to(device), grad_y.to(device), idx.to(device),
                                                  norm_type=1, routed_scaling_factor=2.5, eps=1e-20)
    ref = gating_backward_ref(x_norm, grad_y, idx, 2.5, 1e-20)
    assert out.dtype == gdtype and out.device.type == device and out.shape == (m, n)
    torch.testing.assert_close(out.cpu().double(), ref, rtol=tol, atol=tol)


def test_gating_top_k_backward_is_the_autograd_gradient():
    # the formula is the exact gradient of the sigmoid + renorm forward w.r.t. the logits
    gen = torch.Generator().manual_seed(2)
    logits = torch.randn(4, 8, generator=gen, dtype=torch.float64, requires_grad=True)
    idx = torch.stack([torch.randperm(8, generator=gen)[:3] for _ in range(4)])
    grad_y = torch.randn(4, 3, generator=gen, dtype=torch.float64)
    sigmoid_renorm_forward(logits, idx, 1.5, 1e-20).backward(grad_y)
    out = torch_npu.npu_moe_gating_top_k_backward(torch.sigmoid(logits.detach()), grad_y, idx.int(),
                                                  norm_type=1, routed_scaling_factor=1.5)
    torch.testing.assert_close(out, logits.grad, rtol=1e-10, atol=1e-12)


def test_gating_top_k_backward_undocumented_modes_and_meta():
    x, g, i = torch.rand(2, 4), torch.randn(2, 2), torch.tensor([[0, 1], [2, 3]], dtype=torch.int32)
    with pytest.raises(NotImplementedError, match="norm_type=0"):
        torch_npu.npu_moe_gating_top_k_backward(x, g, i)
    with pytest.raises(NotImplementedError, match="renorm=1"):
        torch_npu.npu_moe_gating_top_k_backward(x, g, i, norm_type=1, renorm=1)
    with FakeTensorMode():
        out = torch_npu.npu_moe_gating_top_k_backward(torch.empty(5, 16), torch.empty(5, 4, dtype=torch.bfloat16),
                                                      torch.empty(5, 4, dtype=torch.int32), norm_type=1)
    assert out.shape == (5, 16) and out.dtype == torch.bfloat16


# ---- npu_moe_update_expert ----------------------------------------------------------------

def update_expert_ref(ids, table, scales, thr, active, rank, world, mode):
    ids, table = ids.tolist(), table.tolist()
    out_ids, out_mask = [], []
    for i, row in enumerate(ids):
        r_ids, r_mask = [], []
        for j, e in enumerate(row):
            count = table[e][0]
            if count == 1:
                col = 1
            elif mode == 0:
                col = rank // math.ceil(world / count) + 1
            else:
                col = i % count + 1
            r_ids.append(table[e][col])
            if scales is None:
                r_mask.append(True)
            else:
                total = sum(scales[i].tolist())
                pruned = scales[i][j].item() < thr[j].item() * total
                r_mask.append(bool(active[i]) and not pruned)
        out_ids.append(r_ids)
        out_mask.append(r_mask)
    return torch.tensor(out_ids), torch.tensor(out_mask)


def make_table(gen, log_experts, world, f):
    rows = []
    for _ in range(log_experts):
        count = int(torch.randint(1, f, (1,), generator=gen))
        ranks = torch.randperm(world, generator=gen)[:count].tolist()
        rows.append([count] + ranks + [0] * (f - 1 - count))
    return torch.tensor(rows, dtype=torch.int32)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode", [0, 1])
@pytest.mark.parametrize("id_dtype", [torch.int32, torch.int64])
def test_update_expert(device, mode, id_dtype):
    gen = torch.Generator().manual_seed(3 + mode)
    bs, k, log_experts, world, f = 12, 4, 9, 8, 5
    table = make_table(gen, log_experts, world, f)
    ids = torch.randint(0, log_experts, (bs, k), generator=gen).to(id_dtype)
    scales = torch.rand(bs, k, generator=gen).sort(1, descending=True).values * 0.25
    thr = torch.rand(1, k, generator=gen) * 0.3
    active = torch.arange(bs) < 9
    for rank in (0, 3, 7):
        out_ids, mask = torch_npu.npu_moe_update_expert(
            ids.to(device), table.to(device), expert_scales=scales.to(device), pruning_threshold=thr.to(device),
            active_mask=active.to(device), local_rank_id=rank, world_size=world, balance_mode=mode)
        ref_ids, ref_mask = update_expert_ref(ids, table, scales, thr[0], active, rank, world, mode)
        assert out_ids.dtype == id_dtype and mask.dtype == torch.bool and out_ids.device.type == device
        assert torch.equal(out_ids.cpu().long(), ref_ids)
        assert torch.equal(mask.cpu(), ref_mask)
        assert 0 < int(mask.sum()) < mask.numel()  # the case prunes something and keeps something


def test_update_expert_without_pruning_and_meta():
    table = torch.tensor([[1, 4, 0], [2, 1, 6]], dtype=torch.int32)
    ids = torch.tensor([[0, 1], [1, 0], [1, 1]])
    out, mask = torch_npu.npu_moe_update_expert(ids, table, balance_mode=1)
    assert out.tolist() == [[4, 1], [6, 4], [1, 1]] and mask.all() and mask.shape == (3, 2)
    with pytest.raises(RuntimeError, match="together"):
        torch_npu.npu_moe_update_expert(ids, table, expert_scales=torch.rand(3, 2), balance_mode=1)
    with FakeTensorMode():
        out, mask = torch_npu.npu_moe_update_expert(torch.empty(7, 3, dtype=torch.int32),
                                                    torch.empty(5, 3, dtype=torch.int32), balance_mode=1)
    assert out.shape == (7, 3) and out.dtype == torch.int32 and mask.shape == (7, 3)


# ---- npu_grouped_matmul_finalize_routing --------------------------------------------------

def gmm_finalize_ref(x, w, counts, scale, pts, logit, row_index, shared, weight, offset, out_rows):
    xs, ws = x.tolist(), w.tolist()
    n = w.shape[2]
    y = [[0.0] * n for _ in range(out_rows)]
    r = 0
    for g, c in enumerate(counts):
        for _ in range(c):
            for col in range(n):
                acc = sum(xs[r][kk] * ws[g][kk][col] for kk in range(len(xs[r])))  # exact integer sum
                v = float(acc) * scale[g][col].item() * pts[r].item() * (1.0 if logit is None else logit[r].item())
                y[row_index[r].item()][col] += v
            r += 1
    if shared is not None:
        for i in range(shared.shape[0]):
            for col in range(n):
                y[offset + i][col] += weight * shared[i][col].item()
    return torch.tensor(y, dtype=torch.float64)


def routing_inputs(gen, batch, top_k, groups):
    """Tokens routed to top_k distinct experts; rows sorted by expert, as the documented example."""
    choice = torch.stack([torch.randperm(groups, generator=gen)[:top_k] for _ in range(batch)])
    flat = choice.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=groups)
    row_index = order // top_k  # source token of each expert-sorted row
    logit = torch.softmax(torch.randn(batch, top_k, generator=gen), 1).reshape(-1)[order]
    return counts, row_index, logit


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("list_type", [0, 1])
def test_gmm_finalize_routing(device, list_type):
    gen = torch.Generator().manual_seed(5)
    batch, top_k, groups, k, n = 6, 2, 3, 16, 8
    m = batch * top_k
    counts, row_index, logit = routing_inputs(gen, batch, top_k, groups)
    x = torch.randint(-10, 10, (m, k), generator=gen, dtype=torch.int8)
    w = torch.randint(-10, 10, (groups, k, n), generator=gen, dtype=torch.int8)
    scale = torch.rand(groups, n, generator=gen) * 0.01
    pts = torch.rand(m, generator=gen) * 0.01
    shared = (torch.randn(2, n, generator=gen) * 0.1).to(torch.bfloat16)
    group_list = counts if list_type == 1 else counts.cumsum(0)
    y = torch_npu.npu_grouped_matmul_finalize_routing(
        x.to(device), w.to(device), group_list.to(device), scale=scale.to(device), pertoken_scale=pts.to(device),
        shared_input=shared.to(device), logit=logit.to(device), row_index=row_index.to(device),
        shared_input_weight=0.5, shared_input_offset=3, output_bs=batch, group_list_type=list_type)
    ref = gmm_finalize_ref(x, w, counts.tolist(), scale, pts, logit, row_index, shared, 0.5, 3, batch)
    assert y.dtype == torch.float32 and y.shape == (batch, n) and y.device.type == device
    torch.testing.assert_close(y.cpu().double(), ref, rtol=1e-5, atol=1e-7)


def test_gmm_finalize_routing_partial_groups_default_bs_and_meta():
    gen = torch.Generator().manual_seed(6)
    m, k, n = 7, 8, 4
    x = torch.randint(-5, 5, (m, k), generator=gen, dtype=torch.int8)
    w = torch.randint(-5, 5, (2, k, n), generator=gen, dtype=torch.int8)
    scale = torch.rand(2, n, generator=gen)
    pts = torch.rand(m, generator=gen)
    row_index = torch.tensor([3, 0, 1, 6, 2, 0, 5])
    counts = [2, 3]  # the last two rows of x are in no group
    y = torch_npu.npu_grouped_matmul_finalize_routing(x, w, torch.tensor(counts), scale=scale, pertoken_scale=pts,
                                                      row_index=row_index)
    ref = gmm_finalize_ref(x, w, counts, scale, pts, None, row_index, None, 1.0, 0, m)
    assert y.shape == (m, n)
    torch.testing.assert_close(y.double(), ref, rtol=1e-5, atol=1e-6)
    with pytest.raises(NotImplementedError, match="bias"):
        torch_npu.npu_grouped_matmul_finalize_routing(x, w, torch.tensor(counts), bias=torch.zeros(2, n),
                                                      row_index=row_index)
    with pytest.raises(NotImplementedError, match="row_index"):
        torch_npu.npu_grouped_matmul_finalize_routing(x, w, torch.tensor(counts))
    with FakeTensorMode():
        out = torch_npu.npu_grouped_matmul_finalize_routing(
            torch.empty(m, k, dtype=torch.int8), torch.empty(2, k, n, dtype=torch.int8),
            torch.empty(2, dtype=torch.int64), row_index=torch.empty(m, dtype=torch.int64), output_bs=3)
    assert out.shape == (3, n) and out.dtype == torch.float32
