"""Round-8 attention ops: emulated ones against float64 references written here from the
documented formulas; meta-only ones through FakeTensorMode (shapes/dtypes from the docs) and
the NotImplementedError of a real call."""
import math

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import torch_npu  # noqa: F401
from torch_npu.op_plugin._registry import not_emulated_message

ops = torch.ops.npu
DEVICES = ["cpu", "npu"]
LOW = [(torch.float16, 2e-3, 2e-3), (torch.bfloat16, 2e-2, 2e-2)]


def _close(actual, expected, atol, rtol):
    torch.testing.assert_close(actual.detach().cpu().double(), expected.double(), atol=atol, rtol=rtol)


# ------------------------------------------------------------------ npu_interleave_rope

def _rope_ref(x, cos, sin):
    x, cos, sin = x.double(), cos.double(), sin.double()
    b, n, s, d = x.shape
    out = torch.empty(b, n, s, d, dtype=torch.float64)
    half = d // 2
    for bi in range(b):
        for ni in range(n):
            for si in range(s):
                c = cos[bi, 0, si if cos.shape[2] > 1 else 0]
                sn = sin[bi, 0, si if sin.shape[2] > 1 else 0]
                q = [x[bi, ni, si, 2 * j] for j in range(half)] + [x[bi, ni, si, 2 * j + 1] for j in range(half)]
                for j in range(d):
                    rot = -q[j + half] if j < half else q[j - half]
                    out[bi, ni, si, j] = q[j] * c[j] + rot * sn[j]
    return out


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("s_cos", [1, 3])
def test_interleave_rope_float32(device, s_cos):
    torch.manual_seed(0)
    x = torch.randn(2, 2, 3, 8)
    cos, sin = torch.randn(2, 1, s_cos, 8), torch.randn(2, 1, s_cos, 8)
    out = torch_npu.npu_interleave_rope(x.to(device), cos.to(device), sin.to(device))
    assert out.device.type == device and out.shape == x.shape and out.dtype == x.dtype
    _close(out, _rope_ref(x, cos, sin), 1e-5, 1e-5)


@pytest.mark.parametrize("dtype,atol,rtol", LOW)
def test_interleave_rope_low_precision(dtype, atol, rtol):
    torch.manual_seed(1)
    x, cos, sin = (torch.randn(2, 2, 1, 64).to(dtype), torch.randn(2, 1, 1, 64).to(dtype),
                   torch.randn(2, 1, 1, 64).to(dtype))
    out = torch_npu.npu_interleave_rope(x.npu(), cos.npu(), sin.npu())
    assert out.dtype == dtype
    _close(out, _rope_ref(x, cos, sin), atol * 8, rtol)


def test_interleave_rope_errors_and_fake():
    with pytest.raises(RuntimeError, match="cos/sin must be"):
        torch_npu.npu_interleave_rope(torch.randn(1, 2, 3, 8), torch.randn(1, 2, 3, 8), torch.randn(1, 2, 3, 8))
    with FakeTensorMode():
        out = ops.npu_interleave_rope(torch.randn(3, 4, 5, 64, dtype=torch.bfloat16),
                                      torch.randn(3, 1, 5, 64, dtype=torch.bfloat16),
                                      torch.randn(3, 1, 5, 64, dtype=torch.bfloat16))
    assert out.shape == (3, 4, 5, 64) and out.dtype == torch.bfloat16


# ------------------------------------------------------------------ npu_masked_softmax_with_rel_pos_bias

def _mswrpb_ref(x5, mask3, bias3, scale):
    b, w, n, s1, s2 = x5.shape
    out = torch.empty(b, w, n, s1, s2, dtype=torch.float64)
    for bi in range(b):
        for wi in range(w):
            for ni in range(n):
                y = scale * x5[bi, wi, ni].double() + bias3[ni].double()
                if mask3 is not None:
                    y = y + mask3[wi].double()
                e = torch.exp(y - y.max(-1, keepdim=True).values)
                out[bi, wi, ni] = e / e.sum(-1, keepdim=True)
    return out


@pytest.mark.parametrize("device", DEVICES)
def test_masked_softmax_rel_pos_bias_4d_and_5d(device):
    torch.manual_seed(2)
    b, w, n, s1, s2 = 2, 3, 2, 4, 5
    x5 = torch.randn(b, w, n, s1, s2)
    mask3 = torch.randn(w, s1, s2)
    bias3 = torch.randn(n, s1, s2)
    ref = _mswrpb_ref(x5, mask3, bias3, 0.7)
    out5 = torch_npu.npu_masked_softmax_with_rel_pos_bias(x5.to(device), mask3.unsqueeze(0).unsqueeze(2).to(device),
                                                          bias3.reshape(1, 1, n, s1, s2).to(device), 0.7)
    _close(out5, ref, 1e-5, 1e-5)
    out4 = torch_npu.npu_masked_softmax_with_rel_pos_bias(x5.reshape(b * w, n, s1, s2).to(device), mask3.to(device),
                                                          bias3.unsqueeze(0).to(device), 0.7)
    assert out4.shape == (b * w, n, s1, s2)
    _close(out4, ref.reshape(b * w, n, s1, s2), 1e-5, 1e-5)
    no_mask = torch_npu.npu_masked_softmax_with_rel_pos_bias(x5.to(device), None, bias3.to(device), 0.7)
    _close(no_mask, _mswrpb_ref(x5, None, bias3, 0.7), 1e-5, 1e-5)


@pytest.mark.parametrize("dtype,atol,rtol", LOW)
def test_masked_softmax_rel_pos_bias_low_precision(dtype, atol, rtol):
    torch.manual_seed(3)
    x5, mask3, bias3 = torch.randn(1, 2, 2, 3, 8), torch.randn(2, 3, 8), torch.randn(2, 3, 8)
    out = torch_npu.npu_masked_softmax_with_rel_pos_bias(x5.to(dtype), mask3.to(dtype), bias3.to(dtype))
    assert out.dtype == dtype
    _close(out, _mswrpb_ref(x5.to(dtype), mask3.to(dtype), bias3.to(dtype), 1.0), atol, rtol)


def test_masked_softmax_rel_pos_bias_errors_and_fake():
    with pytest.raises(RuntimeError, match="multiple of W"):
        torch_npu.npu_masked_softmax_with_rel_pos_bias(torch.randn(5, 2, 3, 4), torch.randn(2, 3, 4),
                                                       torch.randn(2, 3, 4))
    with pytest.raises(RuntimeError, match="relative_pos_bias must hold"):
        torch_npu.npu_masked_softmax_with_rel_pos_bias(torch.randn(4, 2, 3, 4), None, torch.randn(3, 3, 4))
    with FakeTensorMode():
        out = ops.npu_masked_softmax_with_rel_pos_bias(torch.randn(96, 2, 2, 32, 32), torch.randn(1, 2, 1, 32, 32),
                                                       torch.randn(1, 1, 2, 32, 32))
    assert out.shape == (96, 2, 2, 32, 32) and out.dtype == torch.float32


# ------------------------------------------------------------------ npu_attention_update

def _update_ref(lses, outs):
    n, h = outs[0].shape
    out = torch.zeros(n, h, dtype=torch.float64)
    lse = torch.zeros(n, dtype=torch.float64)
    for r in range(n):
        vals = [float(l[r]) for l in lses]
        top = max(vals)
        lse[r] = top + math.log(sum(math.exp(v - top) for v in vals))
        for l_i, o_i in zip(vals, outs):
            out[r] += o_i[r].double() * math.exp(l_i - lse[r])
    return out, lse


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype,atol", [(torch.float32, 1e-5), (torch.float16, 2e-3), (torch.bfloat16, 2e-2)])
def test_attention_update(device, dtype, atol):
    torch.manual_seed(4)
    lses = [torch.randn(6) * 3 for _ in range(3)]
    outs = [torch.randn(6, 16).to(dtype) for _ in range(3)]
    ref_out, ref_lse = _update_ref(lses, outs)
    for update_type in (0, 1):
        out, lse = torch_npu.npu_attention_update([l.to(device) for l in lses], [o.to(device) for o in outs],
                                                  update_type)
        assert out.dtype == dtype and lse.dtype == torch.float32 and out.device.type == device
        _close(out, ref_out, atol, atol)
        _close(lse, ref_lse, 1e-5, 1e-5)


def test_attention_update_errors_and_fake():
    with pytest.raises(RuntimeError, match="update_type"):
        torch_npu.npu_attention_update([torch.randn(2)], [torch.randn(2, 8)], 2)
    with pytest.raises(RuntimeError, match="lse\\[0\\] must be float32"):
        torch_npu.npu_attention_update([torch.randn(2).half()], [torch.randn(2, 8)], 0)
    with FakeTensorMode():
        out, lse = ops.npu_attention_update([torch.randn(5), torch.randn(5)],
                                            [torch.randn(5, 32).bfloat16(), torch.randn(5, 32).bfloat16()], 1)
    assert out.shape == (5, 32) and out.dtype == torch.bfloat16 and lse.shape == (5,) and lse.dtype == torch.float32


# ------------------------------------------------------------------ npu_attn_softmax_ / _backward_

@pytest.mark.parametrize("device", DEVICES)
def test_attn_softmax_inplace_and_backward(device):
    torch.manual_seed(5)
    logits, grad_out, values = torch.randn(2, 4, 6), torch.randn(2, 4, 3), torch.randn(2, 6, 3)
    ref_x = logits.double().requires_grad_(True)
    ref_p = torch.softmax(ref_x, -1)
    torch.matmul(ref_p, values.double()).backward(grad_out.double())
    t = logits.clone().to(device)
    same = torch_npu.npu_attn_softmax_(t)
    assert same is t
    _close(t, ref_p.detach(), 1e-6, 1e-6)
    same = torch_npu.npu_attn_softmax_backward_(t, grad_out.to(device), values.to(device))
    assert same is t
    _close(t, ref_x.grad, 1e-5, 1e-5)


def test_attn_softmax_low_precision_and_fake():
    x = torch.randn(3, 5).half()
    ref = torch.softmax(x.double(), -1)
    torch_npu.npu_attn_softmax_(x)
    _close(x, ref, 1e-3, 1e-3)
    with FakeTensorMode():
        y = torch.randn(2, 7, 9)
        assert ops.npu_attn_softmax_(y) is y
        assert ops.npu_attn_softmax_backward_(y, torch.randn(2, 7, 4), torch.randn(2, 9, 4)).shape == (2, 7, 9)
    with pytest.raises(RuntimeError, match="values dim -2"):
        torch_npu.npu_attn_softmax_backward_(torch.randn(2, 3, 4), torch.randn(2, 3, 5), torch.randn(2, 5, 5))


# ------------------------------------------------------------------ npu_masked_causal_conv1d_backward

