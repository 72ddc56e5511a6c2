"""Convolution ops and the backward ops of convolution, matmul, FFT, gather, max/min,
repeat_interleave and renorm (torch_npu/op_plugin/conv/convolution.py).

Every reference is PyTorch's own autograd of the forward function on CPU tensors in float64.
"""
import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode

import torch_npu

DEVICES = ["cpu", "npu"]


def _rand(*shape, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=dtype)


def _grads(fn, inputs, grad_out):
    leaves = [t.detach().clone().requires_grad_(True) for t in inputs]
    out = fn(*leaves)
    return torch.autograd.grad(out, leaves, grad_out)


def _close(actual, expected, atol=1e-9, rtol=1e-7):
    torch.testing.assert_close(actual.cpu(), expected, atol=atol, rtol=rtol)


@pytest.mark.parametrize("device", DEVICES)
def test_conv2d_forward_and_out(device):
    x, w, b = _rand(2, 4, 7, 6, seed=1), _rand(6, 2, 3, 3, seed=2), _rand(6, seed=3)
    ref = F.conv2d(x, w, b, stride=(2, 1), padding=(1, 2), dilation=(1, 2), groups=2)
    got = torch_npu.npu_conv2d(x.to(device), w.to(device), b.to(device), [2, 1], [1, 2], [1, 2], 2)
    _close(got, ref)
    w4 = _rand(5, 4, 2, 2, seed=8)
    out = torch.empty(0, dtype=torch.float64, device=device)
    res = torch.ops.npu.npu_conv2d.out(x.to(device), w4.to(device), None, [1, 1], [0, 0], [1, 1], 1, out=out)
    assert res is out
    _close(out, F.conv2d(x, w4))
    # npu_convolution is the N-d form: 1-d and 3-d too
    x1, w1 = _rand(2, 3, 9, seed=4), _rand(5, 3, 2, seed=5)
    _close(torch_npu.npu_convolution(x1.to(device), w1.to(device), None, [2], [1], [1], 1),
           F.conv1d(x1, w1, None, 2, 1))
    x3, w3 = _rand(1, 2, 4, 5, 5, seed=6), _rand(3, 2, 2, 3, 3, seed=7)
    _close(torch_npu.npu_convolution(x3.to(device), w3.to(device), None, [1, 1, 2], [0, 1, 1], [1, 1, 1], 1),
           F.conv3d(x3, w3, None, (1, 1, 2), (0, 1, 1)))


@pytest.mark.parametrize("device", DEVICES)
def test_conv_transpose_forward(device):
    x, w, b = _rand(2, 4, 5, 5, seed=1), _rand(4, 3, 3, 3, seed=2), _rand(6, seed=3)
    ref = F.conv_transpose2d(x, w, b, stride=2, padding=1, output_padding=1, groups=2, dilation=1)
    got = torch_npu.npu_conv_transpose2d(x.to(device), w.to(device), b.to(device), [1, 1], [1, 1], [2, 2], [1, 1], 2)
    _close(got, ref)
    x1, w1 = _rand(2, 3, 6, seed=4), _rand(3, 2, 3, seed=5)
    _close(torch_npu.npu_convolution_transpose(x1.to(device), w1.to(device), None, [0], [1], [2], [1], 1),
           F.conv_transpose1d(x1, w1, None, 2, 0, 1))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mask", [[True, True, True], [True, False, True], [False, True, False]])
def test_convolution_backward_ops(device, mask):
    x, w, b = _rand(2, 4, 7, 6, seed=1), _rand(6, 2, 3, 3, seed=2), _rand(6, seed=3)
    args = dict(stride=(2, 1), padding=(1, 2), dilation=(1, 2), groups=2)
    g = _rand(*F.conv2d(x, w, b, **args).shape, seed=9)
    ref = _grads(lambda x, w, b: F.conv2d(x, w, b, **args), [x, w, b], g)
    for op in (torch_npu.npu_conv2d_backward, torch_npu.npu_convolution_backward):
        got = op(x.to(device), g.to(device), w.to(device), [2, 1], [1, 2], [1, 2], 2, mask)
        for m, a, e in zip(mask, got, ref):
            if m:
                _close(a, e)
            else:
                assert a is None


