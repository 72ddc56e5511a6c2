"""Detection ops (npu_rotated_overlaps / npu_rotated_iou, npu_grid_assign_positive,
npu_ps_roi_pooling) against references written here: rotated-box overlap by edge
crossings + contained corners + angular sort + shoelace (float64 loops) and torch_npu's own
hardware golden for npu_rotated_iou; the GridAssigner positive steps as plain loops;
PS-RoI pooling from its documented formula."""
import math

import numpy as np
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import torch_npu

from _op_helpers import DEVICES


# ---------------------------------------------------------------- rotated boxes


def corners(box, trans):
    if trans:
        x1, y1, x2, y2, a = box
        cx, cy, w, h = (x1 + x2) / 2, (y1 + y2) / 2, x2 - x1, y2 - y1
    else:
        cx, cy, w, h, a = box
    t = a * math.pi / 180
    out = []
    for sx, sy in ((-1, -1), (1, -1), (1, 1), (-1, 1)):
        dx, dy = sx * w / 2, sy * h / 2
        out.append((cx + dx * math.cos(t) - dy * math.sin(t), cy + dx * math.sin(t) + dy * math.cos(t)))
    return out, w * h


def inside(p, poly):
    # convex CCW polygon: p on the left of (or on) every edge
    for i in range(4):
        a, b = poly[i], poly[(i + 1) % 4]
        if (b[0] - a[0]) * (p[1] - a[1]) - (b[1] - a[1]) * (p[0] - a[0]) < -1e-12:
            return False
    return True


def seg_cross(p1, p2, q1, q2):
    d = (p2[0] - p1[0]) * (q2[1] - q1[1]) - (p2[1] - p1[1]) * (q2[0] - q1[0])
    if abs(d) < 1e-15:
        return None
    t = ((q1[0] - p1[0]) * (q2[1] - q1[1]) - (q1[1] - p1[1]) * (q2[0] - q1[0])) / d
    u = ((q1[0] - p1[0]) * (p2[1] - p1[1]) - (q1[1] - p1[1]) * (p2[0] - p1[0])) / d
    if 0 <= t <= 1 and 0 <= u <= 1:
        return (p1[0] + t * (p2[0] - p1[0]), p1[1] + t * (p2[1] - p1[1]))
    return None


def ref_overlap(a, b, trans):
    pa, area_a = corners(a, trans)
    pb, area_b = corners(b, trans)
    pts = [p for p in pa if inside(p, pb)] + [p for p in pb if inside(p, pa)]
    for i in range(4):
        for j in range(4):
            c = seg_cross(pa[i], pa[(i + 1) % 4], pb[j], pb[(j + 1) % 4])
            if c is not None:
                pts.append(c)
    if len(pts) < 3:
        return 0.0, area_a, area_b
    cx = sum(p[0] for p in pts) / len(pts)
    cy = sum(p[1] for p in pts) / len(pts)
    pts.sort(key=lambda p: math.atan2(p[1] - cy, p[0] - cx))
    s = sum(pts[i - 1][0] * pts[i][1] - pts[i][0] * pts[i - 1][1] for i in range(len(pts)))
    return abs(s) / 2, area_a, area_b


def rand_rotated(b, n, seed, trans=False):
    g = torch.Generator().manual_seed(seed)
    xy = torch.rand(b, n, 2, generator=g, dtype=torch.float64) * 8
    wh = torch.rand(b, n, 2, generator=g, dtype=torch.float64) * 4 + 1
    ang = torch.rand(b, n, 1, generator=g, dtype=torch.float64) * 360 - 180
    if trans:
        return torch.cat([xy - wh / 2, xy + wh / 2, ang], -1)
    return torch.cat([xy, wh, ang], -1)


