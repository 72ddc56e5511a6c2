"""npu_diou / npu_ciou (detection/box_overlap.py), npu_roi_align (detection/roi_align.py), npu_nms_v4 (detection/nms.py)
against plain-Python references written from the documented formulas."""
import math

import pytest
import torch

import torch_npu

from _op_helpers import DEVICES


def cols(n, seed):
    g = torch.Generator().manual_seed(seed)
    xy = torch.rand(n, 2, generator=g, dtype=torch.float64) * 10
    wh = torch.rand(n, 2, generator=g, dtype=torch.float64) * 5 + 0.5
    return torch.cat([xy, xy + wh], 1).t().contiguous()  # (4, n) x1 y1 x2 y2


def to_xywh(b):
    return torch.stack([(b[0] + b[2]) / 2, (b[1] + b[3]) / 2, b[2] - b[0], b[3] - b[1]])


def ref_overlap(p, q, kind):
    """p, q: [x1, y1, x2, y2] lists."""
    iw = max(min(p[2], q[2]) - max(p[0], q[0]), 0)
    ih = max(min(p[3], q[3]) - max(p[1], q[1]), 0)
    wp, hp, wq, hq = p[2] - p[0], p[3] - p[1], q[2] - q[0], q[3] - q[1]
    inter = iw * ih
    iou = inter / (wp * hp + wq * hq - inter)
    cx = max(p[2], q[2]) - min(p[0], q[0])
    cy = max(p[3], q[3]) - min(p[1], q[1])
    rho2 = ((p[0] + p[2]) / 2 - (q[0] + q[2]) / 2) ** 2 + ((p[1] + p[3]) / 2 - (q[1] + q[3]) / 2) ** 2
    d = iou - rho2 / (cx * cx + cy * cy)
    if kind == "diou":
        return d
    v = 4 / math.pi ** 2 * (math.atan(wq / hq) - math.atan(wp / hp)) ** 2
    return d - v / (1 - iou + v) * v


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["diou", "ciou"])
@pytest.mark.parametrize("trans", [False, True])
@pytest.mark.parametrize("is_cross", [False, True])
def test_diou_ciou(device, kind, trans, is_cross):
    a, b = cols(5, 1), cols(5 if not is_cross else 3, 2)
    fa, fb = (to_xywh(a), to_xywh(b)) if trans else (a, b)
    out = getattr(torch_npu, "npu_" + kind)(fa.float().to(device), fb.float().to(device), trans=trans,
                                            is_cross=is_cross)
    A, B = a.t().tolist(), b.t().tolist()
    if is_cross:
        exp = [[ref_overlap(p, q, kind) for p in A] for q in B]
    else:
        exp = [[ref_overlap(p, q, kind) for p, q in zip(A, B)]]
    assert out.dtype == torch.float32 and out.device.type == device
    torch.testing.assert_close(out.cpu().double(), torch.tensor(exp, dtype=torch.float64), rtol=1e-5, atol=1e-5)


