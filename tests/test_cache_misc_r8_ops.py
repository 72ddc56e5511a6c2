"""Round 8: KV-cache, sampling, detection, RNN and runtime ops of torch.ops.npu.

Meta-only ops: under FakeTensorMode each returns the shapes/dtypes written here from the op's
documentation / op-plugin output-size code, and a real CPU call still raises NotImplementedError
naming the op. Emulated ops are checked against references written here (float64 formulas,
torch.autograd on a float64 formula written in this file), on CPU and npu tensors.
"""
import math

import pytest
import torch
import torch_npu  # noqa: F401
from torch._subclasses.fake_tensor import FakeTensorMode

from torch_npu.op_plugin._registry import IMPLEMENTED, META, NOT_EMULATED, not_emulated_message

npu = torch.ops.npu
f16, f32, i8, i32, i64 = torch.float16, torch.float32, torch.int8, torch.int32, torch.int64


def z(*shape, dtype=f32):
    return torch.zeros(shape, dtype=dtype)


def _ints(n):
    return z(n, dtype=i32)


# (overload, call(), expected [(shape, dtype)] or None for "returns nothing")
META_CASES = [
    ("npu_rope_quant_kvcache",
     lambda: npu.npu_rope_quant_kvcache(z(2, 3, 128, dtype=f16), z(2, 3, 1, 32, dtype=f16), z(2, 3, 1, 32, dtype=f16),
                                        z(2, 16, 1, 32, dtype=i8), z(2, 16, 1, 32, dtype=i8), _ints(2), z(32), z(32),
                                        [64, 32, 32], kv_output=True),
     # q heads = 64 // 32 = 2, k/v heads = k_cache.size(2) = 1
     [((2, 3, 2, 32), f16), ((2, 3, 1, 32), f16), ((2, 3, 1, 32), f16), ((2, 16, 1, 32), i8), ((2, 16, 1, 32), i8)]),
    ("npu_dequant_rope_quant_kvcache",
     lambda: npu.npu_dequant_rope_quant_kvcache(z(4, 96, dtype=i32), z(4, 1, 32, dtype=torch.bfloat16),
                                                z(4, 1, 32, dtype=torch.bfloat16), z(2, 16, 1, 32, dtype=i8),
                                                z(2, 16, 1, 32, dtype=i8), _ints(4), z(32), z(32), [32, 32, 32]),
     # 2-D x: [T, heads, D]; without kv_output k/v are empty [0]
     [((4, 1, 32), torch.bfloat16), ((0,), torch.bfloat16), ((0,), torch.bfloat16), ((2, 16, 1, 32), i8),
      ((2, 16, 1, 32), i8)]),
    ("npu_top_k_top_p_sample",
     lambda: npu.npu_top_k_top_p_sample(z(3, 10, dtype=f16), _ints(3), z(3, dtype=f16), z(3, 10)),
     [((3,), i64), ((3, 10), f32)]),
    ("npu_hans_encode.out",
     lambda: npu.npu_hans_encode(z(64, dtype=f16), pdf=z(256, dtype=i32), mantissa=z(32, dtype=f16),
                                 fixed=z(40, dtype=f16), var=z(8, dtype=f16)),
     [((256,), i32), ((32,), f16), ((40,), f16), ((8,), f16)]),
    ("npu_hans_decode.out",
     lambda: npu.npu_hans_decode(z(32, dtype=f16), z(40, dtype=f16), z(8, dtype=f16), z(256, dtype=i32),
                                 out=z(64, dtype=f16)),
     [((64,), f16)]),
    ("obfuscation_calculate",
     lambda: npu.obfuscation_calculate(_ints(1), z(4, 16, dtype=torch.bfloat16), z(1)),
     [((4, 16), torch.bfloat16)]),
    ("obfuscation_finalize",
     lambda: npu.obfuscation_finalize(_ints(1)),
     [((1,), i32)]),
    ("attention_worker_scheduler", lambda: npu.attention_worker_scheduler(z(64, dtype=i8)), [((64,), i8)]),
    ("attention_worker_scheduler_", lambda: npu.attention_worker_scheduler_(z(64, dtype=i8)), [((64,), i8)]),
    ("ffn_worker_scheduler", lambda: npu.ffn_worker_scheduler(z(64, dtype=i8), sync_group_size=2), [((64,), i8)]),
    ("ffn_worker_scheduler_", lambda: npu.ffn_worker_scheduler_(z(64, dtype=i8)), [((64,), i8)]),
    ("npu_attention_to_ffn",
     lambda: npu.npu_attention_to_ffn(z(2, 16, dtype=f16), _ints(1), _ints(1), _ints(1), z(2, 2, dtype=i32),
                                      z(2, 2, dtype=i32), "group", 2, [1, 1, 10], [1, 1, 2, 2, 32], [1, 2, 2], 4),
     None),
    ("npu_ffn_to_attention",
     lambda: npu.npu_ffn_to_attention(z(6, 16, dtype=f16), _ints(6), _ints(6), _ints(6), _ints(6), z(1, dtype=i64),
                                      "group", 2, [1, 1, 10], [1, 1, 2, 2, 32]),
     None),
    ("npu_attention_worker_combine",
     lambda: npu.npu_attention_worker_combine(z(128, dtype=i8), z(5, 3), _ints(1), 16, token_dtype=1),
     [((5, 16), torch.bfloat16), ((1,), i32)]),
    ("npu_ffn_worker_batching",
     # max_out_shape [A, BS, K+1, H] = [1, 2, 3, 16]: Y = 6 rows
     lambda: npu.npu_ffn_worker_batching(z(128, dtype=i8), 4, [1, 2, 3, 16], token_dtype=2),
     [((6, 16), i8), ((4, 2), i64), ((6,), i32), ((6,), i32), ((6,), i32), ((6,), i32), ((6,), f32), ((1,), i64)]),
    ("_npu_distribute_barrier",
     lambda: npu._npu_distribute_barrier(z(2, 3, dtype=f16), "group", 2),
     [((2, 3), f16)]),
    ("_npu_silent_check",
     lambda: npu._npu_silent_check(z(4), z(), z(1), z(1), z(1), z(1, dtype=i64), 7, 1e6, 1e5, 1e3, 5.0),
     [((1,), i64)]),
    ("_npu_silent_check_v2",
     lambda: npu._npu_silent_check_v2(z(), z(4), z(3), z(1, dtype=i64), 7, 1e6, 1e5, 1e3, 5.0, 1),
     [((1,), i32)]),
    ("_npu_silent_check_v3",
     lambda: npu._npu_silent_check_v3(z(), z(4), z(1, dtype=i64), z(1), z(1), 1e6, 1e3, 0.99, 1),
     [((1,), i32)]),
]