def test_rotated_iou_matches_torch_npu_hardware_golden():
    # torch_npu's test_rotated_iou: numpy seed 1234, boxes (4, 2, 5) / (4, 3, 5), angles in degrees.
    np.random.seed(1234)
    def gen(shape):
        xy = np.random.uniform(20, 60, shape[:2] + [2]).astype(np.float32)
        wh = np.random.randint(1, 20, size=shape[:2] + [2])
        ang = np.random.randint(-180, 180, size=shape[:2] + [1])
        return np.concatenate([xy, wh, ang], dtype=np.float32, axis=-1)
    boxes, query = gen([4, 2, 5]), gen([4, 3, 5])
    golden = torch.tensor([[[0., 0.00045966, 0.], [0., 0., 0.]],
                           [[0., 0., 0.], [0., 0., 0.]],
                           [[0., 0., 0.], [0.00600622, 0.10504241, 0.]],
                           [[0., 0., 0.], [0., 0., 0.]]])
    for device in DEVICES:
        out = torch_npu.npu_rotated_iou(torch.from_numpy(boxes).to(device), torch.from_numpy(query).to(device),
                                        False, 0, True, 0.0, 0.0)
        assert out.device.type == device and out.shape == (4, 2, 3) and out.dtype == torch.float32
        torch.testing.assert_close(out.cpu(), golden, rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("trans", [False, True])
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.float16, 2e-3)])
def test_rotated_iou_and_overlaps_vs_polygon_reference(device, trans, dtype, tol):
    a = rand_rotated(2, 5, 1, trans)
    q = rand_rotated(2, 4, 2, trans)
    a[0, 0] = q[0, 0]                                      # identical pair: IoU 1
    a[1, 1] = torch.tensor([100., 100., 101., 101., 0.] if trans else [100., 100., 1., 1., 0.],
                           dtype=torch.float64)            # far away: 0
    a_l, q_l = a.to(dtype).double(), q.to(dtype).double()
    exp_iou = torch.zeros(2, 5, 4, dtype=torch.float64)
    exp_ov = torch.zeros(2, 5, 4, dtype=torch.float64)
    for b in range(2):
        for i in range(5):
            for j in range(4):
                inter, sa, sq = ref_overlap(a_l[b, i].tolist(), q_l[b, j].tolist(), trans)
                exp_ov[b, i, j] = inter
                exp_iou[b, i, j] = inter / (sa + sq - inter)
    assert exp_iou[0, 0, 0] == pytest.approx(1.0) and exp_iou[1, 1].abs().max() == 0
    assert (exp_iou > 1e-3).sum() >= 4                     # some genuine partial overlaps
    iou = torch_npu.npu_rotated_iou(a.to(dtype).to(device), q.to(dtype).to(device), trans=trans)
    ov = torch_npu.npu_rotated_overlaps(a.to(dtype).to(device), q.to(dtype).to(device), trans=trans)
    assert iou.dtype == dtype and ov.dtype == dtype and iou.device.type == device
    torch.testing.assert_close(iou.cpu().double(), exp_iou, rtol=tol, atol=tol)
    torch.testing.assert_close(ov.cpu().double(), exp_ov, rtol=tol, atol=tol * 20)


def test_rotated_fake_shapes_and_unsupported_modes():
    with FakeTensorMode():
        a, q = torch.empty(3, 7, 5), torch.empty(3, 2, 5)
        assert torch_npu.npu_rotated_iou(a, q).shape == (3, 7, 2)
        assert torch_npu.npu_rotated_overlaps(a, q, True).shape == (3, 7, 2)
    a = torch.ones(1, 2, 5)
    with pytest.raises(NotImplementedError, match="mode=1"):
        torch_npu.npu_rotated_iou(a, a, mode=1)
    with pytest.raises(NotImplementedError, match="is_cross=False"):
        torch_npu.npu_rotated_iou(a, a, is_cross=False)
    with pytest.raises(RuntimeError, match="last dimension must be 5"):
        torch_npu.npu_rotated_overlaps(torch.ones(1, 2, 4), torch.ones(1, 2, 4))


# ---------------------------------------------------------------- grid assign


