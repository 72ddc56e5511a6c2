"""Detection / indexing ops (torch_npu/op_plugin/detection/boxes.py).

References are written here in float64 / plain Python loops from the documented formulas,
never by calling the implementation; documented examples are checked verbatim.
"""
import math

import pytest
import torch

import torch_npu

DEVICES = ["cpu", "npu"]


def boxes(n, seed):
    g = torch.Generator().manual_seed(seed)
    xy = torch.rand(n, 2, generator=g, dtype=torch.float64) * 20
    wh = torch.rand(n, 2, generator=g, dtype=torch.float64) * 10 + 0.5
    return torch.cat([xy, xy + wh], 1)


def close(a, e, dtype=None, device=None, rtol=1e-5, atol=1e-5):
    if dtype is not None:
        assert a.dtype == dtype
    if device is not None:
        assert a.device.type == device
    e = torch.as_tensor(e)
    assert tuple(a.shape) == tuple(e.shape), (a.shape, e.shape)
    torch.testing.assert_close(a.detach().cpu().double(), e.double(), rtol=rtol, atol=atol)


# ------------------------------------------------------------------ iou


def ref_iou(b, g, mode, eps=0.01):
    out = torch.zeros(len(g), len(b), dtype=torch.float64)
    for m, gb in enumerate(g.tolist()):
        for n, bb in enumerate(b.tolist()):
            iw = max(min(bb[2], gb[2]) - max(bb[0], gb[0]), 0.0)
            ih = max(min(bb[3], gb[3]) - max(bb[1], gb[1]), 0.0)
            inter = iw * ih
            ab = (bb[2] - bb[0] + eps) * (bb[3] - bb[1] + eps)
            ag = (gb[2] - gb[0] + eps) * (gb[3] - gb[1] + eps)
            out[m, n] = inter / (ab + ag - inter) if mode == 0 else inter / ag
    return out


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode", [0, 1])
@pytest.mark.parametrize("op", ["npu_iou", "npu_ptiou"])
def test_iou(device, mode, op):
    b, g = boxes(5, 0), boxes(3, 1)
    out = getattr(torch_npu, op)(b.float().to(device), g.float().to(device), mode)
    close(out, ref_iou(b, g, mode), torch.float32, device)


def test_iou_doc_example():
    b = torch.tensor([[0, 0, 10, 10], [10, 10, 20, 20], [32, 32, 38, 42]], dtype=torch.float16).npu()
    g = torch.tensor([[0, 0, 10, 20], [0, 10, 10, 10], [10, 10, 20, 20]], dtype=torch.float16).npu()
    out = torch_npu.npu_iou(b, g, 0)
    exp = torch.tensor([[0.4985, 0, 0], [0, 0, 0], [0, 0.9961, 0]])
    close(out, exp, torch.float16, "npu", rtol=0, atol=1e-3)


def test_iou_meta_and_bad_mode():
    out = torch_npu.npu_iou(torch.empty(7, 4, device="meta"), torch.empty(2, 4, device="meta"))
    assert out.shape == (2, 7)
    with pytest.raises(NotImplementedError, match="mode=2"):
        torch_npu.npu_iou(boxes(2, 0).float(), boxes(2, 1).float(), 2)


# ------------------------------------------------------------------ giou


def ref_giou(a, b, trans):
    out = []
    for i in range(a.shape[1]):
        p, q = a[:, i].tolist(), b[:, i].tolist()
        if trans:
            p = [p[0] - p[2] / 2, p[1] - p[3] / 2, p[0] + p[2] / 2, p[1] + p[3] / 2]
            q = [q[0] - q[2] / 2, q[1] - q[3] / 2, q[0] + q[2] / 2, q[1] + q[3] / 2]
        inter = max(min(p[2], q[2]) - max(p[0], q[0]), 0) * max(min(p[3], q[3]) - max(p[1], q[1]), 0)
        u = (p[2] - p[0]) * (p[3] - p[1]) + (q[2] - q[0]) * (q[3] - q[1]) - inter
        c = (max(p[2], q[2]) - min(p[0], q[0])) * (max(p[3], q[3]) - min(p[1], q[1]))
        out.append([inter / u - (c - u) / c])
    return torch.tensor(out, dtype=torch.float64)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("trans", [False, True])