def _conv_grads_ref(g, x, w, mask):
    s, b, h = x.shape
    width = w.shape[0]
    g = g.double().clone()
    if mask is not None:
        for bi in range(b):
            for si in range(s):
                if not mask[bi, si]:
                    g[si, bi] = 0
    gx = torch.zeros(s, b, h, dtype=torch.float64)
    gw = torch.zeros(width, h, dtype=torch.float64)
    for si in range(s):
        for k in range(width):
            src = si - (width - 1 - k)
            if src >= 0:
                gx[src] += w[k].double() * g[si]
                gw[k] += (g[si] * x[src].double()).sum(0)
    return gx, gw


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("with_mask", [False, True])
def test_masked_causal_conv1d_backward(device, with_mask):
    torch.manual_seed(6)
    x, w, g = torch.randn(7, 2, 4), torch.randn(3, 4), torch.randn(7, 2, 4)
    mask = (torch.rand(2, 7) > 0.3) if with_mask else None
    gx, gw = torch_npu.npu_masked_causal_conv1d_backward(g.to(device), x.to(device), w.to(device),
                                                        mask=None if mask is None else mask.to(device))
    rx, rw = _conv_grads_ref(g, x, w, mask)
    _close(gx, rx, 1e-5, 1e-5)
    _close(gw, rw, 1e-5, 1e-5)


@pytest.mark.parametrize("dtype,atol,rtol", LOW)
def test_masked_causal_conv1d_backward_low_precision_matches_forward_autograd(dtype, atol, rtol):
    torch.manual_seed(7)
    x, w, g = torch.randn(9, 2, 8).to(dtype), torch.randn(3, 8).to(dtype), torch.randn(9, 2, 8).to(dtype)
    gx, gw = torch_npu.npu_masked_causal_conv1d_backward(g, x, w)
    assert gx.dtype == dtype and gw.dtype == dtype
    rx, rw = _conv_grads_ref(g, x, w, None)
    _close(gx, rx, atol * 4, rtol)
    _close(gw, rw, atol * 20, rtol * 2)


def test_masked_causal_conv1d_backward_fake_and_errors():
    with FakeTensorMode():
        gx, gw = ops.npu_masked_causal_conv1d_backward(torch.randn(5, 2, 4).half(), torch.randn(5, 2, 4).half(),
                                                       torch.randn(3, 4).half())
    assert gx.shape == (5, 2, 4) and gw.shape == (3, 4) and gx.dtype == torch.float16
    with pytest.raises(RuntimeError, match="grad_output shape"):
        torch_npu.npu_masked_causal_conv1d_backward(torch.randn(4, 2, 4), torch.randn(5, 2, 4), torch.randn(3, 4))


# ------------------------------------------------------------------ npu_nsa_compress / _grad

def _compress_ref(inp, w, block, stride, cum):
    rows, prev = [], 0
    for end in cum:
        length = end - prev
        i = 0
        while length >= block and i * stride + block <= length:
            start = prev + i * stride
            acc = torch.zeros(inp.shape[1], inp.shape[2], dtype=torch.float64)
            for j in range(block):
                acc += inp[start + j].double() * w[j].double().unsqueeze(-1)
            rows.append(acc)
            i += 1
        prev = end
    return torch.stack(rows)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype,atol", [(torch.float16, 2e-2), (torch.bfloat16, 1.5e-1)])
def test_nsa_compress(device, dtype, atol):
    torch.manual_seed(8)
    cum, block, stride = [20, 20, 70], 32, 16     # batch 1 (20 < 32) has no window, batch 2 has 50 -> 2
    inp, w = torch.randn(70, 2, 16).to(dtype), torch.randn(block, 2).to(dtype)
    out = torch_npu.npu_nsa_compress(inp.to(device), w.to(device), block, stride, actual_seq_len=cum)
    ref = _compress_ref(inp, w, block, stride, cum)
    assert out.shape == (2, 2, 16) and out.dtype == dtype
    _close(out, ref, atol, 1e-2)


def test_nsa_compress_grad_matches_loop_adjoint_and_gradcheck():
    torch.manual_seed(9)
    cum, block, stride = [40, 72], 16, 16
    inp, w = torch.randn(72, 2, 16, dtype=torch.float64), torch.randn(block, 2, dtype=torch.float64)
    out = torch_npu.npu_nsa_compress(inp, w, block, stride, actual_seq_len=cum)
    g = torch.randn_like(out)
    gi, gw = torch_npu.npu_nsa_compress_grad(g, inp, w, block, stride, actual_seq_len=cum)
    # adjoint by loops: <compress(inp, w), g> differentiated by hand
    ri, rw = torch.zeros_like(inp), torch.zeros_like(w)
    r, prev = 0, 0
    for end in cum:
        length, i = end - prev, 0
        while i * stride + block <= length:
            start = prev + i * stride
            for j in range(block):
                ri[start + j] += w[j].unsqueeze(-1) * g[r]
                rw[j] += (inp[start + j] * g[r]).sum(-1)
            i, r = i + 1, r + 1
        prev = end
    _close(gi, ri, 1e-10, 1e-10)
    _close(gw, rw, 1e-10, 1e-10)
    inp_small, w_small = inp[:40, :1].clone().requires_grad_(True), w[:, :1].clone().requires_grad_(True)
    assert torch.autograd.gradcheck(lambda a, b: torch_npu.npu_nsa_compress(a, b, 16, 16, actual_seq_len=[40]),
                                    (inp_small, w_small), fast_mode=True)


def test_nsa_compress_errors_and_fake():
    with pytest.raises(RuntimeError, match="actual_seq_len\\[-1\\]"):
        torch_npu.npu_nsa_compress(torch.randn(32, 1, 16).half(), torch.randn(16, 1).half(), 16, 16,
                                   actual_seq_len=[30])
    with pytest.raises(RuntimeError, match="compress_stride must be"):
        torch_npu.npu_nsa_compress(torch.randn(32, 1, 16).half(), torch.randn(16, 1).half(), 16, 32,
                                   actual_seq_len=[32])
    with FakeTensorMode():
        out = ops.npu_nsa_compress(torch.randn(100, 4, 128).half(), torch.randn(32, 4).half(), 32, 16,
                                   actual_seq_len=[60, 100])
        gi, gw = ops.npu_nsa_compress_grad(torch.randn(3, 4, 128).half(), torch.randn(100, 4, 128).half(),
                                           torch.randn(32, 4).half(), 32, 16, actual_seq_len=[60, 100])
    assert out.shape == (3, 4, 128)           # windows: (60-32)//16+1 = 2 and (40-32)//16+1 = 1
    assert gi.shape == (100, 4, 128) and gw.shape == (32, 4)


# ------------------------------------------------------------------ npu_fused_floyd_attention (+ backward)

def _floyd_ref(q, k1, v1, k2, v2, mask, scale):
    """Documented formula in float64 torch ops (autograd-capable)."""
    b, h, n, m, d = q.shape
    kk = k1.shape[3]
    s = torch.zeros(b, h, n, m, kk, dtype=torch.float64)
    s = s + scale * (torch.matmul(q, k1.transpose(-1, -2)) +
                     (q.unsqueeze(-2) * k2.permute(0, 1, 3, 2, 4).unsqueeze(2)).sum(-1))
    if mask is not None:
        s = s.masked_fill(mask, float("-inf"))
    w = torch.softmax(s, -1)
    out = torch.matmul(w, v1) + (w.unsqueeze(-1) * v2.permute(0, 1, 3, 2, 4).unsqueeze(2)).sum(-2)
    mx = s.amax(-1)
    sm = torch.exp(s - mx.unsqueeze(-1)).sum(-1)
    return out, mx, sm


def _floyd_inputs(dtype, seed=10):
    g = torch.Generator().manual_seed(seed)
    b, h, n, m, kk, d = 1, 2, 2, 3, 4, 16
    q = torch.randn(b, h, n, m, d, generator=g)
    k1, v1 = torch.randn(b, h, n, kk, d, generator=g), torch.randn(b, h, n, kk, d, generator=g)
    k2, v2 = torch.randn(b, h, kk, m, d, generator=g), torch.randn(b, h, kk, m, d, generator=g)
    mask = torch.zeros(b, 1, n, 1, kk, dtype=torch.bool)
    mask[..., 1, :, 2] = True
    return [t.to(dtype) for t in (q, k1, v1, k2, v2)], mask


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype,atol", [(torch.float16, 5e-3), (torch.bfloat16, 5e-2)])
def test_floyd_attention_forward(device, dtype, atol):
    (q, k1, v1, k2, v2), mask = _floyd_inputs(dtype)
    mx, sm, out = torch_npu.npu_fused_floyd_attention(q.to(device), k1.to(device), v1.to(device), k2.to(device),
                                                      v2.to(device), atten_mask=mask.to(device), scale_value=0.25)
    r_out, r_mx, r_sm = _floyd_ref(*[t.double() for t in (q, k1, v1, k2, v2)], mask, 0.25)
    assert out.dtype == dtype and mx.dtype == torch.float32 and mx.shape == (1, 2, 2, 3, 8)
    _close(out, r_out, atol, 1e-2)
    _close(mx, r_mx.unsqueeze(-1).expand(1, 2, 2, 3, 8), 1e-2, 1e-2)
    _close(sm, r_sm.unsqueeze(-1).expand(1, 2, 2, 3, 8), 1e-2, 1e-2)


@pytest.mark.parametrize("device", DEVICES)
def test_floyd_attention_backward_matches_reference_autograd(device):
    (q, k1, v1, k2, v2), mask = _floyd_inputs(torch.float64, seed=11)
    leaves = [t.clone().requires_grad_(True) for t in (q, k1, v1, k2, v2)]
    r_out, _, _ = _floyd_ref(*leaves, mask, 0.5)
    dy = torch.randn_like(r_out)
    r_grads = torch.autograd.grad(r_out, leaves, dy)
    dev = [t.to(device) for t in (q, k1, v1, k2, v2)]
    mx, sm, out = torch_npu.npu_fused_floyd_attention(*dev, atten_mask=mask.to(device), scale_value=0.5)
    grads = torch_npu.npu_fused_floyd_attention_backward(dy.to(device), *dev, out, mx, sm,
                                                         atten_mask=mask.to(device), scale_value=0.5)
    for got, ref in zip(grads, r_grads):
        _close(got, ref, 1e-9, 1e-9)
    # the forward composition is differentiable too
    assert torch.autograd.gradcheck(
        lambda *a: torch_npu.npu_fused_floyd_attention(*a, atten_mask=mask, scale_value=0.5)[2],
        tuple(t.clone().requires_grad_(True) for t in (q, k1, v1, k2, v2)), fast_mode=True)


def test_floyd_attention_fake_and_errors():
    with FakeTensorMode():
        q = torch.randn(1, 1, 16, 128, 32).half()
        k1 = torch.randn(1, 1, 16, 128, 32).half()
        k2 = torch.randn(1, 1, 128, 128, 32).half()
        mx, sm, out = ops.npu_fused_floyd_attention(q, k1, k1, k2, k2)
        grads = ops.npu_fused_floyd_attention_backward(q, q, k1, k1, k2, k2, out, mx, sm)
    assert mx.shape == (1, 1, 16, 128, 8) and mx.dtype == torch.float32 and out.shape == q.shape
    assert [g.shape for g in grads] == [q.shape, k1.shape, k1.shape, k2.shape, k2.shape]
    with pytest.raises(RuntimeError, match="key_jk / value_jk"):
        (q, k1, v1, k2, v2), _ = _floyd_inputs(torch.float16)
        torch_npu.npu_fused_floyd_attention(q, k1, v1, k2[..., :2, :], v2[..., :2, :])


