"""Detection ops (torch_npu/op_plugin/detection/): npu_rotated_box_encode / _decode, _npu_ciou,
npu_ciou_backward, npu_nms_rotated, npu_sub_sample.

References are written here: torch_npu's own goldens for the box coder, float64 formulas in
plain Python, and an independent rotated-box IoU (edge intersections + contained corners +
convex hull) for NMS. CPU and npu tensors, float32 and float16, FakeTensor shapes, errors.
"""
import math

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import torch_npu  # noqa: F401
from torch_npu.op_plugin._registry import IMPLEMENTED, META

from _op_helpers import DEVICES

npu = torch.ops.npu
OPS = ["npu_rotated_box_encode", "npu_rotated_box_decode", "_npu_ciou", "npu_ciou_backward", "npu_nms_rotated",
       "npu_sub_sample"]


def test_ops_are_emulated_without_meta_only_kernels():
    for name in OPS:
        assert name in IMPLEMENTED and name not in META


# ----------------------------------------------------------------- rotated box coder

def ref_centre(b):
    """[x1, y1, x2, y2, angle] -> centre form, width/height clamped to >= 1 (the kernel's rule)."""
    w, h = max(b[2] - b[0], 1.0), max(b[3] - b[1], 1.0)
    return b[0] + w / 2, b[1] + h / 2, w, h, b[4]


def ref_encode(anchor, gt, weight):
    ax, ay, aw, ah, at = ref_centre(anchor)
    gx, gy, gw, gh, gt_ = ref_centre(gt)
    d = [(gx - ax) / aw, (gy - ay) / ah, math.log(gw / aw), math.log(gh / ah),
         math.tan(math.radians(gt_)) - math.tan(math.radians(at))]
    return [v * w for v, w in zip(d, weight)]


def ref_decode(anchor, delta, weight):
    ax, ay, aw, ah, at = ref_centre(anchor)
    dx, dy, dw, dh, dt = [v / w for v, w in zip(delta, weight)]
    cx, cy, w, h = ax + dx * aw, ay + dy * ah, aw * math.exp(dw), ah * math.exp(dh)
    angle = math.degrees(math.atan(math.tan(math.radians(at)) + dt))
    return [cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2, angle]


def per_box(fn, a, b, weight):
    """Apply a per-box reference to (B, 5, N) tensors."""
    out = torch.empty(a.shape, dtype=torch.float64)
    for bi in range(a.size(0)):
        for n in range(a.size(2)):
            out[bi, :, n] = torch.tensor(fn(a[bi, :, n].tolist(), b[bi, :, n].tolist(), weight))
    return out


def corner_boxes(b, n, seed):
    g = torch.Generator().manual_seed(seed)
    xy = torch.rand(b, 2, n, generator=g, dtype=torch.float64) * 50
    wh = torch.rand(b, 2, n, generator=g, dtype=torch.float64) * 30 + 2
    angle = torch.rand(b, 1, n, generator=g, dtype=torch.float64) * 170 - 85
    return torch.cat([xy, xy + wh, angle], 1)


