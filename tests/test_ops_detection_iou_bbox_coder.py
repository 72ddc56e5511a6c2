"""IoU and box-coder ops (torch_npu/op_plugin/detection/iou.py and bbox_coder.py).

References are written here in float64 / plain Python loops from the documented formulas,
never by calling the implementation; documented examples are checked verbatim.
"""
import math

import pytest
import torch

import torch_npu

from _op_helpers import DEVICES, close_ref as close


def boxes(n, seed):
    g = torch.Generator().manual_seed(seed)
    xy = torch.rand(n, 2, generator=g, dtype=torch.float64) * 20
    wh = torch.rand(n, 2, generator=g, dtype=torch.float64) * 10 + 0.5
    return torch.cat([xy, xy + wh], 1)


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


# ------------------------------------------------------------------ sign bits


# ------------------------------------------------------------------ group_norm_silu / softmax CE / max