def _flatten(out):
    if out is None:
        return None
    if isinstance(out, torch.Tensor):
        return [out]
    flat = []
    for item in out:
        flat.extend(_flatten(item) if not isinstance(item, torch.Tensor) else [item])
    return flat


@pytest.mark.parametrize("name,call,expected", META_CASES, ids=[c[0] for c in META_CASES])
def test_meta_shapes_and_cpu_still_raises(name, call, expected):
    assert name in META and name in NOT_EMULATED and name not in IMPLEMENTED
    with FakeTensorMode():
        out = call()
    got = _flatten(out)
    if expected is None:
        assert got is None
    else:
        assert [(tuple(t.shape), t.dtype) for t in got] == [(tuple(s), d) for s, d in expected]
    with pytest.raises(NotImplementedError) as info:
        call()
    assert str(info.value) == not_emulated_message(name)


def test_inplace_metas_return_their_argument():
    with FakeTensorMode():
        ctx = z(64, dtype=i8)
        assert npu.attention_worker_scheduler_(ctx) is ctx
        assert npu.ffn_worker_scheduler_(ctx) is ctx
        out = z(64, dtype=f16)
        mantissa, fixed, var, pdf = z(32, dtype=f16), z(40, dtype=f16), z(8, dtype=f16), z(256, dtype=i32)
        assert npu.npu_hans_decode(mantissa, fixed, var, pdf, out=out) is out


