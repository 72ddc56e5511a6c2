"""Round-5 attention-family ops: npu_mrope, npu_masked_causal_conv1d, npu_mhc_sinkhorn,
npu_mhc_post, npu_mhc_post_backward.

References are written here from the documented formulas / op-plugin goldens as float64
Python loops that never call the implementation. CPU and npu inputs, float32 / float16 /
bfloat16 where the op takes them, FakeTensor shapes, gradcheck in float64.
"""
import math

import pytest
import torch

import torch_npu
from torch._subclasses.fake_tensor import FakeTensorMode

DEVICES = ["cpu", "npu"]
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2, torch.float64: 1e-12}


def rand(shape, dtype=torch.float32, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g, dtype=torch.float64) * scale).to(dtype)


def close(actual, expected, dtype, scale=1.0):
    """Compare with a tolerance relative to the largest reference magnitude (a few ulps of the dtype)."""
    tol = TOL[dtype] * max(1.0, float(expected.abs().max())) * scale
    torch.testing.assert_close(actual.cpu().double(), expected.double(), atol=tol, rtol=0)


# ---------------------------------------------------------------- npu_mrope

def ref_mrope(positions, x, cache, head_size, section, neox, interleave_cache):
    """x [T, N*hs] -> float64, one rotation pair at a time."""
    t_count = positions.shape[-1]
    rot = cache.shape[1]
    half = rot // 2
    x = x.double().reshape(t_count, -1, head_size)
    out = x.clone()
    for t in range(t_count):
        for c in range(half):
            if positions.dim() == 1:
                row = 0
            elif not interleave_cache:
                row = 0 if c < section[0] else (1 if c < section[0] + section[1] else 2)
            else:  # rows 1 and 2 take every third column from 1 and 2, below 3 * section[1]
                row = 1 if (c % 3 == 1 and c < 3 * section[1]) else (2 if (c % 3 == 2 and c < 3 * section[1]) else 0)
            p = int(positions[t] if positions.dim() == 1 else positions[row, t])
            cs, sn = float(cache[p, c]), float(cache[p, half + c])
            for h in range(x.shape[1]):
                i1, i2 = (c, half + c) if neox else (2 * c, 2 * c + 1)
                a, b = float(x[t, h, i1]), float(x[t, h, i2])
                out[t, h, i1] = a * cs - b * sn
                out[t, h, i2] = b * cs + a * sn
    return out.reshape(t_count, -1)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("rotary_mode", ["half", "interleave"])
def test_mrope_plain_positions(device, dtype, rotary_mode):
    t, nq, nk, hs, rot = 5, 3, 1, 12, 8
    positions = torch.tensor([4, 0, 7, 2, 2])
    q, k = rand((t, nq * hs), dtype, 1), rand((t, nk * hs), dtype, 2)
    cache = rand((9, rot), dtype, 3)
    qo, ko = torch_npu.npu_mrope(positions.to(device), q.to(device), k.to(device), cache.to(device), hs,
                                 rotary_mode=rotary_mode)
    assert qo.dtype == dtype and qo.device.type == device and qo.shape == q.shape and ko.shape == k.shape
    neox = rotary_mode == "half"
    close(qo, ref_mrope(positions, q, cache, hs, None, neox, False), dtype, 2)
    close(ko, ref_mrope(positions, k, cache, hs, None, neox, False), dtype, 2)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cache_mode", ["default", "interleave"])
@pytest.mark.parametrize("rotary_mode", ["half", "interleave"])
def test_mrope_multimodal_sections(device, cache_mode, rotary_mode):
    t, nq, nk, hs, rot = 4, 2, 2, 20, 16
    section = [2, 3, 3]
    g = torch.Generator().manual_seed(5)
    positions = torch.randint(0, 10, (3, t), generator=g)
    q, k = rand((t, nq * hs), seed=6), rand((t, nk * hs), seed=7)
    cache = rand((10, rot), seed=8)
    qo, ko = torch_npu.npu_mrope(positions.to(device), q.to(device), k.to(device), cache.to(device), hs,
                                 mrope_section=section, rotary_mode=rotary_mode, cache_mode=cache_mode)
    neox, inter = rotary_mode == "half", cache_mode == "interleave"
    close(qo, ref_mrope(positions, q, cache, hs, section, neox, inter), torch.float32)
    close(ko, ref_mrope(positions, k, cache, hs, section, neox, inter), torch.float32)
    # the pass-through part of each head is untouched
    assert torch.equal(qo.cpu().reshape(t, nq, hs)[..., rot:], q.reshape(t, nq, hs)[..., rot:])