def test_diou_ciou_fp16_grad_meta_errors():
    a, b = cols(6, 3), cols(6, 4)
    out = torch_npu.npu_ciou(a.half().npu(), b.half().npu(), is_cross=False)
    exp = torch.tensor([[ref_overlap(p, q, "ciou") for p, q in zip(a.half().double().t().tolist(),
                                                                    b.half().double().t().tolist())]], dtype=torch.float64)
    assert out.dtype == torch.float16
    torch.testing.assert_close(out.cpu().double(), exp, rtol=0, atol=2e-3)
    x, y = to_xywh(a).requires_grad_(), to_xywh(b).requires_grad_()
    torch.autograd.gradcheck(lambda p, q: torch_npu.npu_diou(p, q, trans=True), (x, y))
    # CIoU: the hardware backward (CIoUGrad) holds alpha = v / (1 - iou + v) constant, so compare
    # with autograd of a float64 reference in which alpha is frozen
    def ref_ciou(p, q):
        pw, ph, qw, qh = p[2], p[3], q[2], q[3]
        iw = (torch.minimum(p[0] + pw / 2, q[0] + qw / 2) - torch.maximum(p[0] - pw / 2, q[0] - qw / 2)).clamp(min=0)
        ih = (torch.minimum(p[1] + ph / 2, q[1] + qh / 2) - torch.maximum(p[1] - ph / 2, q[1] - qh / 2)).clamp(min=0)
        inter = iw * ih
        iou = inter / (pw * ph + qw * qh - inter)
        cw = torch.maximum(p[0] + pw / 2, q[0] + qw / 2) - torch.minimum(p[0] - pw / 2, q[0] - qw / 2)
        chh = torch.maximum(p[1] + ph / 2, q[1] + qh / 2) - torch.minimum(p[1] - ph / 2, q[1] - qh / 2)
        rho2 = (p[0] - q[0]) ** 2 + (p[1] - q[1]) ** 2
        v = 4 / math.pi ** 2 * (torch.atan(qw / qh) - torch.atan(pw / ph)) ** 2
        with torch.no_grad():
            alpha = v / (1 - iou + v)
        return (iou - rho2 / (cw * cw + chh * chh) - alpha * v).unsqueeze(0)

    g = torch.rand(1, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(7))
    got = torch.autograd.grad(torch_npu.npu_ciou(x, y, trans=True, is_cross=False), (x, y), g)
    exp = torch.autograd.grad(ref_ciou(x, y), (x, y), g)
    for a_, e_ in zip(got, exp):
        torch.testing.assert_close(a_, e_)
    m = torch.empty(4, 7, device="meta")
    assert torch_npu.npu_ciou(m, torch.empty(4, 3, device="meta")).shape == (3, 7)
    assert torch_npu.npu_diou(m, m).shape == (1, 7)
    with pytest.raises(NotImplementedError, match="mode=1"):
        torch_npu.npu_diou(a, b, mode=1)


# ------------------------------------------------------------------ roi_align


def ref_roi_align(feat, rois, scale, ph, pw, sample, mode):
    """Scalar loops: sample points at sub-cell centres, bilinear interpolation with the
    out-of-map rules, average per bin."""
    B, C, H, W = feat.shape
    out = torch.zeros(len(rois), C, ph, pw, dtype=torch.float64)
    f = feat.double()
    for n, (bi, x1, y1, x2, y2) in enumerate(rois):
        x1, y1, x2, y2 = x1 * scale, y1 * scale, x2 * scale, y2 * scale
        if mode == 1:
            x2, y2 = x2 + scale, y2 + scale
        if mode in (2, 3):
            x1, y1, x2, y2 = x1 - .5, y1 - .5, x2 - .5, y2 - .5
        rw, rh = x2 - x1, y2 - y1
        if mode != 2:
            rw, rh = max(rw, 1.0), max(rh, 1.0)
        gh = sample or max(1, math.ceil(rh / ph))
        gw = sample or max(1, math.ceil(rw / pw))
        for i in range(ph):
            for j in range(pw):
                acc = torch.zeros(C, dtype=torch.float64)
                for iy in range(gh):
                    y = y1 + i * rh / ph + (iy + .5) * rh / ph / gh
                    for ix in range(gw):
                        x = x1 + j * rw / pw + (ix + .5) * rw / pw / gw
                        if y < -1 or y > H or x < -1 or x > W:
                            continue
                        y, x = max(y, 0.0), max(x, 0.0)
                        yl, xl = int(y), int(x)
                        if yl >= H - 1:
                            yl = yh = H - 1
                            y = float(yl)
                        else:
                            yh = yl + 1
                        if xl >= W - 1:
                            xl = xh = W - 1
                            x = float(xl)
                        else:
                            xh = xl + 1
                        ly, lx = y - yl, x - xl
                        acc += (f[int(bi), :, yl, xl] * (1 - ly) * (1 - lx) + f[int(bi), :, yl, xh] * (1 - ly) * lx
                                + f[int(bi), :, yh, xl] * ly * (1 - lx) + f[int(bi), :, yh, xh] * ly * lx)
                out[n, :, i, j] = acc / (gh * gw)
    return out


def test_roi_align_doc_example():
    x = torch.arange(1., 37.).reshape(1, 1, 6, 6).npu()
    out = torch_npu.npu_roi_align(x, torch.tensor([[0, -2.0, -2.0, 22.0, 22.0]]).npu(), 0.25, 3, 3, 2, 0)
    assert out.cpu().tolist() == [[[[4.5, 6.5, 8.5], [16.5, 18.5, 20.5], [28.5, 30.5, 32.5]]]]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode", [0, 1, 2, 3])
