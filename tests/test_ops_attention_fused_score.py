"""npu_dropout_with_add_softmax, npu_fused_attention_score (+fwd/backward/grad) and
npu_multi_head_attention against references written here in float64 from the documented
formulas (plain loops for the softmax rows, torch matmuls only in float64)."""
import math

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import torch_npu

from _op_helpers import DEVICES

DTYPES = [(torch.float32, 1e-5), (torch.float16, 2e-3), (torch.bfloat16, 2e-2)]


def softmax_rows(t):
    """float64 softmax over the last dim, one row at a time."""
    rows = t.double().reshape(-1, t.shape[-1]).tolist()
    out = []
    for r in rows:
        m = max(r)
        e = [math.exp(v - m) for v in r]
        s = sum(e)
        out.append([v / s for v in e])
    return torch.tensor(out, dtype=torch.float64).reshape(t.shape)


def rand(shape, seed, dtype=torch.float32):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


# ------------------------------------------------------------------ dropout_with_add_softmax


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype,tol", DTYPES)
def test_dropout_with_add_softmax(device, dtype, tol):
    x, x1 = rand((2, 3, 4, 16), 0, dtype), rand((2, 3, 4, 16), 1, dtype)
    torch.manual_seed(5)
    torch.npu.manual_seed(5)  # the generator of the input's device draws the mask
    mask, soft, out = torch_npu.npu_dropout_with_add_softmax(x.to(device), x1.to(device), 0.5, 0.25, -1)
    n = x.numel()
    assert mask.dtype == torch.uint8 and mask.shape == ((n + 127) // 128 * 128,)
    assert soft.dtype == dtype and out.dtype == dtype and out.device.type == device
    keep = mask.cpu()[:n].reshape(x.shape).double()
    assert set(mask.cpu().tolist()) <= {0, 1} and mask.cpu()[n:].sum() == 0
    assert 0.5 < keep.mean() < 0.95  # about 1 - 0.25 kept
    ref = softmax_rows(x1.double() + 0.5 * x.double())
    torch.testing.assert_close(soft.cpu().double(), ref, rtol=tol, atol=tol)
    torch.testing.assert_close(out.cpu().double(), ref * keep / 0.75, rtol=tol, atol=tol * 2)
    torch.manual_seed(5)
    torch.npu.manual_seed(5)  # the generator of the input's device draws the mask
    mask2, _, _ = torch_npu.npu_dropout_with_add_softmax(x.to(device), x1.to(device), 0.5, 0.25, -1)
    assert torch.equal(mask.cpu(), mask2.cpu())


def test_dropout_with_add_softmax_no_drop_and_grad():
    x = rand((2, 8), 2, torch.float64).requires_grad_()
    x1 = rand((2, 8), 3, torch.float64).requires_grad_()
    mask, soft, out = torch_npu.npu_dropout_with_add_softmax(x, x1, 2.0, 0.0, -1)
    assert mask[:16].sum() == 16
    torch.testing.assert_close(out, softmax_rows(x1 + 2.0 * x))
    g = rand((2, 8), 4, torch.float64)
    out.backward(g)
    s = softmax_rows(x1.detach() + 2.0 * x.detach())
    ds = s * (g - (g * s).sum(-1, keepdim=True))
    torch.testing.assert_close(x1.grad, ds)
    torch.testing.assert_close(x.grad, 2.0 * ds)
    # backward op: (alpha * dS with the mask, grad) as the torch_npu wrapper returns
    gs, gx = torch_npu.npu_dropout_with_add_softmax_backward(g, mask, s, 2.0, 0.0, -1)
    torch.testing.assert_close(gs, 2.0 * ds)
    torch.testing.assert_close(gx, g)
    torch.autograd.gradcheck(lambda a, b: torch_npu.npu_dropout_with_add_softmax(a, b, 0.7, 0.0, -1)[2],
                             (x.detach().requires_grad_(), x1.detach().requires_grad_()))


def test_dropout_with_add_softmax_meta():
    with FakeTensorMode():
        x = torch.empty(4, 2, 8, 16)
        mask, soft, out = torch_npu.npu_dropout_with_add_softmax(x, x, 1.0, 0.1, -1)
    assert mask.shape == (1024,) and soft.shape == x.shape and out.shape == x.shape


# ------------------------------------------------------------------ fused attention score


def ref_attention_score(q, k, v, mask, scale, keep):
    b, n, s, d = q.shape
    logits = q.double() @ k.double().transpose(-1, -2) * scale + mask.double()
    p = softmax_rows(logits)
    ctx = (p * keep / (keep.new_tensor(1.0) if keep.dtype != torch.float64 else 1.0)) @ v.double()
    return p, ctx.permute(0, 2, 1, 3).reshape(b * s, n * d)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype,tol", DTYPES)
def test_fused_attention_score_fwd(device, dtype, tol):
    q, k, v = (rand((2, 2, 8, 4), i, dtype) for i in range(3))
    mask = torch.where(rand((2, 1, 8, 8), 7) > 0.5, -10000.0, 0.0).to(dtype)
    ctx, p, dmask = torch_npu.npu_fused_attention_score_fwd(q.to(device), k.to(device), v.to(device),
                                                            mask.to(device), 0.5, 1.0)
    rp, rctx = ref_attention_score(q, k, v, mask, 0.5, torch.ones(1, dtype=torch.float64))
    assert ctx.shape == (16, 8) and p.shape == (2, 2, 8, 8) and dmask.shape == (256,)
    assert ctx.dtype == dtype and ctx.device.type == device and dmask.dtype == torch.uint8
    assert torch.all(dmask.cpu() == 1)
    torch.testing.assert_close(p.cpu().double(), rp, rtol=tol, atol=tol)
    torch.testing.assert_close(ctx.cpu().double(), rctx, rtol=tol * 4, atol=tol * 4)
    # keep_prob < 1: kept entries scaled by 1 / keep_prob; the mask says which
    ctx, p, dmask = torch_npu.npu_fused_attention_score_fwd(q.to(device), k.to(device), v.to(device),
                                                            mask.to(device), 0.5, 0.8)
    keep = dmask.cpu().reshape(2, 2, 8, 8).double()
    assert 0.5 < keep.mean() < 1.0
    rctx = ((rp * keep / 0.8) @ v.double()).permute(0, 2, 1, 3).reshape(16, 8)
    torch.testing.assert_close(ctx.cpu().double(), rctx, rtol=tol * 4, atol=tol * 4)


def test_fused_attention_score_grad_ops_and_autograd():
    q, k, v = (rand((1, 2, 4, 3), 10 + i, torch.float64).requires_grad_() for i in range(3))
    mask = torch.zeros(1, 1, 4, 4, dtype=torch.float64)
    torch.autograd.gradcheck(lambda a, b, c: torch_npu.npu_fused_attention_score(a, b, c, mask, 0.3, 1.0),
                             (q, k, v))
    out = torch_npu.npu_fused_attention_score(q, k, v, mask, 0.3, 1.0)
    g = rand(out.shape, 20, torch.float64)
    out.backward(g)
    ctx, p, dmask = torch_npu.npu_fused_attention_score_fwd(q, k, v, mask, 0.3, 1.0)
    dq, dk, dv = torch_npu.npu_fused_attention_score_backward(g, p, q, k, v, dmask, 0.3, 1.0)
    for got, want in ((dq, q.grad), (dk, k.grad), (dv, v.grad)):
        assert got.shape == (1, 2, 4, 3)
        torch.testing.assert_close(got, want)
    flat = torch_npu.npu_fused_attention_score_grad(g, p, q, k, v, dmask, 0.3, 1.0)
    for got, want in zip(flat, (q.grad, k.grad, v.grad)):
        torch.testing.assert_close(got, want.permute(0, 2, 1, 3).reshape(4, 6))


def test_fused_attention_score_flags_and_meta():
    q = torch.ones(1, 1, 4, 2)
    with pytest.raises(NotImplementedError, match="transpose flags"):
        torch_npu.npu_fused_attention_score(q, q, q, torch.zeros(1, 1, 4, 4), 1.0, 1.0, query_transpose=True)
    with FakeTensorMode():
        q = torch.empty(2, 4, 32, 8, dtype=torch.float16)
        ctx, p, m = torch_npu.npu_fused_attention_score_fwd(q, q, q, torch.empty(2, 1, 32, 32), 0.1, 0.9)
    assert ctx.shape == (64, 32) and p.shape == (2, 4, 32, 32) and m.shape == (8192,)


# ------------------------------------------------------------------ multi-head attention

H, DH, T, S, B = 16, 16, 16, 32, 2
E = H * DH


def mha_args(dtype, device, prob=0.0):
    g = torch.Generator().manual_seed(3)

    def r(*shape, scale=1.0):
        return (torch.rand(shape, generator=g) * 2 - 1).mul(scale).to(dtype).to(device)

    return dict(query=r(B * T, E), key=r(B * S, E), value=r(B * S, E), query_weight=r(E, E, scale=0.1),
                key_weight=r(E, E, scale=0.1), value_weight=r(E, E, scale=0.1),
                attn_mask=r(B, H, T, S), out_proj_weight=r(E, E, scale=0.1), query_bias=r(E),
                key_bias=r(E), value_bias=r(E), out_proj_bias=r(E), dropout_mask=None,
                attn_head_num=H, attn_dim_per_head=DH, src_len=S, tgt_len=T, dropout_prob=prob,
                softmax_use_float=True)


def ref_mha(a, keep=None, prob=0.0):
    d = {k: (v.cpu().double() if isinstance(v, torch.Tensor) else v) for k, v in a.items()}

    def lin(x, w, bias):
        return x @ w.T + bias

    def heads(x, n):
        return x.reshape(B, n, H, DH).permute(0, 2, 1, 3)

    q = heads(lin(d["query"], d["query_weight"], d["query_bias"]) / math.sqrt(DH), T)
    k = heads(lin(d["key"], d["key_weight"], d["key_bias"]), S)
    v = heads(lin(d["value"], d["value_weight"], d["value_bias"]), S)
    scores = softmax_rows(q @ k.transpose(-1, -2) + d["attn_mask"])
    probs = scores if keep is None else scores * keep / (1 - prob)
    ctx = (probs @ v).permute(0, 2, 1, 3).reshape(B * T, E)
    return lin(ctx, d["out_proj_weight"], d["out_proj_bias"]), q, k, v, scores, probs, ctx


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype,tol", DTYPES)
def test_multi_head_attention(device, dtype, tol):
    a = mha_args(dtype, device)
    y, mask, q, k, v, scores, probs, ctx = torch_npu.npu_multi_head_attention(**a)
    ry, rq, rk, rv, rscores, rprobs, rctx = ref_mha(a)
    assert mask.dtype == torch.uint8 and mask.numel() == B * H * T * S // 8
    assert scores.dtype == torch.float32 and y.dtype == dtype and y.device.type == device
    assert q.shape == (B, H, T, DH) and k.shape == (B, H, S, DH) and ctx.shape == (B * T, E)
    for got, want, f in ((q, rq, 1), (k, rk, 1), (v, rv, 1), (scores, rscores, 1), (probs, rprobs, 1),
                         (ctx, rctx, 4), (y, ry, 8)):
        torch.testing.assert_close(got.cpu().double(), want, rtol=tol * f, atol=tol * f)


def test_multi_head_attention_given_mask_and_grad():
    a = mha_args(torch.float64, "cpu", prob=0.5)
    n = B * H * T * S
    keep = rand((n,), 9) > 0
    bits = torch.zeros(n // 8, dtype=torch.uint8)
    for i in range(n):
        if keep[i]:
            bits[i // 8] |= 1 << (i % 8)
    a["dropout_mask"] = bits
    ry, *_ = ref_mha(a, keep.reshape(B, H, T, S).double(), 0.5)
    a["query"].requires_grad_()
    a["value_weight"].requires_grad_()
    y, mask, *_ = torch_npu.npu_multi_head_attention(**a)
    assert torch.equal(mask, bits)
    torch.testing.assert_close(y.detach(), ry)
    y.sum().backward()
    assert a["query"].grad.abs().sum() > 0 and a["value_weight"].grad.abs().sum() > 0
    # the mask drawn by the op is the bit-packed one of _npu_dropout: about half the bits set
    a2 = mha_args(torch.float32, "npu", prob=0.5)
    _, m2, *_ = torch_npu.npu_multi_head_attention(**a2)
    frac = sum(bin(b).count("1") for b in m2.cpu().tolist()) / n
    assert 0.4 < frac < 0.6


def test_multi_head_attention_errors_and_meta():
    a = mha_args(torch.float32, "cpu")
    a["tgt_len"] = 8
    with pytest.raises(RuntimeError, match="should align to 16"):
        torch_npu.npu_multi_head_attention(**a)
    with FakeTensorMode():
        a = mha_args(torch.float16, "cpu")
        a = {k: (torch.empty(v.shape, dtype=v.dtype) if isinstance(v, torch.Tensor) else v) for k, v in a.items()}
        out = torch_npu.npu_multi_head_attention(**a)
    assert out[0].shape == (B * T, E) and out[5].dtype == torch.float32 and out[6].shape == (B, H, T, S)