# torch_npu's goldens (test_rotated_box_encode_decode): anchors, second input, expected
ENCODE_GOLDENS = [
    (torch.float32, [44.2877, 9.1412, 88.7575, 25.8879, 64.8047], [39.1763, 0.9838, 78.1028, 29.5997, 51.5907],
     [-0.1773, -0.1327, -0.1331, 0.5358, -0.8643]),
    (torch.float16, [30.69, 32.6, 45.94, 59.88, -44.53], [30.44, 18.72, 33.22, 45.56, 8.5],
     [-0.4253, -0.5166, -1.702, -0.0162, 1.133]),
]
DECODE_GOLDENS = [
    (torch.float32, [32.1855, 41.9922, 64.1435, 62.5325, 34.607], [1.8725, -1.8915, 0.2395, -0.4622, -34.6539],
     [87.70366, 6.9412346, 128.31055, 19.879467, -88.313515]),
    (torch.float16, [4.137, 33.72, 29.4, 54.06, 41.28], [0.0244, -1.992, 0.2109, 0.315, -37.25],
     [1.786, -10.58, 33., 17.3, -88.44]),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("which", ["encode", "decode"])
@pytest.mark.parametrize("case", [0, 1])
def test_box_coder_goldens(device, which, case):
    dtype, anchor, other, expected = (ENCODE_GOLDENS if which == "encode" else DECODE_GOLDENS)[case]
    col = lambda v: torch.tensor(v, dtype=dtype).reshape(1, 5, 1).to(device)  # noqa: E731
    op = getattr(torch_npu, "npu_rotated_box_" + which)
    out = op(col(anchor), col(other), torch.ones(5, dtype=dtype).to(device))
    assert out.dtype == dtype and out.device.type == device and out.shape == (1, 5, 1)
    tol = dict(rtol=1e-3, atol=1e-4) if dtype == torch.float32 else dict(rtol=2e-3, atol=2e-3)
    torch.testing.assert_close(out.cpu().reshape(5).double(), torch.tensor(expected, dtype=torch.float64), **tol)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_box_coder_formula_with_weights(device, dtype):
    anchor, gt = corner_boxes(2, 7, 1), corner_boxes(2, 7, 2)
    anchor[0, 2, 0] = anchor[0, 0, 0] + 0.25   # a width below 1 is clamped to 1
    weight = [10.0, 10.0, 5.0, 5.0, 2.0]
    a, g = anchor.to(dtype), gt.to(dtype)      # the reference sees the rounded inputs
    w = torch.tensor(weight, dtype=dtype).to(device)
    enc = torch_npu.npu_rotated_box_encode(a.to(device), g.to(device), w)
    exp_enc = per_box(ref_encode, a.double(), g.double(), weight)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-3, atol=2e-2)
    assert enc.dtype == dtype and enc.device.type == device
    torch.testing.assert_close(enc.cpu().double(), exp_enc, **tol)
    deltas = exp_enc.to(dtype)
    dec = torch_npu.npu_rotated_box_decode(a.to(device), deltas.to(device), w)
    exp_dec = per_box(ref_decode, a.double(), deltas.double(), weight)
    # float32 tan -> atan of angles up to 85 degrees loses ~1e-4 degree
    tol = dict(rtol=1e-4, atol=1e-3) if dtype == torch.float32 else dict(rtol=2e-3, atol=0.1)
    torch.testing.assert_close(dec.cpu().double(), exp_dec, **tol)


def test_box_coder_fake_shapes_and_errors():
    with FakeTensorMode():
        a = torch.empty(3, 5, 4, dtype=torch.float16)
        assert torch_npu.npu_rotated_box_encode(a, a, torch.empty(5, dtype=torch.float16)).shape == (3, 5, 4)
        out = torch_npu.npu_rotated_box_decode(a.float(), a.float(), torch.empty(5))
        assert out.shape == (3, 5, 4) and out.dtype == torch.float32
    z = torch.zeros
    with pytest.raises(RuntimeError, match=r"anchor_box must be \(B, 5, N\)"):
        torch_npu.npu_rotated_box_encode(z(2, 4, 3), z(2, 4, 3), z(5))
    with pytest.raises(RuntimeError, match="gt_bboxes must have anchor_box's shape"):
        torch_npu.npu_rotated_box_encode(z(2, 5, 3), z(2, 5, 4), z(5))
    with pytest.raises(RuntimeError, match="weight must hold 5 values"):
        torch_npu.npu_rotated_box_decode(z(2, 5, 3), z(2, 5, 3), z(4))
    with pytest.raises(RuntimeError, match="same dtype"):
        torch_npu.npu_rotated_box_decode(z(2, 5, 3), z(2, 5, 3, dtype=torch.float16), z(5))


# ----------------------------------------------------------------- CIoU

def xywh_cols(n, seed):
    g = torch.Generator().manual_seed(seed)
    xy = torch.rand(2, n, generator=g, dtype=torch.float64) * 6
    wh = torch.rand(2, n, generator=g, dtype=torch.float64) * 4 + 1
    return torch.cat([xy, wh])  # (4, n) x, y, w, h