# ------------------------------------------------------------------ npu_fusion_attention_v3 (+ grad, .out)

def _sdpa_ref(q, k, v, scale, causal=False):
    s = torch.matmul(q, k.transpose(-1, -2)) * scale
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), float("-inf"))
    return torch.matmul(torch.softmax(s, -1), v)


@pytest.mark.parametrize("device", DEVICES)
def test_fusion_attention_v3_bnsd_forward_backward(device):
    torch.manual_seed(12)
    q, k, v = torch.randn(1, 2, 5, 8), torch.randn(1, 2, 6, 8), torch.randn(1, 2, 6, 8)
    leaves = [t.double().requires_grad_(True) for t in (q, k, v)]
    ref = _sdpa_ref(*leaves, 0.3)
    dy = torch.randn(1, 2, 5, 8)
    r_grads = torch.autograd.grad(ref, leaves, dy.double())
    x = [t.to(device).requires_grad_(True) for t in (q, k, v)]
    out, smax, ssum, sout, seed, offset = torch_npu.npu_fusion_attention_v3(x[0], x[1], x[2], 2, "BNSD", scale=0.3)
    _close(out, ref.detach(), 1e-5, 1e-5)
    assert smax.shape == (1, 2, 5, 8) and smax.dtype == torch.float32
    assert seed.shape == (1,) and seed.dtype == torch.int64 and offset.shape == (1,) and offset.dtype == torch.int64
    assert seed.device.type == device
    out.backward(dy.to(device))
    for got, r in zip((x[0].grad, x[1].grad, x[2].grad), r_grads):
        _close(got, r, 1e-5, 1e-5)
    dq, dk, dv, dpse, dsink = torch_npu.npu_fusion_attention_grad_v3(
        q.to(device), k.to(device), v.to(device), dy.to(device), 2, "BNSD", softmax_max=smax, softmax_sum=ssum,
        attention_in=out.detach(), scale_value=0.3, seed=seed, offset=offset)
    for got, r in zip((dq, dk, dv), r_grads):
        _close(got, r, 1e-5, 1e-5)


def test_fusion_attention_v3_tnd_with_tensor_lengths_and_out():
    torch.manual_seed(13)
    q, k, v = torch.randn(5, 2, 8), torch.randn(5, 2, 8), torch.randn(5, 2, 8)
    cq = torch.tensor([2, 5])
    res = torch_npu.npu_fusion_attention_v3(q, k, v, 2, "TND", scale=0.5, actual_seq_qlen=cq, actual_seq_kvlen=cq)
    ref = torch.cat([_sdpa_ref(q[a:b].transpose(0, 1).double(), k[a:b].transpose(0, 1).double(),
                               v[a:b].transpose(0, 1).double(), 0.5).transpose(0, 1) for a, b in ((0, 2), (2, 5))])
    _close(res[0], ref, 1e-5, 1e-5)
    assert res[1].shape == (5, 2, 8)
    outs = torch.ops.npu._npu_fusion_attention_v3_infer_output(q, k, v, 2, "TND")
    assert [o.shape for o in outs] == [(5, 2, 8), (5, 2, 8), (5, 2, 8)]
    extra = [torch.empty(0), torch.empty(1, dtype=torch.int64), torch.empty(1, dtype=torch.int64)]
    got = torch.ops.npu.npu_fusion_attention_v3.out(q, k, v, 2, "TND", scale=0.5, actual_seq_qlen=cq,
                                                    actual_seq_kvlen=cq, attention_score=outs[0],
                                                    softmax_max=outs[1], softmax_sum=outs[2], softmax_out=extra[0],
                                                    seed=extra[1], offset=extra[2])
    assert got[0] is outs[0] and got[4] is extra[1]
    _close(outs[0], ref, 1e-5, 1e-5)
    grads = torch.ops.npu._npu_fusion_attention_grad_v3_infer_output(q, k, v)
    assert [g.shape for g in grads] == [(5, 2, 8)] * 3 + [(0,), (0,)]
    dy = torch.randn(5, 2, 8)
    full = torch_npu.npu_fusion_attention_grad_v3(q, k, v, dy, 2, "TND", scale_value=0.5, actual_seq_qlen=cq,
                                                  actual_seq_kvlen=cq)
    got = torch.ops.npu.npu_fusion_attention_grad_v3.out(q, k, v, dy, 2, "TND", scale_value=0.5, actual_seq_qlen=cq,
                                                         actual_seq_kvlen=cq, dq=grads[0], dk=grads[1], dv=grads[2],
                                                         dpse=grads[3], dsink=grads[4])
    assert got[0] is grads[0]
    for a, b in zip(got[:3], full[:3]):
        torch.testing.assert_close(a, b)


def test_fusion_attention_v3_fake_bsh():
    with FakeTensorMode():
        q = torch.randn(2, 4, 32).half()
        res = ops.npu_fusion_attention_v3(q, q, q, 4, "BSH")
        outs = ops._npu_fusion_attention_v3_infer_output(q, q, q, 4, "SBH")
    assert res[0].shape == (2, 4, 32) and res[1].shape == (2, 4, 4, 8) and res[4].shape == (1,)
    assert outs[1].shape == (4, 4, 2, 8)


# ------------------------------------------------------------------ npu_fused_infer_attention_score.out / infer_output

@pytest.mark.parametrize("device", DEVICES)
def test_fused_infer_attention_score_out(device):
    torch.manual_seed(14)
    q, k, v = torch.randn(1, 2, 3, 8), torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8)
    ref = _sdpa_ref(q.double(), k.double(), v.double(), 0.4)
    s = torch.matmul(q.double(), k.double().transpose(-1, -2)) * 0.4
    ref_lse = torch.logsumexp(s, -1, keepdim=True)
    out, lse = torch.ops.npu._npu_fused_infer_attention_score_infer_output(
        q.to(device), v.to(device), input_layout="BNSD", num_heads=2, softmax_lse_flag=True)
    assert out.shape == (1, 2, 3, 8) and lse.shape == (1, 2, 3, 1) and lse.dtype == torch.float32
    got = torch.ops.npu.npu_fused_infer_attention_score.out(
        q.to(device), k.to(device), v.to(device), num_heads=2, scale=0.4, input_layout="BNSD",
        softmax_lse_flag=True, attention_out=out, softmax_lse=lse)
    assert got[0] is out and got[1] is lse
    _close(out, ref, 1e-5, 1e-5)
    _close(lse, ref_lse, 1e-5, 1e-5)


def test_fused_infer_attention_infer_output_shapes():
    q_bsh, v_bsh = torch.empty(2, 3, 32), torch.empty(2, 7, 16)  # N = 4, N_kv = 2 -> D_v = 8
    out, lse = torch.ops.npu._npu_fused_infer_attention_score_infer_output(q_bsh, v_bsh, num_heads=4,
                                                                           num_key_value_heads=2)
    assert out.shape == (2, 3, 32) and lse.shape == (0,)
    out, lse = torch.ops.npu._npu_fused_infer_attention_score_infer_output(
        torch.empty(2, 4, 3, 16), torch.empty(2, 4, 9, 16), input_layout="BNSD_BSND", num_heads=4,
        softmax_lse_flag=True)
    assert out.shape == (2, 3, 4, 16) and lse.shape == (2, 4, 3, 1)
    out, lse = torch.ops.npu._npu_fused_infer_attention_score_infer_output(
        torch.empty(6, 4, 16, dtype=torch.int8), torch.empty(6, 4, 8), input_layout="TND", num_heads=4,
        softmax_lse_flag=True)
    assert out.shape == (6, 4, 8) and out.dtype == torch.float16 and lse.shape == (6, 4, 1)
    out, _ = torch.ops.npu._npu_fused_infer_attention_score_v2_infer_output(
        torch.empty(2, 3, 32).bfloat16(), torch.empty(2, 7, 32), num_query_heads=4, quant_scale_out=torch.empty(1))
    assert out.dtype == torch.int8
    with pytest.raises(NotImplementedError, match="out_dtype"):
        torch.ops.npu._npu_fused_infer_attention_score_v2_infer_output(torch.empty(2, 3, 32), torch.empty(2, 7, 32),
                                                                       num_query_heads=4, out_dtype=1)
    with pytest.raises(RuntimeError, match="not supported"):
        torch.ops.npu._npu_fused_infer_attention_score_infer_output(q_bsh, v_bsh, input_layout="XYZ")


# ------------------------------------------------------------------ Meta-only ops
# Each case: overload name, a call building its inputs, the expected (shape, dtype) of every
# tensor output, written from the op's documentation / op-plugin allocation code.

f16, bf16, f32, i32 = torch.float16, torch.bfloat16, torch.float32, torch.int32


def _r(*shape, dtype=f32):
    return torch.zeros(shape, dtype=dtype)


META_CASES = [
    ("npu_nsa_compress_attention_infer",
     lambda: ops.npu_nsa_compress_attention_infer(_r(20, 8, 192, dtype=bf16), _r(160, 128, 384, dtype=bf16),
                                                  _r(160, 128, 256, dtype=bf16), 1.0, 8, 2, 64, 16, 128, 32, 16,
                                                  block_table=_r(20, 8, dtype=i32),
                                                  actual_cmp_seq_kvlen=[1024] * 20),
     [((20, 8, 128), bf16), ((20, 2, 16), i32)]),
    ("npu_nsa_select_attention_infer",
     lambda: ops.npu_nsa_select_attention_infer(_r(17, 1, 126, 192, dtype=f16), _r(187, 128, 9, 192, dtype=f16),
                                                _r(187, 128, 9, 128, dtype=f16), _r(17, 9, 21, dtype=i32), 2.0,
                                                126, 9, 64, 21, 128, block_table=_r(17, 11, dtype=i32),
                                                actual_seq_kvlen=[1328] * 17),
     [((17, 1, 126, 128), f16)]),
    ("npu_nsa_select_attention_infer",
     lambda: ops.npu_nsa_select_attention_infer(_r(123, 4, 192, dtype=f16), _r(246, 64, 384, dtype=f16),
                                                _r(246, 64, 256, dtype=f16), _r(123, 2, 2, dtype=i32), 2.0, 4, 2,
                                                64, 2, 64, layout="TND", block_table=_r(123, 2, dtype=i32),
                                                actual_seq_kvlen=[82] * 123),
     [((123, 4, 128), f16)]),
    ("npu_quant_fusion_attention",
     lambda: ops.npu_quant_fusion_attention(_r(2, 4, 6, 64, dtype=torch.float8_e4m3fn),
                                            _r(2, 4, 9, 64, dtype=torch.float8_e4m3fn),
                                            _r(2, 4, 9, 64, dtype=torch.float8_e4m3fn), 4, "BNSD",
                                            d_scale_q=_r(2, 4, 1, 1), d_scale_k=_r(2, 4, 1, 1),
                                            d_scale_v=_r(2, 4, 1, 1)),
     [((2, 4, 6, 64), f16), ((2, 4, 6, 8), f32), ((2, 4, 6, 8), f32), ((0,), f16)]),
]