@pytest.mark.parametrize("device", DEVICES)
def test_conv3d_and_transpose_backward_ops(device):
    x, w, b = _rand(1, 2, 4, 5, 5, seed=1), _rand(4, 1, 2, 3, 3, seed=2), _rand(4, seed=3)
    g = _rand(*F.conv3d(x, w, b, 1, 1, 1, 2).shape, seed=4)
    ref = _grads(lambda x, w, b: F.conv3d(x, w, b, 1, 1, 1, 2), [x, w, b], g)
    got = torch_npu.npu_conv3d_backward(x.to(device), g.to(device), w.to(device), [1, 1, 1], [1, 1, 1],
                                        [1, 1, 1], 2, [True, True, True])
    for a, e in zip(got, ref):
        _close(a, e)

    xt, wt, bt = _rand(2, 4, 5, 5, seed=5), _rand(4, 3, 3, 3, seed=6), _rand(6, seed=7)
    fwd = lambda x, w, b: F.conv_transpose2d(x, w, b, stride=2, padding=1, output_padding=1, groups=2)  # noqa: E731
    gt = _rand(*fwd(xt, wt, bt).shape, seed=8)
    ref = _grads(fwd, [xt, wt, bt], gt)
    for op in (torch_npu.npu_conv_transpose2d_backward, torch_npu.npu_convolution_transpose_backward):
        got = op(xt.to(device), gt.to(device), wt.to(device), [1, 1], [1, 1], [2, 2], [1, 1], 2, [True, True, True])
        for a, e in zip(got, ref):
            _close(a, e)

    x3, w3, b3 = _rand(1, 2, 3, 4, 4, seed=9), _rand(2, 3, 2, 2, 2, seed=10), _rand(3, seed=11)
    fwd3 = lambda x, w, b: F.conv_transpose3d(x, w, b, stride=2, padding=0, output_padding=1)  # noqa: E731
    g3 = _rand(*fwd3(x3, w3, b3).shape, seed=12)
    ref = _grads(fwd3, [x3, w3, b3], g3)
    got = torch_npu.npu_conv_transpose3d_backward(x3.to(device), g3.to(device), w3.to(device), [0, 0, 0],
                                                  [1, 1, 1], [2, 2, 2], [1, 1, 1], 1, [True, True, True])
    for a, e in zip(got, ref):
        _close(a, e)


@pytest.mark.parametrize("device", DEVICES)
def test_slow_and_depthwise_conv_backward(device):
    x, w, b = _rand(2, 3, 8, 8, seed=1), _rand(4, 3, 3, 3, seed=2), _rand(4, seed=3)
    fwd = lambda x, w, b: F.conv2d(x, w, b, stride=1, padding=2, dilation=2)  # noqa: E731
    g = _rand(*fwd(x, w, b).shape, seed=4)
    ref = _grads(fwd, [x, w, b], g)
    got = torch.ops.npu.slow_conv_dilated2d_backward(g.to(device), x.to(device), w.to(device), [3, 3], [1, 1],
                                                     [2, 2], [2, 2], [True, True, True])
    for a, e in zip(got, ref):
        _close(a, e)

    wt, bt = _rand(3, 2, 3, 3, seed=5), _rand(2, seed=6)
    fwdt = lambda x, w, b: F.conv_transpose2d(x, w, b, stride=2, padding=1, output_padding=1)  # noqa: E731
    gt = _rand(*fwdt(x, wt, bt).shape, seed=7)
    ref = _grads(fwdt, [x, wt, bt], gt)
    got = torch.ops.npu.slow_conv_transpose2d_backward(gt.to(device), x.to(device), wt.to(device), [3, 3], [2, 2],
                                                       [1, 1], [1, 1], [1, 1], [True, True, True])
    for a, e in zip(got, ref):
        _close(a, e)

    wd = _rand(6, 1, 3, 3, seed=8)  # depthwise, multiplier 2
    fwdd = lambda x, w: F.conv2d(x, w, None, stride=2, padding=1, groups=3)  # noqa: E731
    gd = _rand(*fwdd(x, wd).shape, seed=9)
    ref = _grads(fwdd, [x, wd], gd)
    got = torch.ops.npu._conv_depthwise2d_backward(gd.to(device), x.to(device), wd.to(device), [3, 3], [2, 2],
                                                   [1, 1], [1, 1], [True, True])
    for a, e in zip(got, ref):
        _close(a, e)
    got = torch.ops.npu._conv_depthwise2d_backward(gd.to(device), x.to(device), wd.to(device), [3, 3], [2, 2],
                                                   [1, 1], [1, 1], [False, True])
    assert got[0] is None
    _close(got[1], ref[1])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shapes", [((3, 4), (4, 5)), ((2, 3, 4), (4, 5)), ((4,), (2, 4, 3)), ((2, 1, 3, 4), (4, 5)),
                                    ((3, 4), (4,))])