def ref_ciou_parts(p, q, trans):
    """(diou, iou, atan_sub) of box p against gt box q ([4] lists)."""
    if trans:
        p = [p[0] - p[2] / 2, p[1] - p[3] / 2, p[0] + p[2] / 2, p[1] + p[3] / 2]
        q = [q[0] - q[2] / 2, q[1] - q[3] / 2, q[0] + q[2] / 2, q[1] + q[3] / 2]
    wp, hp, wq, hq = p[2] - p[0], p[3] - p[1], q[2] - q[0], q[3] - q[1]
    inter = max(min(p[2], q[2]) - max(p[0], q[0]), 0) * max(min(p[3], q[3]) - max(p[1], q[1]), 0)
    iou = inter / (wp * hp + wq * hq - inter)
    c2 = (max(p[2], q[2]) - min(p[0], q[0])) ** 2 + (max(p[3], q[3]) - min(p[1], q[1])) ** 2
    rho2 = ((p[0] + p[2] - q[0] - q[2]) ** 2 + (p[1] + p[3] - q[1] - q[3]) ** 2) / 4
    return iou - rho2 / c2, iou, math.atan(wq / hq) - math.atan(wp / hp)


def ref_ciou(p, q, trans):
    diou, iou, atan_sub = ref_ciou_parts(p, q, trans)
    v = 4 / math.pi ** 2 * atan_sub ** 2
    return diou - v / (1 - iou + v) * v, atan_sub


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("trans", [True, False])
@pytest.mark.parametrize("is_cross", [False, True])
def test_npu_ciou_outputs(device, trans, is_cross):
    a, b = xywh_cols(5, 1), xywh_cols(5 if not is_cross else 3, 2)
    if not trans:  # corner form
        a, b = (torch.cat([t[:2], t[:2] + t[2:]]) for t in (a, b))
    overlap, atan_sub = npu._npu_ciou(a.float().to(device), b.float().to(device), trans=trans, is_cross=is_cross)
    A, B = a.t().tolist(), b.t().tolist()
    pairs = [[(p, q) for p in A] for q in B] if is_cross else [list(zip(A, B))]
    exp = torch.tensor([[ref_ciou(p, q, trans) for p, q in row] for row in pairs], dtype=torch.float64)
    assert overlap.shape == atan_sub.shape == exp.shape[:2] and overlap.device.type == device
    assert overlap.dtype == atan_sub.dtype == torch.float32
    torch.testing.assert_close(overlap.cpu().double(), exp[..., 0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(atan_sub.cpu().double(), exp[..., 1], rtol=1e-5, atol=1e-5)


def test_npu_ciou_float16_dtypes_and_torch_npu_golden():
    # torch_npu's golden for npu_ciou(box1, box2) with the contrib defaults (trans=True, is_cross=False)
    box1 = torch.tensor([[0, 0, 10, 10], [10, 10, 20, 20], [32, 32, 38, 42], [8, 8, 4, 4]], dtype=torch.float32)
    box2 = torch.tensor([[0, 0, 10, 20], [0, 10, 10, 10], [10, 10, 20, 20], [8, 8, 4, 4]], dtype=torch.float32)
    overlap, _ = npu._npu_ciou(box1.npu(), box2.npu(), True, False, 0, True)
    torch.testing.assert_close(overlap.cpu(), torch.tensor([[-0.0794, 0.3052, -0.0610, -0.1021]]),
                               rtol=1e-3, atol=1e-4)
    a, b = xywh_cols(6, 3).half(), xywh_cols(6, 4).half()
    overlap, atan_sub = npu._npu_ciou(a.npu(), b.npu(), True, False)
    assert overlap.dtype == torch.float16 and atan_sub.dtype == torch.float32   # op-plugin's casts
    exp = torch.tensor([[ref_ciou(p, q, True)[0] for p, q in zip(a.double().t().tolist(), b.double().t().tolist())]],
                       dtype=torch.float64)
    torch.testing.assert_close(overlap.cpu().double(), exp, rtol=2e-3, atol=2e-3)
    with FakeTensorMode():
        o, s = npu._npu_ciou(torch.empty(4, 5, dtype=torch.float16), torch.empty(4, 3, dtype=torch.float16))
        assert (o.shape, o.dtype, s.shape, s.dtype) == ((3, 5), torch.float16, (3, 5), torch.float32)
        db, dg = npu.npu_ciou_backward(torch.empty(1, 5), torch.empty(4, 5), torch.empty(4, 5), torch.empty(1, 5),
                                       trans=True, is_cross=False)
        assert db.shape == dg.shape == (4, 5)


def ref_ciou_grad(a, b, grad):
    """(d a, d b) of sum(grad * ciou) for x, y, w, h columns with alpha held constant (CIoUGrad's
    rule), by central differences in float64 of ``diou - alpha0 * v``."""
    def f(p, q, alpha0):
        diou, _, atan_sub = ref_ciou_parts(p, q, True)
        return diou - alpha0 * 4 / math.pi ** 2 * atan_sub ** 2
    da, db = torch.zeros_like(a), torch.zeros_like(b)
    eps = 1e-6
    for n in range(a.size(1)):
        p, q = a[:, n].tolist(), b[:, n].tolist()
        diou, iou, atan_sub = ref_ciou_parts(p, q, True)
        v = 4 / math.pi ** 2 * atan_sub ** 2
        alpha0 = v / (1 - iou + v)
        for k in range(4):
            for box, out, is_a in ((p, da, True), (q, db, False)):
                hi, lo = list(box), list(box)
                hi[k] += eps
                lo[k] -= eps
                fh = f(hi, q, alpha0) if is_a else f(p, hi, alpha0)
                fl = f(lo, q, alpha0) if is_a else f(p, lo, alpha0)
                out[k, n] = grad[n] * (fh - fl) / (2 * eps)
    return da, db


@pytest.mark.parametrize("device", DEVICES)
def test_ciou_backward_and_autograd(device):
    a, b = xywh_cols(6, 5), xywh_cols(6, 6)
    b[:2] = a[:2] + 0.7   # overlapping boxes: every term of the gradient is active
    grad = torch.linspace(0.5, 1.5, 6, dtype=torch.float64)
    exp_da, exp_db = ref_ciou_grad(a, b, grad.tolist())
    ad, bd = a.double().to(device).requires_grad_(), b.double().to(device).requires_grad_()
    overlap, atan_sub = npu._npu_ciou(ad, bd, True, False, 0, True)
    overlap.backward(grad.reshape(1, 6).to(device))
    torch.testing.assert_close(ad.grad.cpu(), exp_da, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(bd.grad.cpu(), exp_db, rtol=1e-6, atol=1e-7)
    da, db = npu.npu_ciou_backward(grad.reshape(1, 6).float().to(device), a.float().to(device), b.float().to(device),
                                   atan_sub.detach().float(), True, False, 0)
    assert da.dtype == db.dtype == torch.float32 and da.device.type == device
    torch.testing.assert_close(da.cpu().double(), exp_da, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(db.cpu().double(), exp_db, rtol=1e-4, atol=1e-5)
    h16 = npu.npu_ciou_backward(grad.half().to(device), a.half().to(device), b.half().to(device),
                                atan_sub.detach().float(), True, False, 0)
    assert all(t.dtype == torch.float16 for t in h16)
    torch.testing.assert_close(h16[0].cpu().double(), exp_da, rtol=2e-2, atol=5e-3)


def test_ciou_backward_uses_the_given_atan_sub_and_errors():
    a, b = xywh_cols(3, 7), xywh_cols(3, 8)
    b[:2] = a[:2] + 0.5
    grad = torch.ones(3, dtype=torch.float64)
    _, atan_sub = npu._npu_ciou(a, b, True, False)
    # v enters as 4/pi^2 * atan_sub^2: a zero atan_sub removes the aspect-ratio term of the gradient
    zero = npu.npu_ciou_backward(grad, a, b, torch.zeros_like(atan_sub), True, False, 0)
    full = npu.npu_ciou_backward(grad, a, b, atan_sub, True, False, 0)
    ref_diou = torch.zeros_like(a), torch.zeros_like(b)
    ad, bd = a.clone().requires_grad_(), b.clone().requires_grad_()
    torch_npu.npu_diou(ad, bd, trans=True, is_cross=False).sum().backward()
    ref_diou = ad.grad, bd.grad
    torch.testing.assert_close(zero[0], ref_diou[0])
    torch.testing.assert_close(zero[1], ref_diou[1])
    assert not torch.allclose(full[0], zero[0])
    z = torch.zeros
    with pytest.raises(NotImplementedError, match="trans=False"):
        npu.npu_ciou_backward(z(1, 3), z(4, 3), z(4, 3), z(1, 3), False, False, 0)
    with pytest.raises(NotImplementedError, match="is_cross=True"):
        npu.npu_ciou_backward(z(1, 3), z(4, 3), z(4, 3), z(1, 3), True, True, 0)
    with pytest.raises(NotImplementedError, match="mode=1"):
        npu.npu_ciou_backward(z(1, 3), z(4, 3), z(4, 3), z(1, 3), True, False, 1)
    with pytest.raises(RuntimeError, match="atan_sub .* is required"):
        npu.npu_ciou_backward(z(1, 3), z(4, 3), z(4, 3), None, True, False, 0)
    with pytest.raises(NotImplementedError, match="mode=1"):
        npu._npu_ciou(z(4, 3), z(4, 3), mode=1)
    with pytest.raises(RuntimeError, match="float16 or float32"):
        npu._npu_ciou(z(4, 3, dtype=torch.bfloat16), z(4, 3, dtype=torch.bfloat16))


# ----------------------------------------------------------------- rotated NMS

def ref_corners(box):
    """Corners of [x, y, w, h, angle(deg, counter-clockwise)]."""
    cx, cy, w, h, angle = box
    c, s = math.cos(math.radians(angle)), math.sin(math.radians(angle))
    return [(cx + dx * c - dy * s, cy + dx * s + dy * c)
            for dx, dy in ((-w / 2, -h / 2), (w / 2, -h / 2), (w / 2, h / 2), (-w / 2, h / 2))]


def ref_inside(pt, poly):
    cross = [(b[0] - a[0]) * (pt[1] - a[1]) - (b[1] - a[1]) * (pt[0] - a[0])
             for a, b in zip(poly, poly[1:] + poly[:1])]
    return all(c >= -1e-9 for c in cross) or all(c <= 1e-9 for c in cross)


def ref_rotated_iou(a, b):
    """IoU from the intersection polygon's vertices: edge crossings plus corners inside the
    other box, ordered by angle around their mean, shoelace area."""
    if a[2] * a[3] < 1e-14 or b[2] * b[3] < 1e-14:
        return 0.0
    pa, pb = ref_corners(a), ref_corners(b)
    pts = [p for p in pa if ref_inside(p, pb)] + [p for p in pb if ref_inside(p, pa)]
    for p1, p2 in zip(pa, pa[1:] + pa[:1]):
        for q1, q2 in zip(pb, pb[1:] + pb[:1]):
            d = (p2[0] - p1[0]) * (q2[1] - q1[1]) - (p2[1] - p1[1]) * (q2[0] - q1[0])
            if abs(d) < 1e-14:
                continue
            t = ((q1[0] - p1[0]) * (q2[1] - q1[1]) - (q1[1] - p1[1]) * (q2[0] - q1[0])) / d
            u = ((q1[0] - p1[0]) * (p2[1] - p1[1]) - (q1[1] - p1[1]) * (p2[0] - p1[0])) / d
            if 0 <= t <= 1 and 0 <= u <= 1:
                pts.append((p1[0] + t * (p2[0] - p1[0]), p1[1] + t * (p2[1] - p1[1])))
    if len(pts) < 3:
        return 0.0
    mx, my = sum(p[0] for p in pts) / len(pts), sum(p[1] for p in pts) / len(pts)
    pts.sort(key=lambda p: math.atan2(p[1] - my, p[0] - mx))
    inter = abs(sum(p[0] * q[1] - q[0] * p[1] for p, q in zip(pts, pts[1:] + pts[:1]))) / 2
    return inter / (a[2] * a[3] + b[2] * b[3] - inter)


def ref_nms_rotated(dets, scores, iou_thr, score_thr, max_out, mode):
    boxes = dets.float().double().tolist()
    if mode == 1:  # corners + counter-clockwise angle -> centre form with the angle negated
        boxes = [[(b[0] + b[2]) / 2, (b[1] + b[3]) / 2, b[2] - b[0], b[3] - b[1], -b[4]] for b in boxes]
    s = scores.float().double().tolist()
    order = sorted(range(len(s)), key=lambda i: s[i], reverse=True)
    kept = []
    for i in order:
        if max_out >= 0 and len(kept) == max_out:
            break
        if s[i] > score_thr and all(ref_rotated_iou(boxes[i], boxes[k]) <= iou_thr for k in kept):
            kept.append(i)
    return kept


def rotated_dets(n, seed, mode):
    g = torch.Generator().manual_seed(seed)
    xy = torch.rand(n, 2, generator=g) * 40
    wh = torch.rand(n, 2, generator=g) * 20 + 4
    angle = torch.rand(n, 1, generator=g) * 180 - 90
    if mode == 1:
        return torch.cat([xy, xy + wh, angle], 1)
    return torch.cat([xy, wh, angle], 1)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode", [0, 1])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_nms_rotated_against_reference(device, mode, dtype):
    dets = rotated_dets(24, 10 + mode, mode).to(dtype)
    scores = torch.rand(24, generator=torch.Generator().manual_seed(3)).to(dtype)
    idx, num = torch_npu.npu_nms_rotated(dets.to(device), scores.to(device), 0.2, mode=mode)
    exp = ref_nms_rotated(dets, scores, 0.2, 0.0, -1, mode)
    assert 3 < len(exp) < 24   # the threshold really suppresses some boxes and keeps others
    assert idx.dtype == num.dtype == torch.int32 and idx.device.type == device and num.shape == (1,)
    assert idx.cpu().tolist() == exp and num.cpu().tolist() == [len(exp)]


def test_nms_rotated_limits_thresholds_and_ties():
    dets = rotated_dets(16, 4, 0)
    scores = torch.rand(16, generator=torch.Generator().manual_seed(5))
    idx, num = torch_npu.npu_nms_rotated(dets, scores, 0.3, 0.4, 3)
    assert idx.tolist() == ref_nms_rotated(dets, scores, 0.3, 0.4, 3, 0) and num.tolist() == [3]
    all_kept = ref_nms_rotated(dets, scores, 0.3, 0.4, -1, 0)
    assert len(all_kept) > 3 and all(scores[i] > 0.4 for i in all_kept)
    idx, _ = torch_npu.npu_nms_rotated(dets, scores, 0.3, 0.4)
    assert idx.tolist() == all_kept
    # equal scores keep input order; an identical box is suppressed (IoU 1)
    two = torch.tensor([[5.0, 5.0, 4.0, 2.0, 30.0]] * 2 + [[50.0, 50.0, 4.0, 2.0, 0.0]])
    idx, num = torch_npu.npu_nms_rotated(two, torch.tensor([0.5, 0.5, 0.5]), 0.9)
    assert idx.tolist() == [0, 2] and num.tolist() == [2]
    with pytest.raises(NotImplementedError, match="equal to scores_threshold"):
        torch_npu.npu_nms_rotated(two, torch.tensor([0.5, 0.0, 0.5]), 0.5)
    with pytest.raises(RuntimeError, match=r"dets must be \(num_boxes, 5\)"):
        torch_npu.npu_nms_rotated(torch.zeros(3, 4), torch.zeros(3), 0.5)
    with pytest.raises(RuntimeError, match="mode must be 0"):
        torch_npu.npu_nms_rotated(two, torch.ones(3), 0.5, mode=2)


def test_nms_rotated_fake_and_meta():
    with FakeTensorMode(shape_env=torch.fx.experimental.symbolic_shapes.ShapeEnv()):
        idx, num = torch_npu.npu_nms_rotated(torch.empty(10, 5), torch.empty(10), 0.5, max_output_size=4)
        assert isinstance(idx.shape[0], torch.SymInt) and idx.dtype == torch.int32
        assert num.shape == (1,) and num.dtype == torch.int32
    with pytest.raises(NotImplementedError, match="depends on the values"):
        torch_npu.npu_nms_rotated(torch.empty(10, 5, device="meta"), torch.empty(10, device="meta"), 0.5)


# ----------------------------------------------------------------- sub-sampling of labels

def ref_sample_counts(labels, per_images, fraction):
    """(positives, negatives) the sample must hold: min(#pos, int(per_images * fraction)) and
    min(#neg, per_images - positives)."""
    n_pos = sum(1 for v in labels if v >= 1)
    n_neg = sum(1 for v in labels if v == 0)
    pos = min(n_pos, int(per_images * fraction))
    return pos, min(n_neg, per_images - pos)


def check_sample(labels, out, per_images, fraction):
    labels, out = labels.tolist(), out.tolist()
    pos, neg = ref_sample_counts(labels, per_images, fraction)
    assert sum(1 for v in out if v >= 1) == pos and sum(1 for v in out if v == 0) == neg
    # a sampled element keeps its label, everything else is -1
    assert all(o == -1 or o == v for o, v in zip(out, labels))
    assert sum(1 for v in out if v != -1) == pos + neg


@pytest.mark.parametrize("device", DEVICES)
def test_sub_sample_counts_as_torch_npu_test(device):
    g = torch.Generator().manual_seed(11)
    for trial in range(20):   # torch_npu's test: 10 labels in {-1, 0, 1}, per_images 5, fraction 0.6
        labels = torch.randint(-1, 2, (10,), generator=g, dtype=torch.int32)
        out = torch_npu.npu_sub_sample(labels.to(device), 5, 0.6)
        assert out.dtype == torch.int32 and out.device.type == device and out.shape == (10,)
        check_sample(labels, out.cpu(), 5, 0.6)
    labels = torch.randint(-1, 4, (300,), generator=g, dtype=torch.int32)   # multi-class positives
    for per_images, fraction in ((64, 0.25), (512, 0.5), (0, 0.5), (40, 1.0), (40, 0.0)):
        check_sample(labels, torch_npu.npu_sub_sample(labels.to(device), per_images, fraction).cpu(),
                     per_images, fraction)


def test_sub_sample_is_uniform_and_seeded():
    labels = torch.tensor([1, 1, 1, 1, 0, 0, 0, 0, 0, 0, -1, 1], dtype=torch.int32)
    torch.manual_seed(3)
    first = torch_npu.npu_sub_sample(labels, 4, 0.5)
    torch.manual_seed(3)
    assert torch.equal(torch_npu.npu_sub_sample(labels, 4, 0.5), first)
    picked = torch.zeros(12)
    trials = 600
    for _ in range(trials):
        picked += (torch_npu.npu_sub_sample(labels, 4, 0.5) != -1).float()
    # each of the 5 positives is drawn with probability 2/5, each of the 6 negatives with 2/6
    freq = picked / trials
    assert freq[10] == 0
    assert torch.all((freq[[0, 1, 2, 3, 11]] - 0.4).abs() < 0.08)
    assert torch.all((freq[4:10] - 1 / 3).abs() < 0.08)
    with FakeTensorMode():
        assert torch_npu.npu_sub_sample(torch.empty(10, dtype=torch.int32), 4, 0.5).shape == (10,)
    with pytest.raises(RuntimeError, match="must be int32"):
        torch_npu.npu_sub_sample(labels.long(), 4, 0.5)
    with pytest.raises(RuntimeError, match=r"positive_fraction must be in \[0, 1\]"):
        torch_npu.npu_sub_sample(labels, 4, 1.5)
