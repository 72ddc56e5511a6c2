"""Tensor ops: npu_scatter_nd_update, scatter_update, npu_sign_bits_pack / unpack and npu_max.dim
against references."""
import pytest
import torch

import torch_npu

from _op_helpers import DEVICES, close_ref as close


@pytest.mark.parametrize("device", DEVICES)
def test_scatter_nd_update(device):
    x = torch.arange(24, dtype=torch.float32).reshape(4, 3, 2)
    idx = torch.tensor([[0, 1], [3, 2]])
    upd = torch.tensor([[100., 101.], [200., 201.]])
    exp = x.clone().tolist()
    for (i, j), u in zip(idx.tolist(), upd.tolist()):
        exp[i][j] = u
    out = torch_npu.npu_scatter_nd_update(x.to(device), idx.to(device), upd.to(device))
    close(out, torch.tensor(exp), torch.float32, device)
    close(x, torch.arange(24.).reshape(4, 3, 2))  # input untouched
    idx1 = torch.tensor([[2], [0]], dtype=torch.int32)
    upd1 = torch.full((2, 3, 2), -1.0)
    y = x.to(device)
    r = torch_npu.npu_scatter_nd_update_(y, idx1.to(device), upd1.to(device))
    exp1 = x.clone().tolist()
    exp1[2] = upd1[0].tolist()
    exp1[0] = upd1[1].tolist()
    close(y, torch.tensor(exp1), torch.float32, device)
    assert r.data_ptr() == y.data_ptr()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("axis", [-1, -2, 1])
def test_scatter_update(device, axis):
    g = torch.Generator().manual_seed(7)
    data = torch.randn(3, 2, 5, 6, generator=g)
    ax = axis % 4
    ushape = list(data.shape)
    ushape[ax] = 2
    upd = torch.randn(ushape, generator=g)
    idx = torch.tensor([0, 3, 1]) if ax != 1 else torch.tensor([0, 0, 0])
    exp = data.clone()
    for b in range(3):
        for j in range(2):
            sl = [b, slice(None), slice(None), slice(None)]
            us = [b, slice(None), slice(None), slice(None)]
            sl[ax] = int(idx[b]) + j
            us[ax] = j
            exp[tuple(sl)] = upd[tuple(us)]
    out = torch_npu.scatter_update(data.to(device), idx.to(device), upd.to(device), axis)
    close(out, exp, torch.float32, device)
    d2 = data.to(device)
    r = torch_npu.scatter_update_(d2, idx.to(device), upd.to(device), axis)
    close(d2, exp, torch.float32, device)
    assert r.data_ptr() == d2.data_ptr()


def test_scatter_update_unsupported():
    data = torch.zeros(2, 1, 4, 8)
    with pytest.raises(NotImplementedError, match="indices of shape"):
        torch_npu.scatter_update(data, torch.zeros(2, 2, dtype=torch.long), torch.ones(2, 1, 1, 8), -2)
    with pytest.raises(NotImplementedError, match="axis=0"):
        torch_npu.scatter_update(data, torch.zeros(2, dtype=torch.long), torch.ones(1, 1, 4, 8), 0)


@pytest.mark.parametrize("device", DEVICES)
def test_sign_bits_doc_example(device):
    a = torch.tensor([5, 4, 3, 2, 0, -1, -2, 4, 3, 2, 1, 0, -1, -2], dtype=torch.float32).to(device)
    p = torch_npu.npu_sign_bits_pack(a, 2)
    assert p.dtype == torch.uint8 and p.device.type == device
    assert p.cpu().tolist() == [[159], [15]]
    u = torch_npu.npu_sign_bits_unpack(torch.tensor([159, 15], dtype=torch.uint8).to(device), 2, torch.float32)
    close(u, [[1, 1, 1, 1, 1, -1, -1, 1], [1, 1, 1, 1, -1, -1, -1, -1]], torch.float32, device)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_sign_bits_random(dtype):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(45, generator=g).to(dtype)
    p = torch_npu.npu_sign_bits_pack(x, 3)
    bits = [1 if v >= 0 else 0 for v in x.tolist()] + [0] * 3
    exp = [sum(bits[8 * k + i] << i for i in range(8)) for k in range(6)]
    assert p.shape == (3, 2) and p.flatten().tolist() == exp
    u = torch_npu.npu_sign_bits_unpack(p.flatten(), 2, dtype)
    assert u.dtype == dtype and u.shape == (2, 24)
    assert u.flatten().tolist() == [2.0 * b - 1 for b in bits]
    with pytest.raises(NotImplementedError, match="dtype"):
        torch_npu.npu_sign_bits_unpack(p.flatten(), 2, torch.float64)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("keepdim", [False, True])
def test_npu_max_dim(device, keepdim):
    x = torch.tensor([[1., 7., 3.], [9., -2., 4.]])
    v, i = torch_npu.npu_max(x.to(device), 1, keepdim)
    ev, ei = [7., 9.], [1, 0]
    shape = (2, 1) if keepdim else (2,)
    close(v, torch.tensor(ev).reshape(shape), torch.float32, device)
    assert i.dtype == torch.int32 and i.cpu().reshape(-1).tolist() == ei and i.shape == shape
    v, i = torch_npu.npu_max(x.to(device), dim=0)
    assert v.cpu().tolist() == [9., 7., 4.] and i.cpu().tolist() == [1, 0, 1]
