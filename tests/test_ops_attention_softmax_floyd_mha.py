"""Attention ops: npu_masked_softmax_with_rel_pos_bias, npu_attention_update, npu_attn_softmax_
(+ backward), npu_fused_floyd_attention (+ backward), npu_multi_head_attention_backward and
npu_fused_attention_layernorm_qkv_fwd / npu_fused_attention_qkv_grad: emulated ones against float64 references written here from the
documented formulas; meta-only ones through FakeTensorMode (shapes/dtypes from the docs) and
the NotImplementedError of a real call."""
import math

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import torch_npu  # noqa: F401

from _op_helpers import DEVICES, close_tol as _close, zeros as _r

ops = torch.ops.npu
LOW = [(torch.float16, 2e-3, 2e-3), (torch.bfloat16, 2e-2, 2e-2)]


# ------------------------------------------------------------------ npu_interleave_rope


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


# ------------------------------------------------------------------ npu_nsa_compress / _grad


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


# ------------------------------------------------------------------ npu_fused_infer_attention_score.out / infer_output


# ------------------------------------------------------------------ Meta-only ops
# Each case: overload name, a call building its inputs, the expected (shape, dtype) of every
# tensor output, written from the op's documentation / op-plugin allocation code.

f16, bf16, f32, i32 = torch.float16, torch.bfloat16, torch.float32, torch.int32


# ------------------------------------------------------------------ npu_nsa_select_attention (+ grad)


# ------------------------------------------------------------------ npu_mhc_pre (+ backward)


# ------------------------------------------------------------------ npu_lightning_indexer_grad


# ------------------------------------------------------------------ npu_fused_infer_attention_score_v2 (+ .out)


# ------------------------------------------------------------------ npu_chunk_gated_delta_rule


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


# ------------------------------------------------------------------ npu_mhc_sinkhorn_backward


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


# ------------------------------------------------------------------ npu_nsa_compress_attention