@pytest.mark.parametrize("name,call,expected", META_CASES, ids=[c[0] for c in META_CASES])
def test_meta_only_ops_shapes_and_not_emulated(name, call, expected):
    with FakeTensorMode():
        res = call()
    res = res if isinstance(res, (tuple, list)) else (res,)
    tensors = [t for t in res if isinstance(t, torch.Tensor)]
    assert [(tuple(t.shape), t.dtype) for t in tensors] == expected
    with pytest.raises(NotImplementedError) as info:
        call()
    assert str(info.value) == not_emulated_message(name)


def test_meta_validation_errors():
    with FakeTensorMode():
        with pytest.raises(RuntimeError, match="beta cannot be empty"):
            ops.npu_chunk_gated_delta_rule(_r(4, 2, 16), _r(4, 2, 16), _r(4, 2, 16), initial_state=_r(1, 2, 16, 16),
                                           actual_seq_lengths=_r(1, dtype=i32), scale=1.0)
        with pytest.raises(RuntimeError, match="align to 16"):
            ops.npu_multi_head_attention_backward(*([_r(8, 8)] * 7), None, None, None, None, *([_r(8, 8)] * 7),
                                                  _r(0), 2, 4, 8, 8, 0.0, True)
    # dtype codes are not modelled: NotImplementedError on meta tensors (FakeTensorMode reports it as an
    # unsupported operator)
    meta_q = torch.empty(2, 3, 32, device="meta")
    with pytest.raises(NotImplementedError, match="query_dtype"):
        ops.npu_fused_infer_attention_score_v2(meta_q, meta_q, meta_q, query_dtype=1)


# ------------------------------------------------------------------ npu_nsa_select_attention (+ grad)

def _select_ref(q, k, v, topk, scale, block, cum_q, cum_kv):
    """Per token, per key head: gather the chosen blocks of the token's batch, softmax attention
    (float64 torch ops, so autograd gives the reference gradients)."""
    t1, n1, d1 = q.shape
    n2 = v.shape[1]
    grp = n1 // n2
    outs, maxes, sums = [], [], []
    b, q_prev, kv_start = 0, 0, 0
    for t in range(t1):
        while t >= cum_q[b]:
            b += 1
        kv_start = 0 if b == 0 else cum_kv[b - 1]
        row_out, row_max, row_sum = [], [], []
        for n in range(n2):
            rows = [kv_start + int(c) * block + j for c in topk[t, n] for j in range(block)]
            ks, vs = k[rows, n], v[rows, n]
            sc = q[t, n * grp:(n + 1) * grp] @ ks.t() * scale
            m = sc.max(-1, keepdim=True).values
            e = torch.exp(sc - m)
            row_out.append((e / e.sum(-1, keepdim=True)) @ vs)
            row_max.append(m)
            row_sum.append(e.sum(-1, keepdim=True))
        outs.append(torch.cat(row_out))
        maxes.append(torch.cat(row_max))
        sums.append(torch.cat(row_sum))
    return torch.stack(outs), torch.stack(maxes), torch.stack(sums)


def _select_inputs(dtype, seed=15):
    g = torch.Generator().manual_seed(seed)
    cum_q, cum_kv, block, count = [2, 5], [128, 320], 64, 2   # batch 0: 2 blocks, batch 1: 3 blocks
    q = torch.randn(5, 4, 32, generator=g).to(dtype)
    k = torch.randn(320, 2, 32, generator=g).to(dtype)
    v = torch.randn(320, 2, 16, generator=g).to(dtype)
    topk = torch.tensor([[[0, 1], [1, 0]], [[1, 1], [0, 0]], [[2, 0], [1, 2]], [[0, 1], [2, 2]], [[1, 2], [0, 1]]],
                        dtype=torch.int32)
    return q, k, v, topk, block, count, cum_q, cum_kv


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype,atol", [(torch.float16, 3e-3), (torch.bfloat16, 3e-2)])
def test_nsa_select_attention_forward(device, dtype, atol):
    q, k, v, topk, block, count, cum_q, cum_kv = _select_inputs(dtype)
    out, mx, sm = torch_npu.npu_nsa_select_attention(q.to(device), k.to(device), v.to(device), topk.to(device),
                                                     0.2, 4, block, count, actual_seq_qlen=cum_q,
                                                     actual_seq_kvlen=cum_kv)
    r_out, r_mx, r_sm = _select_ref(q.double(), k.double(), v.double(), topk, 0.2, block, cum_q, cum_kv)
    assert out.shape == (5, 4, 16) and out.dtype == dtype and mx.shape == (5, 4, 8) and mx.dtype == torch.float32
    _close(out, r_out, atol, 1e-2)
    _close(mx, r_mx.expand(5, 4, 8), 1e-2, 1e-2)
    _close(sm, r_sm.expand(5, 4, 8), 2e-2, 1e-2)


@pytest.mark.parametrize("device", DEVICES)
def test_nsa_select_attention_grad_matches_reference_autograd(device):
    q, k, v, topk, block, count, cum_q, cum_kv = _select_inputs(torch.float64, seed=16)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    r_out, _, _ = _select_ref(*leaves, topk, 0.3, block, cum_q, cum_kv)
    g = torch.randn_like(r_out)
    r_grads = torch.autograd.grad(r_out, leaves, g)
    dev = [t.to(device) for t in (q, k, v)]
    out, mx, sm = torch_npu.npu_nsa_select_attention(*dev, topk.to(device), 0.3, 4, block, count,
                                                     actual_seq_qlen=cum_q, actual_seq_kvlen=cum_kv)
    grads = torch_npu.npu_nsa_select_attention_grad(g.to(device), *dev, out, mx, sm, topk.to(device), 0.3, 4, block,
                                                    count, actual_seq_qlen=cum_q, actual_seq_kvlen=cum_kv)
    for got, ref in zip(grads, r_grads):
        _close(got, ref, 1e-9, 1e-9)
    fwd = [t.clone().requires_grad_(True) for t in (q, k, v)]
    out = torch_npu.npu_nsa_select_attention(*fwd, topk, 0.3, 4, block, count, actual_seq_qlen=cum_q,
                                             actual_seq_kvlen=cum_kv)[0]
    for got, ref in zip(torch.autograd.grad(out, fwd, g), r_grads):
        _close(got, ref, 1e-9, 1e-9)


def test_nsa_select_attention_errors_and_fake():
    q, k, v, topk, block, count, cum_q, cum_kv = _select_inputs(torch.float16)
    with pytest.raises(NotImplementedError, match="atten_mask"):
        torch_npu.npu_nsa_select_attention(q, k, v, topk, 1.0, 4, block, count, atten_mask=torch.zeros(5, 320).bool(),
                                           actual_seq_qlen=cum_q, actual_seq_kvlen=cum_kv)
    with pytest.raises(RuntimeError, match="topk_indices must be int32"):
        torch_npu.npu_nsa_select_attention(q, k, v, topk.long(), 1.0, 4, block, count, actual_seq_qlen=cum_q,
                                           actual_seq_kvlen=cum_kv)
    with FakeTensorMode():
        fq, fk, fv = torch.randn(256, 16, 192).half(), torch.randn(3072, 4, 192).half(), torch.randn(3072, 4, 128).half()
        ft = torch.zeros(256, 4, 16, dtype=torch.int32)
        out, mx, sm = ops.npu_nsa_select_attention(fq, fk, fv, ft, 1.0, 16, 64, 16, actual_seq_qlen=[128, 256],
                                                   actual_seq_kvlen=[2048, 3072])
        grads = ops.npu_nsa_select_attention_grad(out, fq, fk, fv, out, mx, sm, ft, 1.0, 16, 64, 16,
                                                  actual_seq_qlen=[128, 256], actual_seq_kvlen=[2048, 3072])
    assert out.shape == (256, 16, 128) and mx.shape == (256, 16, 8) and mx.dtype == torch.float32
    assert [g.shape for g in grads] == [fq.shape, fk.shape, fv.shape]


# ------------------------------------------------------------------ npu_mhc_pre (+ backward)

def _mhc_pre_ref(x, phi, alpha, bias, gamma, norm_eps, hc_eps):
    """Documented formula, float64 torch ops token by token (autograd gives the reference backward)."""
    n, d = x.shape[-2], x.shape[-1]
    flat_x = x.reshape(-1, n, d)
    outs = [[] for _ in range(6)]
    for tok in flat_x:
        xf = tok.reshape(n * d)
        rms = torch.sqrt((xf * xf).sum() / (n * d) + norm_eps)
        g = xf if gamma is None else xf * gamma.reshape(n * d)
        mix = phi @ g
        w = mix / rms
        pre = torch.sigmoid(alpha[0] * w[:n] + bias[:n]) + hc_eps
        post = 2 * torch.sigmoid(alpha[1] * w[n:2 * n] + bias[n:2 * n])
        res = (alpha[2] * w[2 * n:] + bias[2 * n:]).reshape(n, n)
        h_in = (pre.unsqueeze(-1) * tok).sum(0)
        for lst, val in zip(outs, (h_in, post, res, 1 / rms, mix, pre)):
            lst.append(val)
    lead = tuple(x.shape[:-2])
    return [torch.stack(o).reshape(lead + tuple(o[0].shape)) for o in outs]


