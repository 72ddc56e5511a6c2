"""npu_batch_nms, npu_nms_with_mask and npu_random_choice_with_mask against references written
here with plain Python loops (IoU from corner arithmetic, greedy suppression, sorting)."""
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import torch_npu

from _op_helpers import DEVICES


def iou(a, b):
    iw = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    ih = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = iw * ih
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


def make_boxes(shape_lead, seed):
    g = torch.Generator().manual_seed(seed)
    xy = torch.rand(shape_lead + (2,), generator=g) * 20
    wh = torch.rand(shape_lead + (2,), generator=g) * 10 + 1
    return torch.cat([xy, xy + wh], -1)


def ref_batch_nms(boxes, scores, st, it, per_class, total):
    b, n, q, _ = boxes.shape
    c = scores.shape[2]
    res = []
    for bi in range(b):
        cand = []
        for ci in range(c):
            bx = boxes[bi, :, 0 if q == 1 else ci].tolist()
            sc = scores[bi, :, ci].tolist()
            order = sorted((i for i in range(n) if sc[i] > st), key=lambda i: (-sc[i], i))
            kept = []
            for i in order:
                if len(kept) < per_class and all(iou(bx[i], bx[k]) <= it for k in kept):
                    kept.append(i)
            cand += [(-sc[i], ci, r, bx[i]) for r, i in enumerate(kept)]
        cand.sort(key=lambda t: t[:3])
        res.append(cand[:total])
    return res


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("q", [1, 3])
def test_batch_nms(device, dtype, q):
    boxes = make_boxes((2, 12, q), 0).to(dtype)
    scores = torch.rand(2, 12, 3, generator=torch.Generator().manual_seed(1)).to(dtype)
    out_b, out_s, out_c, out_n = torch_npu.npu_batch_nms(boxes.to(device), scores.to(device), 0.2, 0.3, 4, 7)
    assert out_b.shape == (2, 7, 4) and out_s.shape == (2, 7) and out_c.shape == (2, 7)
    assert out_n.dtype == torch.int32 and out_b.dtype == dtype and out_b.device.type == device
    ref = ref_batch_nms(boxes.double(), scores.double(), 0.2, 0.3, 4, 7)
    for bi, cand in enumerate(ref):
        assert out_n[bi].item() == len(cand)
        for j, (neg, ci, _, bx) in enumerate(cand):
            assert out_c[bi, j].item() == ci
            assert out_s[bi, j].item() == pytest.approx(-neg, rel=1e-3)
            assert out_b[bi, j].cpu().double().tolist() == pytest.approx(bx, rel=1e-3)
        assert torch.all(out_b[bi, len(cand):] == 0) and torch.all(out_s[bi, len(cand):] == 0)


def test_batch_nms_suppresses_and_meta():
    # two nearly identical boxes of one class: the lower-scored one goes
    boxes = torch.tensor([[[[0., 0., 10., 10.]], [[0., 0., 10., 9.]], [[20., 20., 30., 30.]]]])
    scores = torch.tensor([[[0.9], [0.8], [0.7]]])
    b, s, c, n = torch_npu.npu_batch_nms(boxes, scores, 0.1, 0.5, 3, 3)
    assert n.tolist() == [2] and s[0].tolist() == pytest.approx([0.9, 0.7, 0.0])
    with pytest.raises(NotImplementedError, match="transpose_box"):
        torch_npu.npu_batch_nms(boxes, scores, 0.1, 0.5, 3, 3, transpose_box=True)
    with FakeTensorMode():
        out = torch_npu.npu_batch_nms(torch.empty(4, 10, 1, 4), torch.empty(4, 10, 2), 0.1, 0.5, 3, 5)
    assert [tuple(t.shape) for t in out] == [(4, 5, 4), (4, 5), (4, 5), (4,)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cols", [5, 8])
def test_nms_with_mask(device, cols):
    boxes = make_boxes((20,), 3)
    boxes = boxes.repeat_interleave(2, 0)[:20] + torch.rand(20, 4, generator=torch.Generator().manual_seed(4))
    scores = torch.linspace(0.9, 0.1, 20).unsqueeze(1)
    inp = torch.cat([boxes, scores, torch.zeros(20, cols - 5)], 1).to(device)
    sel, idx, mask = torch_npu.npu_nms_with_mask(inp, 0.5)
    bl = boxes.double().tolist()
    kept = []
    for i in range(20):
        if all(iou(bl[i], bl[k]) <= 0.5 for k in kept):
            kept.append(i)
    assert mask.dtype == torch.uint8 and idx.dtype == torch.int32 and sel.shape == (20, 5)
    assert mask.cpu().tolist() == [1 if i in kept else 0 for i in range(20)]
    assert 0 < len(kept) < 20
    assert idx.cpu().tolist() == list(range(20)) and torch.equal(sel.cpu(), inp.cpu()[:, :5])


def test_nms_with_mask_doc_example():
    inp = torch.tensor([[0.0, 1.0, 2.0, 3.0, 0.6], [6.0, 7.0, 8.0, 9.0, 0.4]], dtype=torch.float16).npu()
    sel, idx, mask = torch_npu.npu_nms_with_mask(inp, 0.5)
    assert idx.tolist() == [0, 1] and mask.tolist() == [1, 1] and torch.equal(sel, inp)


@pytest.mark.parametrize("device", DEVICES)
def test_random_choice_with_mask(device):
    x = torch.rand(4, 5, generator=torch.Generator().manual_seed(5)) > 0.6
    coords = {tuple(c) for c in torch.nonzero(x).tolist()}
    y, mask = torch_npu.npu_random_choice_with_mask(x.to(device), 3, 1, 2)
    assert y.shape == (3, 2) and y.dtype == torch.int32 and mask.dtype == torch.bool
    assert mask.all() and len({tuple(r) for r in y.tolist()}) == 3 and {tuple(r) for r in y.tolist()} <= coords
    y2, _ = torch_npu.npu_random_choice_with_mask(x.to(device), 3, 1, 2)
    assert torch.equal(y.cpu(), y2.cpu())  # fixed seed pair, fixed choice
    big, m = torch_npu.npu_random_choice_with_mask(x.to(device), 30)
    k = len(coords)
    assert m.cpu().tolist() == [True] * k + [False] * (30 - k)
    assert {tuple(r) for r in big[:k].tolist()} == coords and torch.all(big[k:] == 0)
    every, m0 = torch_npu.npu_random_choice_with_mask(x.to(device), 0)
    assert every.shape == (k, 2) and {tuple(r) for r in every.tolist()} == coords


def test_random_choice_doc_example_and_meta():
    x = torch.tensor([1, 0, 1, 0], dtype=torch.bool).npu()
    y, mask = torch_npu.npu_random_choice_with_mask(x, 2, 1, 0)
    assert sorted(y.reshape(-1).tolist()) == [0, 2] and mask.tolist() == [True, True]
    with FakeTensorMode():
        y, m = torch_npu.npu_random_choice_with_mask(torch.empty(3, 4, 5, dtype=torch.bool), 16)
    assert y.shape == (16, 3) and m.shape == (16,)