def test_giou(device, trans):
    a, b = boxes(6, 2).t().contiguous(), boxes(6, 3).t().contiguous()
    out = torch_npu.npu_giou(a.float().to(device), b.float().to(device), trans=trans)
    close(out, ref_giou(a, b, trans), torch.float32, device)


def test_giou_identical_is_one_and_unsupported():
    a = boxes(4, 4).t().float().npu()
    close(torch_npu.npu_giou(a, a, trans=True, is_cross=False, mode=0), torch.ones(4, 1))
    with pytest.raises(NotImplementedError, match="is_cross"):
        torch_npu.npu_giou(a, a, is_cross=True)
    with pytest.raises(NotImplementedError, match="mode=1"):
        torch_npu.npu_giou(a, a, mode=1)


# ------------------------------------------------------------------ bounding box encode / decode


def test_bbox_encode_doc_example():
    a = torch.tensor([[1., 2., 3., 4.], [3., 4., 5., 6.]]).npu()
    g = torch.tensor([[5., 6., 7., 8.], [7., 8., 9., 6.]]).npu()
    out = torch_npu.npu_bounding_box_encode(a, g, 0, 0, 0, 0, 0.1, 0.1, 0.2, 0.2)
    exp = [[13.3281, 13.3281, 0.0, 0.0], [13.3281, 6.6641, 0.0, -5.4922]]
    close(out, exp, torch.float32, "npu", rtol=0, atol=1e-2)


def test_bbox_decode_doc_example():
    r = torch.tensor([[1., 2., 3., 4.], [3., 4., 5., 6.]]).npu()
    d = torch.tensor([[5., 6., 7., 8.], [7., 8., 9., 6.]]).npu()
    out = torch_npu.npu_bounding_box_decode(r, d, 0, 0, 0, 0, 1, 1, 1, 1, (10, 10), 0.1)
    close(out, [[2.5, 6.5, 9.0, 9.0], [9.0, 9.0, 9.0, 9.0]], torch.float32, "npu")


MEANS, STDS = (0.1, -0.2, 0.05, 0.0), (0.1, 0.2, 0.3, 0.4)


def ref_encode(a, g):
    out = []
    for p, q in zip(a.tolist(), g.tolist()):
        pw, ph, gw, gh = p[2] - p[0] + 1, p[3] - p[1] + 1, q[2] - q[0] + 1, q[3] - q[1] + 1
        px, py, gx, gy = (p[0] + p[2]) / 2, (p[1] + p[3]) / 2, (q[0] + q[2]) / 2, (q[1] + q[3]) / 2
        d = [(gx - px) / pw, (gy - py) / ph, math.log(gw / pw), math.log(gh / ph)]
        out.append([(d[i] - MEANS[i]) / STDS[i] for i in range(4)])
    return torch.tensor(out, dtype=torch.float64)


def ref_decode(r, deltas, shape, clip):
    mr = abs(math.log(clip))
    out = []
    for p, d in zip(r.tolist(), deltas.tolist()):
        d = [d[i] * STDS[i] + MEANS[i] for i in range(4)]
        dw, dh = min(max(d[2], -mr), mr), min(max(d[3], -mr), mr)
        pw, ph = p[2] - p[0] + 1, p[3] - p[1] + 1
        px, py = (p[0] + p[2]) / 2, (p[1] + p[3]) / 2
        gw, gh = pw * math.exp(dw), ph * math.exp(dh)
        gx, gy = px + pw * d[0], py + ph * d[1]
        cx = lambda v: min(max(v, 0), shape[1] - 1)
        cy = lambda v: min(max(v, 0), shape[0] - 1)
        out.append([cx(gx - gw / 2 + 0.5), cy(gy - gh / 2 + 0.5), cx(gx + gw / 2 - 0.5), cy(gy + gh / 2 - 0.5)])
    return torch.tensor(out, dtype=torch.float64)


