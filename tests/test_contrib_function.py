"""torch_npu.contrib.function against independent references (plain torch math on CPU tensors),
on CPU and npu inputs."""
import math

import pytest
import torch

import torch_npu  # noqa: F401
from torch_npu.contrib import function as F
from torch_npu.contrib.function import iou as iou_mod

DEVICES = ["cpu", "npu"]


def _boxes(n, seed, scale=100.):
    g = torch.Generator().manual_seed(seed)
    xy = torch.rand(n, 2, generator=g) * scale
    wh = torch.rand(n, 2, generator=g) * scale / 2 + 1
    return torch.cat([xy, xy + wh], 1)


# ---------------------------------------------------------------- bbox coder

def _ref_encode(anchors, gts, means, stds):
    # legacy +1 box convention of the npu encode kernel
    pw, ph = anchors[:, 2] - anchors[:, 0] + 1, anchors[:, 3] - anchors[:, 1] + 1
    px, py = anchors[:, 0] + 0.5 * (pw - 1), anchors[:, 1] + 0.5 * (ph - 1)
    gw, gh = gts[:, 2] - gts[:, 0] + 1, gts[:, 3] - gts[:, 1] + 1
    gx, gy = gts[:, 0] + 0.5 * (gw - 1), gts[:, 1] + 0.5 * (gh - 1)
    d = torch.stack([(gx - px) / pw, (gy - py) / ph, torch.log(gw / pw), torch.log(gh / ph)], 1)
    return (d - torch.tensor(means)) / torch.tensor(stds)


@pytest.mark.parametrize("device", DEVICES)
def test_bbox_encode_xyxy2xywh(device):
    anchors, gts = _boxes(20, 0), _boxes(20, 1)
    means, stds = [0.1, -0.1, 0.0, 0.05], [0.1, 0.1, 0.2, 0.2]
    out = F.npu_bbox_coder_encode_xyxy2xywh(anchors.to(device), gts.to(device), means, stds)
    assert out.device.type == device and out.shape == (20, 4)
    torch.testing.assert_close(out.cpu(), _ref_encode(anchors, gts, means, stds), rtol=1e-4, atol=1e-4)
    # normalised coordinates are scaled back first
    norm = F.npu_bbox_coder_encode_xyxy2xywh((anchors / 1000).to(device), (gts / 1000).to(device),
                                             means, stds, is_normalized=True, normalized_scale=1000.)
    torch.testing.assert_close(norm.cpu(), _ref_encode(anchors, gts, means, stds), rtol=1e-3, atol=1e-3)


def test_bbox_coder_rejects_mismatched_boxes():
    with pytest.raises(ValueError, match=r"bboxes.size\(0\) == gt_bboxes.size\(0\)"):
        F.npu_bbox_coder_encode_xyxy2xywh(_boxes(3, 0), _boxes(4, 1))
    with pytest.raises(ValueError, match="== 4"):
        F.npu_bbox_coder_decode_xywh2xyxy(_boxes(3, 0), torch.zeros(3, 5))