def _mhc_inputs(lead, dtype, gamma=True, seed=17):
    g = torch.Generator().manual_seed(seed)
    n, d = 4, 16
    x = torch.randn(lead + (n, d), generator=g).to(dtype)
    fdt = torch.float64 if dtype == torch.float64 else torch.float32
    phi = (torch.randn(n * n + 2 * n, n * d, generator=g) * 0.1).to(fdt)
    alpha = torch.tensor([0.5, 0.7, 0.9]).to(fdt)
    bias = (torch.randn(n * n + 2 * n, generator=g) * 0.1).to(fdt)
    gam = torch.randn(n, d, generator=g).to(fdt) if gamma else None
    return x, phi, alpha, bias, gam


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("lead,dtype,atol", [((2, 3), torch.bfloat16, 3e-2), ((5,), torch.float16, 3e-3)])
def test_mhc_pre_forward(device, lead, dtype, atol):
    x, phi, alpha, bias, gamma = _mhc_inputs(lead, dtype)
    res = torch_npu.npu_mhc_pre(x.to(device), phi.to(device), alpha.to(device), bias.to(device),
                                gamma=gamma.to(device), norm_eps=1e-5, hc_eps=1e-3, out_flag=1)
    ref = _mhc_pre_ref(x.double(), phi.double(), alpha.double(), bias.double(), gamma.double(), 1e-5, 1e-3)
    assert res[0].dtype == dtype and all(t.dtype == torch.float32 for t in res[1:])
    assert [tuple(t.shape) for t in res] == [lead + (16,), lead + (4,), lead + (4, 4), lead, lead + (24,), lead + (4,)]
    _close(res[0], ref[0], atol, 1e-2)
    for got, exp in zip(res[1:], ref[1:]):
        _close(got, exp, 1e-4, 1e-4)
    short = torch_npu.npu_mhc_pre(x, phi, alpha, bias)
    assert [tuple(t.shape) for t in short[3:]] == [(0,), (0,), (0,)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("with_gamma", [True, False])
def test_mhc_pre_backward_matches_reference_autograd(device, with_gamma):
    x, phi, alpha, bias, gamma = _mhc_inputs((2, 3), torch.float64, gamma=with_gamma, seed=18)
    leaves = [x, phi, alpha, bias] + ([gamma] if with_gamma else [])
    leaves = [t.clone().requires_grad_(True) for t in leaves]
    ref = _mhc_pre_ref(leaves[0], leaves[1], leaves[2], leaves[3], leaves[4] if with_gamma else None, 1e-6, 1e-4)
    gen = torch.Generator().manual_seed(19)
    g_in, g_post, g_res = (torch.randn(r.shape, generator=gen, dtype=torch.float64) for r in ref[:3])
    g_xpost = torch.randn(x.shape, generator=gen, dtype=torch.float64)
    r_grads = torch.autograd.grad(ref[:3], leaves, (g_in, g_post, g_res))
    dv = lambda t: None if t is None else t.to(device)  # noqa: E731
    fwd = torch_npu.npu_mhc_pre(dv(x), dv(phi), dv(alpha), dv(bias), gamma=dv(gamma), hc_eps=1e-4, out_flag=1)
    got = torch_npu.npu_mhc_pre_backward(dv(x), dv(phi), dv(alpha), dv(g_in), dv(g_post), dv(g_res), fwd[3], fwd[4],
                                         fwd[5], fwd[1], gamma=dv(gamma), hc_eps=1e-4, grad_x_post=dv(g_xpost))
    _close(got[0], r_grads[0] + g_xpost, 1e-9, 1e-9)
    for a, b in zip(got[1:4], r_grads[1:4]):
        _close(a, b, 1e-9, 1e-9)
    if with_gamma:
        _close(got[4], r_grads[4], 1e-9, 1e-9)
    else:
        assert got[4].shape == (4, 16) and not got[4].any()


def test_mhc_pre_errors_and_fake():
    x, phi, alpha, bias, gamma = _mhc_inputs((3,), torch.bfloat16)
    with pytest.raises(RuntimeError, match="phi must be"):
        torch_npu.npu_mhc_pre(x, phi[:-1], alpha, bias)
    with pytest.raises(NotImplementedError, match="inner_precise"):
        torch_npu.npu_mhc_pre(x, phi, alpha, bias, inner_precise=1)
    with FakeTensorMode():
        fx = torch.randn(2, 5, 8, 32).bfloat16()
        res = ops.npu_mhc_pre(fx, torch.randn(80, 256), torch.randn(3), torch.randn(80), out_flag=1)
        grads = ops.npu_mhc_pre_backward(fx, torch.randn(80, 256), torch.randn(3), torch.randn(2, 5, 32).bfloat16(),
                                         torch.randn(2, 5, 8), torch.randn(2, 5, 8, 8), torch.randn(2, 5),
                                         torch.randn(2, 5, 80), torch.randn(2, 5, 8), torch.randn(2, 5, 8))
    assert [tuple(t.shape) for t in res] == [(2, 5, 32), (2, 5, 8), (2, 5, 8, 8), (2, 5), (2, 5, 80), (2, 5, 8)]
    assert [tuple(t.shape) for t in grads] == [(2, 5, 8, 32), (80, 256), (3,), (80,), (8, 32)]
    assert grads[0].dtype == torch.bfloat16 and grads[1].dtype == torch.float32


# ------------------------------------------------------------------ npu_lightning_indexer_grad

def _indexer_grad_ref(q, k, dy, idx, w, key_start):
    """Loops of the op-plugin golden: per token, key head, selected slot and query head of the group."""
    tokens, n1, d = q.shape
    n2 = k.shape[1]
    grp = n1 // n2
    dq, dk, dw = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(w)
    for t in range(tokens):
        for n in range(n2):
            for s in range(idx.shape[-1]):
                j = int(idx[t, n, s])
                if j < 0:
                    continue
                row = key_start[t] + j
                for h in range(n * grp, (n + 1) * grp):
                    r = float(q[t, h] @ k[row, n])
                    if r > 0:
                        dq[t, h] += w[t, h] * dy[t, n, s] * k[row, n]
                        dk[row, n] += w[t, h] * dy[t, n, s] * q[t, h]
                        dw[t, h] += r * dy[t, n, s]
    return dq, dk, dw


@pytest.mark.parametrize("device", DEVICES)
def test_lightning_indexer_grad_bsnd(device):
    gen = torch.Generator().manual_seed(20)
    b, s1, s2, n1, n2, d, kk = 2, 3, 6, 4, 2, 8, 3
    q, k = torch.randn(b, s1, n1, d, generator=gen), torch.randn(b, s2, n2, d, generator=gen)
    w = torch.randn(b, s1, n1, generator=gen)
    idx = torch.randint(0, s2, (b, s1, n2, kk), generator=gen, dtype=torch.int32)
    idx[0, 1, 1, 2] = -1
    idx[1, 2, 0, 0] = idx[1, 2, 0, 1]          # a key picked twice accumulates
    dy = torch.randn(b, s1, n2, kk, generator=gen)
    got = torch_npu.npu_lightning_indexer_grad(q.to(device), k.to(device), dy.to(device), idx.to(device),
                                               w.to(device))
    ref = _indexer_grad_ref(q.double().reshape(b * s1, n1, d), k.double().reshape(b * s2, n2, d),
                            dy.double().reshape(b * s1, n2, kk), idx.reshape(b * s1, n2, kk),
                            w.double().reshape(b * s1, n1), [bi * s2 for bi in range(b) for _ in range(s1)])
    for g_, r_, shape in zip(got, ref, (q.shape, k.shape, w.shape)):
        assert g_.shape == shape
        _close(g_, r_.reshape(shape), 1e-5, 1e-5)


@pytest.mark.parametrize("dtype,atol", [(torch.bfloat16, 6e-2), (torch.float16, 1e-2)])
def test_lightning_indexer_grad_tnd_low_precision(dtype, atol):
    gen = torch.Generator().manual_seed(21)
    q, k = torch.randn(5, 4, 16, generator=gen).to(dtype), torch.randn(7, 1, 16, generator=gen).to(dtype)
    w = torch.randn(5, 4, generator=gen).to(dtype)
    idx = torch.tensor([[0, 1], [1, -1], [0, 2], [3, 1], [2, 2]], dtype=torch.int32)   # batches: q 2|3, k 3|4
    dy = torch.randn(5, 2, generator=gen).to(dtype)
    got = torch_npu.npu_lightning_indexer_grad(q.npu(), k.npu(), dy.npu(), idx.npu(), w.npu(),
                                               torch.tensor([2, 5]), torch.tensor([3, 7]), layout="TND")
    ref = _indexer_grad_ref(q.double(), k.double(), dy.double().unsqueeze(1), idx.unsqueeze(1), w.double(),
                            [0, 0, 3, 3, 3])
    assert [g_.dtype for g_ in got] == [dtype] * 3
    for g_, r_ in zip(got, ref):
        _close(g_, r_, atol, 2e-2)


def test_lightning_indexer_grad_fake_and_errors():
    with FakeTensorMode():
        got = ops.npu_lightning_indexer_grad(torch.randn(1, 4, 8, 64).bfloat16(), torch.randn(1, 6, 1, 64).bfloat16(),
                                             torch.randn(1, 4, 1, 2).bfloat16(),
                                             torch.zeros(1, 4, 1, 2, dtype=torch.int32), torch.randn(1, 4, 8).bfloat16())
    assert [tuple(t.shape) for t in got] == [(1, 4, 8, 64), (1, 6, 1, 64), (1, 4, 8)]
    assert all(t.dtype == torch.bfloat16 for t in got)
    with pytest.raises(RuntimeError, match="dy shape"):
        torch_npu.npu_lightning_indexer_grad(torch.randn(1, 2, 2, 8), torch.randn(1, 3, 1, 8), torch.randn(1, 2, 3),
                                             torch.zeros(1, 2, 2, dtype=torch.int32), torch.randn(1, 2, 2))
    with pytest.raises(RuntimeError, match="actual_seq_lengths_query is required"):
        torch_npu.npu_lightning_indexer_grad(torch.randn(2, 2, 8), torch.randn(3, 1, 8), torch.randn(2, 2),
                                             torch.zeros(2, 2, dtype=torch.int32), torch.randn(2, 2), layout="TND")


# ------------------------------------------------------------------ npu_fused_infer_attention_score_v2 (+ .out)

@pytest.mark.parametrize("device", DEVICES)
def test_fused_infer_attention_score_v2_gqa_bnsd_and_bsh(device):
    torch.manual_seed(22)
    q, k, v = torch.randn(2, 4, 3, 8), torch.randn(2, 2, 6, 8), torch.randn(2, 2, 6, 8)
    kr, vr = k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)
    s = torch.matmul(q.double(), kr.double().transpose(-1, -2)) * 0.35
    ref = torch.matmul(torch.softmax(s, -1), vr.double())
    out, lse = torch_npu.npu_fused_infer_attention_score_v2(
        q.to(device), k.to(device), v.to(device), num_query_heads=4, num_key_value_heads=2, softmax_scale=0.35,
        input_layout="BNSD", return_softmax_lse=True)
    _close(out, ref, 1e-5, 1e-5)
    _close(lse, torch.logsumexp(s, -1, keepdim=True), 1e-5, 1e-5)
    bsh = lambda t: t.transpose(1, 2).reshape(t.shape[0], t.shape[2], -1)  # noqa: E731
    out_bsh, lse_empty = torch_npu.npu_fused_infer_attention_score_v2(
        bsh(q).to(device), bsh(k).to(device), bsh(v).to(device), num_query_heads=4, num_key_value_heads=2,
        softmax_scale=0.35)
    _close(out_bsh, bsh(ref), 1e-5, 1e-5)
    assert lse_empty.shape == (0,)
    buf_out, buf_lse = torch.empty(0, device=device), torch.empty(0, device=device)
    got = torch.ops.npu.npu_fused_infer_attention_score_v2.out(
        q.to(device), k.to(device), v.to(device), num_query_heads=4, num_key_value_heads=2, softmax_scale=0.35,
        input_layout="BNSD", return_softmax_lse=True, attention_out=buf_out, softmax_lse=buf_lse)
    assert got[0] is buf_out and buf_out.shape == (2, 4, 3, 8)
    _close(buf_out, ref, 1e-5, 1e-5)


@pytest.mark.parametrize("dtype,atol", [(torch.float16, 3e-3), (torch.bfloat16, 3e-2)])
def test_fused_infer_attention_score_v2_low_precision_and_fake(dtype, atol):
    torch.manual_seed(23)
    q, k = torch.randn(1, 2, 2, 16).to(dtype), torch.randn(1, 2, 5, 16).to(dtype)
    ref = torch.matmul(torch.softmax(torch.matmul(q.double(), k.double().transpose(-1, -2)) * 0.25, -1), k.double())
    out, _ = torch_npu.npu_fused_infer_attention_score_v2(q, k, k, num_query_heads=2, softmax_scale=0.25,
                                                          input_layout="BNSD")
    assert out.dtype == dtype
    _close(out, ref, atol, 1e-2)
    with FakeTensorMode():
        fq = torch.randn(2, 4, 3, 16).to(dtype)
        fout, flse = ops.npu_fused_infer_attention_score_v2(fq, torch.randn(2, 1, 9, 16).to(dtype),
                                                            torch.randn(2, 1, 9, 16).to(dtype), num_query_heads=4,
                                                            num_key_value_heads=1, input_layout="BNSD",
                                                            return_softmax_lse=True)
    assert fout.shape == (2, 4, 3, 16) and fout.dtype == dtype and flse.shape == (2, 4, 3, 1)


