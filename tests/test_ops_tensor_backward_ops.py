"""The backward ops torch_npu's autograd formulas call for matmul, bmmV2, FFT, gather, max/min,
repeat_interleave and renorm, against autograd of the PyTorch functions."""
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import torch_npu

from _op_helpers import DEVICES, autograd_grads as _grads, close_cpu as _close, randn_dims as _rand


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
