"""torch_npu.contrib.module against independent references (plain torch on CPU), on CPU and npu."""
import math
import warnings

import pytest
import torch
import torch.nn.functional as TF

import torch_npu  # noqa: F401
import torch_npu.contrib as contrib
from torch_npu.contrib import module as M
from torch_npu.contrib.module import activations, bidirectional_lstm, focus, multihead_attention

DEVICES = ["cpu", "npu"]


def _leaf(t, device):
    return t.detach().to(device).requires_grad_()


# ---------------------------------------------------------------- ChannelShuffle

def _ref_shuffle(x1, x2, groups):
    x = torch.cat([x1, x2], 1)
    n, c, h, w = x.shape
    return x.view(n, groups, c // groups, h, w).transpose(1, 2).reshape(n, c, h, w)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("split_shuffle", [True, False])
@pytest.mark.parametrize("training", [True, False])
def test_channel_shuffle(device, split_shuffle, training):
    x1, x2 = torch.randn(2, 6, 3, 3), torch.randn(2, 6, 3, 3)
    m = contrib.ChannelShuffle(12, groups=2, split_shuffle=split_shuffle).train(training)
    a, b = _leaf(x1, device), _leaf(x2, device)
    out = m(a, b)
    ra, rb = _leaf(x1, "cpu"), _leaf(x2, "cpu")
    ref = _ref_shuffle(ra, rb, 2)
    if split_shuffle:
        ref = ref.chunk(2, 1)
        assert all(torch.equal(o.detach().cpu(), r.detach()) for o, r in zip(out, ref))
    else:
        assert torch.equal(out.detach().cpu(), ref.detach())
    if training:
        weights = [torch.randn(2, 6, 3, 3) for _ in range(2)] if split_shuffle else [torch.randn(2, 12, 3, 3)]
        outs = out if split_shuffle else (out,)
        refs = ref if split_shuffle else (ref,)
        sum((o * w.to(device)).sum() for o, w in zip(outs, weights)).backward()
        sum((r * w).sum() for r, w in zip(refs, weights)).backward()
        assert torch.equal(a.grad.cpu(), ra.grad) and torch.equal(b.grad.cpu(), rb.grad)


# ---------------------------------------------------------------- LabelSmoothingCrossEntropy

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("smooth", [0.0, 0.1])
def test_label_smoothing_cross_entropy(device, smooth):
    pred, target = torch.randn(8, 5), torch.randint(0, 5, (8,))
    loss = contrib.LabelSmoothingCrossEntropy(num_classes=5, smooth_factor=smooth)(pred.to(device), target.to(device))
    q = torch.full((8, 5), smooth / 4)
    q[torch.arange(8), target] = 1 - smooth
    ref = (-(q * torch.log_softmax(pred, 1)).sum(1)).mean()
    assert loss.dtype == torch.float32 and loss.device.type == device
    torch.testing.assert_close(loss.cpu(), ref, rtol=1e-5, atol=1e-6)
    if smooth == 0.0:
        torch.testing.assert_close(loss.cpu(), TF.cross_entropy(pred, target), rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------- ROIAlign

def _bilinear(img, y, x):
    """torchvision/detectron2 bilinear sample of img (C, H, W) at scalar (y, x)."""
    _, h, w = img.shape
    if y < -1.0 or y > h or x < -1.0 or x > w:
        return img.new_zeros(img.shape[0])
    y, x = max(y, 0.), max(x, 0.)
    y_lo, x_lo = int(y), int(x)
    if y_lo >= h - 1:
        y_lo = y_hi = h - 1
        y = float(y_lo)
    else:
        y_hi = y_lo + 1
    if x_lo >= w - 1:
        x_lo = x_hi = w - 1
        x = float(x_lo)
    else:
        x_hi = x_lo + 1
    ly, lx = y - y_lo, x - x_lo
    hy, hx = 1 - ly, 1 - lx
    return (hy * hx * img[:, y_lo, x_lo] + hy * lx * img[:, y_lo, x_hi]
            + ly * hx * img[:, y_hi, x_lo] + ly * lx * img[:, y_hi, x_hi])


def _ref_roi_align(feat, rois, out_hw, scale, ratio, aligned):
    outs = []
    ph, pw = out_hw
    for roi in rois.tolist():
        img = feat[int(roi[0])]
        off = 0.5 if aligned else 0.
        x1, y1, x2, y2 = (v * scale - off for v in roi[1:])
        rw, rh = max(x2 - x1, 1.), max(y2 - y1, 1.)
        bw, bh = rw / pw, rh / ph
        bins = []
        for i in range(ph):
            for j in range(pw):
                acc = 0
                for iy in range(ratio):
                    for ix in range(ratio):
                        acc = acc + _bilinear(img, y1 + i * bh + (iy + .5) * bh / ratio,
                                              x1 + j * bw + (ix + .5) * bw / ratio)
                bins.append(acc / (ratio * ratio))
        outs.append(torch.stack(bins, 1).reshape(-1, ph, pw))
    return torch.stack(outs)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("aligned", [True, False])
def test_roi_align(device, aligned):
    feat = torch.randn(2, 3, 8, 9)
    rois = torch.tensor([[0, 1.0, 2.0, 20.0, 18.0], [1, 4.0, 0.5, 30.0, 12.0], [0, 10.0, 10.0, 11.0, 11.5]])
    m = contrib.ROIAlign((2, 3), spatial_scale=0.5, sampling_ratio=2, aligned=aligned)
    ours = _leaf(feat, device)
    out = m(ours, rois.to(device))
    ref_in = _leaf(feat, "cpu")
    ref = _ref_roi_align(ref_in, rois, (2, 3), 0.5, 2, aligned)
    assert out.shape == (3, 3, 2, 3)
    torch.testing.assert_close(out.detach().cpu(), ref.detach(), rtol=1e-4, atol=1e-5)
    g = torch.randn_like(ref)
    out.backward(g.to(device))
    ref.backward(g)
    torch.testing.assert_close(ours.grad.cpu(), ref_in.grad, rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="rois.dim"):
        m(feat, rois[:, :4])
    assert "aligned=%s" % aligned in repr(m)


# ---------------------------------------------------------------- activations, BiLSTM, Focus

@pytest.mark.parametrize("device", DEVICES)
def test_mish_silu_swish(device):
    x = torch.randn(4, 7)
    with pytest.warns(FutureWarning, match="deprecated"):
        mish = activations.Mish()
    with pytest.warns(FutureWarning, match="deprecated"):
        silu = activations.SiLU()
    assert activations.Swish is activations.SiLU
    torch.testing.assert_close(mish(x.to(device)).cpu(), x * torch.tanh(torch.log1p(torch.exp(x))))
    torch.testing.assert_close(silu(x.to(device)).cpu(), x / (1 + torch.exp(-x)))


@pytest.mark.parametrize("device", DEVICES)
def test_bilstm_matches_bidirectional_lstm(device):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        m = bidirectional_lstm.BiLSTM(5, 4)
    ref = torch.nn.LSTM(5, 4, bidirectional=True)
    with torch.no_grad():
        for name in ("weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0"):
            getattr(ref, name).copy_(getattr(m.fw_rnn, name))
            getattr(ref, name + "_reverse").copy_(getattr(m.bw_rnn, name))
    x = torch.randn(6, 2, 5)
    out = m.to(device)(x.to(device))
    assert out.shape == (6, 2, 8)
    torch.testing.assert_close(out.detach().cpu(), ref(x)[0].detach(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_focus(device):
    torch.manual_seed(0)
    m = contrib.Focus(3, 8, k=3).to(device)
    x = torch.randn(2, 3, 6, 8)
    ours = _leaf(x, device)
    out = m(ours)
    ref_in = _leaf(x, "cpu")
    slices = [ref_in[..., ::2, ::2], ref_in[..., 1::2, ::2], ref_in[..., ::2, 1::2], ref_in[..., 1::2, 1::2]]
    for got, want in zip(focus.fast_slice(x.to(device)), slices):
        assert torch.equal(got.cpu(), want.detach())
    conv = m.conv
    w = conv.conv.weight.detach().cpu()
    y = TF.conv2d(torch.cat(slices, 1), w, padding=1)
    bn = conv.bn
    y = TF.batch_norm(y, None, None, bn.weight.detach().cpu(), bn.bias.detach().cpu(), training=True, eps=bn.eps)
    ref = TF.leaky_relu(y, 0.1)
    assert out.shape == (2, 8, 3, 4)
    torch.testing.assert_close(out.detach().cpu(), ref.detach(), rtol=1e-4, atol=1e-5)
    out.sum().backward()
    ref.sum().backward()
    torch.testing.assert_close(ours.grad.cpu(), ref_in.grad, rtol=1e-4, atol=1e-4)
    assert focus.autopad(3) == 1 and focus.autopad((3, 5)) == [1, 2] and focus.autopad(3, 0) == 0


# ---------------------------------------------------------------- dropouts

class _Wrapper(torch.nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        return self.inner(x)


def test_cached_dropout_uses_pregenerated_masks():
    M.NpuCachedDropout.task_dict.clear()
    assert M.NpuFairseqDropout is M.NpuCachedDropout
    p = 0.3
    model = _Wrapper(M.NpuCachedDropout(p))
    M.NpuCachedDropout.enable_dropout_ensemble(model)
    x = torch.randn(64, 64).npu()
    first = model(x)  # no mask queued yet: input unchanged, request recorded; the hook queues one
    assert torch.equal(first.cpu(), x.cpu())
    second = model(x).cpu()
    kept = second != 0
    torch.testing.assert_close(second[kept], x.cpu()[kept] / (1 - p))
    assert abs((1 - kept.float().mean().item()) - p) < 0.05
    # a [shape, dtype, device] request returns the mask itself once queued
    mask = model.inner([x.shape, x.dtype, x.device])
    assert isinstance(mask, torch.Tensor) and mask.dtype == torch.uint8
    assert M.NpuCachedDropout(0.0)(x) is x
    with pytest.raises(RuntimeError, match="input type error"):
        M.NpuCachedDropout(0.5)(3)
    M.NpuCachedDropout.task_dict.clear()


def test_drop_path():
    M.NpuDropPath.task_dict.clear()
    drop = M.NpuDropPath(0.5)
    model = _Wrapper(drop)
    M.NpuDropPath.enable_droppath_ensemble(model)
    x = torch.randn(400, 3, 2).npu() + 5
    assert torch.equal(model(x).cpu(), x.cpu())  # first call records the shape
    torch.manual_seed(0)
    out = model(x).cpu()
    per_sample_kept = (out != 0).flatten(1)
    assert torch.all(per_sample_kept.all(1) | (~per_sample_kept).all(1))  # whole samples dropped
    kept = per_sample_kept.all(1)
    torch.testing.assert_close(out[kept], x.cpu()[kept] / 0.5)
    assert 0.35 < kept.float().mean().item() < 0.65
    assert torch.equal(drop.eval()(x).cpu(), x.cpu())
    assert M.NpuDropPath(0.)(x) is x
    M.NpuDropPath.task_dict.clear()


@pytest.mark.parametrize("device", DEVICES)
def test_dropout_with_byte_mask_module(device):
    torch.manual_seed(0)
    m = M.DropoutWithByteMask(p=0.2)
    x = torch.randn(100, 100).to(device)
    out = m(x).cpu()
    kept = out != 0
    torch.testing.assert_close(out[kept], x.cpu()[kept] / 0.8)
    assert abs((1 - kept.float().mean().item()) - 0.2) < 0.03
    assert torch.equal(m.eval()(x).cpu(), x.cpu())
    with pytest.raises(ValueError, match="between 0 and 1"):
        M.DropoutWithByteMask(p=-0.1)


# ---------------------------------------------------------------- Prefetcher

def test_prefetcher():
    batches = [(torch.randn(2, 3), torch.tensor([i, i + 1])) for i in range(3)]
    pre = contrib.Prefetcher(batches)
    for x, y in batches:
        got_x, got_y = pre.next()
        assert got_x.device.type == "npu" and got_y.device.type == "npu"
        assert torch.equal(got_x.cpu(), x) and torch.equal(got_y.cpu(), y)
    assert pre.next() == (None, None)


# ---------------------------------------------------------------- quantised linears

def _pow2_scales(n, seed):
    g = torch.Generator().manual_seed(seed)
    return 2.0 ** -torch.randint(3, 8, (n,), generator=g).float()  # exact after fp19 packing


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cls", [M.LinearQuant, M.LinearA8W8Quant])
def test_linear_quant_dequant_output(device, cls):
    g = torch.Generator().manual_seed(0)
    x = torch.randint(-5, 5, (3, 16), generator=g, dtype=torch.int8)
    w = torch.randint(-5, 5, (8, 16), generator=g, dtype=torch.int8)
    bias = torch.randint(-20, 20, (8,), generator=g, dtype=torch.int32)
    scale = _pow2_scales(8, 1)
    m = cls(16, 8, bias=True, output_dtype=torch.float16)
    m.weight.data, m.scale.data, m.bias.data = w, scale, bias
    out = m.to(device)(x.to(device))
    ref = ((x.long() @ w.long().t() + bias.long()).float() * scale).half()
    assert out.dtype == torch.float16 and out.device.type == device
    assert torch.equal(out.cpu(), ref)


def test_linear_quant_int8_output_and_dtype_check():
    g = torch.Generator().manual_seed(2)
    x = torch.randint(-4, 4, (2, 16), generator=g, dtype=torch.int8)
    w = torch.randint(-4, 4, (4, 16), generator=g, dtype=torch.int8)
    m = M.LinearQuant(16, 4, bias=False)
    m.weight.data, m.scale.data = w, _pow2_scales(4, 3)
    ref = torch.round((x.long() @ w.long().t()).float() * m.scale.data).clamp(-128, 127).to(torch.int8)
    assert torch.equal(m(x), ref)
    with pytest.raises(ValueError, match="both torch.int32 or both torch.int8"):
        m(x.float())


@pytest.mark.parametrize("device", DEVICES)
def test_linear_weight_quant(device):
    g = torch.Generator().manual_seed(4)
    # float16 activations (the op's documented input dtypes)
    x = torch.randn(5, 16, generator=g).half()
    w = torch.randint(-8, 8, (6, 16), generator=g, dtype=torch.int8)
    scale = (torch.rand(6, generator=g) + 0.5).half()
    offset = torch.randn(6, generator=g).half()
    bias = torch.randn(6, generator=g).half()
    m = M.LinearWeightQuant(16, 6, bias=True, antiquant_offset=True)
    m.weight.data, m.antiquant_scale.data, m.antiquant_offset.data, m.bias.data = w, scale, offset, bias
    out = m.to(device)(x.to(device))
    dequant = (w.float() + offset.float()[:, None]) * scale.float()[:, None]
    ref = x.float() @ dequant.t() + bias.float()
    assert out.dtype == torch.float16
    torch.testing.assert_close(out.cpu().float(), ref, rtol=2e-3, atol=2e-2)


# ---------------------------------------------------------------- MultiheadAttention

def test_multihead_attention_fused_path():
    torch.manual_seed(0)
    bsz, tgt, src, embed, heads = 2, 16, 32, 256, 16  # lengths/heads/dim multiples of 16
    m = contrib.MultiheadAttention(embed, heads, dropout=0.0, self_attention=False)
    q, k, v = (torch.randn(bsz * n, embed) for n in (tgt, src, src))
    mask = torch.zeros(bsz, 1, tgt, src)
    mask[..., -3:] = -10000.
    assert m(q, k, v, bsz, tgt, src, key_padding_mask=mask) == (None, None)  # unfused path is left out
    multihead_attention.MHAConfig.set_fussion()
    try:
        out, weights = m.npu()(q.npu(), k.npu(), v.npu(), bsz, tgt, src, key_padding_mask=mask.npu())
    finally:
        multihead_attention.MHAConfig.use_fussion_mha = False
    assert weights is None
    p = {n: t.detach().cpu() for n, t in m.named_parameters()}

    def heads_of(t, n):
        return t.view(bsz, n, heads, embed // heads).transpose(1, 2)
    qh = heads_of(q @ p["q_proj.weight"].t() + p["q_proj.bias"], tgt) * (embed // heads) ** -0.5
    kh = heads_of(k @ p["k_proj.weight"].t() + p["k_proj.bias"], src)
    vh = heads_of(v @ p["v_proj.weight"].t() + p["v_proj.bias"], src)
    ctx = torch.softmax(qh @ kh.transpose(-1, -2) + mask, -1) @ vh
    ctx = ctx.transpose(1, 2).reshape(bsz * tgt, embed)
    ref = ctx @ p["out_proj.weight"].t() + p["out_proj.bias"]
    torch.testing.assert_close(out.detach().cpu(), ref, rtol=1e-4, atol=1e-5)


def test_multihead_attention_helpers():
    m = contrib.MultiheadAttention(16, 2)
    assert m.head_dim == 8 and math.isclose(m.scaling, 8 ** -0.5)
    with pytest.raises(ValueError, match="divisible"):
        contrib.MultiheadAttention(10, 3)
    a, b = torch.randn(2, 3, 4), torch.randn(2, 5, 4)
    torch.testing.assert_close(multihead_attention.Matmul_transpose(a, b), a @ b.transpose(-1, -2))
    packed_w, packed_b = torch.randn(48, 16), torch.randn(48)
    state = {"attn.in_proj_weight": packed_w, "attn.in_proj_bias": packed_b}
    m.upgrade_state_dict_named(state, "attn")
    assert set(state) == {"attn.%s_proj.%s" % (x, y) for x in "qkv" for y in ("weight", "bias")}
    assert torch.equal(state["attn.k_proj.weight"], packed_w[16:32])
    assert torch.equal(state["attn.v_proj.bias"], packed_b[32:])
    assert m.apply_sparse_mask("w", 1, 1, 1) == "w"


# ---------------------------------------------------------------- modules over ops emulated in later rounds

def test_psroipool_checks_its_arguments():
    # PSROIPool runs since npu_ps_roi_pooling is emulated: tests/test_ops_detection_rotated_grid_psroi.py checks its forward.
    with pytest.raises(ValueError, match="pooled_height == pooled_width == group_size"):
        contrib.PSROIPool(7, 6, 1 / 16., 7, 22)
    # QuantConv2d runs since npu_quant_conv2d is emulated: tests/test_ops_quant_matmul_gelu_conv2d.py checks its forward.


def _ref_modulated_deform_conv(x, offset, mask, weight, bias, stride, padding, dilation, dg):
    """DCNv2 in float64 with mmcv's layout: offset channel 2*(g*K + k) is dy, 2*(g*K + k) + 1 is dx for
    tap k = i*kw + j; mask [N, dg*K, Ho, Wo] multiplies each sample. Sampling by F.grid_sample
    (bilinear, zeros outside), the taps contracted with the weight by einsum (groups=1)."""
    n, c, h, w = x.shape
    cout, _, kh, kw = weight.shape
    ho, wo = offset.shape[2:]
    k = kh * kw
    off = offset.view(n, dg, k, 2, ho, wo)
    tap_i = torch.arange(kh, dtype=x.dtype).repeat_interleave(kw).view(1, 1, k, 1, 1)
    tap_j = torch.arange(kw, dtype=x.dtype).repeat(kh).view(1, 1, k, 1, 1)
    y = (torch.arange(ho, dtype=x.dtype) * stride - padding).view(1, 1, 1, ho, 1) + tap_i * dilation + off[:, :, :, 0]
    xx = (torch.arange(wo, dtype=x.dtype) * stride - padding).view(1, 1, 1, 1, wo) + tap_j * dilation + off[:, :, :, 1]
    grid = torch.stack([(2 * xx + 1) / w - 1, (2 * y + 1) / h - 1], -1)  # align_corners=False pixel centres
    sampled = TF.grid_sample(x.reshape(n * dg, c // dg, h, w), grid.view(n * dg, k * ho, wo, 2),
                             mode="bilinear", padding_mode="zeros", align_corners=False)
    sampled = sampled.view(n, dg, c // dg, k, ho, wo) * mask.view(n, dg, 1, k, ho, wo)
    out = torch.einsum("ngckhw,ogck->nohw", sampled, weight.reshape(cout, dg, c // dg, k))
    return out + bias.view(1, -1, 1, 1)


@pytest.mark.parametrize("device", DEVICES)
def test_modulated_deform_conv_unpacked_forward_backward(device):
    torch.manual_seed(0)
    dcn = contrib.ModulatedDeformConv(4, 3, 3, stride=1, padding=1, deformable_groups=2, pack=False)
    with torch.no_grad():
        dcn.bias.uniform_(-1, 1)
    x = torch.randn(2, 4, 5, 6)
    offset = torch.rand(2, 2 * 2 * 9, 5, 6) * 5 - 2.5
    mask = torch.rand(2, 2 * 9, 5, 6)
    r = torch.randn(2, 3, 5, 6)
    leaves = [_leaf(t, device) for t in (x, offset, mask)]
    dcn = dcn.to(device)
    out = dcn(tuple(leaves))
    (out * r.to(device)).sum().backward()
    ref_leaves = [t.double().requires_grad_() for t in (x, offset, mask, dcn.weight.detach().cpu(),
                                                          dcn.bias.detach().cpu())]
    ref = _ref_modulated_deform_conv(*ref_leaves, stride=1, padding=1, dilation=1, dg=2)
    (ref * r.double()).sum().backward()
    assert out.device.type == device and out.dtype == torch.float32
    torch.testing.assert_close(out.detach().cpu().double(), ref.detach(), rtol=1e-4, atol=1e-4)
    got = [t.grad for t in leaves] + [dcn.weight.grad, dcn.bias.grad]
    for name, g, e in zip(("x", "offset", "mask", "weight", "bias"), got, ref_leaves):
        torch.testing.assert_close(g.cpu().double(), e.grad, rtol=1e-4, atol=1e-4,
                                   msg=lambda m: "grad %s: %s" % (name, m))


@pytest.mark.parametrize("device", DEVICES)
def test_modulated_deform_conv_packed_starts_as_half_a_conv(device):
    torch.manual_seed(1)
    dcn = contrib.ModulatedDeformConv(4, 6, 3, stride=2, padding=1)
    bound = 1 / math.sqrt(4 * 9)
    assert dcn.weight.abs().max() <= bound and torch.all(dcn.bias == 0)
    assert torch.all(dcn.conv_offset.weight == 0) and dcn.conv_offset.out_channels == 27
    with torch.no_grad():
        dcn.bias.uniform_(-1, 1)
    x = torch.randn(2, 4, 7, 6)
    # zero-initialised conv_offset: offsets 0 and mask sigmoid(0) = 0.5, so out = 0.5 * conv + bias
    expected = 0.5 * TF.conv2d(x, dcn.weight.detach(), stride=2, padding=1) + dcn.bias.detach().view(1, -1, 1, 1)
    dcn = dcn.to(device)
    xd = _leaf(x, device)
    out = dcn(xd)
    torch.testing.assert_close(out.detach().cpu(), expected, rtol=1e-5, atol=1e-5)
    out.sum().backward()
    # the offset branch gets a gradient through the op's offset/mask gradient
    assert dcn.conv_offset.weight.grad is not None and dcn.conv_offset.weight.grad.abs().sum() > 0
    assert xd.grad is not None and xd.grad.shape == xd.shape


def test_lazy_exports():
    assert sorted(contrib.__all__) == sorted([
        "npu_multiclass_nms", "npu_batched_multiclass_nms", "npu_single_level_responsible_flags",
        "npu_fast_condition_index_put", "npu_bbox_coder_encode_yolo", "npu_bbox_coder_encode_xyxy2xywh",
        "npu_bbox_coder_decode_xywh2xyxy", "fuse_add_softmax_dropout", "roll", "matmul_transpose",
        "npu_fused_attention_with_layernorm", "npu_fused_attention", "ChannelShuffle", "Prefetcher",
        "LabelSmoothingCrossEntropy", "ROIAlign", "ModulatedDeformConv", "PSROIPool", "NpuFairseqDropout",
        "NpuCachedDropout", "MultiheadAttention", "NpuDropPath", "Focus", "LinearA8W8Quant", "LinearQuant",
        "LinearWeightQuant"])
    assert contrib.ROIAlign is M.ROIAlign and contrib.roll is contrib.function.roll
    with pytest.raises(AttributeError):
        contrib.no_such_name  # noqa: B018
