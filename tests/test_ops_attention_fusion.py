"""npu_fusion_attention(_v2) and their grad ops on the CPU-emulated NPU.

Checked against an independent float64 reference written here from the documented formula
``Dropout(Softmax(Mask(scale * (pse + q k^T), atten_mask)), keep_prob) @ v`` (per-head loop
over [B, S, N, D] data, key/value heads shared by ``N / N_kv`` query heads), with the
sparse-mode masks written from the documentation's descriptions (triu/tril of the
documented diagonals), forward values, softmax_max / softmax_sum and gradients vs
autograd of the reference; TND varlen against per-batch references and against the
documented "outer cut" examples of sparse_mode 7/8; dropout reproducibility, keep
fraction and mask reuse by the grad op; CPU and npu inputs; float32/float16/bfloat16;
gradcheck in float64; FakeTensor shapes; peak memory below one score matrix.
"""
import pytest
import torch

import torch_npu
from torch_npu.op_plugin.attention import flash as attention_flash

from _op_helpers import DEVICES, randn as rand

FWD_TOL = {torch.float32: (1e-5, 1e-5), torch.float16: (2e-3, 2e-3), torch.bfloat16: (2e-2, 2e-2)}
GRAD_TOL = {torch.float32: (1e-4, 1e-4), torch.float16: (1e-2, 1e-2), torch.bfloat16: (6e-2, 6e-2)}
BIG = 2147483647


# ------------------------------------------------------------------ reference


