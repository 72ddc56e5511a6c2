"""npu_yolo_boxes_encode and npu_anchor_response_flags (mmdetection target helpers).

References: the values published with the real op's test for ``torch.manual_seed(1234)``
inputs, and the mmdetection formulas written here as Python loops."""
import math

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import torch_npu

from _op_helpers import DEVICES


@pytest.mark.parametrize("device", DEVICES)
def test_yolo_boxes_encode_published_values(device):
    torch.manual_seed(1234)
    anchors = torch.rand(2, 4)
    gt = torch.rand(2, 4)
    stride = torch.tensor([2, 2], dtype=torch.int32)
    expected = torch.tensor([[0.7921727, 0.5314963, -0.74224466, -13.815511],
                             [0.7360072, 0.58343244, 4.3334002, -0.51378196]])
    out = torch_npu.npu_yolo_boxes_encode(anchors.to(device), gt.to(device), stride.to(device), False)
    assert out.device.type == device and out.dtype == torch.float32
    torch.testing.assert_close(out.cpu(), expected, rtol=1e-4, atol=1e-4)


def encode_loop(anchors, gt, stride, eps=1e-6):
    rows = []
    for a, g, s in zip(anchors.tolist(), gt.tolist(), stride.tolist()):
        cx, cy, w, h = (a[0] + a[2]) / 2, (a[1] + a[3]) / 2, a[2] - a[0], a[3] - a[1]
        gx, gy, gw, gh = (g[0] + g[2]) / 2, (g[1] + g[3]) / 2, g[2] - g[0], g[3] - g[1]
        rows.append([min(max((gx - cx) / s + 0.5, eps), 1 - eps), min(max((gy - cy) / s + 0.5, eps), 1 - eps),
                     math.log(max(gw / w, eps)), math.log(max(gh / h, eps))])
    return torch.tensor(rows, dtype=torch.float64)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.float16, 2e-2)])
def test_yolo_boxes_encode_formula(device, dtype, tol):
    g = torch.Generator().manual_seed(7)
    xy = torch.rand(50, 2, generator=g) * 50
    anchors = torch.cat([xy, xy + torch.rand(50, 2, generator=g) * 20 + 1], 1).to(dtype)
    gxy = xy + torch.randn(50, 2, generator=g) * 8
    gt = torch.cat([gxy, gxy + torch.rand(50, 2, generator=g) * 20 + 1], 1).to(dtype)
    stride = torch.randint(4, 33, (50,), generator=g, dtype=torch.int32)
    out = torch_npu.npu_yolo_boxes_encode(anchors.to(device), gt.to(device), stride.to(device))
    assert out.dtype == dtype and out.shape == (50, 4)
    torch.testing.assert_close(out.cpu().double(), encode_loop(anchors.double(), gt.double(), stride),
                               rtol=tol, atol=tol)
    with FakeTensorMode():
        f = torch_npu.npu_yolo_boxes_encode(torch.empty(9, 4), torch.empty(9, 4), torch.empty(9, dtype=torch.int32))
        assert f.shape == (9, 4)


@pytest.mark.parametrize("device", DEVICES)
def test_anchor_response_flags(device):
    g = torch.Generator().manual_seed(3)
    feat, stride, nba = (6, 5), (4, 8), 3
    x1 = torch.rand(12, generator=g) * 19
    y1 = torch.rand(12, generator=g) * 47
    boxes = torch.stack([x1, y1, x1 + torch.rand(12, generator=g), y1 + torch.rand(12, generator=g)], 1)
    expected = [0] * (feat[0] * feat[1] * nba)
    for bx in boxes.tolist():
        cell = math.floor((bx[1] + bx[3]) / 2 / stride[1]) * feat[1] + math.floor((bx[0] + bx[2]) / 2 / stride[0])
        for a in range(nba):
            expected[cell * nba + a] = 1
    out = torch_npu.npu_anchor_response_flags(boxes.to(device), list(feat), list(stride), nba)
    assert out.dtype == torch.uint8 and out.device.type == device
    assert out.cpu().tolist() == expected
    x = torch.rand(100, 4)
    assert torch_npu.npu_anchor_response_flags(x, [60, 60], [2, 2], 9).shape == (32400,)