def test_mrope_errors_and_fake():
    pos, q, cache = torch.arange(4), torch.randn(4, 16), torch.randn(4, 16)
    with pytest.raises(RuntimeError, match="cache_mode only support default or interleave"):
        torch_npu.npu_mrope(pos, q, q, cache, 16, cache_mode="invalid_mode")
    with pytest.raises(RuntimeError, match="rotary_mode only support half or interleave"):
        torch_npu.npu_mrope(pos, q, q, cache, 16, rotary_mode="full")
    with FakeTensorMode():
        qo, ko = torch_npu.npu_mrope(torch.zeros(3, 6, dtype=torch.long), torch.empty(6, 64, dtype=torch.bfloat16),
                                     torch.empty(6, 32, dtype=torch.bfloat16), torch.empty(8, 16), 32,
                                     mrope_section=[2, 3, 3])
    assert qo.shape == (6, 64) and ko.shape == (6, 32) and qo.dtype == torch.bfloat16


# ---------------------------------------------------------------- npu_masked_causal_conv1d

def ref_causal_conv(x, w, mask):
    s_len, b_len, h_len = x.shape
    width = w.shape[0]
    out = torch.zeros(x.shape, dtype=torch.float64)
    for s in range(s_len):
        for b in range(b_len):
            if mask is not None and not bool(mask[b, s]):
                continue
            for h in range(h_len):
                acc = 0.0
                for k in range(width):
                    src = s - (width - 1 - k)
                    if src >= 0:
                        acc += float(w[k, h]) * float(x[src, b, h])
                out[s, b, h] = acc
    return out


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("masked", [False, True])
def test_masked_causal_conv1d(device, dtype, masked):
    s, b, h = 7, 2, 5
    x, w = rand((s, b, h), dtype, 11), rand((3, h), dtype, 12)
    mask = (torch.rand(b, s, generator=torch.Generator().manual_seed(13)) > 0.4) if masked else None
    out = torch_npu.npu_masked_causal_conv1d(x.to(device), w.to(device),
                                             mask=None if mask is None else mask.to(device))
    assert out.dtype == dtype and out.shape == x.shape and out.device.type == device
    close(out, ref_causal_conv(x, w, mask), dtype, 3)


def test_masked_causal_conv1d_grad_and_fake():
    s, b, h = 5, 2, 3
    x = rand((s, b, h), torch.float64, 14).requires_grad_()
    w = rand((3, h), torch.float64, 15).requires_grad_()
    mask = torch.tensor([[True, False, True, True, False], [True, True, True, False, True]])
    assert torch.autograd.gradcheck(lambda a, c: torch_npu.npu_masked_causal_conv1d(a, c, mask=mask), (x, w))
    # npu bf16 backward equals the float64 gradient of the reference formula
    xb, wb = x.detach().to(torch.bfloat16).npu().requires_grad_(), w.detach().to(torch.bfloat16).npu().requires_grad_()
    torch_npu.npu_masked_causal_conv1d(xb, wb, mask=mask.npu()).float().sum().backward()
    gx = torch.zeros(s, b, h, dtype=torch.float64)
    gw = torch.zeros(3, h, dtype=torch.float64)
    xd, wd = xb.detach().cpu().double(), wb.detach().cpu().double()
    for t in range(s):
        for bb in range(b):
            if mask[bb, t]:
                for k in range(3):
                    src = t - (2 - k)
                    if src >= 0:
                        gx[src, bb] += wd[k]
                        gw[k] += xd[src, bb]
    close(xb.grad, gx, torch.bfloat16, 4)
    close(wb.grad, gw, torch.bfloat16, 4)
    with FakeTensorMode():
        out = torch_npu.npu_masked_causal_conv1d(torch.empty(9, 2, 4, dtype=torch.float16),
                                                 torch.empty(3, 4, dtype=torch.float16),
                                                 mask=torch.empty(2, 9, dtype=torch.bool))
    assert out.shape == (9, 2, 4) and out.dtype == torch.float16
    with pytest.raises(RuntimeError, match="weight must be"):
        torch_npu.npu_masked_causal_conv1d(torch.randn(4, 1, 2), torch.randn(4, 2))


# ---------------------------------------------------------------- npu_mhc_sinkhorn