@pytest.mark.parametrize("device", DEVICES)
def test_bbox_decode_roundtrip_and_clip(device):
    anchors, gts = _boxes(16, 2), _boxes(16, 3)
    deltas = _ref_encode(anchors, gts, [0.] * 4, [1.] * 4)
    out = F.npu_bbox_coder_decode_xywh2xyxy(anchors.to(device), deltas.to(device))
    torch.testing.assert_close(out.cpu(), gts, rtol=1e-4, atol=1e-3)
    # clipping to max_shape (h, w): x to [0, w - 1], y to [0, h - 1]
    clipped = F.npu_bbox_coder_decode_xywh2xyxy(anchors.to(device), deltas.to(device), max_shape=(40, 60))
    ref = gts.clone()
    ref[:, 0::2] = ref[:, 0::2].clamp(0, 59)
    ref[:, 1::2] = ref[:, 1::2].clamp(0, 39)
    torch.testing.assert_close(clipped.cpu(), ref, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("device", DEVICES)
def test_bbox_encode_yolo(device):
    anchors = _boxes(12, 4)
    gts = anchors + torch.randn(12, 4, generator=torch.Generator().manual_seed(5))
    stride = torch.tensor([8, 16, 32] * 4)
    out = F.npu_bbox_coder_encode_yolo(anchors.to(device), gts.to(device), stride.to(device))
    eps = 1e-6
    cx, cy = (anchors[:, 0] + anchors[:, 2]) / 2, (anchors[:, 1] + anchors[:, 3]) / 2
    w, h = anchors[:, 2] - anchors[:, 0], anchors[:, 3] - anchors[:, 1]
    gx, gy = (gts[:, 0] + gts[:, 2]) / 2, (gts[:, 1] + gts[:, 3]) / 2
    gw, gh = gts[:, 2] - gts[:, 0], gts[:, 3] - gts[:, 1]
    ref = torch.stack([((gx - cx) / stride + 0.5).clamp(eps, 1 - eps), ((gy - cy) / stride + 0.5).clamp(eps, 1 - eps),
                       torch.log((gw / w).clamp(min=eps)), torch.log((gh / h).clamp(min=eps))], 1)
    torch.testing.assert_close(out.cpu(), ref, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------- anchor flags

@pytest.mark.parametrize("device", DEVICES)
def test_single_level_responsible_flags(device):
    feat_h, feat_w, stride, num_anchors = 5, 7, (16, 16), 3
    gts = torch.tensor([[0., 0., 20., 20.], [50., 30., 70., 40.], [100., 60., 110., 75.]])
    flags = F.npu_single_level_responsible_flags((feat_h, feat_w), gts.to(device), stride, num_anchors)
    ref = torch.zeros(feat_h, feat_w, num_anchors, dtype=torch.uint8)
    for x1, y1, x2, y2 in gts.tolist():
        ref[int(((y1 + y2) / 2) // stride[1]), int(((x1 + x2) / 2) // stride[0]), :] = 1
    assert flags.device.type == device
    assert flags.shape == (feat_h * feat_w * num_anchors,)
    assert torch.equal(flags.cpu().to(torch.uint8), ref.reshape(-1))
    # integer boxes are accepted (cast to float32)
    flags_int = F.npu_single_level_responsible_flags((feat_h, feat_w), gts.int().to(device), stride, num_anchors)
    assert torch.equal(flags_int.cpu().to(torch.uint8), ref.reshape(-1))


# ---------------------------------------------------------------- index put / roll / matmul_transpose

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("value", [0., 1., -2.5])
def test_fast_condition_index_put(device, value):
    x = torch.randn(16, 33)
    cond = x < 0.3
    ref = x.clone()
    ref[cond] = value
    out = F.npu_fast_condition_index_put(x.to(device), cond.to(device), value)
    assert out.device.type == device
    assert torch.equal(out.cpu(), ref)
    with pytest.raises(TypeError, match="bool"):
        F.npu_fast_condition_index_put(x, cond.int(), value)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shifts", [(-3, -3), (2, -1), (5, 0)])
def test_roll_forward_backward(device, shifts):
    x = torch.randn(2, 7, 6, 4)
    weight = torch.randn(2, 7, 6, 4)
    ours = x.detach().to(device).requires_grad_()
    out = F.roll(ours, shifts, (1, 2))
    ref_in = x.detach().clone().requires_grad_()
    ref = torch.roll(ref_in, shifts=shifts, dims=(1, 2))
    assert torch.equal(out.detach().cpu(), ref.detach())
    (out * weight.to(device)).sum().backward()
    (ref * weight).sum().backward()
    assert torch.equal(ours.grad.cpu(), ref_in.grad)


def test_roll_argument_checks():
    with pytest.raises(ValueError, match="x.dim"):
        F.roll(torch.zeros(3, 3, 3), (1, 1), (1, 2))
    with pytest.raises(ValueError, match="len\\(shifts\\)"):
        F.roll(torch.zeros(1, 3, 3, 1), (1,), (1, 2))


@pytest.mark.parametrize("device", DEVICES)
def test_matmul_transpose(device):
    a, b = torch.randn(3, 2, 5, 8), torch.randn(3, 2, 6, 8)
    a_n, b_n = a.detach().to(device).requires_grad_(), b.detach().to(device).requires_grad_()
    out = F.matmul_transpose(a_n, b_n)
    a_r, b_r = a.detach().clone().requires_grad_(), b.detach().clone().requires_grad_()
    ref = torch.einsum("bhik,bhjk->bhij", a_r, b_r)
    torch.testing.assert_close(out.detach().cpu(), ref.detach(), rtol=1e-5, atol=1e-5)
    g = torch.randn_like(ref)
    out.backward(g.to(device))
    ref.backward(g)
    torch.testing.assert_close(a_n.grad.cpu(), a_r.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(b_n.grad.cpu(), b_r.grad, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------- attention helpers

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", [(2, 16, 128, 128), (1, 3, 10, 10)])  # fused and unfused paths
def test_fuse_add_softmax_dropout_eval(device, shape):
    scores, mask = torch.randn(shape), torch.randn(shape)
    head_size = 64
    dropout = torch.nn.Dropout(0.3).eval()
    out = F.fuse_add_softmax_dropout(False, dropout, mask.to(device), scores.to(device), head_size, p=0.3)
    ref = torch.softmax(mask + scores / math.sqrt(head_size), dim=-1)
    assert out.device.type == device
    torch.testing.assert_close(out.cpu(), ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("shape", [(2, 16, 128, 128), (1, 3, 10, 10)])
def test_fuse_add_softmax_dropout_training(shape):
    torch.manual_seed(0)
    scores, mask = torch.randn(shape), torch.randn(shape)
    p = 0.25
    out = F.fuse_add_softmax_dropout(True, torch.nn.Dropout(p), mask.npu(), scores.npu(), 16, p=p).cpu()
    probs = torch.softmax(mask + scores / 4, dim=-1)
    kept = out != 0
    # kept elements are the probabilities scaled by 1 / (1 - p); the drop rate is about p
    torch.testing.assert_close(out[kept], probs[kept] / (1 - p), rtol=1e-5, atol=1e-6)
    drop_rate = 1 - kept.float().mean().item()
    assert abs(drop_rate - p) < 0.05 if out.numel() > 10000 else 0 < drop_rate < 0.6


# ---------------------------------------------------------------- fused BERT attention

_FA_B, _FA_S, _FA_H = 2, 32, 768          # shapes the fused kernels take (B*S % 32 == 0, H in 768/1024)
_FA_N = _FA_H // 64


@pytest.fixture
def fresh_fa_check(monkeypatch):
    """torch_npu checks the fused-attention inputs once per process: start each test unchecked."""
    from torch_npu.contrib.function import fused_attention
    monkeypatch.setitem(fused_attention._compatibility, "checked", False)


def _fa_params(seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    b, s, h = _FA_B, _FA_S, _FA_H
    p = {"hidden": torch.randn(b * s, h, generator=g), "mask": torch.zeros(b, 1, s, s)}
    p["mask"][1, :, :, 20:] = -10000.0          # BERT padding mask of the second sequence
    for name in ("wq", "wk", "wv"):
        p[name] = torch.randn(h, h, generator=g) * 0.03
    for name in ("bq", "bk", "bv"):
        p[name] = torch.randn(h, generator=g) * 0.1
    p["gamma"] = 1 + 0.1 * torch.randn(h, generator=g)
    p["beta"] = 0.1 * torch.randn(h, generator=g)
    return {k: v.to(dtype) for k, v in p.items()}


def _fa_npu_args(p, layernorm):
    """Inputs as torch_npu wants them: hidden/mask/kernels FRACTAL_NZ (29), biases and gamma/beta ND."""
    def nz(t):
        return torch_npu.npu_format_cast(t.npu(), 29).requires_grad_(t.dtype.is_floating_point)
    args = [nz(p["hidden"]), torch_npu.npu_format_cast(p["mask"].npu(), 29), nz(p["wq"]), nz(p["wk"]), nz(p["wv"])]
    args += [p[k].npu().requires_grad_() for k in ("bq", "bk", "bv")]
    if layernorm:
        args += [p["gamma"].npu().requires_grad_(), p["beta"].npu().requires_grad_()]
    args[1].requires_grad_(False)
    return args


def _bert_self_attention(hidden, mask, wq, wk, wv, bq, bk, bv, scale):
    """Plain BERT self-attention (heads of 64) on CPU: (B*S, H) context."""
    b, s, n = _FA_B, _FA_S, _FA_N

    def heads(x):
        return x.view(b, s, n, 64).permute(0, 2, 1, 3)
    q, k, v = heads(hidden @ wq + bq), heads(hidden @ wk + bk), heads(hidden @ wv + bv)
    probs = torch.softmax(q @ k.transpose(-1, -2) * scale + mask, dim=-1)
    return (probs @ v).permute(0, 2, 1, 3).reshape(b * s, n * 64)


@pytest.mark.parametrize("layernorm", [False, True])
def test_fused_attention_matches_bert_reference(fresh_fa_check, layernorm):
    p = _fa_params(0)
    scale = 1 / math.sqrt(64)
    args = _fa_npu_args(p, layernorm)
    ref_in = {k: v.double().requires_grad_(k != "mask") for k, v in p.items()}
    grad_ctx = torch.randn(_FA_B * _FA_S, _FA_H)
    if layernorm:
        ctx, norm = F.npu_fused_attention_with_layernorm(*args, scale, 1.0)
        ref_norm = torch.nn.functional.layer_norm(ref_in["hidden"], (_FA_H,), ref_in["gamma"], ref_in["beta"], 1e-5)
        grad_norm = torch.randn(_FA_B * _FA_S, _FA_H)
        torch.testing.assert_close(norm.cpu().double(), ref_norm, rtol=1e-5, atol=1e-5)
        ((ctx * grad_ctx.npu()).sum() + (norm * grad_norm.npu()).sum()).backward()
    else:
        ctx = F.npu_fused_attention(*args, scale, 1.0)
        ref_norm = ref_in["hidden"]
        ctx.backward(grad_ctx.npu())
    ref_ctx = _bert_self_attention(ref_norm, ref_in["mask"], *(ref_in[k] for k in ("wq", "wk", "wv", "bq", "bk", "bv")),
                                   scale)
    assert ctx.shape == (_FA_B * _FA_S, _FA_H) and ctx.device.type == "npu"
    torch.testing.assert_close(ctx.cpu().double(), ref_ctx, rtol=1e-5, atol=1e-5)
    ref_loss = (ref_ctx * grad_ctx.double()).sum()
    if layernorm:
        ref_loss = ref_loss + (ref_norm * grad_norm.double()).sum()
    ref_loss.backward()
    names = ["hidden", "wq", "wk", "wv", "bq", "bk", "bv"] + (["gamma", "beta"] if layernorm else [])
    for name, got in zip(names, [args[0]] + args[2:]):
        want = ref_in[name].grad
        torch.testing.assert_close(got.grad.cpu().double(), want, rtol=1e-4, atol=1e-4 * want.abs().max().item() + 1e-6,
                                   msg=lambda m: "%s: %s" % (name, m))
    assert args[1].grad is None


def test_fused_attention_float16(fresh_fa_check):
    p = _fa_params(1, torch.float16)
    args = _fa_npu_args(p, layernorm=False)
    ctx = F.npu_fused_attention(*args, 0.125, 1.0)
    assert ctx.dtype == torch.float16
    ref = _bert_self_attention(*(p[k].double() for k in ("hidden", "mask", "wq", "wk", "wv", "bq", "bk", "bv")), 0.125)
    # float16 inputs, float32 compute, float16 results (q/k/v rounded to float16 between the ops)
    torch.testing.assert_close(ctx.cpu().double(), ref, rtol=2e-2, atol=2e-2)


def test_fused_attention_dropout_rate_and_scaling(fresh_fa_check):
    """Uniform attention (zero query/key projections) over all-ones values: each context entry is
    (number of kept probabilities in its row) / (S * keep_prob), so the drop mask is readable."""
    p = _fa_params(2)
    p["mask"].zero_()
    for name in ("wq", "wk", "wv", "bq", "bk"):
        p[name].zero_()
    p["bv"].fill_(1.0)
    keep_prob = 0.8
    torch.npu.manual_seed(5)
    ctx = F.npu_fused_attention(*_fa_npu_args(p, layernorm=False), 1.0, keep_prob).detach().cpu().double()
    kept = (ctx * _FA_S * keep_prob).view(_FA_B, _FA_S, _FA_N, 64)
    torch.testing.assert_close(kept, kept.round(), rtol=0, atol=1e-4)   # whole counts: kept values scaled by 1/keep
    assert torch.equal(kept[..., :1].expand_as(kept), kept)            # one mask row per (b, s, head)
    rate = kept[..., 0].sum().item() / (_FA_B * _FA_N * _FA_S * _FA_S)
    assert abs(rate - keep_prob) < 0.01                                # 24576 draws: std 0.0026


@pytest.mark.parametrize("layernorm", [False, True])
def test_fused_attention_dropout_backward_uses_forward_mask(fresh_fa_check, layernorm):
    """With the generator reset before each forward the mask repeats, so the directional
    derivative of <context, G> by central differences must equal the backward's gradient."""
    p = _fa_params(3, torch.float64)
    keep_prob, scale = 0.7, 0.125
    g = torch.Generator().manual_seed(9)
    grad_ctx = torch.randn(_FA_B * _FA_S, _FA_H, generator=g, dtype=torch.float64).npu()
    dirs = {k: torch.randn(p[k].shape, generator=g, dtype=torch.float64) for k in ("hidden", "wq", "wv")}
    fn = F.npu_fused_attention_with_layernorm if layernorm else F.npu_fused_attention

    def loss(shift):
        q = dict(p)
        for k, d in dirs.items():
            q[k] = p[k] + shift * d
        args = _fa_npu_args(q, layernorm)
        torch.npu.manual_seed(11)
        out = fn(*args, scale, keep_prob)
        ctx = out[0] if layernorm else out
        return (ctx * grad_ctx).sum(), args

    value, args = loss(0.0)
    value.backward()
    analytic = sum((args[i].grad.cpu() * dirs[k]).sum().item() for i, k in ((0, "hidden"), (2, "wq"), (4, "wv")))
    eps = 1e-5
    numeric = (loss(eps)[0].item() - loss(-eps)[0].item()) / (2 * eps)
    assert abs(numeric - analytic) <= 1e-6 * max(1.0, abs(analytic))
    torch.npu.manual_seed(12)   # another mask gives another value: the mask does matter
    other = fn(*_fa_npu_args(p, layernorm), scale, keep_prob)
    assert abs(((other[0] if layernorm else other) * grad_ctx).sum().item() - value.item()) > 1e-3


def test_fused_attention_compatibility_check(fresh_fa_check):
    from torch_npu.contrib.function import fused_attention
    p = _fa_params(4)
    cpu_args = [p[k] for k in ("hidden", "mask", "wq", "wk", "wv", "bq", "bk", "bv")]
    with pytest.raises(RuntimeError, match="format not matches"):
        F.npu_fused_attention(*cpu_args, 0.125, 1.0)     # ND tensors: the kernels need FRACTAL_NZ
    args = _fa_npu_args(p, layernorm=True)
    gamma_nz = torch_npu.npu_format_cast(args[8].detach(), 29)
    fused_attention._compatibility["checked"] = False
    with pytest.raises(RuntimeError, match="gamma or beta format not matches"):
        F.npu_fused_attention_with_layernorm(*args[:8], gamma_nz, args[9], 0.125, 1.0)
    bad_hidden = torch_npu.npu_format_cast(torch.randn(64, 512).npu(), 29)
    fused_attention._compatibility["checked"] = False
    with pytest.raises(RuntimeError, match="shape of hidden_states not matches"):
        F.npu_fused_attention(bad_hidden, *args[1:8], 0.125, 1.0)
    bad_mask = torch_npu.npu_format_cast(torch.zeros(2, 1, 32, 16).npu(), 29)
    fused_attention._compatibility["checked"] = False
    with pytest.raises(RuntimeError, match="shape of attention_mask not matches"):
        F.npu_fused_attention(args[0], bad_mask, *args[2:8], 0.125, 1.0)
    # as in torch_npu the check runs once per process: after the first call, even ND inputs pass it
    fused_attention._compatibility["checked"] = False
    F.npu_fused_attention(*args[:8], 0.125, 1.0)
    nd_hidden = args[0].detach().clone()
    torch_npu.npu_format_cast_(nd_hidden, 2)
    assert F.npu_fused_attention(nd_hidden, *args[1:8], 0.125, 1.0).shape == (64, 768)


@pytest.mark.parametrize("device", DEVICES)
def test_dropout_with_byte_mask(device):
    torch.manual_seed(1)
    x = torch.randn(200, 100).to(device)
    out = F.dropout_with_byte_mask(x, p=0.4, training=True).cpu()
    kept = out != 0
    torch.testing.assert_close(out[kept], x.cpu()[kept] / 0.6)
    assert abs((1 - kept.float().mean().item()) - 0.4) < 0.03
    assert torch.equal(F.dropout_with_byte_mask(x, p=0.4, training=False).cpu(), x.cpu())
    with pytest.raises(ValueError, match="between 0 and 1"):
        F.dropout_with_byte_mask(x, p=1.5)
    with pytest.raises(ValueError, match="no-inplace"):
        F.dropout_with_byte_mask(x, p=0.5, inplace=True)


# ---------------------------------------------------------------- NMS

def _iou_matrix(a, b):
    lt = torch.max(a[:, None, :2], b[None, :, :2])
    rb = torch.min(a[:, None, 2:], b[None, :, 2:])
    inter = (rb - lt).clamp(min=0).prod(-1)
    area_a = (a[:, 2:] - a[:, :2]).prod(-1)
    area_b = (b[:, 2:] - b[:, :2]).prod(-1)
    return inter / (area_a[:, None] + area_b[None] - inter)


def _ref_multiclass_nms(boxes, scores, score_thr, nms_thr, max_num):
    """boxes (n, C, 4) or (n, 4); scores (n, C) without background. Greedy per-class NMS."""
    n, num_classes = scores.shape
    kept = []
    for c in range(num_classes):
        cls_boxes = boxes[:, c] if boxes.dim() == 3 else boxes
        idx = [i for i in torch.argsort(scores[:, c], descending=True).tolist() if scores[i, c] > score_thr]
        chosen = []
        for i in idx:
            if all(_iou_matrix(cls_boxes[i:i + 1], cls_boxes[j:j + 1]).item() <= nms_thr for j in chosen):
                chosen.append(i)
        kept += [(scores[i, c].item(), c, cls_boxes[i]) for i in chosen]
    kept.sort(key=lambda t: -t[0])
    kept = kept[:max_num]
    dets = torch.zeros(max_num, 5)
    labels = torch.zeros(max_num)
    for row, (s, c, b) in enumerate(kept):
        dets[row, :4], dets[row, 4], labels[row] = b, s, c
    return dets, labels, len(kept)


def _nms_case(seed, n=30, num_classes=3, per_class_boxes=True):
    g = torch.Generator().manual_seed(seed)
    # coordinates and scores representable in float16, distinct scores
    base = (torch.rand(n, 2, generator=g) * 60).round()
    size = (torch.rand(n, 2, generator=g) * 30 + 5).round()
    boxes = torch.cat([base, base + size], 1)
    if per_class_boxes:
        jitter = (torch.rand(n, num_classes, 4, generator=g) * 4).round()
        boxes = boxes[:, None, :] + jitter
    perm = torch.randperm(n * num_classes, generator=g).float()
    scores = (perm / 128 + 1 / 256).reshape(n, num_classes)  # exact in float16, all distinct
    background = torch.rand(n, 1, generator=g)
    return boxes, torch.cat([scores, background], 1)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("per_class_boxes", [True, False])
def test_multiclass_nms(device, per_class_boxes):
    boxes, scores = _nms_case(7, per_class_boxes=per_class_boxes)
    max_num = 20
    dets, labels = F.npu_multiclass_nms(boxes.to(device), scores.to(device), score_thr=0.1, nms_thr=0.3,
                                        max_num=max_num)
    ref_dets, ref_labels, count = _ref_multiclass_nms(boxes, scores[:, :-1], 0.1, 0.3, max_num)
    assert count > 3
    assert dets.device.type == device and dets.shape == (max_num, 5) and labels.shape == (max_num,)
    torch.testing.assert_close(dets.cpu().float(), ref_dets, rtol=1e-3, atol=1e-2)
    assert torch.equal(labels.cpu().float()[:count], ref_labels[:count])


def test_multiclass_nms_score_factors():
    boxes, scores = _nms_case(8)
    factors = torch.full((30,), 0.5)
    dets, labels = F.npu_multiclass_nms(boxes, scores, score_thr=0.05, nms_thr=0.5, max_num=10,
                                        score_factors=factors)
    ref_dets, ref_labels, count = _ref_multiclass_nms(boxes, scores[:, :-1] * 0.5, 0.05, 0.5, 10)
    torch.testing.assert_close(dets.float(), ref_dets, rtol=1e-3, atol=1e-2)
    assert torch.equal(labels.float()[:count], ref_labels[:count])


@pytest.mark.parametrize("device", DEVICES)
def test_batched_multiclass_nms(device):
    cases = [_nms_case(s) for s in (11, 12)]
    boxes = torch.stack([c[0] for c in cases])
    scores = torch.stack([c[1] for c in cases])
    dets, labels = F.npu_batched_multiclass_nms(boxes.to(device), scores.to(device), score_thr=0.1,
                                                nms_thr=0.4, max_num=15)
    assert dets.shape == (2, 15, 5) and labels.shape == (2, 15)
    for b in range(2):
        ref_dets, ref_labels, count = _ref_multiclass_nms(boxes[b], scores[b, :, :-1], 0.1, 0.4, 15)
        torch.testing.assert_close(dets[b].cpu().float(), ref_dets, rtol=1e-3, atol=1e-2)
        assert torch.equal(labels[b].cpu().float()[:count], ref_labels[:count])


# ---------------------------------------------------------------- IoU family (torch_npu.contrib.function.iou)

def _iou_kernel_formula(a, b):
    # the npu IoU kernel's areas carry a 0.01 offset; the intersection does not
    lt = torch.max(a[:, None, :2], b[None, :, :2])
    rb = torch.min(a[:, None, 2:], b[None, :, 2:])
    inter = (rb - lt).clamp(min=0).prod(-1)
    area_a = ((a[:, 2:] - a[:, :2]) + 0.01).prod(-1)
    area_b = ((b[:, 2:] - b[:, :2]) + 0.01).prod(-1)
    return inter / (area_a[:, None] + area_b[None] - inter)


@pytest.mark.parametrize("device", DEVICES)
def test_iou_layout_and_value(device):
    a, b = _boxes(6, 20), _boxes(4, 21)
    for mode in ("iou", "ptiou"):
        out = iou_mod.npu_iou(a.to(device), b.to(device), mode=mode)
        assert out.shape == (6, 4)
        torch.testing.assert_close(out.cpu(), _iou_kernel_formula(a, b), rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="mode"):
        iou_mod.npu_iou(a, b, mode="giou")


def _xywh_to_xyxy(t):
    return torch.cat([t[..., :2] - t[..., 2:] / 2, t[..., :2] + t[..., 2:] / 2], -1)


@pytest.mark.parametrize("device", DEVICES)
def test_giou_forward_backward(device):
    g = torch.Generator().manual_seed(3)
    b1 = torch.cat([torch.rand(8, 2, generator=g) * 10, torch.rand(8, 2, generator=g) * 5 + 1], 1)
    b2 = torch.cat([torch.rand(8, 2, generator=g) * 10, torch.rand(8, 2, generator=g) * 5 + 1], 1)
    ours = b1.detach().to(device).requires_grad_()
    out = iou_mod.npu_giou(ours, b2.to(device))
    assert out.shape == (8, 1)
    ref_in = b1.detach().clone().requires_grad_()
    x1, x2 = _xywh_to_xyxy(ref_in), _xywh_to_xyxy(b2)
    lt, rb = torch.max(x1[:, :2], x2[:, :2]), torch.min(x1[:, 2:], x2[:, 2:])
    inter = (rb - lt).clamp(min=0).prod(-1)
    union = ref_in[:, 2:].prod(-1) + b2[:, 2:].prod(-1) - inter
    enclose = (torch.max(x1[:, 2:], x2[:, 2:]) - torch.min(x1[:, :2], x2[:, :2])).prod(-1)
    ref = (inter / union - (enclose - union) / enclose)[:, None]
    torch.testing.assert_close(out.detach().cpu(), ref.detach(), rtol=1e-4, atol=1e-4)
    out.sum().backward()
    ref.sum().backward()
    torch.testing.assert_close(ours.grad.cpu(), ref_in.grad, rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("device", DEVICES)
def test_diou_ciou(device):
    g = torch.Generator().manual_seed(4)
    b1 = torch.cat([torch.rand(2, 6, generator=g) * 10, torch.rand(2, 6, generator=g) * 5 + 1], 0)
    b2 = torch.cat([torch.rand(2, 6, generator=g) * 10, torch.rand(2, 6, generator=g) * 5 + 1], 0)
    x1, x2 = _xywh_to_xyxy(b1.t()), _xywh_to_xyxy(b2.t())
    lt, rb = torch.max(x1[:, :2], x2[:, :2]), torch.min(x1[:, 2:], x2[:, 2:])
    inter = (rb - lt).clamp(min=0).prod(-1)
    union = b1[2:].prod(0) + b2[2:].prod(0) - inter
    iou = inter / union
    rho2 = ((b1[:2] - b2[:2]) ** 2).sum(0)
    c2 = ((torch.max(x1[:, 2:], x2[:, 2:]) - torch.min(x1[:, :2], x2[:, :2])) ** 2).sum(-1)
    diou = iou - rho2 / c2
    v = 4 / math.pi ** 2 * (torch.atan(b2[2] / b2[3]) - torch.atan(b1[2] / b1[3])) ** 2
    ciou = diou - v / (1 - iou + v) * v
    out_d = iou_mod.npu_diou(b1.to(device), b2.to(device))
    out_c = iou_mod.npu_ciou(b1.to(device), b2.to(device))
    torch.testing.assert_close(out_d.cpu(), diou[None], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(out_c.cpu(), ciou[None], rtol=1e-4, atol=1e-5)
