"""Backward ops of the detection family (npu_diou_backward, npu_giou_backward, npu_roi_alignbk)
against autograd through the forwards."""
import math

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from _op_helpers import zeros as z

npu = torch.ops.npu


f16, f32, i8, i32, i64 = torch.float16, torch.float32, torch.int8, torch.int32, torch.int64


def _corners64(t, trans):
    if trans:  # x, y (centre), w, h
        return t[0] - t[2] / 2, t[1] - t[3] / 2, t[0] + t[2] / 2, t[1] + t[3] / 2
    return t[0], t[1], t[2], t[3]


def _diou_reference(boxes, gt, trans, is_cross):
    """float64 DIoU = IoU - centre distance^2 / enclosing diagonal^2, [1, N] or [M, N]."""
    bx1, by1, bx2, by2 = (v.unsqueeze(0) for v in _corners64(boxes, trans))
    gx1, gy1, gx2, gy2 = (v.unsqueeze(1 if is_cross else 0) for v in _corners64(gt, trans))
    iw = (torch.minimum(bx2, gx2) - torch.maximum(bx1, gx1)).clamp(min=0)
    ih = (torch.minimum(by2, gy2) - torch.maximum(by1, gy1)).clamp(min=0)
    inter = iw * ih
    union = (bx2 - bx1) * (by2 - by1) + (gx2 - gx1) * (gy2 - gy1) - inter
    cw = torch.maximum(bx2, gx2) - torch.minimum(bx1, gx1)
    ch = torch.maximum(by2, gy2) - torch.minimum(by1, gy1)
    dist = ((bx1 + bx2) / 2 - (gx1 + gx2) / 2) ** 2 + ((by1 + by2) / 2 - (gy1 + gy2) / 2) ** 2
    return inter / union - dist / (cw ** 2 + ch ** 2)


def _giou_reference(boxes, gt):
    """float64 aligned GIoU (x, y, w, h boxes) = IoU - (enclosing - union) / enclosing, [N, 1]."""
    bx1, by1, bx2, by2 = _corners64(boxes, True)
    gx1, gy1, gx2, gy2 = _corners64(gt, True)
    inter = ((torch.minimum(bx2, gx2) - torch.maximum(bx1, gx1)).clamp(min=0)
             * (torch.minimum(by2, gy2) - torch.maximum(by1, gy1)).clamp(min=0))
    union = (bx2 - bx1) * (by2 - by1) + (gx2 - gx1) * (gy2 - gy1) - inter
    enclose = (torch.maximum(bx2, gx2) - torch.minimum(bx1, gx1)) * (torch.maximum(by2, gy2) - torch.minimum(by1, gy1))
    return (inter / union - (enclose - union) / enclose).unsqueeze(-1)


def _boxes(n, seed, trans):
    g = torch.Generator().manual_seed(seed)
    if trans:
        xy = torch.rand(2, n, generator=g, dtype=torch.float64) * 10
        wh = torch.rand(2, n, generator=g, dtype=torch.float64) * 4 + 1
        return torch.cat([xy, wh])
    lo = torch.rand(2, n, generator=g, dtype=torch.float64) * 10
    return torch.cat([lo, lo + torch.rand(2, n, generator=g, dtype=torch.float64) * 4 + 1])


def _reference_vjp(fn, grad, boxes, gt):
    b = boxes.clone().requires_grad_(True)
    g = gt.clone().requires_grad_(True)
    return torch.autograd.grad(fn(b, g), (b, g), grad)