def ref_sinkhorn(mat, eps, iters):
    """One n x n matrix as nested lists of floats -> (norms, sums) lists, float64 Python math."""
    n = len(mat)
    y = []
    for row in mat:
        m = max(row)
        e = [math.exp(v - m) for v in row]
        z = sum(e)
        y.append([v / z for v in e])
    norms, sums = [[r[:] for r in y]], [None]  # norm[0]: the softmax itself
    y = [[v + eps for v in r] for r in y]

    def col_step(y):
        c = [sum(y[i][j] for i in range(n)) + eps for j in range(n)]
        return [[y[i][j] / c[j] for j in range(n)] for i in range(n)], c

    def row_step(y):
        r = [sum(y[i]) + eps for i in range(n)]
        return [[y[i][j] / r[i] for j in range(n)] for i in range(n)], r

    y, c = col_step(y)
    norms.append(y)
    sums.append(c)
    for _ in range(iters - 1):
        y, r = row_step(y)
        norms.append(y)
        sums.append(r)
        y, c = col_step(y)
        norms.append(y)
        sums.append(c)
    return norms, sums


@pytest.mark.parametrize("device", DEVICES)
def test_mhc_sinkhorn_bsnn(device):
    b, s, n, iters, eps = 2, 3, 4, 5, 1e-6
    x = rand((b, s, n, n), seed=21, scale=2.0)
    y, norm_out, sum_out = torch_npu.npu_mhc_sinkhorn(x.to(device), eps=eps, num_iters=iters, out_flag=1)
    assert y.shape == x.shape and y.dtype == torch.float32 and y.device.type == device
    assert norm_out.shape == (2 * iters, n, n, b, s) and sum_out.shape == (2 * iters, n, b, s)
    for bb in range(b):
        for ss in range(s):
            norms, sums = ref_sinkhorn(x[bb, ss].double().tolist(), eps, iters)
            close(y[bb, ss], torch.tensor(norms[-1]), torch.float32)
            close(norm_out[:, :, :, bb, ss], torch.tensor(norms), torch.float32)
            close(sum_out[1:, :, bb, ss], torch.tensor(sums[1:]), torch.float32)
            assert torch.isnan(sum_out[0, :, bb, ss].cpu()).all()  # undefined by the formula
    # the stored intermediates are what npu_mhc_sinkhorn_backward reads: fed back, they give
    # exactly the autograd gradient of the forward (float64)
    x64 = x.double().to(device).requires_grad_(True)
    y64, norm64, sum64 = torch_npu.npu_mhc_sinkhorn(x64, eps=eps, num_iters=iters, out_flag=1)
    g = rand((b, s, n, n), seed=22).double().to(device)
    expected = torch.autograd.grad(y64, x64, g)[0]
    got = torch.ops.npu.npu_mhc_sinkhorn_backward(g, norm64.detach(), sum64.detach())
    torch.testing.assert_close(got.cpu(), expected.cpu(), rtol=1e-9, atol=1e-12)
    # the result is (nearly) doubly stochastic after enough iterations
    y20 = torch_npu.npu_mhc_sinkhorn(x.to(device))[0].cpu()
    torch.testing.assert_close(y20.sum(-1), torch.ones(b, s, n), atol=1e-2, rtol=0)
    torch.testing.assert_close(y20.sum(-2), torch.ones(b, s, n), atol=1e-4, rtol=0)


def test_mhc_sinkhorn_tnn_flag0_grad_fake():
    x = rand((3, 6, 6), seed=22)
    y, norm_out, sum_out = torch_npu.npu_mhc_sinkhorn(x, num_iters=1)
    assert norm_out.numel() == 0 and sum_out.numel() == 0
    for t in range(3):
        close(y[t], torch.tensor(ref_sinkhorn(x[t].double().tolist(), 1e-6, 1)[0][-1]), torch.float32)
    ones = torch.ones(2, 4, 4, device="npu")
    torch.testing.assert_close(torch_npu.npu_mhc_sinkhorn(ones)[0].cpu(), torch.full((2, 4, 4), 0.25),
                               atol=1e-5, rtol=0)
    xd = rand((2, 4, 4), torch.float64, 23).requires_grad_()
    assert torch.autograd.gradcheck(lambda a: torch_npu.npu_mhc_sinkhorn(a, num_iters=3)[0], (xd,))
    with FakeTensorMode():
        y, no, so = torch_npu.npu_mhc_sinkhorn(torch.empty(2, 5, 8, 8), num_iters=4, out_flag=1)
    assert y.shape == (2, 5, 8, 8) and no.shape == (8, 8, 8, 2, 5) and so.shape == (8, 8, 2, 5)
    with pytest.raises(RuntimeError, match="n in 4, 6, 8"):
        torch_npu.npu_mhc_sinkhorn(torch.randn(2, 5, 5))


# ---------------------------------------------------------------- npu_mhc_post (+ backward)