@pytest.mark.parametrize("sample", [0, 2])
def test_roi_align_modes(device, mode, sample):
    g = torch.Generator().manual_seed(mode)
    feat = torch.randn(2, 3, 7, 8, generator=g)
    rois = [[0, 1.0, 2.0, 20.0, 14.0], [1, -6.0, -3.0, 9.0, 30.0], [1, 10.0, 10.0, 10.5, 11.0]]
    out = torch_npu.npu_roi_align(feat.to(device), torch.tensor(rois).to(device), 0.5, 3, 2, sample, mode)
    assert out.shape == (3, 3, 3, 2) and out.device.type == device
    torch.testing.assert_close(out.cpu().double(), ref_roi_align(feat, rois, 0.5, 3, 2, sample, mode),
                               rtol=1e-5, atol=1e-5)


def test_roi_align_half_grad_meta():
    g = torch.Generator().manual_seed(9)
    feat = torch.randn(1, 2, 5, 5, generator=g, dtype=torch.float64)
    rois = [[0, 0.5, 0.5, 6.0, 7.0]]
    out = torch_npu.npu_roi_align(feat.half().npu(), torch.tensor(rois).npu(), 0.7, 2, 2, 2, 0)
    assert out.dtype == torch.float16
    torch.testing.assert_close(out.cpu().double(), ref_roi_align(feat.half().double(), rois, 0.7, 2, 2, 2, 0),
                               rtol=0, atol=3e-3)
    f = feat.clone().requires_grad_()
    torch.autograd.gradcheck(lambda t: torch_npu.npu_roi_align(t, torch.tensor(rois, dtype=torch.float64),
                                                               0.7, 2, 2, 2, 0), (f,))
    m = torch_npu.npu_roi_align(torch.empty(2, 4, 9, 9, device="meta"), torch.empty(5, 5, device="meta"),
                                0.5, 3, 3, 2, 1)
    assert m.shape == (5, 4, 3, 3)


# ------------------------------------------------------------------ nms_v4


def ref_iou(p, q):
    lx, ly = max(min(p[0], p[2]), min(q[0], q[2])), max(min(p[1], p[3]), min(q[1], q[3]))
    hx, hy = min(max(p[0], p[2]), max(q[0], q[2])), min(max(p[1], p[3]), max(q[1], q[3]))
    inter = max(hx - lx, 0) * max(hy - ly, 0)
    ap, aq = abs(p[2] - p[0]) * abs(p[3] - p[1]), abs(q[2] - q[0]) * abs(q[3] - q[1])
    return 0.0 if ap <= 0 or aq <= 0 else inter / (ap + aq - inter)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("pad", [False, True])
def test_nms_v4(device, pad):
    g = torch.Generator().manual_seed(4)
    xy = torch.rand(60, 2, generator=g) * 50
    boxes = torch.cat([xy, xy + torch.rand(60, 2, generator=g) * 20 + 1], 1)
    scores = torch.rand(60, generator=g)
    idx, valid = torch_npu.npu_nms_v4(boxes.to(device), scores.to(device), 25, torch.tensor(0.4).to(device),
                                      torch.tensor(0.2).to(device), pad_to_max_output_size=pad)
    assert idx.dtype == torch.int32 and valid.dtype == torch.int32 and valid.dim() == 0
    k = int(valid)
    kept = idx.cpu().tolist()[:k]
    B, S = boxes.double().tolist(), scores.double().tolist()
    # reference greedy selection
    exp = []
    for i in sorted(range(60), key=lambda i: -S[i]):
        if S[i] > 0.2 and len(exp) < 25 and all(ref_iou(B[i], B[j]) <= 0.4 for j in exp):
            exp.append(i)
    assert kept == exp
    assert idx.numel() == (25 if pad else k)
    if pad:
        assert idx.cpu().tolist()[k:] == [0] * (25 - k)


def test_nms_v4_doc_shapes_and_meta():
    boxes = torch.rand(100, 4).npu().uniform_(0, 100)
    scores = torch.rand(100).npu().uniform_(0, 1)
    idx, valid = torch_npu.npu_nms_v4(boxes, scores, 20, torch.tensor(0.5).npu(), torch.tensor(0.3).npu())
    assert idx.numel() == int(valid) <= 20
    with pytest.raises(NotImplementedError, match="depends on the values"):
        torch_npu.npu_nms_v4(torch.empty(3, 4, device="meta"), torch.empty(3, device="meta"), 2,
                             torch.tensor(0.5), torch.tensor(0.1))