@pytest.mark.parametrize("device", ["cpu", "npu"])
@pytest.mark.parametrize("dtype,tol", [(f32, 1e-5), (f16, 2e-3)])
@pytest.mark.parametrize("trans,is_cross", [(False, False), (True, False), (False, True)])
def test_diou_backward_is_the_gradient_of_diou(device, dtype, tol, trans, is_cross):
    boxes, gt = _boxes(5, 1, trans), _boxes(3 if is_cross else 5, 2, trans)
    # low precision: the reference sees the rounded inputs the op sees
    boxes, gt = boxes.to(dtype).double(), gt.to(dtype).double()
    grad = torch.randn((3 if is_cross else 1, 5), generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    exp_b, exp_g = _reference_vjp(lambda b, g: _diou_reference(b, g, trans, is_cross), grad, boxes, gt)
    db, dg = npu.npu_diou_backward(grad.to(dtype).to(device), boxes.to(dtype).to(device), gt.to(dtype).to(device),
                                   trans, is_cross)
    assert db.device.type == device and db.dtype == dtype and db.shape == boxes.shape and dg.shape == gt.shape
    scale = max(1.0, float(exp_b.abs().max()), float(exp_g.abs().max()))
    torch.testing.assert_close(db.cpu().double(), exp_b, atol=tol * scale * 4, rtol=tol * 4)
    torch.testing.assert_close(dg.cpu().double(), exp_g, atol=tol * scale * 4, rtol=tol * 4)


@pytest.mark.parametrize("device", ["cpu", "npu"])
@pytest.mark.parametrize("dtype,tol", [(f32, 1e-5), (f16, 2e-3)])
def test_giou_backward_is_the_gradient_of_giou(device, dtype, tol):
    boxes, gt = _boxes(6, 4, True).to(dtype).double(), _boxes(6, 5, True).to(dtype).double()
    grad = torch.randn((6, 1), generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    exp_b, exp_g = _reference_vjp(_giou_reference, grad, boxes, gt)
    db, dg = npu.npu_giou_backward(grad.to(dtype).to(device), boxes.to(dtype).to(device), gt.to(dtype).to(device),
                                   True, False, 0)
    assert db.device.type == device and db.dtype == dtype and db.shape == (4, 6) and dg.shape == (4, 6)
    torch.testing.assert_close(db.cpu().double(), exp_b, atol=tol * 4, rtol=tol * 4)
    torch.testing.assert_close(dg.cpu().double(), exp_g, atol=tol * 4, rtol=tol * 4)


def test_box_backward_float16_boxes_give_float16_and_fake_shapes():
    with FakeTensorMode():
        db, dg = npu.npu_diou_backward(z(3, 5), z(4, 5, dtype=f16), z(4, 3, dtype=f16), False, True)
        assert (db.shape, db.dtype, dg.shape, dg.dtype) == ((4, 5), f16, (4, 3), f16)
        db, dg = npu.npu_giou_backward(z(5, 1), z(4, 5), z(4, 5), True)
        assert (db.shape, dg.shape) == ((4, 5), (4, 5))


def test_box_backward_errors():
    with pytest.raises(RuntimeError, match="giou backward only support trans==True"):
        npu.npu_giou_backward(z(5, 1), _boxes(5, 1, True).float(), _boxes(5, 2, True).float(), False)
    with pytest.raises(RuntimeError, match="grad must hold one value per overlap"):
        npu.npu_diou_backward(z(1, 4), _boxes(5, 1, False).float(), _boxes(5, 2, False).float())
    with pytest.raises(NotImplementedError, match="mode=1"):
        npu.npu_diou_backward(z(1, 5), _boxes(5, 1, False).float(), _boxes(5, 2, False).float(), mode=1)


def test_diou_backward_float64_is_exact():
    boxes, gt = _boxes(3, 7, False), _boxes(3, 8, False)
    grad = torch.randn(1, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(9))
    exp_b, _ = _reference_vjp(lambda b, g: _diou_reference(b, g, False, False), grad, boxes, gt)
    db, _ = npu.npu_diou_backward(grad, boxes, gt)
    torch.testing.assert_close(db, exp_b, atol=1e-12, rtol=1e-10)


def _roi_align_reference(x, rois, scale, ph, pw, sample_num, end_mode):
    """float64 RoIAlign written out: roi_end_mode 1 extends the box end by ``scale``, sizes
    clamped to >= 1; each bin averages sample_num^2 bilinear samples at sub-cell centres,
    samples beyond one pixel outside the map count as 0."""
    assert end_mode in (0, 1)
    _, c, h, w = x.shape
    out = []
    for roi in rois.tolist():
        img = x[int(roi[0])]
        x1, y1, x2, y2 = (v * scale for v in roi[1:])
        if end_mode == 1:
            x2, y2 = x2 + scale, y2 + scale
        rw, rh = max(x2 - x1, 1.0), max(y2 - y1, 1.0)
        bins = torch.zeros(c, ph, pw, dtype=x.dtype)
        for i in range(ph):
            for j in range(pw):
                acc_ = torch.zeros(c, dtype=x.dtype)
                for a in range(sample_num):
                    for b in range(sample_num):
                        y = y1 + i * rh / ph + (a + 0.5) * rh / ph / sample_num
                        xx = x1 + j * rw / pw + (b + 0.5) * rw / pw / sample_num
                        if y < -1 or y > h or xx < -1 or xx > w:
                            continue
                        y, xx = max(y, 0.0), max(xx, 0.0)
                        yl, xl = int(math.floor(y)), int(math.floor(xx))
                        if yl >= h - 1:
                            yl = yh = h - 1
                            y = float(yl)
                        else:
                            yh = yl + 1
                        if xl >= w - 1:
                            xl = xh = w - 1
                            xx = float(xl)
                        else:
                            xh = xl + 1
                        ly, lx = y - yl, xx - xl
                        acc_ = acc_ + ((1 - ly) * (1 - lx) * img[:, yl, xl] + (1 - ly) * lx * img[:, yl, xh]
                                       + ly * (1 - lx) * img[:, yh, xl] + ly * lx * img[:, yh, xh])
                bins[:, i, j] = acc_ / sample_num ** 2
        out.append(bins)
    return torch.stack(out)


@pytest.mark.parametrize("device", ["cpu", "npu"])
@pytest.mark.parametrize("dtype,tol", [(f32, 1e-5), (f16, 3e-3)])
@pytest.mark.parametrize("end_mode", [None, 0, 1])
def test_roi_alignbk_is_the_gradient_of_roi_align(device, dtype, tol, end_mode):
    gen = torch.Generator().manual_seed(11)
    x = torch.randn(2, 3, 7, 6, dtype=torch.float64, generator=gen)
    rois = torch.tensor([[0, 2.0, 1.0, 9.0, 11.0], [1, -1.0, 0.0, 13.0, 12.0], [0, 4.0, 4.0, 5.0, 5.0]],
                        dtype=torch.float64)
    ph, pw, scale, samples = 3, 2, 0.5, 2
    grad = torch.randn(3, 3, ph, pw, dtype=torch.float64, generator=gen).to(dtype).double()
    xr = x.clone().requires_grad_(True)
    ref = _roi_align_reference(xr, rois, scale, ph, pw, samples, 1 if end_mode is None else end_mode)
    (expected,) = torch.autograd.grad(ref, xr, grad)
    out = npu.npu_roi_alignbk(grad.to(dtype).to(device), rois.float().to(device), [2, 3, 7, 6], pw, ph, scale,
                              samples, end_mode)
    assert out.device.type == device and out.dtype == dtype and out.shape == (2, 3, 7, 6)
    torch.testing.assert_close(out.cpu().double(), expected, atol=tol * 4, rtol=tol * 4)


def test_roi_alignbk_fake_shape_and_errors():
    with FakeTensorMode():
        out = npu.npu_roi_alignbk(z(3, 4, 2, 2, dtype=f16), z(3, 5), [2, 4, 8, 8], 2, 2, 0.5, 2)
        assert (out.shape, out.dtype) == ((2, 4, 8, 8), f16)
    with pytest.raises(RuntimeError, match="xdiff_shape must be"):
        npu.npu_roi_alignbk(z(3, 4, 2, 2), z(3, 5), [4, 8, 8], 2, 2, 0.5, 2)
    with pytest.raises(RuntimeError, match="grad must be"):
        npu.npu_roi_alignbk(z(3, 4, 2, 3), z(3, 5), [2, 4, 8, 8], 2, 2, 0.5, 2)
    with pytest.raises(RuntimeError, match="roi batch index 5"):
        npu.npu_roi_alignbk(z(1, 4, 2, 2), torch.tensor([[5.0, 0, 0, 1, 1]]), [2, 4, 8, 8], 2, 2, 0.5, 2)