def ref_mhc_post(x, h_res, h_out, h_post):
    """y[.., j, d] = h_post[.., j] h_out[.., d] + sum_i h_res[.., i, j] x[.., i, d], float64 loops."""
    lead = x.shape[:-2]
    n, d = x.shape[-2:]
    xf, rf, of, pf = (t.double().reshape(-1, *t.shape[len(lead):]) for t in (x, h_res, h_out, h_post))
    y = torch.zeros(xf.shape, dtype=torch.float64)
    for r in range(xf.shape[0]):
        for j in range(n):
            acc = pf[r, j] * of[r]
            for i in range(n):
                acc = acc + rf[r, i, j] * xf[r, i]
            y[r, j] = acc
    return y.reshape(x.shape)


def post_inputs(lead, n, d, dtype, seed):
    return (rand(lead + (n, d), dtype, seed), rand(lead + (n, n), torch.float32, seed + 1).abs(),
            rand(lead + (d,), dtype, seed + 2), rand(lead + (n,), torch.float32, seed + 3))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("lead", [(2, 3), (5,)])
def test_mhc_post(device, dtype, lead):
    x, h_res, h_out, h_post = post_inputs(lead, 4, 16, dtype, 31)
    y = torch_npu.npu_mhc_post(*(t.to(device) for t in (x, h_res, h_out, h_post)))
    assert y.dtype == dtype and y.shape == x.shape and y.device.type == device
    close(y, ref_mhc_post(x, h_res, h_out, h_post), dtype, 2)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_mhc_post_backward(device, dtype):
    lead, n, d = (2, 2), 4, 8
    x, h_res, h_out, h_post = post_inputs(lead, n, d, dtype, 41)
    gy = rand(x.shape, dtype, 45)
    gx, gres, gout, gpost = torch_npu.npu_mhc_post_backward(*(t.to(device) for t in (gy, x, h_res, h_out, h_post)))
    assert (gx.dtype, gres.dtype, gout.dtype, gpost.dtype) == (dtype, torch.float32, dtype, torch.float32)
    # reference: float64 autograd of the loop formula
    leaves = [t.double().requires_grad_() for t in (x, h_res, h_out, h_post)]
    ref_mhc_post(*leaves).backward(gy.double())
    close(gx, leaves[0].grad, dtype, 4)
    close(gres, leaves[1].grad, torch.float32, 4)
    close(gout, leaves[2].grad, dtype, 4)
    close(gpost, leaves[3].grad, torch.float32, 4)


def test_mhc_post_grad_errors_fake():
    lead, n, d = (3,), 4, 5
    args = [t.double().requires_grad_() for t in post_inputs(lead, n, d, torch.float32, 51)]
    assert torch.autograd.gradcheck(torch_npu.npu_mhc_post, tuple(args))
    # autograd through the forward agrees with the backward op
    y = torch_npu.npu_mhc_post(*args)
    gy = rand(y.shape, torch.float64, 55)
    auto = torch.autograd.grad(y, args, gy)
    for a, b in zip(auto, torch_npu.npu_mhc_post_backward(gy, *[t.detach() for t in args])):
        torch.testing.assert_close(a, b)
    x, h_res, h_out, h_post = post_inputs(lead, n, d, torch.float16, 56)
    with pytest.raises(RuntimeError, match="x dtype must be FLOAT16 or BFLOAT16"):
        torch_npu.npu_mhc_post_backward(x.float(), x.float(), h_res, h_out.float(), h_post)
    with pytest.raises(RuntimeError, match="h_post dtype must be FLOAT32"):
        torch_npu.npu_mhc_post(x, h_res, h_out, h_post.half())
    with pytest.raises(RuntimeError, match="grad_y shape must be the same as x shape"):
        torch_npu.npu_mhc_post_backward(x[..., :2], x, h_res, h_out, h_post)
    with pytest.raises(RuntimeError, match="h_res shape must be"):
        torch_npu.npu_mhc_post(x, torch.rand(3, 4, 8), h_out, h_post)
    with pytest.raises(NotImplementedError, match="h_res=None"):
        torch_npu.npu_mhc_post(x, None, h_out, h_post)
    with FakeTensorMode():
        outs = torch_npu.npu_mhc_post_backward(torch.empty(2, 3, 4, 64, dtype=torch.bfloat16),
                                               torch.empty(2, 3, 4, 64, dtype=torch.bfloat16),
                                               torch.empty(2, 3, 4, 4), torch.empty(2, 3, 64, dtype=torch.bfloat16),
                                               torch.empty(2, 3, 4))
    assert [tuple(o.shape) for o in outs] == [(2, 3, 4, 64), (2, 3, 4, 4), (2, 3, 64), (2, 3, 4)]