def to_bsnd(x, layout, n):
    """Reference layout -> [B, S, N, D] (written independently of the op)."""
    if layout == "BSH":
        b, s, h = x.shape
        return x.reshape(b, s, n, h // n)
    if layout == "SBH":
        s, b, h = x.shape
        return x.permute(1, 0, 2).reshape(b, s, n, h // n)
    if layout == "BSND":
        return x
    return x.permute(0, 2, 1, 3)  # BNSD


def from_bsnd(x, layout):
    b, s, n, d = x.shape
    if layout == "BSH":
        return x.reshape(b, s, n * d)
    if layout == "SBH":
        return x.reshape(b, s, n * d).permute(1, 0, 2)
    if layout == "BSND":
        return x
    return x.permute(0, 2, 1, 3)


def ref_attention(q, k, v, n, layout, n_kv=None, pse=None, mask=None, scale=1.0, keep=None, keep_prob=1.0,
                  pse_type=1):
    """float64 reference; ``mask`` bool broadcastable to [B, N, S1, S2], True = masked;
    ``keep`` bool [B, N, S1, S2] dropout keep mask. Fully masked rows give zeros.
    Returns (out in layout, row max [B,N,S1], row sum [B,N,S1])."""
    n_kv = n if n_kv is None else n_kv
    qs, ks, vs = to_bsnd(q, layout, n), to_bsnd(k, layout, n_kv), to_bsnd(v, layout, n_kv)
    b, s1, _, d = qs.shape
    s2 = ks.shape[1]
    outs, maxes, sums = [], [], []
    for h in range(n):
        kv = h // (n // n_kv)
        x = torch.einsum("bid,bjd->bij", qs[:, :, h], ks[:, :, kv])
        if pse is not None:
            ph = pse.expand(b, n, s1, s2)[:, h]
            x = scale * (x + ph) if pse_type == 1 else scale * x + ph
        else:
            x = scale * x
        if mask is not None:
            x = x.masked_fill(mask.expand(b, n, s1, s2)[:, h], float("-inf"))
        m = x.max(-1).values
        live = ~torch.isneginf(m)
        e = torch.exp(x - torch.where(live, m, torch.zeros_like(m)).unsqueeze(-1))
        ssum = e.sum(-1)
        y = e / torch.where(live, ssum, torch.ones_like(ssum)).unsqueeze(-1)
        if keep is not None:
            y = y * keep[:, h].to(y.dtype) / keep_prob
        outs.append(torch.einsum("bij,bjd->bid", y, vs[:, :, kv]))
        maxes.append(m)
        sums.append(ssum)
    out = torch.stack(outs, 2)
    return from_bsnd(out, layout), torch.stack(maxes, 1), torch.stack(sums, 1)


# masks from the documentation's pictures: True = masked, d = j - i
def left_up(s1, s2):
    return torch.ones(s1, s2, dtype=torch.bool).triu(1)


def right_down(s1, s2):
    return torch.ones(s1, s2, dtype=torch.bool).triu(1 + s2 - s1)


def band(s1, s2, pre, nxt, shift):
    ones = torch.ones(s1, s2, dtype=torch.bool)
    return ones.triu(nxt + 1 + shift) | ones.tril(-pre - 1 + shift)


def shape_of(layout, b, s, n, d):
    return {"BSH": (b, s, n * d), "SBH": (s, b, n * d), "BSND": (b, s, n, d), "BNSD": (b, n, s, d)}[layout]


def run_case(device, dtype, layout, b=2, s1=5, s2=7, n=4, n_kv=4, d=8, pse=False, mask=None,
             sparse_mode=0, scale=0.35, ref_mask=None, pass_mask=True, pre=BIG, nxt=BIG, prefix=None,
             op=None, pse_type=1):
    q = rand(shape_of(layout, b, s1, n, d), dtype, device, 1).requires_grad_()
    k = rand(shape_of(layout, b, s2, n_kv, d), dtype, device, 2).requires_grad_()
    v = rand(shape_of(layout, b, s2, n_kv, d), dtype, device, 3).requires_grad_()
    p = rand((b, n, s1, s2), dtype, device, 4).requires_grad_() if pse else None
    am = mask.to(device) if (mask is not None and pass_mask) else None
    if op is None:
        res = torch_npu.npu_fusion_attention(q, k, v, n, layout, pse=p, atten_mask=am, scale=scale,
                                             sparse_mode=sparse_mode, pre_tockens=pre, next_tockens=nxt,
                                             prefix=prefix)
    else:
        res = op(q, k, v, n, layout, pse=p, atten_mask=am, scale=scale, sparse_mode=sparse_mode, pre_tokens=pre,
                 next_tokens=nxt, prefix=prefix, pse_type=pse_type)
    out, smax, ssum, sout, seed, offset, numels = res
    rq, rk, rv = (t.detach().cpu().double().requires_grad_() for t in (q, k, v))
    rp = p.detach().cpu().double().requires_grad_() if pse else None
    rout, rmax, rsum = ref_attention(rq, rk, rv, n, layout, n_kv, rp, ref_mask if ref_mask is not None else mask,
                                     scale, pse_type=pse_type)
    assert out.shape == q.shape and out.dtype == dtype and out.device.type == device
    rtol, atol = FWD_TOL[dtype]
    torch.testing.assert_close(out.cpu().double(), rout, rtol=rtol, atol=atol)
    assert smax.shape == (b, n, s1, 8) and ssum.shape == (b, n, s1, 8)
    assert smax.dtype == torch.float32 and ssum.dtype == torch.float32
    srtol = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(smax.cpu().double(), rmax.unsqueeze(-1).expand(b, n, s1, 8), rtol=srtol, atol=srtol)
    torch.testing.assert_close(ssum.cpu().double(), rsum.unsqueeze(-1).expand(b, n, s1, 8), rtol=srtol, atol=srtol)
    assert sout.numel() == 0
    assert (seed, offset, numels) == (0, 0, b * n * s1 * s2)
    dy = rand(out.shape, torch.float64, "cpu", 5)
    out.backward(dy.to(dtype).to(device))
    rout.backward(dy.to(dtype).double())
    grtol, gatol = GRAD_TOL[dtype]
    pairs = [(q.grad, rq.grad), (k.grad, rk.grad), (v.grad, rv.grad)] + ([(p.grad, rp.grad)] if pse else [])
    for got, ref in pairs:
        assert got.dtype == dtype and got.device.type == device
        torch.testing.assert_close(got.cpu().double(), ref, rtol=grtol, atol=gatol)


# ---------------------------------------------------------------------- fixed-length layouts


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", ["BSH", "SBH", "BSND", "BNSD"])
def test_layouts(device, layout):
    run_case(device, torch.float32, layout)


def test_layout_is_case_insensitive():
    q = rand((1, 3, 8))
    a = torch_npu.npu_fusion_attention(q, q, q, 2, "bsh")[0]
    b = torch_npu.npu_fusion_attention(q, q, q, 2, "BSH")[0]
    torch.testing.assert_close(a, b)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", ["BSH", "BNSD"])
def test_gqa(device, layout):
    run_case(device, torch.float32, layout, n=6, n_kv=2)
    run_case(device, torch.float32, layout, n=4, n_kv=1, pse=True)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mshape", ["s1s2", "b1", "bn", "11"])
def test_atten_mask_sparse0_and_1(device, mshape):
    b, n, s1, s2 = 2, 4, 5, 7
    shape = {"s1s2": (s1, s2), "b1": (b, 1, s1, s2), "bn": (b, n, s1, s2), "11": (1, 1, s1, s2)}[mshape]
    m = torch.rand(shape, generator=torch.Generator().manual_seed(7)) < 0.4
    run_case(device, torch.float32, "BSND", b=b, s1=s1, s2=s2, n=n, mask=m, pse=True)
    run_case(device, torch.float32, "BSND", b=b, s1=s1, s2=s2, n=n, mask=m.to(torch.uint8), ref_mask=m)
    # allMask ignores pre/next
    run_case(device, torch.float32, "BSND", b=b, s1=s1, s2=s2, n=n, mask=m, sparse_mode=1, pre=0, nxt=0)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("s1,s2", [(6, 6), (4, 9), (7, 5)])
def test_sparse0_band_top_left(device, s1, s2):
    # sparse_mode 0 with a mask: the pre/next band (origin top-left) applies too
    none = torch.zeros(s1, s2, dtype=torch.bool)
    for pre, nxt in ((2, 0), (1, 3), (9, -2)):
        run_case(device, torch.float32, "BNSD", s1=s1, s2=s2, mask=none, pre=pre, nxt=nxt,
                 ref_mask=band(s1, s2, pre, nxt, 0))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("sparse_mode", [2, 3])
@pytest.mark.parametrize("s1,s2", [(6, 6), (4, 9), (8, 5)])
def test_causal(device, sparse_mode, s1, s2):
    ref = left_up(s1, s2) if sparse_mode == 2 else right_down(s1, s2)
    # the real op takes the compressed 2048x2048 mask; the causal mask is built from the mode
    compressed = torch.ones(2048, 2048, dtype=torch.bool).triu(1)
    run_case(device, torch.float32, "BSH", s1=s1, s2=s2, sparse_mode=sparse_mode, mask=compressed, ref_mask=ref,
             pse=True)


@pytest.mark.parametrize("sparse_mode", [2, 3, 4])
def test_no_mask_means_full_computation(sparse_mode):
    # documented: with atten_mask None, sparse_mode / pre / next do not apply
    run_case("cpu", torch.float32, "BSH", sparse_mode=sparse_mode, mask=None, pre=1, nxt=0)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("s1,s2", [(6, 6), (4, 9), (9, 5)])
def test_band_mode4_bottom_right(device, s1, s2):
    compressed = torch.ones(2048, 2048, dtype=torch.bool).triu(1)
    for pre, nxt in ((2, 1), (3, 0), (6, -1)):
        ref = band(s1, s2, pre, nxt, s2 - s1)
        run_case(device, torch.float32, "BSND", s1=s1, s2=s2, sparse_mode=4, mask=compressed, pre=pre, nxt=nxt,
                 ref_mask=ref)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("sparse_mode", [5, 6])
@pytest.mark.parametrize("s1,s2", [(6, 8), (5, 5)])
def test_prefix(device, sparse_mode, s1, s2):
    b = 2
    prefix = [s2 - s1 + 1, s2 - 1] if s2 > s1 else [1, 3]
    # rightDownCausal with the first prefix[b] key columns of batch b visible
    ref = torch.stack([right_down(s1, s2) & (torch.arange(s2) >= p).unsqueeze(0) for p in prefix]).unsqueeze(1)
    given = ref if sparse_mode == 5 else torch.ones(3072, 2048, dtype=torch.bool)
    run_case(device, torch.float32, "BNSD", b=b, s1=s1, s2=s2, sparse_mode=sparse_mode, mask=given, ref_mask=ref,
             prefix=prefix)


def test_fully_masked_rows_output_zeros():
    # rightDownCausal with S1 > S2: the first S1 - S2 rows see no key
    s1, s2 = 7, 4
    compressed = torch.ones(2048, 2048, dtype=torch.bool).triu(1)
    q, k, v = rand((1, s1, 8), seed=1), rand((1, s2, 8), seed=2), rand((1, s2, 8), seed=3)
    out, smax, ssum = torch_npu.npu_fusion_attention(q, k, v, 2, "BSH", atten_mask=compressed, sparse_mode=3)[:3]
    assert torch.all(out[:, : s1 - s2] == 0)
    assert torch.all(torch.isneginf(smax[:, :, : s1 - s2])) and torch.all(ssum[:, :, : s1 - s2] == 0)
    ref = ref_attention(q.double(), k.double(), v.double(), 2, "BSH", mask=right_down(s1, s2))[0]
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision(device, dtype):
    m = right_down(5, 7)
    run_case(device, dtype, "BSH", mask=m, pse=True, n=4, n_kv=2)
    run_case(device, dtype, "BNSD", scale=0.125)


def test_scale_and_pse_order():
    # scale multiplies (pse + qk^T): pse = c everywhere is a no-op, pse depending on j is not
    q, k, v = rand((1, 3, 4)), rand((1, 5, 4), seed=1), rand((1, 5, 4), seed=2)
    base = torch_npu.npu_fusion_attention(q, k, v, 1, "BSH", scale=0.5)[0]
    const = torch_npu.npu_fusion_attention(q, k, v, 1, "BSH", pse=torch.full((1, 1, 3, 5), 3.0), scale=0.5)[0]
    torch.testing.assert_close(base, const)
    pse = torch.arange(5.0).view(1, 1, 1, 5)
    got = torch_npu.npu_fusion_attention(q, k, v, 1, "BSH", pse=pse, scale=0.5)
    ref, rmax, _ = ref_attention(q.double(), k.double(), v.double(), 1, "BSH", pse=pse.double(), scale=0.5)
    torch.testing.assert_close(got[0].double(), ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got[1][..., 0].double(), rmax, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("pse_shape", [(2, 4, 5, 7), (2, 4, 1, 7), (1, 4, 5, 7)])
def test_pse_shapes_and_grad(pse_shape):
    q = rand((2, 4, 5, 8), seed=1).requires_grad_()
    k, v = rand((2, 4, 7, 8), seed=2), rand((2, 4, 7, 8), seed=3)
    p = rand(pse_shape, seed=4).requires_grad_()
    out = torch_npu.npu_fusion_attention(q, k, v, 4, "BNSD", pse=p, scale=0.3)[0]
    rq, rp = q.detach().double().requires_grad_(), p.detach().double().requires_grad_()
    ref = ref_attention(rq, k.double(), v.double(), 4, "BNSD", pse=rp, scale=0.3)[0]
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)
    dy = rand(out.shape, seed=6)
    out.backward(dy)
    ref.backward(dy.double())
    assert p.grad.shape == p.shape
    torch.testing.assert_close(p.grad.double(), rp.grad, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(q.grad.double(), rq.grad, rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------------- TND varlen


def tnd_case(qlens, kvlens, n=4, n_kv=2, d=8, dtype=torch.float32, device="cpu"):
    tq, tk = sum(qlens), sum(kvlens)
    q = rand((tq, n, d), dtype, device, 1)
    k = rand((tk, n_kv, d), dtype, device, 2)
    v = rand((tk, n_kv, d), dtype, device, 3)
    cum = lambda xs: [sum(xs[: i + 1]) for i in range(len(xs))]  # noqa: E731
    return q, k, v, cum(qlens), cum(kvlens)


def tnd_reference(q, k, v, qlens, kvlens, n, n_kv, masks, scale, keep=None, keep_prob=1.0):
    """per-batch float64 reference: batch b uses rows of T and masks[b] ([sq, skv] or None)."""
    outs = torch.zeros(q.shape[0], n, v.shape[2], dtype=torch.float64)
    maxes = torch.zeros(q.shape[0], n, dtype=torch.float64)
    qs = ks = 0
    for bi, (sq, skv) in enumerate(zip(qlens, kvlens)):
        if sq == 0 or skv == 0:
            qs, ks = qs + sq, ks + skv
            continue
        qb = q[qs:qs + sq].unsqueeze(0)
        kb, vb = k[ks:ks + skv].unsqueeze(0), v[ks:ks + skv].unsqueeze(0)
        kp = None if keep is None else keep[bi]
        o, m, _ = ref_attention(qb, kb, vb, n, "BSND", n_kv, mask=masks[bi], scale=scale, keep=kp,
                                keep_prob=keep_prob)
        outs[qs:qs + sq] = o[0]
        maxes[qs:qs + sq] = m[0].transpose(0, 1)
        qs, ks = qs + sq, ks + skv
    return outs, maxes


@pytest.mark.parametrize("device", DEVICES)
def test_tnd_varlen_forward_backward(device):
    qlens, kvlens = [3, 5, 2], [4, 5, 6]
    n, n_kv = 4, 2
    q, k, v, cq, ckv = tnd_case(qlens, kvlens, n, n_kv, device=device)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    out, smax, ssum, _, seed, offset, numels = torch_npu.npu_fusion_attention(
        q, k, v, n, "TND", scale=0.4, actual_seq_qlen=cq, actual_seq_kvlen=ckv)
    assert out.shape == q.shape and smax.shape == (sum(qlens), n, 8) and ssum.shape == (sum(qlens), n, 8)
    assert numels == n * sum(a * b for a, b in zip(qlens, kvlens))
    rq, rk, rv = (t.detach().cpu().double().requires_grad_() for t in (q, k, v))
    ref, rmax = tnd_reference(rq, rk, rv, qlens, kvlens, n, n_kv, [None] * 3, 0.4)
    torch.testing.assert_close(out.cpu().double(), ref.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(smax[..., 0].cpu().double(), rmax, rtol=1e-5, atol=1e-5)
    dy = rand(out.shape, seed=7)
    out.backward(dy.to(device))
    ref.backward(dy.double())
    for got, want in ((q.grad, rq.grad), (k.grad, rk.grad), (v.grad, rv.grad)):
        torch.testing.assert_close(got.cpu().double(), want, rtol=1e-4, atol=1e-4)
    # the explicit grad op gives the same
    dq, dk, dv, dpse, dsink = torch_npu.npu_fusion_attention_grad(
        q.detach(), k.detach(), v.detach(), dy.to(device), n, "TND", scale_value=0.4, actual_seq_qlen=cq,
        actual_seq_kvlen=ckv)
    for got, want in ((dq, rq.grad), (dk, rk.grad), (dv, rv.grad)):
        torch.testing.assert_close(got.cpu().double(), want, rtol=1e-4, atol=1e-4)
    assert dpse.numel() == 0 and dsink.numel() == 0


@pytest.mark.parametrize("sparse_mode", [0, 1, 2, 3, 4])
def test_tnd_masks(sparse_mode):
    qlens, kvlens = [3, 6, 4], [5, 6, 2]
    n, n_kv = 2, 2
    q, k, v, cq, ckv = tnd_case(qlens, kvlens, n, n_kv)
    pre, nxt = 2, 1
    if sparse_mode in (0, 1):
        given = torch.rand(6, 6, generator=torch.Generator().manual_seed(3)) < 0.3
        masks = [given[:a, :b] | (band(a, b, pre, nxt, 0) if sparse_mode == 0 else False)
                 for a, b in zip(qlens, kvlens)]
    else:
        given = torch.ones(2048, 2048, dtype=torch.bool).triu(1)
        make = {2: lambda a, b: left_up(a, b), 3: lambda a, b: right_down(a, b),
                4: lambda a, b: band(a, b, pre, nxt, b - a)}[sparse_mode]
        masks = [make(a, b) for a, b in zip(qlens, kvlens)]
    out = torch_npu.npu_fusion_attention(q, k, v, n, "TND", atten_mask=given, scale=0.5, sparse_mode=sparse_mode,
                                         pre_tockens=pre, next_tockens=nxt, actual_seq_qlen=cq,
                                         actual_seq_kvlen=ckv)[0]
    ref, _ = tnd_reference(q.double(), k.double(), v.double(), qlens, kvlens, n, n_kv, masks, 0.5)
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)


def test_tnd_prefix_compressed_mode6():
    qlens, kvlens, prefix = [3, 4], [5, 4], [3, 1]
    q, k, v, cq, ckv = tnd_case(qlens, kvlens, 2, 1)
    out = torch_npu.npu_fusion_attention(q, k, v, 2, "TND", atten_mask=torch.ones(3072, 2048, dtype=torch.bool),
                                         sparse_mode=6, prefix=prefix, actual_seq_qlen=cq, actual_seq_kvlen=ckv)[0]
    masks = [right_down(a, b) & (torch.arange(b) >= p) for a, b, p in zip(qlens, kvlens, prefix)]
    ref, _ = tnd_reference(q.double(), k.double(), v.double(), qlens, kvlens, 2, 1, masks, 1.0)
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)


def test_tnd_outer_cut_modes_7_and_8_match_the_documented_examples():
    compressed = torch.ones(2048, 2048, dtype=torch.bool).triu(1)
    n = 2
    # mode 7 (doc): uncut batches (3x3, 4x6) in rightDownCausal; card 1 holds batch 0 and the
    # first 2 query rows of batch 1 with pre=6, next=-2, qlen {3,5}, kvlen {3,9}
    q, k, v, cq, ckv = tnd_case([3, 4], [3, 6], n, n)
    full = torch_npu.npu_fusion_attention(q, k, v, n, "TND", atten_mask=compressed, sparse_mode=3,
                                          actual_seq_qlen=cq, actual_seq_kvlen=ckv)[0]
    card1 = torch_npu.npu_fusion_attention(q[:5], k, v, n, "TND", atten_mask=compressed, sparse_mode=7,
                                           pre_tockens=6, next_tockens=-2, actual_seq_qlen=[3, 5],
                                           actual_seq_kvlen=[3, 9])[0]
    torch.testing.assert_close(card1, full[:5], rtol=1e-6, atol=1e-6)
    # mode 8 (doc): a 5x4 leftUpCausal batch cut after 2 query rows; card 2 holds its last 3 rows
    # (band pre=4, next=1) then two more batches, qlen {3,8,12}, kvlen {4,9,13}
    q, k, v, cq, ckv = tnd_case([5, 5, 4], [4, 5, 4], n, n)
    full = torch_npu.npu_fusion_attention(q, k, v, n, "TND", atten_mask=compressed, sparse_mode=2,
                                          actual_seq_qlen=cq, actual_seq_kvlen=ckv)[0]
    card2 = torch_npu.npu_fusion_attention(q[2:], k, v, n, "TND", atten_mask=compressed, sparse_mode=8,
                                           pre_tockens=4, next_tockens=1, actual_seq_qlen=[3, 8, 12],
                                           actual_seq_kvlen=[4, 9, 13])[0]
    torch.testing.assert_close(card2, full[2:], rtol=1e-6, atol=1e-6)


def test_tnd_zero_length_and_trailing_batches():
    # a batch of length 0 in the middle, and trailing zeros = batches that take no part
    qlens, kvlens = [2, 0, 3], [3, 0, 2]
    q, k, v, _, _ = tnd_case(qlens, kvlens, 2, 2)
    q = torch.cat([q, rand((2, 2, 8), seed=9)])  # 2 extra packed tokens outside every batch
    out = torch_npu.npu_fusion_attention(q, k, v, 2, "TND", actual_seq_qlen=[2, 2, 5, 0],
                                         actual_seq_kvlen=[3, 3, 5, 0])[0]
    ref, _ = tnd_reference(q[:5].double(), k.double(), v.double(), qlens, kvlens, 2, 2, [None] * 3, 1.0)
    torch.testing.assert_close(out[:5].double(), ref, rtol=1e-5, atol=1e-5)
    assert torch.all(out[5:] == 0)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_tnd_low_precision(dtype):
    qlens, kvlens = [4, 3], [4, 5]
    q, k, v, cq, ckv = tnd_case(qlens, kvlens, 2, 1, dtype=dtype, device="npu")
    compressed = torch.ones(2048, 2048, dtype=torch.bool, device="npu").triu(1)
    out = torch_npu.npu_fusion_attention(q, k, v, 2, "TND", atten_mask=compressed, sparse_mode=3,
                                         actual_seq_qlen=cq, actual_seq_kvlen=ckv, scale=0.3)[0]
    assert out.dtype == dtype and out.device.type == "npu"
    masks = [right_down(a, b) for a, b in zip(qlens, kvlens)]
    ref, _ = tnd_reference(q.cpu().double(), k.cpu().double(), v.cpu().double(), qlens, kvlens, 2, 1, masks, 0.3)
    rtol, atol = FWD_TOL[dtype]
    torch.testing.assert_close(out.cpu().double(), ref, rtol=rtol, atol=atol)


# ---------------------------------------------------------------------- dropout


def _state():
    raw = bytes(torch.npu.get_rng_state().tolist())
    return int.from_bytes(raw[:8], "little"), int.from_bytes(raw[8:], "little", signed=True)


def _keep_mask_from(qk_shape, n, keep_prob, seed, device="cpu"):
    """Reads the dropout keep mask back: with value = identity rows (S2 == D) every output
    entry is p_ij * keep_ij / keep_prob, zero exactly where dropped (p_ij > 0 everywhere)."""
    b, s1, s2 = qk_shape
    q = rand((b, n, s1, s2), seed=11).to(device)
    k = rand((b, n, s2, s2), seed=12).to(device)
    eye = torch.eye(s2).expand(b, n, s2, s2).contiguous().to(device)
    torch.npu.manual_seed(seed)
    res = torch_npu.npu_fusion_attention(q, k, eye, n, "BNSD", scale=0.1, keep_prob=keep_prob)
    probs = torch.softmax(0.1 * q.cpu().double() @ k.cpu().double().transpose(-1, -2), -1)
    return res[0].cpu() != 0, res, probs


@pytest.mark.parametrize("device", DEVICES)
def test_dropout_reproducible_and_seed_offset(device):
    q = rand((2, 4, 16, 16), device=device, seed=1)
    k = rand((2, 4, 24, 16), device=device, seed=2)
    torch.npu.manual_seed(123)
    seed0, off0 = _state()
    a = torch_npu.npu_fusion_attention(q, k, k, 4, "BNSD", keep_prob=0.7)
    assert (a[4], a[5]) == (seed0, off0) and seed0 == 123
    assert _state() == (123, off0 + 10)  # the generator's offset advanced, as philox_engine_inputs(10)
    b = torch_npu.npu_fusion_attention(q, k, k, 4, "BNSD", keep_prob=0.7)
    assert b[5] == off0 + 10 and not torch.equal(a[0], b[0])
    torch.npu.manual_seed(123)
    c = torch_npu.npu_fusion_attention(q, k, k, 4, "BNSD", keep_prob=0.7)
    assert torch.equal(a[0], c[0]) and (c[4], c[5]) == (a[4], a[5])
    assert a[6] == 2 * 4 * 16 * 24


def test_dropout_seed_offset_at_the_state_boundaries():
    # The pair is read from the generator's 16-byte state [seed: uint64 | offset: int64]:
    # a seed with the top bit set comes back as the signed int64 the real op returns, a
    # negative offset as is, and the offset advances by 10 across zero.
    q = rand((1, 2, 8, 8), seed=1).npu()
    state = (2**64 - 5).to_bytes(8, "little") + (-6).to_bytes(8, "little", signed=True)
    torch.npu.set_rng_state(torch.tensor(list(state), dtype=torch.uint8))
    out = torch_npu.npu_fusion_attention(q, q, q, 2, "BNSD", keep_prob=0.5)
    assert (out[4], out[5]) == (-5, -6)
    assert _state() == (2**64 - 5, 4)


def test_dropout_keep_fraction_and_scaling():
    keep, res, probs = _keep_mask_from((2, 64, 64), 4, 0.8, 5)
    frac = keep.double().mean().item()
    assert abs(frac - 0.8) < 0.01, frac  # 32768 draws: 6 sigma ~ 0.013
    # kept entries are p / keep_prob exactly
    torch.testing.assert_close(res[0].double(), probs * keep.double() / 0.8, rtol=1e-5, atol=1e-7)
    keep2, _, _ = _keep_mask_from((2, 64, 64), 4, 0.3, 5)
    assert abs(keep2.double().mean().item() - 0.3) < 0.015


@pytest.mark.parametrize("device", DEVICES)
def test_dropout_grad_uses_the_same_mask(device):
    b, n, s, kp = 1, 2, 32, 0.75
    keep, _, _ = _keep_mask_from((b, s, s), n, kp, 99, device)
    # same seed and shapes -> same mask, now with a general value and autograd
    q = rand((b, n, s, s), seed=11).to(device).requires_grad_()
    k = rand((b, n, s, s), seed=12).to(device).requires_grad_()
    v = rand((b, n, s, s), seed=13).to(device).requires_grad_()
    torch.npu.manual_seed(99)
    out, smax, ssum, _, seed, offset, numels = torch_npu.npu_fusion_attention(q, k, v, n, "BNSD", scale=0.1,
                                                                              keep_prob=kp)
    rq, rk, rv = (t.detach().cpu().double().requires_grad_() for t in (q, k, v))
    ref = ref_attention(rq, rk, rv, n, "BNSD", scale=0.1, keep=keep, keep_prob=kp)[0]
    torch.testing.assert_close(out.cpu().double(), ref.detach(), rtol=1e-5, atol=1e-5)
    dy = rand(out.shape, seed=14)
    out.backward(dy.to(device))
    ref.backward(dy.double())
    for got, want in ((q.grad, rq.grad), (k.grad, rk.grad), (v.grad, rv.grad)):
        torch.testing.assert_close(got.cpu().double(), want, rtol=1e-4, atol=1e-4)
    # the explicit grad op regenerates the mask from (seed, offset), whatever the generator does now
    torch.npu.manual_seed(7)
    dq, dk, dv, _, _ = torch_npu.npu_fusion_attention_grad(
        q.detach(), k.detach(), v.detach(), dy.to(device), n, "BNSD", softmax_max=smax, softmax_sum=ssum,
        attention_in=out.detach(), scale_value=0.1, keep_prob=kp, seed=seed, offset=offset, numels=numels)
    for got, want in ((dq, rq.grad), (dk, rk.grad), (dv, rv.grad)):
        torch.testing.assert_close(got.cpu().double(), want, rtol=1e-4, atol=1e-4)


def test_dropout_mask_independent_of_chunking(monkeypatch):
    q = rand((1, 2, 200, 8), seed=1)
    k = rand((1, 2, 40, 8), seed=2)
    torch.npu.manual_seed(3)
    whole = torch_npu.npu_fusion_attention(q, k, k, 2, "BNSD", keep_prob=0.6)[0]
    monkeypatch.setattr(attention_flash, "CHUNK_ELEMENTS", 16 * 2 * 40)  # one 16-row block at a time
    torch.npu.manual_seed(3)
    chunked = torch_npu.npu_fusion_attention(q, k, k, 2, "BNSD", keep_prob=0.6)[0]
    torch.testing.assert_close(chunked, whole, rtol=1e-6, atol=1e-6)


def test_gradcheck_float64_with_pse_mask_dropout():
    q = rand((1, 2, 4, 3), torch.float64, seed=1).requires_grad_()
    k = rand((1, 2, 5, 3), torch.float64, seed=2).requires_grad_()
    v = rand((1, 2, 5, 3), torch.float64, seed=3).requires_grad_()
    p = rand((1, 2, 4, 5), torch.float64, seed=4).requires_grad_()
    m = torch.zeros(4, 5, dtype=torch.bool)
    m[1, 2] = m[3, 0] = True

    def f(q, k, v, p):
        torch.npu.manual_seed(5)
        return torch_npu.npu_fusion_attention(q, k, v, 2, "BNSD", pse=p, atten_mask=m, scale=0.7, keep_prob=0.8)[0]

    assert torch.autograd.gradcheck(f, (q, k, v, p))


# ---------------------------------------------------------------------- v2


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("pse_type", [0, 1])
def test_v2_pse_types(device, pse_type):
    run_case(device, torch.float32, "BSND", pse=True, mask=right_down(5, 7), sparse_mode=0, scale=0.4,
             op=torch_npu.npu_fusion_attention_v2, pse_type=pse_type)


def test_v2_grad_op():
    q, k, v = rand((2, 5, 16), seed=1), rand((2, 6, 16), seed=2), rand((2, 6, 16), seed=3)
    p = rand((2, 2, 5, 6), seed=4)
    dy = rand((2, 5, 16), seed=5)
    grads = torch_npu.npu_fusion_attention_grad_v2(q, k, v, dy, 2, "BSH", pse=p, scale_value=0.3, pse_type=0)
    assert len(grads) == 7 and all(g.numel() == 0 for g in grads[4:])
    rq, rk, rv, rp = (t.double().requires_grad_() for t in (q, k, v, p))
    ref = ref_attention(rq, rk, rv, 2, "BSH", pse=rp, scale=0.3, pse_type=0)[0]
    want = torch.autograd.grad(ref, (rq, rk, rv, rp), dy.double())
    for got, w in zip(grads[:4], want):
        torch.testing.assert_close(got.double(), w, rtol=1e-4, atol=1e-4)
    with pytest.raises(NotImplementedError, match="pse_type 2"):
        torch_npu.npu_fusion_attention_v2(q, k, v, 2, "BSH", pse=p, pse_type=2)
    with pytest.raises(NotImplementedError, match="query_rope"):
        torch_npu.npu_fusion_attention_v2(q, k, v, 2, "BSH", query_rope=q)


# ---------------------------------------------------------------------- shapes, memory, errors


def test_meta_and_fake_shapes():
    from torch._subclasses.fake_tensor import FakeTensorMode
    for layout in ("BSH", "SBH", "BSND", "BNSD"):
        q = torch.empty(shape_of(layout, 3, 10, 8, 16), device="meta", dtype=torch.bfloat16)
        k = torch.empty(shape_of(layout, 3, 12, 2, 16), device="meta", dtype=torch.bfloat16)
        out, smax, ssum, sout, seed, offset, numels = torch_npu.npu_fusion_attention(
            q, k, k, 8, layout, atten_mask=torch.zeros(10, 12, dtype=torch.bool, device="meta"), keep_prob=0.9)
        assert out.shape == q.shape and out.dtype == torch.bfloat16 and out.device.type == "meta"
        assert smax.shape == ssum.shape == (3, 8, 10, 8) and smax.dtype == torch.float32
        assert numels == 3 * 8 * 10 * 12
    with FakeTensorMode():
        q = torch.empty(9, 4, 16, device="npu", dtype=torch.float16)
        k = torch.empty(11, 2, 16, device="npu", dtype=torch.float16)
        out, smax, ssum = torch_npu.npu_fusion_attention(q, k, k, 4, "TND", actual_seq_qlen=[4, 9],
                                                         actual_seq_kvlen=[5, 11], keep_prob=0.9)[:3]
        assert out.shape == (9, 4, 16) and smax.shape == (9, 4, 8) and out.device.type == "npu"
        dq = torch_npu.npu_fusion_attention_grad(q, k, k, q, 4, "TND", actual_seq_qlen=[4, 9],
                                                 actual_seq_kvlen=[5, 11])[0]
        assert dq.shape == q.shape and dq.dtype == torch.float16


def test_peak_memory_stays_below_one_score_matrix(monkeypatch):
    b, n, s, d = 1, 1, 1024, 8
    score_bytes = b * n * s * s * 4
    monkeypatch.setattr(attention_flash, "CHUNK_ELEMENTS", 1 << 14)  # 16 rows of logits at a time
    q = rand((b, n, s, d), seed=1).npu().requires_grad_()
    k = rand((b, n, s, d), seed=2).npu().requires_grad_()
    v = rand((b, n, s, d), seed=3).npu().requires_grad_()
    mask = torch.ones(2048, 2048, dtype=torch.bool).triu(1).npu()
    torch.npu.synchronize()
    base = torch.npu.memory_allocated()
    torch.npu.reset_peak_memory_stats()
    out = torch_npu.npu_fusion_attention(q, k, v, n, "BNSD", atten_mask=mask, sparse_mode=3, keep_prob=0.9)[0]
    out.backward(torch.ones_like(out))
    peak = torch.npu.max_memory_allocated() - base
    # SDPA's math path holds at least the scores and their softmax (2 x score_bytes)
    assert peak < score_bytes / 3, (peak, score_bytes)


@pytest.mark.parametrize("device", DEVICES)
def test_errors(device):
    q = rand((1, 4, 8), device=device)
    with pytest.raises(RuntimeError, match=r"The keep_prob value must be in range of \(0, 1\], but got 0"):
        torch_npu.npu_fusion_attention(q, q, q, 2, "BSH", keep_prob=0.0)
    with pytest.raises(RuntimeError, match=r"The sparse_mode value must be in range of \[0,6\], but got 7"):
        torch_npu.npu_fusion_attention(q, q, q, 2, "BSH", sparse_mode=7)
    t = rand((4, 2, 4), device=device)
    with pytest.raises(RuntimeError, match=r"range of \[0,5\) or \(5,8\], but got 5"):
        torch_npu.npu_fusion_attention(t, t, t, 2, "TND", sparse_mode=5, actual_seq_qlen=[4], actual_seq_kvlen=[4])
    with pytest.raises(RuntimeError, match="must be the same and cannot be empty"):
        torch_npu.npu_fusion_attention(t, t, t, 2, "TND", actual_seq_qlen=[4])
    with pytest.raises(RuntimeError, match="The input_layout should be BSH/SBH/BNSD/BSND/TND"):
        torch_npu.npu_fusion_attention(q, q, q, 2, "XYZ")
    with pytest.raises(RuntimeError, match="divisible"):
        torch_npu.npu_fusion_attention(q, q, q, 3, "BSH")
    k3 = rand((1, 4, 2, 4), device=device)
    q3 = rand((1, 4, 3, 4), device=device)
    with pytest.raises(RuntimeError, match="divisible"):
        torch_npu.npu_fusion_attention(q3, k3, k3, 3, "BSND")
    for arg in ("padding_mask", "sink", "dropout_mask"):
        with pytest.raises(NotImplementedError, match=arg):
            torch_npu.npu_fusion_attention(q, q, q, 2, "BSH", **{arg: torch.zeros(1, device=device)})
    with pytest.raises(NotImplementedError, match="pse with input_layout TND"):
        torch_npu.npu_fusion_attention(t, t, t, 2, "TND", pse=torch.zeros(1, 2, 4, 4), actual_seq_qlen=[4],
                                       actual_seq_kvlen=[4])