def test_fused_infer_attention_score_v2_not_emulated_arguments():
    q = torch.randn(1, 2, 2, 16)
    with pytest.raises(NotImplementedError, match="quant_scale_out"):
        torch_npu.npu_fused_infer_attention_score_v2(q, q, q, num_query_heads=2, input_layout="BNSD",
                                                     quant_scale_out=torch.ones(1))
    with pytest.raises(NotImplementedError, match="learnable_sink"):
        torch_npu.npu_fused_infer_attention_score_v2(q, q, q, num_query_heads=2, input_layout="BNSD",
                                                     learnable_sink=torch.ones(2))
    with pytest.raises(NotImplementedError, match="key_quant_mode"):
        torch_npu.npu_fused_infer_attention_score_v2(q, q, q, num_query_heads=2, input_layout="BNSD",
                                                     key_quant_mode=1)


# ------------------------------------------------------------------ npu_chunk_gated_delta_rule

def _gdr_ref(q, k, v, beta, state, lengths, scale, g):
    """Documented recurrence in float64, token by token."""
    t_total, nk, dk = q.shape
    nv, dv = v.shape[1], v.shape[2]
    out = torch.zeros(t_total, nv, dv, dtype=torch.float64)
    finals, start = [], 0
    for b, length in enumerate(lengths):
        s = state[b].double().clone()
        for t in range(start, start + length):
            for h in range(nv):
                kh, qh = k[t, h // (nv // nk)].double(), q[t, h // (nv // nk)].double()
                a = math.exp(float(g[t, h])) if g is not None else 1.0
                s[h] = a * s[h] + float(beta[t, h]) * torch.outer(v[t, h].double() - a * s[h] @ kh, kh)
                out[t, h] = s[h] @ (qh * scale)
        finals.append(s)
        start += length
    return out, torch.stack(finals)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("with_g,state_dtype", [(True, torch.float32), (False, torch.bfloat16)])
def test_chunk_gated_delta_rule(device, with_g, state_dtype):
    gen = torch.Generator().manual_seed(24)
    lengths, nk, nv, dk, dv = [3, 0, 4], 1, 2, 8, 4
    t_total = sum(lengths)
    q = torch.nn.functional.normalize(torch.randn(t_total, nk, dk, generator=gen), dim=-1).bfloat16()
    k = torch.nn.functional.normalize(torch.randn(t_total, nk, dk, generator=gen), dim=-1).bfloat16()
    v = torch.randn(t_total, nv, dv, generator=gen).bfloat16()
    beta = torch.rand(t_total, nv, generator=gen).bfloat16()
    g = -torch.rand(t_total, nv, generator=gen) if with_g else None
    state = torch.randn(3, nv, dv, dk, generator=gen).to(state_dtype)
    o, final = torch_npu.npu_chunk_gated_delta_rule(
        q.to(device), k.to(device), v.to(device), beta=beta.to(device), initial_state=state.to(device),
        actual_seq_lengths=torch.tensor(lengths, dtype=torch.int32).to(device), scale=dk ** -0.5,
        g=None if g is None else g.to(device))
    r_o, r_final = _gdr_ref(q, k, v, beta, state, lengths, dk ** -0.5, g)
    assert o.shape == (t_total, nv, dv) and o.dtype == torch.bfloat16
    assert final.shape == state.shape and final.dtype == state_dtype
    _close(o, r_o, 3e-2, 2e-2)
    _close(final, r_final, 3e-2 if state_dtype == torch.bfloat16 else 1e-4, 2e-2)


def test_chunk_gated_delta_rule_fake_and_compile():
    with FakeTensorMode():
        o, final = ops.npu_chunk_gated_delta_rule(
            _r(10, 2, 16, dtype=bf16), _r(10, 2, 16, dtype=bf16), _r(10, 4, 32, dtype=bf16),
            beta=_r(10, 4, dtype=bf16), initial_state=_r(3, 4, 32, 16), actual_seq_lengths=_r(3, dtype=i32),
            scale=0.25)
    assert (tuple(o.shape), o.dtype, tuple(final.shape), final.dtype) == ((10, 4, 32), bf16, (3, 4, 32, 16), f32)
    gen = torch.Generator().manual_seed(26)
    q = torch.nn.functional.normalize(torch.randn(4, 1, 8, generator=gen), dim=-1).bfloat16()
    v, beta = torch.randn(4, 1, 4, generator=gen).bfloat16(), torch.rand(4, 1, generator=gen).bfloat16()
    st, lens = torch.randn(2, 1, 4, 8, generator=gen), torch.tensor([1, 3], dtype=torch.int32)

    def f(q, v, beta, st, lens):
        return torch_npu.npu_chunk_gated_delta_rule(q, q, v, beta=beta, initial_state=st, actual_seq_lengths=lens,
                                                    scale=0.5)
    eager = f(q, v, beta, st, lens)
    compiled = torch.compile(f, backend="aot_eager", fullgraph=True)(q, v, beta, st, lens)
    assert torch.equal(eager[0], compiled[0]) and torch.equal(eager[1], compiled[1])


def test_chunk_gated_delta_rule_errors():
    x = torch.zeros(4, 1, 8, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="sum to T=4"):
        torch_npu.npu_chunk_gated_delta_rule(x, x, torch.zeros(4, 1, 4, dtype=torch.bfloat16),
                                             beta=torch.zeros(4, 1, dtype=torch.bfloat16),
                                             initial_state=torch.zeros(1, 1, 4, 8),
                                             actual_seq_lengths=torch.tensor([3], dtype=torch.int32), scale=1.0)
    with pytest.raises(RuntimeError, match="query dtype must be bfloat16"):
        torch_npu.npu_chunk_gated_delta_rule(x.float(), x.float(), torch.zeros(4, 1, 4, dtype=torch.bfloat16),
                                             beta=torch.zeros(4, 1, dtype=torch.bfloat16),
                                             initial_state=torch.zeros(1, 1, 4, 8),
                                             actual_seq_lengths=torch.tensor([4], dtype=torch.int32), scale=1.0)


# ------------------------------------------------------------------ npu_multi_head_attention_backward

def _mha_ref(x_q, x_k, x_v, wq, wk, wv, wo, bq, bk, bv, bo, mask, keep, p_drop, heads, dim):
    """Forward of the emulated npu_multi_head_attention written with plain float64 torch ops."""
    b = x_q.shape[0] // 16
    def split(x, length):
        return x.reshape(b, length, heads, dim).permute(0, 2, 1, 3)
    q = split((x_q @ wq.t() + bq) * dim ** -0.5, 16)
    k = split(x_k @ wk.t() + bk, 16)
    v = split(x_v @ wv.t() + bv, 16)
    probs = torch.softmax(q @ k.transpose(-1, -2) + mask, -1)
    if p_drop > 0:
        probs = probs * keep / (1 - p_drop)
    ctx = (probs @ v).permute(0, 2, 1, 3).reshape(b * 16, heads * dim)
    return ctx @ wo.t() + bo


def _unpack_bits(mask, numel):
    bits = [(int(byte) >> i) & 1 for byte in mask.tolist() for i in range(8)]
    return torch.tensor(bits[:numel], dtype=torch.float64)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("p_drop", [0.0, 0.3])
def test_multi_head_attention_backward(device, p_drop):
    gen = torch.Generator().manual_seed(25)
    heads, dim, e = 16, 16, 256
    rnd = lambda *s: (torch.randn(*s, generator=gen, dtype=torch.float64) * 0.2)  # noqa: E731
    x_q, x_k, x_v = rnd(16, e), rnd(16, e), rnd(16, e)
    ws = [rnd(e, e) for _ in range(4)]
    bs = [rnd(e) for _ in range(4)]
    mask = rnd(1, 1, 16, 16)
    dv_ = lambda t: t.to(device)  # noqa: E731
    fwd = torch_npu.npu_multi_head_attention(dv_(x_q), dv_(x_k), dv_(x_v), dv_(ws[0]), dv_(ws[1]), dv_(ws[2]),
                                             dv_(mask), dv_(ws[3]), dv_(bs[0]), dv_(bs[1]), dv_(bs[2]), dv_(bs[3]),
                                             None, heads, dim, 16, 16, p_drop, True)
    keep = _unpack_bits(fwd[1].cpu(), heads * 16 * 16).reshape(1, heads, 16, 16)
    leaves = [t.clone().requires_grad_(True) for t in [x_q, x_k, x_v] + ws + bs]
    y = _mha_ref(*leaves[:3], *leaves[3:7], *leaves[7:], mask, keep, p_drop, heads, dim)
    _close(fwd[0], y.detach(), 1e-9, 1e-9)
    g = rnd(16, e)
    r = torch.autograd.grad(y, leaves, g)
    got = torch_npu.npu_multi_head_attention_backward(
        dv_(x_q), dv_(x_k), dv_(x_v), dv_(ws[0]), dv_(ws[1]), dv_(ws[2]), dv_(ws[3]), dv_(bs[0]), dv_(bs[1]),
        dv_(bs[2]), dv_(bs[3]), fwd[2], fwd[3], fwd[4], fwd[5], fwd[6], fwd[7], dv_(g), fwd[1], heads, dim, 16, 16,
        p_drop, True)
    expected = [r[3], r[4], r[5], r[6], r[0], r[1], r[2]] + [rb.unsqueeze(0) for rb in r[7:]]
    assert [tuple(t.shape) for t in got] == [(e, e)] * 4 + [(16, e)] * 3 + [(1, e)] * 4
    for a, b in zip(got, expected):
        _close(a, b, 1e-9, 1e-9)


def test_multi_head_attention_backward_fake():
    with FakeTensorMode():
        h = _r(32, 256, dtype=f16)
        w = _r(256, 256, dtype=f16)
        heads4 = _r(2, 16, 16, 16, dtype=f16)
        got = ops.npu_multi_head_attention_backward(h, h, h, w, w, w, w, _r(256, dtype=f16), None, None, None,
                                                    heads4, heads4, heads4, heads4, heads4, h, h,
                                                    _r(0, dtype=torch.uint8), 16, 16, 16, 16, 0.0, True)
    assert [(tuple(t.shape), t.dtype) for t in got] == ([((256, 256), f16)] * 4 + [((32, 256), f16)] * 3
                                                        + [((1, 256), f16)] * 4)


# ------------------------------------------------------------------ npu_sparse_flash_attention_grad

def _sfa_ref(q, k, v, qr, kr, idx, scale, block, sparse_mode, q_lens, kv_lens, q_starts, kv_starts):
    """Documented sparse attention, float64 torch ops per (batch, key head, query row): positions of
    the listed blocks up to the first -1 and below the key length; sparse_mode 3 fills positions
    after the right-down causal limit with -1e12."""
    rows, n1, _ = q.shape
    n2 = k.shape[1]
    grp = n1 // n2
    qa = torch.cat([q, qr], -1) if qr is not None else q
    ka = torch.cat([k, kr], -1) if kr is not None else k
    out = [None] * rows
    for b, (s1, s2) in enumerate(zip(q_lens, kv_lens)):
        for i in range(s1):
            r = q_starts[b] + i
            heads_out = []
            for h in range(n2):
                pos = []
                for blk in idx[r, h].tolist():
                    if blk < 0:
                        break
                    pos += [blk * block + j for j in range(block) if blk * block + j < s2]
                rows_k = [kv_starts[b] + j for j in pos]
                logit = qa[r, h * grp:(h + 1) * grp] @ ka[rows_k, h].t() * scale
                if sparse_mode == 3:
                    late = torch.tensor([j >= s2 - s1 + i + 1 for j in pos])
                    logit = torch.where(late, torch.full_like(logit, -1e12), logit)
                heads_out.append(torch.softmax(logit, -1) @ v[rows_k, h])
            out[r] = torch.cat(heads_out)
    return torch.stack(out)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout,sparse_mode,rope", [("BSND", 3, True), ("TND", 0, False), ("TND", 3, True)])
def test_sparse_flash_attention_grad(device, layout, sparse_mode, rope):
    gen = torch.Generator().manual_seed(27)
    n1, n2, d, dr, dv, block = 4, 2, 8, 4, 6, 2
    q_lens, kv_lens = [3, 2], [7, 5]
    rnd = lambda *s: torch.randn(*s, generator=gen, dtype=torch.float64)  # noqa: E731
    if layout == "BSND":
        q, qr = rnd(2, 3, n1, d), rnd(2, 3, n1, dr)
        k, kr, v = rnd(2, 7, n2, d), rnd(2, 7, n2, dr), rnd(2, 7, n2, dv)
        idx = torch.tensor([[[[0, 2, -1], [3, 1, 0]], [[1, -1, 2], [2, 0, 3]], [[3, 0, 1], [1, 1, -1]]],
                            [[[0, 1, 2], [2, -1, -1]], [[1, 0, -1], [0, 2, 1]], [[0, 0, 0], [0, 0, 0]]]],
                           dtype=torch.int32)
        lens = dict(actual_seq_qlen=None, actual_seq_kvlen=torch.tensor([7, 5]))
        fwd_lens = dict(actual_seq_lengths_query=None, actual_seq_lengths_kv=torch.tensor([7, 5]))
        flat = lambda t: t.flatten(0, 1)  # noqa: E731
        q_starts, kv_starts, ref_q_lens = [0, 3], [0, 7], [3, 3]
    else:
        q, qr = rnd(5, n1, d), rnd(5, n1, dr)
        k, kr, v = rnd(12, n2, d), rnd(12, n2, dr), rnd(12, n2, dv)
        idx = torch.tensor([[[0, 2, -1], [3, 1, 0]], [[1, -1, 2], [2, 0, 3]], [[3, 0, 1], [1, 1, -1]],
                            [[0, 1, 2], [2, -1, -1]], [[1, 0, -1], [0, 2, 1]]], dtype=torch.int32)
        lens = dict(actual_seq_qlen=torch.tensor([3, 5]), actual_seq_kvlen=torch.tensor([7, 12]))
        fwd_lens = dict(actual_seq_lengths_query=lens["actual_seq_qlen"], actual_seq_lengths_kv=lens["actual_seq_kvlen"])
        flat = lambda t: t  # noqa: E731
        q_starts, kv_starts, ref_q_lens = [0, 3], [0, 7], q_lens
    if not rope:
        qr = kr = None
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v) + ((qr, kr) if rope else ())]
    lq, lk, lv = leaves[:3]
    lqr, lkr = (leaves[3], leaves[4]) if rope else (None, None)
    ref = _sfa_ref(flat(lq), flat(lk), flat(lv), None if lqr is None else flat(lqr),
                   None if lkr is None else flat(lkr), flat(idx), 0.3, block, sparse_mode, ref_q_lens, kv_lens,
                   q_starts, kv_starts)
    d_out = rnd(*ref.shape)
    r_grads = torch.autograd.grad(ref, leaves, d_out)
    dv_ = lambda t: None if t is None else t.to(device)  # noqa: E731
    layout_kw = dict(layout_query=layout, layout_kv=layout)
    out, smax, ssum = torch_npu.npu_sparse_flash_attention(
        dv_(q), dv_(k), dv_(v), dv_(idx), 0.3, query_rope=dv_(qr), key_rope=dv_(kr), sparse_block_size=block,
        sparse_mode=sparse_mode, return_softmax_lse=True, attention_mode=2 if rope else 0,
        **{kk: dv_(vv) for kk, vv in fwd_lens.items()}, **layout_kw)
    d_out_shaped = d_out.reshape(out.shape)
    got = torch_npu.npu_sparse_flash_attention_grad(
        dv_(q), dv_(k), dv_(v), dv_(idx), dv_(d_out_shaped), out, smax, ssum, 0.3, block, query_rope=dv_(qr),
        key_rope=dv_(kr), layout=layout, sparse_mode=sparse_mode, attention_mode=2 if rope else 0,
        **{kk: dv_(vv) for kk, vv in lens.items()})
    expected = list(r_grads[:3]) + (list(r_grads[3:]) if rope else [None, None])
    for g_, r_ in zip(got, expected):
        if r_ is None:
            assert g_.shape == (0,)
        else:
            _close(g_, r_, 1e-6, 1e-6)