def test_matmul_double_backward(device, shapes):
    a, b = _rand(*shapes[0], seed=1), _rand(*shapes[1], seed=2)
    go = _rand(*torch.matmul(a, b).shape, seed=3)
    gs, gother = _rand(*a.shape, seed=4), _rand(*b.shape, seed=5)

    # reference: differentiate L = <gs, dL/da> + <gother, dL/db> of matmul's first backward
    leaves = [t.clone().requires_grad_(True) for t in (go, a, b)]
    da, db = torch.autograd.grad(torch.matmul(leaves[1], leaves[2]), leaves[1:], leaves[0], create_graph=True)
    ref = torch.autograd.grad((da * gs).sum() + (db * gother).sum(), leaves, retain_graph=True)

    got = torch.ops.npu.matmul_double_backward(gs.to(device), gother.to(device), go.to(device), a.to(device),
                                               b.to(device), [True, True, True])
    for x, e in zip(got, ref):
        _close(x, e)
    # a missing incoming gradient counts as zero
    ref_only_self = torch.autograd.grad((da * gs).sum(), leaves, allow_unused=True, materialize_grads=True)
    got = torch.ops.npu.matmul_double_backward(gs.to(device), None, go.to(device), a.to(device), b.to(device),
                                               [True, True, False])
    _close(got[0], ref_only_self[0])
    _close(got[1], ref_only_self[1])
    assert got[2] is None


@pytest.mark.parametrize("device", DEVICES)
def test_bmm_v2_backward(device):
    a, b = _rand(3, 2, 4, seed=1), _rand(1, 4, 5, seed=2)
    g = _rand(3, 2, 5, seed=3)
    ref = _grads(torch.matmul, [a, b], g)
    _close(torch_npu.npu_bmm_v2_mat1_backward(g.to(device), a.to(device), b.to(device), list(a.shape)), ref[0])
    _close(torch_npu.npu_bmm_v2_mat2_backward(g.to(device), a.to(device), b.to(device), list(b.shape)), ref[1])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("n", [8, 9])