@pytest.mark.parametrize("device", DEVICES)
def test_bbox_encode_decode(device):
    a, g = boxes(8, 5), boxes(8, 6)
    enc = torch_npu.npu_bounding_box_encode(a.float().to(device), g.float().to(device), *MEANS, *STDS)
    close(enc, ref_encode(a, g), torch.float32, device, rtol=1e-4, atol=1e-4)
    shape = (18, 25)
    dec = torch_npu.npu_bounding_box_decode(a.float().to(device), enc, *MEANS, *STDS, shape, 16 / 1000)
    close(dec, ref_decode(a, enc.cpu().double(), shape, 16 / 1000), torch.float32, device, rtol=1e-4, atol=1e-4)
    meta = torch_npu.npu_bounding_box_decode(torch.empty(3, 4, device="meta"), torch.empty(3, 4, device="meta"),
                                             *MEANS, *STDS, shape, 0.1)
    assert meta.shape == (3, 4)
    with pytest.raises(NotImplementedError, match="max_shape"):
        torch_npu.npu_bounding_box_decode(a.float(), enc.cpu(), *MEANS, *STDS, [5], 0.1)


# ------------------------------------------------------------------ scatter_nd_update / scatter_update


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


# ------------------------------------------------------------------ sign bits


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


# ------------------------------------------------------------------ group_norm_silu / softmax CE / max


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_group_norm_silu(device, dtype):
    g = torch.Generator().manual_seed(9)
    x = torch.randn(2, 6, 3, 2, generator=g, dtype=torch.float64)
    w, b = torch.randn(6, generator=g, dtype=torch.float64), torch.randn(6, generator=g, dtype=torch.float64)
    xq, wq, bq = x.to(dtype), w.to(dtype), b.to(dtype)
    y, mean, rstd = torch_npu.npu_group_norm_silu(xq.to(device), wq.to(device), bq.to(device), 3, 1e-5)
    xd, wd, bd = xq.double(), wq.double(), bq.double()
    ey = torch.empty_like(xd)
    em = torch.empty(2, 3, dtype=torch.float64)
    er = torch.empty(2, 3, dtype=torch.float64)
    for n in range(2):
        for gi in range(3):
            vals = xd[n, 2 * gi:2 * gi + 2].flatten().tolist()
            mu = sum(vals) / len(vals)
            var = sum((v - mu) ** 2 for v in vals) / len(vals)
            r = 1 / math.sqrt(var + 1e-5)
            em[n, gi], er[n, gi] = mu, r
            for c in range(2 * gi, 2 * gi + 2):
                z = (xd[n, c] - mu) * r * wd[c] + bd[c]
                ey[n, c] = z / (1 + torch.exp(-z))
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-3, atol=2e-3)
    close(y, ey, dtype, device, **tol)
    close(mean, em, dtype, device, **tol)
    close(rstd, er, dtype, device, **tol)
    ym, mm, rm = torch_npu.npu_group_norm_silu(torch.empty(2, 6, 4, device="meta"), None, None, 2)
    assert ym.shape == (2, 6, 4) and mm.shape == (2, 2) and rm.shape == (2, 2)


@pytest.mark.parametrize("device", DEVICES)
def test_softmax_cross_entropy_with_logits(device):
    g = torch.Generator().manual_seed(11)
    x = torch.randn(4, 5, generator=g, dtype=torch.float64)
    lab = torch.rand(4, 5, generator=g, dtype=torch.float64)
    lab = lab / lab.sum(-1, keepdim=True)
    exp = []
    for row, lr in zip(x.tolist(), lab.tolist()):
        lse = math.log(sum(math.exp(v) for v in row))
        exp.append(-sum(l * (v - lse) for v, l in zip(row, lr)))
    out = torch_npu.npu_softmax_cross_entropy_with_logits(x.float().to(device), lab.float().to(device))
    close(out, torch.tensor(exp), torch.float32, device)


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