def ref_grid_assign(init, overlaps, flags, max_ov, argmax_ov, gt_max, gt_argmax, num_gts, pos_thr, min_pos, all_):
    out = init.tolist()
    n, k = len(out), len(gt_max)
    for j in range(n):
        if max_ov[j] > pos_thr and flags[j]:
            out[j] = argmax_ov[j] + 1
    for i in range(min(num_gts, k)):
        if gt_max[i] > min_pos:
            if all_:
                for j in range(n):
                    if overlaps[i][j] == gt_max[i] and flags[j]:
                        out[j] = i + 1
            elif flags[gt_argmax[i]]:
                out[gt_argmax[i]] = i + 1
    return out


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("assign_all", [True, False])
def test_grid_assign_positive(device, dtype, assign_all):
    g = torch.Generator().manual_seed(5)
    k, n = 3, 10
    overlaps = torch.rand(k, n, generator=g).to(dtype)
    overlaps[1, 4] = overlaps[1, 7] = overlaps[1].max() + 0.05   # tie for gt 1
    max_ov, argmax_ov = overlaps.max(0)
    gt_max, gt_argmax = overlaps.max(1)
    gt_max[2] = 0.0                                              # below min_pos_iou: skipped
    flags = (torch.rand(n, generator=g) > 0.3).to(torch.uint8)
    flags[4] = flags[7] = 1
    init = -torch.ones(n, dtype=dtype)
    args = (init, overlaps, flags, max_ov, argmax_ov.int(), gt_max, gt_argmax.int())
    for num_gts in (k, 1, 128):
        expected = ref_grid_assign(init, overlaps.tolist(), flags.tolist(), max_ov.tolist(), argmax_ov.tolist(),
                                   gt_max.tolist(), gt_argmax.tolist(), num_gts, 0.5, 0.1, assign_all)
        out = torch_npu.npu_grid_assign_positive(*(t.to(device) for t in args), num_gts, 0.5, 0.1, assign_all)
        assert out.dtype == dtype and out.device.type == device
        assert out.cpu().tolist() == expected
    assert init.tolist() == [-1.0] * n                           # input not mutated


def test_grid_assign_positive_hardware_golden_rule():
    # torch_npu's golden: min_pos_iou=0 with random gt maxima (no ties) -> only the first step.
    g = torch.Generator().manual_seed(0)
    inp = torch.rand(4, generator=g)
    max_ov = torch.rand(4, generator=g)
    out = torch_npu.npu_grid_assign_positive(
        inp.npu(), torch.rand(2, 4, generator=g).npu(), torch.tensor([1, 1, 1, 0], dtype=torch.uint8).npu(),
        max_ov.npu(), torch.tensor([1, 0, 1, 0], dtype=torch.int32).npu(), torch.rand(2, generator=g).npu(),
        torch.tensor([1, 0], dtype=torch.int32).npu(), 128, .5, .0, True)
    pos = (max_ov > 0.5) & torch.tensor([True, True, True, False])
    expected = torch.where(pos, torch.tensor([2., 1., 2., 1.]), inp)
    assert out.cpu().tolist() == expected.tolist()
    with FakeTensorMode():
        f = torch.empty(6)
        assert torch_npu.npu_grid_assign_positive(
            f, torch.empty(2, 6), torch.empty(6, dtype=torch.uint8), f, torch.empty(6, dtype=torch.int32),
            torch.empty(2), torch.empty(2, dtype=torch.int32), 2, .5, .0, True).shape == (6,)


# ---------------------------------------------------------------- quant matmul + gelu


# ---------------------------------------------------------------- quant conv2d


# ---------------------------------------------------------------- dropout with byte mask


# ---------------------------------------------------------------- position-sensitive RoI pooling


def ps_bins(roi, scale, g, h, w):
    """Bin limits of one RoI with float32 arithmetic (torch_npu's golden computes in float32)."""
    f = np.float32
    sw, sh = f(np.round(f(roi[1]))) * f(scale), f(np.round(f(roi[2]))) * f(scale)
    ew, eh = f(np.round(f(roi[3]) + f(1))) * f(scale), f(np.round(f(roi[4]) + f(1))) * f(scale)
    bh, bw = max(eh - sh, f(0.1)) / f(g), max(ew - sw, f(0.1)) / f(g)
    out = {}
    for ph in range(g):
        for pw in range(g):
            hs = min(max(int(f(ph) * bh + sh), 0), h)
            he = min(max(int(math.ceil(f(ph + 1) * bh + sh)), 0), h)
            ws = min(max(int(math.floor(f(pw) * bw + sw)), 0), w)
            we = min(max(int(math.ceil(f(pw + 1) * bw + sw)), 0), w)
            out[ph, pw] = (hs, he, ws, we)
    return out


def ref_ps_roi_pooling(x, rois, scale, g, dim):
    n, c, h, w = x.shape
    flat = rois.transpose(1, 2).reshape(-1, 5).tolist()
    out = torch.zeros(len(flat), dim, g, g, dtype=torch.float64)
    xs = x.double()
    for r, roi in enumerate(flat):
        bins = ps_bins(roi, scale, g, h, w)
        for ct in range(dim):
            for (ph, pw), (hs, he, ws, we) in bins.items():
                if he > hs and we > ws:
                    out[r, ct, ph, pw] = xs[int(roi[0]), (ct * g + ph) * g + pw, hs:he, ws:we].mean()
    return out