def test_sparse_flash_attention_grad_fake_and_errors():
    with FakeTensorMode():
        got = ops.npu_sparse_flash_attention_grad(
            _r(1, 4, 8, 512, dtype=bf16), _r(1, 6, 1, 512, dtype=bf16), _r(1, 6, 1, 512, dtype=bf16),
            _r(1, 4, 1, 2, dtype=i32), _r(1, 4, 8, 512, dtype=bf16), _r(1, 4, 8, 512, dtype=bf16), _r(1, 1, 4, 8),
            _r(1, 1, 4, 8), 0.1, 1, query_rope=_r(1, 4, 8, 64, dtype=bf16), key_rope=_r(1, 6, 1, 64, dtype=bf16),
            attention_mode=2)
    assert [(tuple(t.shape), t.dtype) for t in got] == [((1, 4, 8, 512), bf16), ((1, 6, 1, 512), bf16),
                                                        ((1, 6, 1, 512), bf16), ((1, 4, 8, 64), bf16),
                                                        ((1, 6, 1, 64), bf16)]
    with pytest.raises(RuntimeError, match="query_rope and key_rope go together"):
        torch_npu.npu_sparse_flash_attention_grad(_r(1, 2, 2, 8), _r(1, 3, 1, 8), _r(1, 3, 1, 8),
                                                  _r(1, 2, 1, 1, dtype=i32), _r(1, 2, 2, 8), _r(1, 2, 2, 8),
                                                  _r(1, 1, 2, 2), _r(1, 1, 2, 2), 1.0, 1, query_rope=_r(1, 2, 2, 4))


# ------------------------------------------------------------------ npu_mhc_sinkhorn_backward

def _sinkhorn_ref(x, iters, eps, keep_prob_in_norm0=True):
    """Documented Sinkhorn forward in float64 torch ops; returns y and the intermediates in the
    documented out_flag=1 layouts (norm[0] = softmax(x), sum[0] unused)."""
    p = torch.softmax(x, -1)
    cur = p + eps
    norms, sums = [p], [torch.zeros_like(p[..., 0])]
    col = cur.sum(-2, keepdim=True) + eps
    cur = cur / col
    norms.append(cur)
    sums.append(col.squeeze(-2))
    for _ in range(iters - 1):
        row = cur.sum(-1, keepdim=True) + eps
        cur = cur / row
        norms.append(cur)
        sums.append(row.squeeze(-1))
        col = cur.sum(-2, keepdim=True) + eps
        cur = cur / col
        norms.append(cur)
        sums.append(col.squeeze(-2))
    lead = x.dim() - 2
    norm_out = torch.stack(norms).permute(0, lead + 1, lead + 2, *range(1, lead + 1))
    sum_out = torch.stack(sums).permute(0, lead + 1, *range(1, lead + 1))
    return cur, norm_out, sum_out


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", [(2, 3, 4, 4), (5, 6, 6)])
def test_mhc_sinkhorn_backward_matches_autograd(device, shape):
    gen = torch.Generator().manual_seed(28)
    x = torch.randn(shape, generator=gen, dtype=torch.float64)
    leaf = x.clone().requires_grad_(True)
    y, norm, sums = _sinkhorn_ref(leaf, 4, 1e-6)
    g = torch.randn(shape, generator=gen, dtype=torch.float64)
    (ref,) = torch.autograd.grad(y, leaf, g)
    got = torch_npu.npu_mhc_sinkhorn_backward(g.to(device), norm.detach().to(device), sums.detach().to(device))
    assert got.shape == shape and got.dtype == torch.float64
    _close(got, ref, 1e-10, 1e-10)
    # with the emulated forward's intermediates (float32)
    _, norm32, sum32 = torch_npu.npu_mhc_sinkhorn(x.float().to(device), eps=1e-6, num_iters=4, out_flag=1)
    got32 = torch_npu.npu_mhc_sinkhorn_backward(g.float().to(device), norm32, sum32)
    assert got32.dtype == torch.float32
    _close(got32, ref, 1e-4, 1e-4)


def test_mhc_sinkhorn_backward_fake_and_errors():
    with FakeTensorMode():
        out = ops.npu_mhc_sinkhorn_backward(_r(2, 3, 4, 4), _r(40, 4, 4, 2, 3), _r(40, 4, 2, 3))
    assert out.shape == (2, 3, 4, 4) and out.dtype == f32
    with pytest.raises(RuntimeError, match="sum must be"):
        torch_npu.npu_mhc_sinkhorn_backward(torch.zeros(5, 4, 4), torch.zeros(8, 4, 4, 5), torch.zeros(8, 4, 4))