@pytest.mark.parametrize("call,message", [
    (lambda: npu.npu_dequant_rope_quant_kvcache(z(4, 96), z(4, 1, 32), z(4, 1, 32), z(2, 16, 1, 32, dtype=i8),
                                                z(2, 16, 1, 32, dtype=i8), _ints(4), z(32), z(32), [32, 32, 32]),
     "x must be int32"),
    (lambda: npu.npu_rope_quant_kvcache(z(4, 96), z(4, 1, 32), z(4, 1, 32), z(2, 16, 32, dtype=i8),
                                        z(2, 16, 32, dtype=i8), _ints(4), z(32), z(32), [32, 32, 32]),
     "k_cache must be 4-D"),
    (lambda: npu.npu_qkv_rms_norm_rope_cache(z(6, 64), z(8), z(8), z(6, 8), z(6, 8), z(6, dtype=i64), z(6, 32),
                                             z(4, 16, 2, 8), z(4, 16, 2, 8), [2, 3, 8], [4, 2, 2]),
     "qkv_size must be"),
    (lambda: npu.npu_top_k_top_p_sample(z(2, 3, 10), _ints(2), z(2)), "logits must be 2-D"),
    (lambda: npu.npu_rotated_box_encode(z(2, 4, 7), z(2, 4, 7), z(5)), "anchor_box must be (B, 5, N)"),
    (lambda: npu.npu_ffn_worker_batching(z(8, dtype=i8), 4, [1, 2, 16]), "max_out_shape must have 4 elements"),
    (lambda: npu.npu_ffn_worker_batching(z(8, dtype=i8), 0, [1, 2, 3, 16]), "expert_num should be a positive"),
])
def test_meta_validation_errors(call, message):
    with FakeTensorMode(), pytest.raises(RuntimeError, match=message.replace("(", r"\(").replace(")", r"\)")):
        call()


def test_side_effecting_communication_ops_are_kept_by_fx():
    from torch.fx.node import _side_effectful_functions  # the set has_side_effect() fills
    assert torch.ops.npu.npu_attention_to_ffn.default in _side_effectful_functions
    assert torch.ops.npu.npu_ffn_to_attention.default in _side_effectful_functions


# ----------------------------------------------------------------- emulated: DIoU / GIoU backward

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


# ----------------------------------------------------------------- emulated: RoIAlign backward

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


# ----------------------------------------------------------------- emulated: top-k / top-p filtering

def _top_k_top_p_reference(logits, p, k):
    """Row by row in float64 from the documented formula; -inf marks a dropped logit."""
    out = torch.full(logits.shape, float("-inf"), dtype=torch.float64)
    for b, row in enumerate(logits.double().tolist()):
        vocab = len(row)
        keep = [True] * vocab
        if k is not None and 0 < int(k[b]) < vocab:
            threshold = sorted(row)[vocab - int(k[b])]
            keep = [v >= threshold for v in row]
        if p is not None:
            order = sorted(range(vocab), key=lambda i: row[i])           # ascending, stable
            kept = [row[i] for i in order if keep[i]]
            top = max(kept)
            norm = sum(math.exp(v - top) for v in kept)
            cumulative = 0.0
            for rank, i in enumerate(order):
                if keep[i]:
                    cumulative += math.exp(row[i] - top) / norm
                if rank < vocab - 1 and cumulative <= 1 - float(p[b]):
                    keep[i] = False
        for i in range(vocab):
            if keep[i]:
                out[b, i] = row[i]
    return out


@pytest.mark.parametrize("device", ["cpu", "npu"])
@pytest.mark.parametrize("dtype", [f32, f16, torch.bfloat16])
@pytest.mark.parametrize("use_p,use_k", [(True, True), (True, False), (False, True)])
def test_top_k_top_p_matches_formula(device, dtype, use_p, use_k):
    gen = torch.Generator().manual_seed(21)
    logits = (torch.randn(5, 40, generator=gen) * 2).to(dtype)
    p = torch.tensor([0.5, 0.9, 0.0, 1.0, 0.3]).to(dtype) if use_p else None
    # k = 0 and k >= vocab skip top-k for that row
    k = torch.tensor([3, 0, 40, 7, 55], dtype=i32) if use_k else None
    expected = _top_k_top_p_reference(logits, p, k)
    out = npu.npu_top_k_top_p(logits.to(device), None if p is None else p.to(device),
                              None if k is None else k.to(device))
    assert out.device.type == device and out.dtype == dtype and out.shape == logits.shape
    assert torch.equal(out.cpu().double().isinf(), expected.isinf())
    # kept logits are copied unchanged
    assert torch.equal(out.cpu().double()[~expected.isinf()], expected[~expected.isinf()])


def test_top_k_top_p_keeps_ties_at_the_threshold_and_the_largest():
    logits = torch.tensor([[1.0, 3.0, 2.0, 3.0, 0.5]])
    out = npu.npu_top_k_top_p(logits, None, torch.tensor([1], dtype=i32))
    assert out.tolist() == [[float("-inf"), 3.0, float("-inf"), 3.0, float("-inf")]]
    out = npu.npu_top_k_top_p(logits, torch.tensor([0.0]), None)       # p = 0: only the largest survives
    assert out.isfinite().sum() == 1 and out[0, 3] == 3.0                # stable sort: index 3 is last


