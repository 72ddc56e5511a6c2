"""npu_fusion_attention on the CPU-emulated NPU.

Checked against an independent float64 reference written here from the documented
formula ``softmax(Mask(scale * (pse + q k^T), atten_mask)) @ v`` (per-head loop over
[B, S, N, D] data, key/value heads shared by ``N / N_kv`` query heads), forward values,
softmax_max / softmax_sum, and q/k/v gradients vs autograd of the reference; CPU and
npu inputs; float32/float16/bfloat16; Meta shapes; unsupported modes.
"""
import pytest
import torch

import torch_npu

DEVICES = ["cpu", "npu"]
FWD_TOL = {torch.float32: (1e-5, 1e-5), torch.float16: (2e-3, 2e-3), torch.bfloat16: (2e-2, 2e-2)}
GRAD_TOL = {torch.float32: (1e-4, 1e-4), torch.float16: (1e-2, 1e-2), torch.bfloat16: (6e-2, 6e-2)}


def rand(shape, dtype=torch.float32, device="cpu", seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g, dtype=torch.float64).to(dtype).to(device)


# ------------------------------------------------------------------ reference


def to_bsnd(x, layout, n):
    """Reference layout -> [B, S, N, D] float64 (written independently of the op)."""
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


def ref_attention(q, k, v, n, layout, n_kv=None, pse=None, mask=None, scale=1.0):
    """float64 reference; ``mask`` a bool [B|1, N|1, S1, S2]-broadcastable tensor, True = masked.
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
            x = x + pse.expand(b, n, s1, s2)[:, h]
        x = scale * x
        if mask is not None:
            x = x.masked_fill(mask.expand(b, n, s1, s2)[:, h], float("-inf"))
        m = x.max(-1).values
        e = torch.exp(x - m.unsqueeze(-1))
        ssum = e.sum(-1)
        y = e / ssum.unsqueeze(-1)
        outs.append(torch.einsum("bij,bjd->bid", y, vs[:, :, kv]))
        maxes.append(m)
        sums.append(ssum)
    out = torch.stack(outs, 2)
    return from_bsnd(out, layout), torch.stack(maxes, 1), torch.stack(sums, 1)


def causal(s1, s2, right_down):
    i = torch.arange(s1).unsqueeze(1)
    j = torch.arange(s2).unsqueeze(0)
    return j > i + (s2 - s1 if right_down else 0)


def shape_of(layout, b, s, n, d):
    return {"BSH": (b, s, n * d), "SBH": (s, b, n * d), "BSND": (b, s, n, d), "BNSD": (b, n, s, d)}[layout]


def run_case(device, dtype, layout, b=2, s1=5, s2=7, n=4, n_kv=4, d=8, pse=False, mask=None,
             sparse_mode=0, scale=0.35, ref_mask=None, pass_mask=True):
    q = rand(shape_of(layout, b, s1, n, d), dtype, device, 1).requires_grad_()
    k = rand(shape_of(layout, b, s2, n_kv, d), dtype, device, 2).requires_grad_()
    v = rand(shape_of(layout, b, s2, n_kv, d), dtype, device, 3).requires_grad_()
    p = rand((b, n, s1, s2), dtype, device, 4) if pse else None
    out, smax, ssum, sout, seed, offset, numels = torch_npu.npu_fusion_attention(
        q, k, v, n, layout, pse=p, atten_mask=(mask.to(device) if (mask is not None and pass_mask) else None),
        scale=scale, sparse_mode=sparse_mode)
    rq, rk, rv = (t.detach().cpu().double().requires_grad_() for t in (q, k, v))
    rp = p.cpu().double() if pse else None
    rout, rmax, rsum = ref_attention(rq, rk, rv, n, layout, n_kv, rp, ref_mask if ref_mask is not None else mask,
                                     scale)
    assert out.shape == q.shape and out.dtype == dtype and out.device.type == device
    rtol, atol = FWD_TOL[dtype]
    torch.testing.assert_close(out.cpu().double(), rout, rtol=rtol, atol=atol)
    assert smax.shape == (b, n, s1, 8) and ssum.shape == (b, n, s1, 8)
    assert smax.dtype == torch.float32 and ssum.dtype == torch.float32
    # statistics are of the float32 logits computed from the (possibly rounded) inputs
    srtol = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(smax.cpu().double(), rmax.unsqueeze(-1).expand(b, n, s1, 8), rtol=srtol, atol=srtol)
    torch.testing.assert_close(ssum.cpu().double(), rsum.unsqueeze(-1).expand(b, n, s1, 8), rtol=srtol, atol=srtol)
    assert sout.numel() == 0
    assert (seed, offset, numels) == (0, 0, b * n * s1 * s2)
    dy = rand(out.shape, torch.float64, "cpu", 5)
    out.backward(dy.to(dtype).to(device))
    rout.backward(dy.to(dtype).double())
    grtol, gatol = GRAD_TOL[dtype]
    for got, ref in ((q.grad, rq.grad), (k.grad, rk.grad), (v.grad, rv.grad)):
        assert got.dtype == dtype and got.device.type == device
        torch.testing.assert_close(got.cpu().double(), ref, rtol=grtol, atol=gatol)


# ---------------------------------------------------------------------- tests


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", ["BSH", "SBH", "BSND", "BNSD"])
def test_layouts(device, layout):
    run_case(device, torch.float32, layout)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", ["BSH", "BNSD"])
def test_gqa(device, layout):
    run_case(device, torch.float32, layout, n=6, n_kv=2)
    run_case(device, torch.float32, layout, n=4, n_kv=1, pse=True)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mshape", ["s1s2", "b1", "bn"])
def test_atten_mask(device, mshape):
    b, n, s1, s2 = 2, 4, 5, 7
    shape = {"s1s2": (s1, s2), "b1": (b, 1, s1, s2), "bn": (b, n, s1, s2)}[mshape]
    m = torch.rand(shape, generator=torch.Generator().manual_seed(7)) < 0.4
    m[..., 0] = False  # no fully masked row
    run_case(device, torch.float32, "BSND", b=b, s1=s1, s2=s2, n=n, mask=m, pse=True)
    # 0/1 uint8 mask means the same
    run_case(device, torch.float32, "BSND", b=b, s1=s1, s2=s2, n=n, pass_mask=True, mask=m.to(torch.uint8),
             ref_mask=m)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("sparse_mode", [2, 3])
@pytest.mark.parametrize("s1,s2", [(6, 6), (4, 9)])
def test_causal(device, sparse_mode, s1, s2):
    ref = causal(s1, s2, right_down=sparse_mode == 3)
    run_case(device, torch.float32, "BSH", s1=s1, s2=s2, sparse_mode=sparse_mode, ref_mask=ref, mask=None)
    # the compressed 2048x2048 mask the real op takes is accepted and the causal mask used
    compressed = torch.ones(2048, 2048, dtype=torch.bool).triu(1)
    run_case(device, torch.float32, "BSH", s1=s1, s2=s2, sparse_mode=sparse_mode, mask=compressed, ref_mask=ref)


@pytest.mark.parametrize("device", DEVICES)
def test_sparse0_band(device):
    # pre/next tokens band with S1 == S2: keep -pre <= j - i <= next
    q = rand((1, 6, 2, 4), device=device, seed=1)
    k = rand((1, 6, 2, 4), device=device, seed=2)
    v = rand((1, 6, 2, 4), device=device, seed=3)
    out = torch_npu.npu_fusion_attention(q, k, v, 2, "BSND", pre_tockens=2, next_tockens=0)[0]
    i, j = torch.arange(6).unsqueeze(1), torch.arange(6).unsqueeze(0)
    band = (j > i) | (i - j > 2)
    ref = ref_attention(q.cpu().double(), k.cpu().double(), v.cpu().double(), 2, "BSND", mask=band)[0]
    torch.testing.assert_close(out.cpu().double(), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision(device, dtype):
    m = causal(5, 7, True)
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


def test_meta_shapes():
    for layout in ("BSH", "SBH", "BSND", "BNSD"):
        q = torch.empty(shape_of(layout, 3, 10, 8, 16), device="meta", dtype=torch.bfloat16)
        k = torch.empty(shape_of(layout, 3, 12, 2, 16), device="meta", dtype=torch.bfloat16)
        out, smax, ssum, sout, seed, offset, numels = torch_npu.npu_fusion_attention(
            q, k, k, 8, layout, atten_mask=torch.zeros(10, 12, dtype=torch.bool, device="meta"))
        assert out.shape == q.shape and out.dtype == torch.bfloat16 and out.device.type == "meta"
        assert smax.shape == ssum.shape == (3, 8, 10, 8) and smax.dtype == torch.float32
        assert numels == 3 * 8 * 10 * 12


@pytest.mark.parametrize("device", DEVICES)
def test_unsupported_raise(device):
    q = rand((1, 4, 8), device=device)
    for mode in (1, 4, 5, 6, 7, 8):
        with pytest.raises(NotImplementedError, match="sparse_mode %d" % mode):
            torch_npu.npu_fusion_attention(q, q, q, 2, "BSH", sparse_mode=mode)
    with pytest.raises(NotImplementedError, match="TND"):
        torch_npu.npu_fusion_attention(q, q, q, 2, "TND")
    with pytest.raises(NotImplementedError, match="keep_prob"):
        torch_npu.npu_fusion_attention(q, q, q, 2, "BSH", keep_prob=0.9)
    with pytest.raises(RuntimeError, match="input_layout"):
        torch_npu.npu_fusion_attention(q, q, q, 2, "XYZ")
    with pytest.raises(RuntimeError, match="divisible"):
        torch_npu.npu_fusion_attention(q, q, q, 3, "BSH")
    k3 = rand((1, 4, 2, 4), device=device)
    q3 = rand((1, 4, 3, 4), device=device)
    with pytest.raises(RuntimeError, match="divisible"):
        torch_npu.npu_fusion_attention(q3, k3, k3, 3, "BSND")