# ------------------------------------------------------------------ npu_fused_attention_layernorm_qkv_fwd / qkv_grad

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype,atol", [(torch.float32, 1e-5), (torch.float16, 4e-3)])
def test_fused_attention_layernorm_qkv_fwd(device, dtype, atol):
    gen = torch.Generator().manual_seed(29)
    rows, hidden, seq, heads = 6, 8, 3, 2
    x = torch.randn(rows, hidden, generator=gen)
    ws = [torch.randn(hidden, hidden, generator=gen) * 0.3 for _ in range(3)]
    bs = [torch.randn(hidden, generator=gen) for _ in range(3)]
    gamma, beta = torch.randn(hidden, generator=gen), torch.randn(hidden, generator=gen)
    c = lambda t: t.to(dtype).to(device)  # noqa: E731
    got = torch_npu.npu_fused_attention_layernorm_qkv_fwd(c(x), c(ws[0]), c(ws[1]), c(ws[2]), c(gamma), c(beta),
                                                          c(bs[0]), c(bs[1]), None, seq_len=seq, num_heads=heads,
                                                          eps=1e-5)
    xd = x.to(dtype).double()
    mu = xd.sum(-1, keepdim=True) / hidden
    var = ((xd - mu) ** 2).sum(-1, keepdim=True) / hidden
    rstd = 1 / torch.sqrt(var + 1e-5)
    norm = (xd - mu) * rstd * gamma.to(dtype).double() + beta.to(dtype).double()
    def heads_of(y):
        return y.reshape(rows // seq, seq, heads, hidden // heads).permute(0, 2, 1, 3)
    refs = [norm] + [heads_of(norm @ w.to(dtype).double() + (b.to(dtype).double() if b is not None else 0))
                     for w, b in zip(ws, bs[:2] + [None])] + [mu.squeeze(-1), rstd.squeeze(-1)]
    assert [tuple(t.shape) for t in got] == [(6, 8), (2, 2, 3, 4), (2, 2, 3, 4), (2, 2, 3, 4), (6,), (6,)]
    assert all(t.dtype == dtype for t in got)
    for a, b in zip(got, refs):
        _close(a, b, atol * 4, atol * 4)


@pytest.mark.parametrize("device", DEVICES)
def test_fused_attention_qkv_grad(device):
    gen = torch.Generator().manual_seed(30)
    rows, hidden = 6, 8
    rnd = lambda *s: torch.randn(*s, generator=gen, dtype=torch.float64)  # noqa: E731
    h = rnd(rows, hidden).requires_grad_(True)
    ws = [rnd(hidden, hidden).requires_grad_(True) for _ in range(3)]
    bs = [rnd(hidden).requires_grad_(True) for _ in range(3)]
    gs = [rnd(rows, hidden) for _ in range(3)]
    g_ln = rnd(rows, hidden)
    loss = sum(((h @ w + b) * g).sum() for w, b, g in zip(ws, bs, gs)) + (h * g_ln).sum()
    r = torch.autograd.grad(loss, [h] + ws + bs)
    d = lambda t: t.detach().to(device)  # noqa: E731
    got = torch_npu.npu_fused_attention_qkv_grad(d(gs[0]), d(gs[1]), d(gs[2]), d(ws[0]), d(ws[1]), d(ws[2]), d(h),
                                                 d(g_ln))
    assert [tuple(t.shape) for t in got] == [(6, 8)] + [(8, 8)] * 3 + [(8,)] * 3
    for a, b in zip(got, r):
        _close(a, b, 1e-10, 1e-10)


def test_fused_attention_ln_qkv_fake_and_errors():
    with FakeTensorMode():
        got = ops.npu_fused_attention_layernorm_qkv_fwd(_r(64, 96, dtype=f16), _r(96, 96, dtype=f16),
                                                        _r(96, 96, dtype=f16), _r(96, 96, dtype=f16),
                                                        _r(96, dtype=f16), _r(96, dtype=f16), seq_len=32, num_heads=3)
        grads = ops.npu_fused_attention_qkv_grad(*([_r(64, 96, dtype=f16)] * 3), *([_r(96, 96, dtype=f16)] * 3),
                                                 _r(64, 96, dtype=f16), _r(64, 96, dtype=f16))
    assert [tuple(t.shape) for t in got] == [(64, 96), (2, 3, 32, 32), (2, 3, 32, 32), (2, 3, 32, 32), (64,), (64,)]
    assert [tuple(t.shape) for t in grads] == [(64, 96)] + [(96, 96)] * 3 + [(96,)] * 3
    with pytest.raises(RuntimeError, match="divisible by seq_len"):
        torch_npu.npu_fused_attention_layernorm_qkv_fwd(torch.randn(5, 8), *([torch.randn(8, 8)] * 3),
                                                        torch.randn(8), torch.randn(8), seq_len=2, num_heads=2)


# ------------------------------------------------------------------ npu_nsa_compress_infer.cache

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype,atol", [(torch.float16, 2e-2), (torch.bfloat16, 1.5e-1)])
def test_nsa_compress_infer_cache(device, dtype, atol):
    gen = torch.Generator().manual_seed(31)
    page, n, d, block, stride = 16, 2, 16, 32, 16
    kv = torch.randn(6, page, n, d, generator=gen).to(dtype)
    w = torch.randn(block, n, generator=gen).to(dtype)
    table = torch.tensor([[4, 1, 3], [0, 5, 2], [2, 0, 1]], dtype=torch.int32)
    lens = [48, 40, 32]            # batch 1: (40-32) % 16 != 0 -> untouched
    slots = torch.tensor([3, 0, 1], dtype=torch.int32)
    cache = torch.full((5, n, d), 7.0).to(dtype)
    expected = cache.double().clone()
    for b, s in enumerate(lens):
        if s >= block and (s - block) % stride == 0:
            acc_ = torch.zeros(n, d, dtype=torch.float64)
            for j in range(block):
                t = s - block + j
                acc_ += kv[int(table[b, t // page]), t % page].double() * w[j].double().unsqueeze(-1)
            expected[int(slots[b])] = acc_
    c = cache.to(device)
    out = torch.ops.npu.npu_nsa_compress_infer.cache(kv.to(device), w.to(device), slots.to(device), block, stride,
                                                     page, block_table=table.to(device), actual_seq_len=lens, cache=c)
    assert out is c and out.dtype == dtype
    _close(out, expected, atol, 1e-2)


def test_nsa_compress_infer_cache_fake_and_errors():
    with FakeTensorMode():
        c = _r(8, 2, 16, dtype=f16)
        out = ops.npu_nsa_compress_infer.cache(_r(4, 128, 2, 16, dtype=f16), _r(32, 2, dtype=f16), _r(2, dtype=i32),
                                               32, 16, 128, block_table=_r(2, 2, dtype=i32), actual_seq_len=[48, 70],
                                               cache=c)
    assert out is c
    with pytest.raises(RuntimeError, match="weight must be"):
        torch.ops.npu.npu_nsa_compress_infer.cache(torch.zeros(2, 16, 1, 16), torch.zeros(16, 2), torch.zeros(1).int(),
                                                   16, 16, 16, block_table=torch.zeros(1, 2).int(),
                                                   actual_seq_len=[16], cache=torch.zeros(2, 1, 16))


# ------------------------------------------------------------------ npu_nsa_compress_attention

def _compress_attention_ref(q, k, v, scale, cblock, stride, sblock, count, topk_mask, mask, cum_q, cum_k, cum_s):
    """The op-plugin golden's formula as float64 loops."""
    n1, n2 = q.shape[1], v.shape[1]
    grp = n1 // n2
    m, n = sblock // stride, cblock // stride
    inner = m + n - 1
    times = [min(j + 1 if j < inner / 2 else inner - j, n) for j in range(inner)]
    outs, maxes, sums, tops = [], [], [], []
    for b in range(len(cum_q)):
        q0, k0, s_0 = (0, 0, 0) if b == 0 else (cum_q[b - 1], cum_k[b - 1], cum_s[b - 1])
        s1, s2, nsel = cum_q[b] - q0, cum_k[b] - k0, cum_s[b] - s_0
        p = torch.zeros(n1, s1, s2, dtype=torch.float64)
        for h in range(n1):
            logit = q[q0:q0 + s1, h].double() @ k[k0:k0 + s2, h // grp].double().t() * scale
            if mask is not None:
                logit = logit - 40000.0 * mask[:s1, :s2].double()
            mx = logit.max(-1, keepdim=True).values
            e = torch.exp(logit - mx)
            p[h] = e / e.sum(-1, keepdim=True)
            maxes.append(mx.squeeze(-1))
            sums.append(e.sum(-1))
        outs.append(torch.einsum("hst,thd->shd", p, v[k0:k0 + s2].double().repeat_interleave(grp, dim=1)))
        top = torch.zeros(s1, n2, count, dtype=torch.int64)
        for g2 in range(n2):
            for s in range(s1):
                scores = []
                for jb in range(nsel):
                    val = 0.0
                    for j in range(inner):
                        t = m * (jb + 1) - j
                        if 0 <= t < s2:
                            val += times[j] * float(p[g2 * grp:(g2 + 1) * grp, s, t].sum())
                    if topk_mask is not None and bool(topk_mask[s, jb]):
                        val = 23333.0
                    scores.append(val)
                order = sorted(range(nsel), key=lambda j: (-scores[j], j))
                top[s, g2] = torch.tensor(order[:count])
        tops.append(top)
    mx = torch.cat([torch.stack(maxes[i * n1:(i + 1) * n1], 1) for i in range(len(cum_q))])
    sm = torch.cat([torch.stack(sums[i * n1:(i + 1) * n1], 1) for i in range(len(cum_q))])
    return torch.cat(outs), torch.cat(tops), mx, sm


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("masks", [False, True])
def test_nsa_compress_attention(device, masks):
    gen = torch.Generator().manual_seed(32)
    cum_q, cum_k, cum_s = [3, 8], [10, 21], [3, 6]
    q = torch.randn(8, 4, 16, generator=gen).half()
    k = torch.randn(21, 2, 16, generator=gen).half()
    v = torch.randn(21, 2, 8, generator=gen).half()
    topk_mask = torch.eye(5, 3, dtype=torch.bool) if masks else None
    mask = torch.ones(5, 11).triu(4).to(torch.uint8) if masks else None
    out, top, mx, sm = torch_npu.npu_nsa_compress_attention(
        q.to(device), k.to(device), v.to(device), 0.3, 4, 32, 16, 64, 2,
        topk_mask=None if topk_mask is None else topk_mask.to(device), atten_mask=None if mask is None else
        mask.to(device), actual_seq_qlen=cum_q, actual_cmp_seq_kvlen=cum_k, actual_sel_seq_kvlen=cum_s)
    r_out, r_top, r_mx, r_sm = _compress_attention_ref(q, k, v, 0.3, 32, 16, 64, 2, topk_mask, mask, cum_q, cum_k,
                                                       cum_s)
    assert out.shape == (8, 4, 8) and out.dtype == torch.float16
    assert top.dtype == torch.int32 and torch.equal(top.cpu().long(), r_top)
    assert mx.shape == (8, 4, 8) and mx.dtype == torch.float32
    _close(out, r_out, 3e-3, 1e-2)
    _close(mx, r_mx.unsqueeze(-1).expand(8, 4, 8), 1e-3, 1e-3)
    _close(sm, r_sm.unsqueeze(-1).expand(8, 4, 8), 1e-3, 1e-3)


def test_nsa_compress_attention_fake_and_errors():
    with FakeTensorMode():
        res = ops.npu_nsa_compress_attention(_r(6, 4, 192, dtype=bf16), _r(5, 2, 192, dtype=bf16),
                                             _r(5, 2, 128, dtype=bf16), 0.1, 4, 32, 16, 64, 2, actual_seq_qlen=[6],
                                             actual_cmp_seq_kvlen=[5], actual_sel_seq_kvlen=[2])
    assert [(tuple(t.shape), t.dtype) for t in res] == [((6, 4, 128), bf16), ((6, 2, 2), i32), ((6, 4, 8), f32),
                                                        ((6, 4, 8), f32)]
    with pytest.raises(NotImplementedError, match="select_block_count 3 exceeds"):
        torch_npu.npu_nsa_compress_attention(torch.zeros(2, 2, 16).half(), torch.zeros(4, 2, 16).half(),
                                             torch.zeros(4, 2, 16).half(), 1.0, 2, 32, 16, 64, 3, actual_seq_qlen=[2],
                                             actual_cmp_seq_kvlen=[4], actual_sel_seq_kvlen=[2])
