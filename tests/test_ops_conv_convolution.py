"""Convolution ops and their backward ops (torch_npu/op_plugin/conv/convolution.py).

Every reference is PyTorch's own autograd of the forward function on CPU tensors in float64.
"""
import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode

import torch_npu

from _op_helpers import DEVICES, autograd_grads as _grads, close_cpu as _close, randn_dims as _rand


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