def ref_ps_roi_pooling_grad(grad, rois, scale, g, dim, shape):
    n, c, h, w = shape
    gx = torch.zeros(shape, dtype=torch.float64)
    for r, roi in enumerate(rois.transpose(1, 2).reshape(-1, 5).tolist()):
        for ct in range(dim):
            for (ph, pw), (hs, he, ws, we) in ps_bins(roi, scale, g, h, w).items():
                if he > hs and we > ws:
                    gx[int(roi[0]), (ct * g + ph) * g + pw, hs:he, ws:we] += float(grad[r, ct, ph, pw]) / ((he - hs) * (we - ws))
    return gx


def ps_rois():
    # (B=2, 5, R=3): batch index, x1, y1, x2, y2 (fractional, one out of the image, one tiny)
    return torch.tensor([[[0, 1, 1], [3.4, 0.2, 30.], [2.6, 5.5, 31.], [17.2, 9.0, 40.], [21.7, 14.4, 50.]],
                         [[1, 0, 1], [1.0, 8.0, 0.0], [4.0, 8.2, 0.0], [9.0, 8.3, 27.9], [9.0, 8.1, 27.9]]])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.float16, 2e-3), (torch.bfloat16, 1e-2)])
def test_ps_roi_pooling_vs_reference(device, dtype, tol):
    g, dim, scale = 3, 2, 0.25
    x = (torch.rand(2, dim * g * g, 9, 11, generator=torch.Generator().manual_seed(6)) + 0.1).to(dtype)
    rois = ps_rois()
    expected = ref_ps_roi_pooling(x, rois, scale, g, dim)
    assert (expected == 0).any() and (expected != 0).sum() > 40     # empty bins and real ones
    out = torch_npu.npu_ps_roi_pooling(x.to(device), rois.to(dtype).to(device), scale, g, dim)
    assert out.shape == (6, dim, g, g) and out.dtype == dtype and out.device.type == device
    torch.testing.assert_close(out.cpu().double(), expected, rtol=tol, atol=tol)


@pytest.mark.parametrize("device", DEVICES)
def test_ps_roi_pooling_backward_and_gradcheck(device):
    g, dim, scale = 3, 2, 0.25
    x = torch.rand(2, dim * g * g, 9, 11, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    rois = ps_rois().double()
    grad = torch.randn(6, dim, g, g, generator=torch.Generator().manual_seed(8), dtype=torch.float64)
    expected = ref_ps_roi_pooling_grad(grad, rois, scale, g, dim, x.shape)
    gx = torch.ops.npu.npu_ps_roi_pooling_backward(grad.to(device), rois.to(device), scale, g, dim, list(x.shape))
    torch.testing.assert_close(gx.cpu(), expected)
    xr = x.to(device).requires_grad_()
    torch_npu.npu_ps_roi_pooling(xr, rois.to(device), scale, g, dim).backward(grad.to(device))
    torch.testing.assert_close(xr.grad.cpu(), expected)
    small = torch.rand(1, 8, 4, 5, dtype=torch.float64, requires_grad=True)
    r = torch.tensor([[[0.], [0.6], [1.2], [13.], [10.]]], dtype=torch.float64)
    assert torch.autograd.gradcheck(lambda t: torch_npu.npu_ps_roi_pooling(t, r, 0.25, 2, 2), (small,))


def test_ps_roi_pooling_fake_and_contrib_module():
    with FakeTensorMode():
        out = torch_npu.npu_ps_roi_pooling(torch.empty(2, 4 * 49, 8, 8), torch.empty(2, 5, 3), 0.0625, 7, 4)
        assert out.shape == (6, 4, 7, 7)
    x = torch.rand(2, 2 * 9, 9, 11, generator=torch.Generator().manual_seed(6))
    from torch_npu import contrib
    out = contrib.PSROIPool(3, 3, 0.25, 3, 2)(x.npu(), ps_rois().npu())
    torch.testing.assert_close(out.cpu().double(), ref_ps_roi_pooling(x, ps_rois(), 0.25, 3, 2), rtol=1e-5, atol=1e-5)
    with pytest.raises(RuntimeError, match="output_dim \\* group_size"):
        torch_npu.npu_ps_roi_pooling(x, ps_rois(), 0.25, 3, 3)