@pytest.mark.parametrize("norm", [0, 1, 2])
def test_fft_backward(device, n, norm):
    # c2r: irfft over the last dim, output length n
    z = torch.complex(_rand(3, n // 2 + 1, seed=1), _rand(3, n // 2 + 1, seed=2))
    g = _rand(3, n, seed=3)
    zl = z.clone().requires_grad_(True)
    ref = torch.autograd.grad(torch.ops.aten._fft_c2r(zl, [1], norm, n), zl, g)[0]
    got = torch.ops.npu.fft_c2r_backward(g.to(device), [1], norm)
    torch.testing.assert_close(got.cpu(), ref)
    # r2c one-sided and two-sided
    x = _rand(3, n, seed=4)
    for onesided in (True, False):
        xl = x.clone().requires_grad_(True)
        y = torch.ops.aten._fft_r2c(xl, [1], norm, onesided)
        gy = torch.complex(_rand(*y.shape, seed=5), _rand(*y.shape, seed=6))
        ref = torch.autograd.grad(y, xl, gy)[0]
        got = torch.ops.npu.fft_r2c_backward(gy.to(device), [1], norm, onesided, n)
        torch.testing.assert_close(got.cpu(), ref)


@pytest.mark.parametrize("device", DEVICES)
def test_gather_max_min_backward(device):
    x = _rand(3, 5, seed=1)
    idx = torch.tensor([[0, 4, 4], [1, 1, 2], [3, 0, 0]])
    g = _rand(3, 3, seed=2)
    ref = _grads(lambda x: torch.gather(x, 1, idx), [x], g)[0]
    _close(torch_npu.npu_gather_backward(g.to(device), [3, 5], 1, idx.to(device), False), ref)

    for keepdim in (False, True):
        values, indices = torch_npu.npu_max(x.to(device), 1, keepdim)
        gm = _rand(*values.shape, seed=3)
        ref = _grads(lambda x: torch.max(x, 1, keepdim)[0], [x], gm)[0]
        _close(torch.ops.npu.npu_max_backward(gm.to(device), 1, indices, [3, 5], keepdim), ref)

        values, indices = torch.ops.npu.npu_min.dim(x.to(device), 1, keepdim)
        ref_v, ref_i = torch.min(x, 1, keepdim)
        _close(values, ref_v)
        assert indices.dtype == torch.int32 and torch.equal(indices.cpu().long(), ref_i)
        ref = _grads(lambda x: torch.min(x, 1, keepdim)[0], [x], gm)[0]
        _close(torch.ops.npu.npu_min_backward(gm.to(device), 1, indices, [3, 5], keepdim), ref)


@pytest.mark.parametrize("device", DEVICES)
def test_repeat_interleave_backward(device):
    x = _rand(2, 3, seed=1)
    for dim in (None, 0, 1):
        g = _rand(*torch.repeat_interleave(x, 3, dim).shape, seed=2)
        ref = _grads(lambda x: torch.repeat_interleave(x, 3, dim), [x], g)[0]
        _close(torch.ops.npu.repeat_interleave_backward_int(g.to(device), x.to(device), 3, dim), ref)
    reps = torch.tensor([2, 0, 3])
    g = _rand(*torch.repeat_interleave(x, reps, 1).shape, seed=3)
    ref = _grads(lambda x: torch.repeat_interleave(x, reps, 1), [x], g)[0]
    _close(torch.ops.npu.repeat_interleave_backward_tensor(g.to(device), x.to(device), reps.to(device), 1), ref)
    reps = torch.tensor([1, 2, 0, 1, 3, 1])
    g = _rand(int(reps.sum()), seed=4)
    ref = _grads(lambda x: torch.repeat_interleave(x, reps), [x], g)[0]
    _close(torch.ops.npu.repeat_interleave_backward_tensor(g.to(device), x.to(device), reps.to(device), None), ref)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("p", [1.0, 2.0, 3.0, float("inf")])
def test_renorm_backward(device, p):
    x = _rand(4, 3, 2, seed=1) * 2
    x[1] *= 0.01  # one slice below maxnorm: gradient passes through
    g = _rand(4, 3, 2, seed=2)
    ref = _grads(lambda x: torch.renorm(x, p, 0, 1.5), [x], g)[0]
    got = torch_npu.npu_renorm_backward(g.to(device), x.to(device), p, 0, 1.5)
    _close(got, ref, atol=1e-6, rtol=1e-6)


def test_fake_tensor_shapes():
    with FakeTensorMode():
        x, w = torch.empty(2, 4, 7, 6), torch.empty(6, 2, 3, 3)
        assert torch_npu.npu_conv2d(x, w, None, [2, 1], [1, 2], [1, 2], 2).shape == (2, 6, 4, 6)
        gi, gw, gb = torch_npu.npu_conv2d_backward(x, torch.empty(2, 6, 4, 6), w, [2, 1], [1, 2], [1, 2], 2,
                                                   [True, True, True])
        assert gi.shape == x.shape and gw.shape == w.shape and gb.shape == (6,)
        assert torch.ops.npu.fft_c2r_backward(torch.empty(3, 8), [1], 0).shape == (3, 5)
        assert torch.ops.npu.npu_min.dim(torch.empty(3, 5), 1)[1].dtype == torch.int32


def test_float32_npu_conv_matches_cpu():
    x, w = _rand(2, 3, 9, 9, seed=1, dtype=torch.float32), _rand(5, 3, 3, 3, seed=2, dtype=torch.float32)
    torch.testing.assert_close(torch_npu.npu_conv2d(x.npu(), w.npu(), None, [1, 1], [1, 1], [1, 1], 1).cpu(),
                               F.conv2d(x, w, None, 1, 1))


def test_stft_backward_meta_only():
    from torch_npu.op_plugin._registry import not_emulated_message
    with FakeTensorMode():
        x = torch.empty(2, 64)
        g = torch.empty(2, 9, 5, dtype=torch.complex64)
        out = torch.ops.npu.stft_backward(g, x, 16, 4)
        assert out.shape == (2, 64) and out.dtype == torch.float32
    with pytest.raises(NotImplementedError) as info:
        torch.ops.npu.stft_backward(torch.zeros(2, 9, 5, dtype=torch.complex64), torch.zeros(2, 64), 16, 4)
    assert str(info.value) == not_emulated_message("stft_backward")
