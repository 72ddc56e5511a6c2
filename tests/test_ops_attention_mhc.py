"""mHC ops: npu_mhc_sinkhorn, npu_mhc_post (+ backward), npu_mhc_pre (+ backward) and
npu_mhc_sinkhorn_backward.

References are written here from the documented formulas / op-plugin goldens as float64
Python loops that never call the implementation. CPU and npu inputs, float32 / float16 /
bfloat16 where the op takes them, FakeTensor shapes, gradcheck in float64.
"""
import math

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import torch_npu

from _op_helpers import DEVICES, close_scaled as close, close_tol as _close, randn_scaled as rand, zeros as _r


# ---------------------------------------------------------------- npu_mrope


# ---------------------------------------------------------------- npu_masked_causal_conv1d


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


ops = torch.ops.npu


f16, bf16, f32, i32 = torch.float16, torch.bfloat16, torch.float32, torch.int32


def _mhc_pre_ref(x, phi, alpha, bias, gamma, norm_eps, hc_eps):
    """Documented formula, float64 torch ops token by token (autograd gives the reference backward)."""
    n, d = x.shape[-2], x.shape[-1]
    flat_x = x.reshape(-1, n, d)
    outs = [[] for _ in range(6)]
    for tok in flat_x:
        xf = tok.reshape(n * d)
        rms = torch.sqrt((xf * xf).sum() / (n * d) + norm_eps)
        g = xf if gamma is None else xf * gamma.reshape(n * d)
        mix = phi @ g
        w = mix / rms
        pre = torch.sigmoid(alpha[0] * w[:n] + bias[:n]) + hc_eps
        post = 2 * torch.sigmoid(alpha[1] * w[n:2 * n] + bias[n:2 * n])
        res = (alpha[2] * w[2 * n:] + bias[2 * n:]).reshape(n, n)
        h_in = (pre.unsqueeze(-1) * tok).sum(0)
        for lst, val in zip(outs, (h_in, post, res, 1 / rms, mix, pre)):
            lst.append(val)
    lead = tuple(x.shape[:-2])
    return [torch.stack(o).reshape(lead + tuple(o[0].shape)) for o in outs]