def test_top_k_top_p_fake_and_errors():
    with FakeTensorMode():
        out = npu.npu_top_k_top_p(z(3, 10, dtype=torch.bfloat16), z(3, dtype=torch.bfloat16), _ints(3))
        assert (out.shape, out.dtype) == ((3, 10), torch.bfloat16)
    with pytest.raises(RuntimeError, match="p and k must not both be None"):
        npu.npu_top_k_top_p(z(2, 4))
    with pytest.raises(RuntimeError, match="p must have logits' dtype"):
        npu.npu_top_k_top_p(z(2, 4), z(2, dtype=f16), None)
    with pytest.raises(RuntimeError, match="k must be int32"):
        npu.npu_top_k_top_p(z(2, 4), None, z(2, dtype=i64))
    with pytest.raises(RuntimeError, match="logits must be 2-D"):
        npu.npu_top_k_top_p(z(2, 2, 4), None, _ints(2))


# ----------------------------------------------------------------- emulated: paged KV-cache gather

def _gather_reference(cache, block_tables, lens, offsets, nz):
    rows = []
    block_size = cache.size(2) if nz else cache.size(1)
    for b, n in enumerate(lens):
        for s in range(n):
            block = int(block_tables[b, offsets[b] // block_size + s // block_size])
            if nz:
                rows.append(cache[block, :, s % block_size, :].reshape(-1))
            else:
                rows.append(cache[block, s % block_size])
    return torch.stack(rows)


@pytest.mark.parametrize("device", ["cpu", "npu"])
@pytest.mark.parametrize("dtype", [f16, torch.bfloat16, i8])
@pytest.mark.parametrize("nz", [False, True])
@pytest.mark.parametrize("cumsum,with_offset", [(False, False), (True, False), (False, True)])
def test_gather_pa_kv_cache_matches_loop(device, dtype, nz, cumsum, with_offset):
    gen = torch.Generator().manual_seed(31)
    num_blocks, block_size, heads, dk, dv, a = 9, 4, 2, 8, 4, 4
    if nz:
        kc = torch.randint(-100, 100, (num_blocks, heads * dk // a, block_size, a), generator=gen).to(dtype)
        vc = torch.randint(-100, 100, (num_blocks, heads * dv // a, block_size, a), generator=gen).to(dtype)
    else:
        kc = torch.randint(-100, 100, (num_blocks, block_size, heads, dk), generator=gen).to(dtype)
        vc = torch.randint(-100, 100, (num_blocks, block_size, heads, dv), generator=gen).to(dtype)
    lens, offsets = [5, 0, 7], ([4, 0, 8] if with_offset else [0, 0, 0])
    tables = torch.tensor([[3, 1, 6, 0], [2, 2, 2, 2], [8, 5, 7, 4]], dtype=i32)
    seq_lens = torch.tensor([0, 5, 5, 12] if cumsum else lens, dtype=i32)
    rows = 14                                           # 12 gathered, the last 2 stay untouched
    kshape, vshape = ((rows, heads * dk), (rows, heads * dv)) if nz else ((rows, heads, dk), (rows, heads, dv))
    key, value = torch.full(kshape, 7).to(dtype), torch.full(vshape, 7).to(dtype)
    exp_k, exp_v = key.clone(), value.clone()
    exp_k[:12] = _gather_reference(kc, tables, lens, offsets, nz).reshape(exp_k[:12].shape)
    exp_v[:12] = _gather_reference(vc, tables, lens, offsets, nz).reshape(exp_v[:12].shape)
    offset = torch.tensor(offsets, dtype=i32).to(device) if with_offset else None
    args = [t.to(device) for t in (kc, vc, tables, seq_lens)]
    k_out, v_out = npu.npu_gather_pa_kv_cache_functional(*args, key.to(device), value.to(device), seq_offset=offset,
                                                         is_seq_lens_cumsum=cumsum)
    assert k_out.device.type == device and torch.equal(k_out.cpu(), exp_k) and torch.equal(v_out.cpu(), exp_v)
    key_d, value_d = key.to(device), value.to(device)
    assert npu.npu_gather_pa_kv_cache(*args, key_d, value_d, seq_offset=offset, is_seq_lens_cumsum=cumsum) is None
    assert torch.equal(key_d.cpu(), exp_k) and torch.equal(value_d.cpu(), exp_v)


def test_gather_pa_kv_cache_fake_and_errors():
    kc, vc, tables = z(4, 16, 2, 8), z(4, 16, 2, 4), z(2, 2, dtype=i32)
    with FakeTensorMode():
        k_out, v_out = npu.npu_gather_pa_kv_cache_functional(z(4, 16, 2, 8), z(4, 16, 2, 4), z(2, 2, dtype=i32),
                                                             _ints(2), z(10, 2, 8), z(10, 2, 4))
        assert (k_out.shape, v_out.shape) == ((10, 2, 8), (10, 2, 4))
    with pytest.raises(RuntimeError, match="hold 20 tokens"):
        npu.npu_gather_pa_kv_cache(kc, vc, tables, torch.tensor([10, 10], dtype=i32), z(10, 2, 8), z(10, 2, 4))
    with pytest.raises(RuntimeError, match="needs block_tables columns"):
        npu.npu_gather_pa_kv_cache(kc, vc, tables, torch.tensor([40, 0], dtype=i32), z(40, 2, 8), z(40, 2, 4))
    with pytest.raises(RuntimeError, match="block ids must be in"):
        npu.npu_gather_pa_kv_cache(kc, vc, torch.tensor([[9, 0], [0, 0]], dtype=i32), torch.tensor([3, 0], dtype=i32),
                                   z(4, 2, 8), z(4, 2, 4))
    with pytest.raises(RuntimeError, match=r"seq_lens must be \[batch \+ 1\]"):
        npu.npu_gather_pa_kv_cache(kc, vc, tables, torch.tensor([3, 0], dtype=i32), z(4, 2, 8), z(4, 2, 4),
                                   is_seq_lens_cumsum=True)
    with pytest.raises(RuntimeError, match="must end with the rows'"):
        npu.npu_gather_pa_kv_cache(kc, vc, tables, _ints(2), z(4, 3, 8), z(4, 2, 4))


# ----------------------------------------------------------------- emulated: K-cache scatter, list scatter

@pytest.mark.parametrize("device", ["cpu", "npu"])
@pytest.mark.parametrize("dtype", [f16, torch.bfloat16, i8])
def test_scatter_pa_cache_writes_each_token_at_its_slot(device, dtype):
    gen = torch.Generator().manual_seed(41)
    key = torch.randint(-50, 50, (5, 2, 3), generator=gen).to(dtype)
    cache = torch.zeros(4, 3, 2, 3, dtype=dtype)
    slots = torch.tensor([7, 0, 11, 4, 5], dtype=i32)
    expected = cache.clone()
    for t, s in enumerate(slots.tolist()):
        expected[s // 3, s % 3] = key[t]
    cache_d = cache.to(device)
    out = npu.npu_scatter_pa_cache(key.to(device), slots.to(device), key_cache=cache_d)
    assert out is cache_d and torch.equal(cache_d.cpu(), expected)


def test_scatter_pa_cache_errors_and_fake():
    with FakeTensorMode():
        cache = z(2, 4, 2, 4)
        assert npu.npu_scatter_pa_cache(z(3, 2, 4), _ints(3), key_cache=cache) is cache
    with pytest.raises(RuntimeError, match="slot_mapping values must be in"):
        npu.npu_scatter_pa_cache(z(2, 2, 4), torch.tensor([0, 8], dtype=i32), key_cache=z(2, 4, 2, 4))
    with pytest.raises(RuntimeError, match="key_cache must be"):
        npu.npu_scatter_pa_cache(z(2, 2, 4), _ints(2), key_cache=z(2, 4, 3, 4))
    with pytest.raises(NotImplementedError, match="compressed scenarios"):
        npu.npu_scatter_pa_cache(z(2, 3, 2, 4), z(2, 2, dtype=i32), seq_lens=_ints(2), key_cache=z(2, 4, 1, 4))


@pytest.mark.parametrize("device", ["cpu", "npu"])
@pytest.mark.parametrize("axis", [-2, -1])
def test_scatter_list_replaces_one_row_per_tensor(device, axis):
    gen = torch.Generator().manual_seed(51)
    tensors = [torch.randn(3, 6, 5, generator=gen).to(f16) for _ in range(4)]
    indices = torch.tensor([0, 5, 2, 4] if axis == -2 else [4, 0, 3, 1], dtype=i32)
    upd_shape = (4, 3, 1, 5) if axis == -2 else (4, 3, 6, 1)
    updates = torch.randn(upd_shape, generator=gen).to(f16)
    expected = [t.clone() for t in tensors]
    for i, t in enumerate(expected):          # the op-plugin test's loop
        for j in range(t.shape[0]):
            if axis == -2:
                t[j][int(indices[i])] = updates[i][j][0]
            else:
                for k in range(t.shape[1]):
                    t[j][k][int(indices[i])] = updates[i][j][k][0]
    mask = torch.ones(4, dtype=torch.uint8)
    outs = npu.npu_scatter_list([t.to(device) for t in tensors], indices.to(device), updates.to(device),
                                mask.to(device), "update", axis)
    assert all(o.device.type == device and torch.equal(o.cpu(), e) for o, e in zip(outs, expected))
    inplace = [t.to(device) for t in tensors]
    assert npu.npu_scatter_list_(inplace, indices.to(device), updates.to(device), None, "update", axis) is None
    assert all(torch.equal(o.cpu(), e) for o, e in zip(inplace, expected))


def test_scatter_list_errors_and_fake():
    with FakeTensorMode():
        outs = npu.npu_scatter_list([z(2, 3, 4, dtype=f16)] * 2, _ints(2), z(2, 2, 1, 4, dtype=f16))
        assert [(o.shape, o.dtype) for o in outs] == [((2, 3, 4), f16)] * 2
    tensors = [z(2, 3, 4), z(2, 3, 4)]
    with pytest.raises(NotImplementedError, match="mask with zero entries"):
        npu.npu_scatter_list(tensors, _ints(2), z(2, 2, 1, 4), torch.tensor([1, 0], dtype=torch.uint8))
    with pytest.raises(NotImplementedError, match="updates of 2 rows"):
        npu.npu_scatter_list(tensors, _ints(2), z(2, 2, 2, 4))
    with pytest.raises(RuntimeError, match="reduce must be 'update'"):
        npu.npu_scatter_list(tensors, _ints(2), z(2, 2, 1, 4), None, "add")
    with pytest.raises(RuntimeError, match="indices must be 1-D"):
        npu.npu_scatter_list(tensors, _ints(3), z(2, 2, 1, 4))


# ----------------------------------------------------------------- emulated: MLA kv RMSNorm + RoPE + cache

RMS, ROPE = 64, 32


def _kv_reference(kv, gamma, cos, sin, eps):
    """float64 golden: RMSNorm of the first RMS features, RoPE (pairs (2i, 2i+1) de-interleaved by
    a view/transpose, then k*cos + rotate_half(k)*sin) of the last ROPE features."""
    b, _, s, _ = kv.shape
    rms_in, rope_in = kv.double()[..., :RMS], kv.double()[..., RMS:]
    y = rms_in / torch.sqrt((rms_in ** 2).mean(-1, keepdim=True) + eps) * gamma.double()
    k = rope_in.view(b, 1, s, ROPE // 2, 2).transpose(4, 3).reshape(b, 1, s, ROPE)
    rotated = torch.cat((-k[..., ROPE // 2:], k[..., :ROPE // 2]), -1)
    return k * cos.double() + rotated * sin.double(), y


def _kv_inputs(dtype, b, s, seed=61):
    gen = torch.Generator().manual_seed(seed)
    kv = torch.randn(b, 1, s, RMS + ROPE, generator=gen).to(dtype)
    gamma = torch.rand(RMS, generator=gen).add(0.5).to(dtype)
    angle = torch.rand(b, 1, s, ROPE, generator=gen) * 6
    return kv, gamma, angle.cos().to(dtype), angle.sin().to(dtype)


def _expected_caches(k_rows, y_rows, index, mode, k_cache, ckv_cache, scales=None):
    """Applies the documented / golden cache update with plain loops."""
    k_cache, ckv_cache = k_cache.clone(), ckv_cache.clone()
    b, _, s, _ = k_rows.shape
    if scales is not None:
        k_rows = torch.round(k_rows * scales[0].double()).clamp(-128, 127)
        y_rows = torch.round(y_rows * scales[1].double()).clamp(-128, 127)
    for cache, rows in ((k_cache, k_rows), (ckv_cache, y_rows)):
        dim = rows.size(-1)
        for bi in range(b):
            for si in range(s):
                row = rows[bi, 0, si].to(cache.dtype)
                if mode == "Norm":
                    if index[bi, si] >= 0:
                        cache[bi, 0, int(index[bi, si])] = row
                    continue
                bs = cache.size(1)
                if "BLK" in mode:
                    per_batch = index.numel() // b
                    page_off = int(index[bi * per_batch + si // bs])
                    if page_off < 0:
                        continue
                    page, r = page_off // bs, si % bs
                else:
                    off = int(index[bi * s + si])
                    if off < 0:
                        continue
                    page, r = off // bs, off % bs
                if mode.endswith("NZ"):
                    d0 = 32 if scales is not None else 16
                    nz = cache.view(cache.size(0), dim // d0, bs, d0)
                    nz[page, :, r, :] = row.reshape(dim // d0, d0)
                else:
                    cache[page, r, 0] = row
    return k_cache, ckv_cache


def _kv_index(mode, b, s, bs):
    if mode == "Norm":
        return torch.tensor([[3, 0, -1], [1, 4, 2]])[:b, :s]
    if "BLK" in mode:
        pages = (s + bs - 1) // bs
        return torch.tensor([2, 0, 3, 1][:b * pages]) * bs
    return torch.tensor([9, 0, -1, 14, 5, 2])[:b * s]


@pytest.mark.parametrize("device", ["cpu", "npu"])
@pytest.mark.parametrize("dtype,tol", [(f16, 2e-3), (torch.bfloat16, 1.6e-2)])
@pytest.mark.parametrize("mode", ["Norm", "PA_BNSD", "PA_NZ", "PA_BLK_BNSD", "PA_BLK_NZ"])
def test_kv_rmsnorm_rope_cache_matches_golden(device, dtype, tol, mode):
    b, s, bs = 2, 3, 4
    kv, gamma, cos, sin = _kv_inputs(dtype, b, s)
    index = _kv_index(mode, b, s, bs)
    if mode == "Norm":
        k_cache, ckv_cache = torch.full((b, 1, 6, ROPE), 9.0).to(dtype), torch.full((b, 1, 6, RMS), 9.0).to(dtype)
    else:
        k_cache, ckv_cache = torch.full((5, bs, 1, ROPE), 9.0).to(dtype), torch.full((5, bs, 1, RMS), 9.0).to(dtype)
    k_ref, y_ref = _kv_reference(kv, gamma, cos, sin, 1e-5)
    exp_k, exp_ckv = _expected_caches(k_ref, y_ref, index, mode, k_cache, ckv_cache)
    kc, ckvc = k_cache.to(device), ckv_cache.to(device)
    out_k, out_ckv, k_rope, c_kv = npu.npu_kv_rmsnorm_rope_cache(
        kv.to(device), gamma.to(device), cos.to(device), sin.to(device), index.to(device), kc, ckvc,
        cache_mode=mode, is_output_kv=True)
    assert out_k is kc and out_ckv is ckvc                      # updated in place and returned
    assert k_rope.dtype == dtype and k_rope.shape == (b, 1, s, ROPE) and c_kv.shape == (b, 1, s, RMS)
    torch.testing.assert_close(k_rope.cpu().double(), k_ref, atol=tol * 8, rtol=tol * 2)
    torch.testing.assert_close(c_kv.cpu().double(), y_ref, atol=tol * 8, rtol=tol * 2)
    torch.testing.assert_close(kc.cpu().double(), exp_k.double(), atol=tol * 8, rtol=tol * 2)
    torch.testing.assert_close(ckvc.cpu().double(), exp_ckv.double(), atol=tol * 8, rtol=tol * 2)
    untouched = exp_k.double() == 9.0
    assert torch.equal(kc.cpu().double()[untouched], exp_k.double()[untouched])


@pytest.mark.parametrize("device", ["cpu", "npu"])
def test_kv_rmsnorm_rope_cache_v2_int8_nz_and_functional(device):
    b, s, bs = 2, 3, 4
    kv, gamma, cos, sin = _kv_inputs(f16, b, s, seed=62)
    index = _kv_index("PA_NZ", b, s, bs)
    k_scale, c_scale = torch.full((ROPE,), 20.0), torch.full((RMS,), 30.0)
    k_cache, ckv_cache = torch.zeros(5, bs, 1, ROPE, dtype=i8), torch.zeros(5, bs, 1, RMS, dtype=i8)
    k_ref, y_ref = _kv_reference(kv, gamma, cos, sin, 1e-5)
    exp_k, exp_ckv = _expected_caches(k_ref, y_ref, index, "PA_NZ", k_cache, ckv_cache, (k_scale, c_scale))
    kc, ckvc = k_cache.to(device), ckv_cache.to(device)
    args = [t.to(device) for t in (kv, gamma, cos, sin, index)]
    kw = dict(k_rope_scale=k_scale.to(device), c_kv_scale=c_scale.to(device), cache_mode="PA_NZ")
    k_rope, c_kv = npu.npu_kv_rmsnorm_rope_cache_v2(*args, kc, ckvc, **kw)
    # float32 vs float64 rounding may differ by one step at .5
    assert (kc.cpu().int() - exp_k.int()).abs().max() <= 1 and (ckvc.cpu().int() - exp_ckv.int()).abs().max() <= 1
    assert (kc.cpu() != exp_k).float().mean() < 0.05
    torch.testing.assert_close(c_kv.cpu().double(), y_ref, atol=2e-2, rtol=4e-3)
    k2, c2, k_out, ckv_out = npu.npu_kv_rmsnorm_rope_cache_v2_functional(*args, k_cache.to(device),
                                                                         ckv_cache.to(device), **kw)
    assert torch.equal(k_out.cpu(), kc.cpu()) and torch.equal(ckv_out.cpu(), ckvc.cpu())
    assert torch.equal(k2.cpu(), k_rope.cpu()) and torch.equal(c2.cpu(), c_kv.cpu())


def test_kv_rmsnorm_rope_cache_fake_and_errors():
    with FakeTensorMode():
        out = npu.npu_kv_rmsnorm_rope_cache(z(2, 1, 3, 576, dtype=f16), z(512, dtype=f16), z(2, 1, 3, 64, dtype=f16),
                                            z(2, 1, 3, 64, dtype=f16), z(6, dtype=i64), z(4, 16, 1, 64, dtype=f16),
                                            z(4, 16, 1, 512, dtype=f16), cache_mode="PA_BNSD")
        assert [tuple(t.shape) for t in out] == [(4, 16, 1, 64), (4, 16, 1, 512), (2, 1, 3, 64), (2, 1, 3, 512)]
        out = npu.npu_kv_rmsnorm_rope_cache_v2_functional(z(2, 1, 3, 96), z(64), z(2, 1, 3, 32), z(2, 1, 3, 32),
                                                          z(6, dtype=i64), z(4, 4, 1, 32), z(4, 4, 1, 64))
        assert [tuple(t.shape) for t in out] == [(2, 1, 3, 32), (2, 1, 3, 64), (4, 4, 1, 32), (4, 4, 1, 64)]
    kv, gamma, cos, sin = _kv_inputs(f16, 1, 2)
    caches = (torch.zeros(2, 4, 1, ROPE, dtype=f16), torch.zeros(2, 4, 1, RMS, dtype=f16))
    idx = torch.tensor([0, 1])
    with pytest.raises(NotImplementedError, match="the v input"):
        npu.npu_kv_rmsnorm_rope_cache_v2(kv, gamma, cos, sin, idx, *caches, cache_mode="PA", v=kv)
    with pytest.raises(NotImplementedError, match="k_rope_offset"):
        npu.npu_kv_rmsnorm_rope_cache_v2(kv, gamma, cos, sin, idx, *caches, cache_mode="PA", k_rope_offset=z(ROPE))
    with pytest.raises(RuntimeError, match="cache_mode must be one of"):
        npu.npu_kv_rmsnorm_rope_cache_v2(kv, gamma, cos, sin, idx, *caches, cache_mode="BSND")
    with pytest.raises(RuntimeError, match="quantised caches"):
        npu.npu_kv_rmsnorm_rope_cache_v2(kv, gamma, cos, sin, idx, *caches, cache_mode="PA", k_rope_scale=z(ROPE),
                                         c_kv_scale=z(RMS))
    with pytest.raises(RuntimeError, match="index points past block_num"):
        npu.npu_kv_rmsnorm_rope_cache_v2(kv, gamma, cos, sin, torch.tensor([0, 8]), *caches, cache_mode="PA")


def test_value_dependent_ops_compile_as_one_node():
    """The opaque ops (host reads of lengths / block ids / RoI boxes) trace through their fake
    kernels and run eagerly inside the compiled graph."""
    def gather(kc, vc, tables, lens, k, v):
        key, value = npu.npu_gather_pa_kv_cache_functional(kc, vc, tables, lens, k, v)
        return key * 2, value
    kc, vc = torch.randn(4, 4, 2, 8), torch.randn(4, 4, 2, 4)
    args = (kc, vc, torch.tensor([[1, 2], [3, 0]], dtype=i32), torch.tensor([5, 3], dtype=i32), z(8, 2, 8), z(8, 2, 4))
    compiled = torch.compile(gather, backend="aot_eager", fullgraph=True)
    assert all(torch.equal(a, b) for a, b in zip(compiled(*args), gather(*args)))