def _mhc_inputs(lead, dtype, gamma=True, seed=17):
    g = torch.Generator().manual_seed(seed)
    n, d = 4, 16
    x = torch.randn(lead + (n, d), generator=g).to(dtype)
    fdt = torch.float64 if dtype == torch.float64 else torch.float32
    phi = (torch.randn(n * n + 2 * n, n * d, generator=g) * 0.1).to(fdt)
    alpha = torch.tensor([0.5, 0.7, 0.9]).to(fdt)
    bias = (torch.randn(n * n + 2 * n, generator=g) * 0.1).to(fdt)
    gam = torch.randn(n, d, generator=g).to(fdt) if gamma else None
    return x, phi, alpha, bias, gam


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("lead,dtype,atol", [((2, 3), torch.bfloat16, 3e-2), ((5,), torch.float16, 3e-3)])
def test_mhc_pre_forward(device, lead, dtype, atol):
    x, phi, alpha, bias, gamma = _mhc_inputs(lead, dtype)
    res = torch_npu.npu_mhc_pre(x.to(device), phi.to(device), alpha.to(device), bias.to(device),
                                gamma=gamma.to(device), norm_eps=1e-5, hc_eps=1e-3, out_flag=1)
    ref = _mhc_pre_ref(x.double(), phi.double(), alpha.double(), bias.double(), gamma.double(), 1e-5, 1e-3)
    assert res[0].dtype == dtype and all(t.dtype == torch.float32 for t in res[1:])
    assert [tuple(t.shape) for t in res] == [lead + (16,), lead + (4,), lead + (4, 4), lead, lead + (24,), lead + (4,)]
    _close(res[0], ref[0], atol, 1e-2)
    for got, exp in zip(res[1:], ref[1:]):
        _close(got, exp, 1e-4, 1e-4)
    short = torch_npu.npu_mhc_pre(x, phi, alpha, bias)
    assert [tuple(t.shape) for t in short[3:]] == [(0,), (0,), (0,)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("with_gamma", [True, False])
def test_mhc_pre_backward_matches_reference_autograd(device, with_gamma):
    x, phi, alpha, bias, gamma = _mhc_inputs((2, 3), torch.float64, gamma=with_gamma, seed=18)
    leaves = [x, phi, alpha, bias] + ([gamma] if with_gamma else [])
    leaves = [t.clone().requires_grad_(True) for t in leaves]
    ref = _mhc_pre_ref(leaves[0], leaves[1], leaves[2], leaves[3], leaves[4] if with_gamma else None, 1e-6, 1e-4)
    gen = torch.Generator().manual_seed(19)
    g_in, g_post, g_res = (torch.randn(r.shape, generator=gen, dtype=torch.float64) for r in ref[:3])
    g_xpost = torch.randn(x.shape, generator=gen, dtype=torch.float64)
    r_grads = torch.autograd.grad(ref[:3], leaves, (g_in, g_post, g_res))
    dv = lambda t: None if t is None else t.to(device)  # noqa: E731
    fwd = torch_npu.npu_mhc_pre(dv(x), dv(phi), dv(alpha), dv(bias), gamma=dv(gamma), hc_eps=1e-4, out_flag=1)
    got = torch_npu.npu_mhc_pre_backward(dv(x), dv(phi), dv(alpha), dv(g_in), dv(g_post), dv(g_res), fwd[3], fwd[4],
                                         fwd[5], fwd[1], gamma=dv(gamma), hc_eps=1e-4, grad_x_post=dv(g_xpost))
    _close(got[0], r_grads[0] + g_xpost, 1e-9, 1e-9)
    for a, b in zip(got[1:4], r_grads[1:4]):
        _close(a, b, 1e-9, 1e-9)
    if with_gamma:
        _close(got[4], r_grads[4], 1e-9, 1e-9)
    else:
        assert got[4].shape == (4, 16) and not got[4].any()


def test_mhc_pre_errors_and_fake():
    x, phi, alpha, bias, gamma = _mhc_inputs((3,), torch.bfloat16)
    with pytest.raises(RuntimeError, match="phi must be"):
        torch_npu.npu_mhc_pre(x, phi[:-1], alpha, bias)
    with pytest.raises(NotImplementedError, match="inner_precise"):
        torch_npu.npu_mhc_pre(x, phi, alpha, bias, inner_precise=1)
    with FakeTensorMode():
        fx = torch.randn(2, 5, 8, 32).bfloat16()
        res = ops.npu_mhc_pre(fx, torch.randn(80, 256), torch.randn(3), torch.randn(80), out_flag=1)
        grads = ops.npu_mhc_pre_backward(fx, torch.randn(80, 256), torch.randn(3), torch.randn(2, 5, 32).bfloat16(),
                                         torch.randn(2, 5, 8), torch.randn(2, 5, 8, 8), torch.randn(2, 5),
                                         torch.randn(2, 5, 80), torch.randn(2, 5, 8), torch.randn(2, 5, 8))
    assert [tuple(t.shape) for t in res] == [(2, 5, 32), (2, 5, 8), (2, 5, 8, 8), (2, 5), (2, 5, 80), (2, 5, 8)]
    assert [tuple(t.shape) for t in grads] == [(2, 5, 8, 32), (80, 256), (3,), (80,), (8, 32)]
    assert grads[0].dtype == torch.bfloat16 and grads[1].dtype == torch.float32


def _sinkhorn_ref(x, iters, eps, keep_prob_in_norm0=True):
    """Documented Sinkhorn forward in float64 torch ops; returns y and the intermediates in the
    documented out_flag=1 layouts (norm[0] = softmax(x), sum[0] unused)."""
    p = torch.softmax(x, -1)
    cur = p + eps
    norms, sums = [p], [torch.zeros_like(p[..., 0])]
    col = cur.sum(-2, keepdim=True) + eps
    cur = cur / col
    norms.append(cur)
    sums.append(col.squeeze(-2))
    for _ in range(iters - 1):
        row = cur.sum(-1, keepdim=True) + eps
        cur = cur / row
        norms.append(cur)
        sums.append(row.squeeze(-1))
        col = cur.sum(-2, keepdim=True) + eps
        cur = cur / col
        norms.append(cur)
        sums.append(col.squeeze(-2))
    lead = x.dim() - 2
    norm_out = torch.stack(norms).permute(0, lead + 1, lead + 2, *range(1, lead + 1))
    sum_out = torch.stack(sums).permute(0, lead + 1, *range(1, lead + 1))
    return cur, norm_out, sum_out


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", [(2, 3, 4, 4), (5, 6, 6)])
def test_mhc_sinkhorn_backward_matches_autograd(device, shape):
    gen = torch.Generator().manual_seed(28)
    x = torch.randn(shape, generator=gen, dtype=torch.float64)
    leaf = x.clone().requires_grad_(True)
    y, norm, sums = _sinkhorn_ref(leaf, 4, 1e-6)
    g = torch.randn(shape, generator=gen, dtype=torch.float64)
    (ref,) = torch.autograd.grad(y, leaf, g)
    got = torch_npu.npu_mhc_sinkhorn_backward(g.to(device), norm.detach().to(device), sums.detach().to(device))
    assert got.shape == shape and got.dtype == torch.float64
    _close(got, ref, 1e-10, 1e-10)
    # with the emulated forward's intermediates (float32)
    _, norm32, sum32 = torch_npu.npu_mhc_sinkhorn(x.float().to(device), eps=1e-6, num_iters=4, out_flag=1)
    got32 = torch_npu.npu_mhc_sinkhorn_backward(g.float().to(device), norm32, sum32)
    assert got32.dtype == torch.float32
    _close(got32, ref, 1e-4, 1e-4)


def test_mhc_sinkhorn_backward_fake_and_errors():
    with FakeTensorMode():
        out = ops.npu_mhc_sinkhorn_backward(_r(2, 3, 4, 4), _r(40, 4, 4, 2, 3), _r(40, 4, 2, 3))
    assert out.shape == (2, 3, 4, 4) and out.dtype == f32
    with pytest.raises(RuntimeError, match="sum must be"):
        torch_npu.npu_mhc_sinkhorn_backward(torch.zeros(5, 4, 4), torch.zeros(8, 4, 4, 5), torch.zeros(8, 4, 4))
