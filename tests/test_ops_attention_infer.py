"""npu_prompt_flash_attention, npu_incre_flash_attention, npu_fused_infer_attention_score and
npu_fusion_attention_grad on the CPU-emulated NPU (more in test_ops_attention_fusion.py).

Checked against an independent float64 reference written here from the documented formula
``softmax(Mask(scale * q k^T)) @ v`` (per-head loop over [B, S, N, D] data, key/value head
``h // (N / N_kv)`` for query head h), its log-sum-exp, and autograd of that reference for
the explicit backward; CPU and npu inputs; float32/float16; Meta shapes; unsupported arguments.
"""
import math

import pytest
import torch

import torch_npu

from _op_helpers import DEVICES, randn as rand

TOL = {torch.float32: (1e-5, 1e-5), torch.float16: (2e-3, 2e-3)}


def shape_of(layout, b, s, n, d):
    return {"BSH": (b, s, n * d), "BSND": (b, s, n, d), "BNSD": (b, n, s, d)}[layout]


def to_bsnd(x, layout, n):
    if layout == "BSH":
        b, s, h = x.shape
        return x.reshape(b, s, n, h // n)
    if layout == "BSND":
        return x
    return x.permute(0, 2, 1, 3)


def from_bsnd(x, layout):
    b, s, n, d = x.shape
    if layout == "BSH":
        return x.reshape(b, s, n * d)
    if layout == "BSND":
        return x
    return x.permute(0, 2, 1, 3)


def ref(q, k, v, n, n_kv, layout, mask=None, scale=1.0, kv_len=None, pse=None):
    """float64 reference. mask: bool broadcastable to [B, N, S1, S2], True = masked;
    kv_len: per-batch valid key count. Returns (out in layout, lse [B, N, S1, 1])."""
    qs, ks, vs = to_bsnd(q.double(), layout, n), to_bsnd(k.double(), layout, n_kv), to_bsnd(v.double(), layout, n_kv)
    b, s1, _, d = qs.shape
    s2 = ks.shape[1]
    out = torch.zeros(b, s1, n, d, dtype=torch.float64)
    lse = torch.full((b, n, s1, 1), math.inf, dtype=torch.float64)
    outs = []
    for bi in range(b):
        per_head = []
        for h in range(n):
            kv = h // (n // n_kv)
            rows = []
            for i in range(s1):
                logits = []
                keep = []
                for j in range(s2):
                    x = qs[bi, i, h] @ ks[bi, j, kv]
                    if pse is not None:
                        x = x + pse.double().expand(b, n, s1, s2)[bi, h, i, j]
                    logits.append(scale * x)
                    masked = mask is not None and bool(mask.expand(b, n, s1, s2)[bi, h, i, j])
                    if kv_len is not None and j >= kv_len[bi]:
                        masked = True
                    keep.append(not masked)
                idx = [j for j in range(s2) if keep[j]]
                if not idx:
                    rows.append(torch.zeros(d, dtype=torch.float64))
                    continue
                xs = torch.stack([logits[j] for j in idx])
                m = xs.max()
                w = torch.exp(xs - m)
                lse[bi, h, i, 0] = (m + torch.log(w.sum())).detach()
                p = w / w.sum()
                rows.append(sum(p[t] * vs[bi, j, kv] for t, j in enumerate(idx)))
            per_head.append(torch.stack(rows))
        outs.append(torch.stack(per_head, 1))
    out = torch.stack(outs)
    return from_bsnd(out, layout), lse


def make(layout, b, s1, s2, n, n_kv, d, dtype=torch.float32, device="cpu"):
    q = rand(shape_of(layout, b, s1, n, d), dtype, device, 1)
    k = rand(shape_of(layout, b, s2, n_kv, d), dtype, device, 2)
    v = rand(shape_of(layout, b, s2, n_kv, d), dtype, device, 3)
    return q, k, v


def close(got, want, dtype=torch.float32, device="cpu"):
    assert got.device.type == device
    rtol, atol = TOL[dtype]
    torch.testing.assert_close(got.cpu().double(), want, rtol=rtol, atol=atol)


# ------------------------------------------------------------ prompt flash attention


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", ["BSH", "BSND", "BNSD"])
@pytest.mark.parametrize("n,n_kv", [(4, 4), (4, 2), (6, 1)])
def test_pfa_layouts_gqa(device, layout, n, n_kv):
    q, k, v = make(layout, 2, 5, 7, n, n_kv, 8, device=device)
    out = torch_npu.npu_prompt_flash_attention(q, k, v, num_heads=n, num_key_value_heads=n_kv if n_kv != n else 0,
                                               scale_value=0.3, input_layout=layout)
    assert out.shape == q.shape and out.dtype == q.dtype
    close(out, ref(q.cpu(), k.cpu(), v.cpu(), n, n_kv, layout, scale=0.3)[0], device=device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mshape", ["s1s2", "b_s1s2", "b1s1s2"])
def test_pfa_mask(device, mshape):
    b, n, s = 2, 2, 6
    q, k, v = make("BNSD", b, s, s, n, n, 4, device=device)
    causal = torch.ones(s, s, dtype=torch.bool).triu(1)
    rnd = torch.rand(b, s, s, generator=torch.Generator().manual_seed(3)) < 0.4
    full = causal | rnd
    full[..., 0] = False
    m = {"s1s2": causal, "b_s1s2": full, "b1s1s2": full.unsqueeze(1)}[mshape]
    want = ref(q.cpu(), k.cpu(), v.cpu(), n, n, "BNSD", mask=m if m.dim() == 4 else
               (m.unsqueeze(1) if m.dim() == 3 else m), scale=0.5)[0]
    # defaults pre_tokens=INT_MAX, next_tokens=0 with a causal-containing mask: band is a no-op here
    out = torch_npu.npu_prompt_flash_attention(q, k, v, atten_mask=m.to(device), num_heads=n, scale_value=0.5,
                                               input_layout="BNSD")
    close(out, want, device=device)
    # 0/1 uint8 mask means the same
    out = torch_npu.npu_prompt_flash_attention(q, k, v, atten_mask=m.to(torch.uint8).to(device), num_heads=n,
                                               scale_value=0.5, input_layout="BNSD", next_tokens=65535)
    close(out, want, device=device)


def test_pfa_band_and_no_mask_ignores_tokens():
    q, k, v = make("BSH", 1, 6, 6, 2, 2, 4)
    # without a mask pre/next tokens are ignored (spec): next_tokens=0 default is *not* causal
    out = torch_npu.npu_prompt_flash_attention(q, k, v, num_heads=2)
    close(out, ref(q, k, v, 2, 2, "BSH")[0])
    # with an (all-False) mask the band -pre <= j - i <= next is applied
    zero = torch.zeros(6, 6, dtype=torch.bool)
    out = torch_npu.npu_prompt_flash_attention(q, k, v, atten_mask=zero, num_heads=2, pre_tokens=2, next_tokens=1)
    i, j = torch.arange(6).unsqueeze(1), torch.arange(6).unsqueeze(0)
    close(out, ref(q, k, v, 2, 2, "BSH", mask=(j - i > 1) | (i - j > 2))[0])


@pytest.mark.parametrize("device", DEVICES)
def test_pfa_actual_seq_lengths_kv_fp16(device):
    q, k, v = make("BSH", 2, 3, 6, 4, 2, 8, dtype=torch.float16, device=device)
    out = torch_npu.npu_prompt_flash_attention(q, k, v, num_heads=4, num_key_value_heads=2, scale_value=0.25,
                                               actual_seq_lengths_kv=[4, 6])
    assert out.dtype == torch.float16
    want = ref(q.cpu(), k.cpu(), v.cpu(), 4, 2, "BSH", scale=0.25, kv_len=[4, 6])[0]
    close(out, want, torch.float16, device)


def test_pfa_unsupported():
    q, k, v = make("BSH", 1, 2, 2, 1, 1, 4)
    for kw, word in ((dict(sparse_mode=2), "sparse_mode"), (dict(input_layout="TND"), "input_layout"),
                     (dict(pse_shift=torch.zeros(1, 1, 2, 2)), "pse_shift"),
                     (dict(actual_seq_lengths=[2]), "actual_seq_lengths"),
                     (dict(quant_scale2=torch.ones(1)), "quant_scale2"),
                     (dict(padding_mask=torch.zeros(2, 2)), "padding_mask")):
        with pytest.raises(NotImplementedError, match=word):
            torch_npu.npu_prompt_flash_attention(q, k, v, **kw)


# ------------------------------------------------------------ incremental flash attention


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", ["BSH", "BNSD"])
@pytest.mark.parametrize("n,n_kv", [(4, 4), (8, 2)])
def test_ifa(device, layout, n, n_kv):
    b, s2, d = 3, 9, 8
    q, k, v = make(layout, b, 1, s2, n, n_kv, d, device=device)
    out = torch_npu.npu_incre_flash_attention(q, k, v, num_heads=n, num_key_value_heads=n_kv, scale_value=0.35,
                                              input_layout=layout)
    assert out.shape == q.shape
    close(out, ref(q.cpu(), k.cpu(), v.cpu(), n, n_kv, layout, scale=0.35)[0], device=device)
    # actual_seq_lengths limits the valid kv length of each batch
    lens = [9, 4, 1]
    out = torch_npu.npu_incre_flash_attention(q, k, v, num_heads=n, num_key_value_heads=n_kv, scale_value=0.35,
                                              input_layout=layout, actual_seq_lengths=lens)
    close(out, ref(q.cpu(), k.cpu(), v.cpu(), n, n_kv, layout, scale=0.35, kv_len=lens)[0], device=device)
    # a [B, 1, 1, S2] mask, combined with actual_seq_lengths
    m = torch.rand(b, 1, 1, s2, generator=torch.Generator().manual_seed(5)) < 0.3
    m[..., 0] = False
    for mm in (m, m.view(b, s2)):
        out = torch_npu.npu_incre_flash_attention(q, k, v, atten_mask=mm.to(device), num_heads=n,
                                                  num_key_value_heads=n_kv, scale_value=0.35, input_layout=layout,
                                                  actual_seq_lengths=lens)
        close(out, ref(q.cpu(), k.cpu(), v.cpu(), n, n_kv, layout, mask=m, scale=0.35, kv_len=lens)[0],
              device=device)


def test_ifa_fp16_zero_length_and_errors():
    q, k, v = make("BSH", 2, 1, 5, 2, 2, 4, dtype=torch.float16)
    out = torch_npu.npu_incre_flash_attention(q, k, v, num_heads=2, actual_seq_lengths=[3, 0])
    close(out, ref(q, k, v, 2, 2, "BSH", kv_len=[3, 0])[0], torch.float16)
    assert torch.all(out[1] == 0)
    with pytest.raises(NotImplementedError, match="kv_padding_size with block_table"):
        torch_npu.npu_incre_flash_attention(q, k, v, num_heads=2, block_table=torch.zeros(2, 1, dtype=torch.int32),
                                            kv_padding_size=torch.tensor([1]), block_size=16, actual_seq_lengths=[1, 1])
    with pytest.raises(NotImplementedError, match="antiquant_scale"):
        torch_npu.npu_incre_flash_attention(q, k, v, num_heads=2, antiquant_scale=torch.ones(2))
    q2 = rand((2, 3, 8))
    with pytest.raises(RuntimeError, match="decode"):
        torch_npu.npu_incre_flash_attention(q2, q2, q2, num_heads=2)


# ------------------------------------------------------------ page attention, KV left padding


def paged(dense, table, block_size, lens):
    """Scatter dense BSH keys [B, S, H] into a cache of blocks through ``table`` (written here,
    independently of the op): token j of batch b -> block table[b, j // bs], row j % bs."""
    b, s, h = dense.shape
    nblocks = int(table.max()) + 2
    cache = torch.full((nblocks, block_size, h), float("nan"), dtype=dense.dtype)  # rows past a length: NaN
    for bi in range(b):
        for j in range(lens[bi]):
            cache[table[bi, j // block_size], j % block_size] = dense[bi, j]
    return cache


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("four_d", [False, True])
def test_ifa_page_attention(device, four_d):
    b, s2, n, n_kv, d, bs = 2, 12, 4, 2, 8, 4
    layout = "BNSD" if four_d else "BSH"
    q = rand(shape_of(layout, b, 1, n, d), seed=41)
    k, v = rand((b, s2, n_kv * d), seed=42), rand((b, s2, n_kv * d), seed=43)
    table = torch.tensor([[4, 0, 6], [2, 5, 1]], dtype=torch.int32)
    lens = [10, 7]
    kc, vc = paged(k, table, bs, lens), paged(v, table, bs, lens)
    if four_d:
        kc = kc.view(kc.shape[0], bs, n_kv, d).transpose(1, 2).contiguous()
        vc = vc.view(vc.shape[0], bs, n_kv, d).transpose(1, 2).contiguous()
    out = torch_npu.npu_incre_flash_attention(q.to(device), kc.to(device), vc.to(device),
                                              num_heads=n, num_key_value_heads=n_kv, scale_value=0.4,
                                              input_layout=layout, block_table=table.to(device), block_size=bs,
                                              actual_seq_lengths=lens)
    kd = to_bsnd(k, "BSH", n_kv)
    vd = to_bsnd(v, "BSH", n_kv)
    want = ref(q, from_bsnd(kd, layout), from_bsnd(vd, layout), n, n_kv, layout, scale=0.4, kv_len=lens)[0]
    close(out, want, device=device)


def test_fias_page_attention_prompt_fp16():
    b, s1, s2, n, d, bs = 2, 3, 8, 2, 8, 4
    q = rand((b, s1, n * d), torch.float16, seed=44)
    k, v = rand((b, s2, n * d), torch.float16, seed=45), rand((b, s2, n * d), torch.float16, seed=46)
    table = torch.tensor([[3, 1], [0, 2]], dtype=torch.int32)
    m = torch.ones(s1, s2, dtype=torch.bool).triu(1 + s2 - s1)
    out, _ = torch_npu.npu_fused_infer_attention_score(
        q.npu(), paged(k, table, bs, [8, 6]).npu(), paged(v, table, bs, [8, 6]).npu(), atten_mask=m.npu(), num_heads=n,
        scale=0.3, block_table=table.npu(), block_size=bs, actual_seq_lengths_kv=[8, 6])
    close(out, ref(q, k, v, n, n, "BSH", mask=m, scale=0.3, kv_len=[8, 6])[0], torch.float16, "npu")


@pytest.mark.parametrize("device", DEVICES)
def test_ifa_kv_left_padding(device):
    b, s2, n, d = 3, 9, 2, 4
    q, k, v = make("BSND", b, 1, s2, n, n, d, device=device)
    pad, lens = 2, [5, 7, 8]
    out = torch_npu.npu_incre_flash_attention(q, k, v, num_heads=n, input_layout="BSND", scale_value=0.5,
                                              actual_seq_lengths=lens, kv_padding_size=torch.tensor([pad]))
    mask = torch.ones(b, 1, 1, s2, dtype=torch.bool)
    for bi, n_ in enumerate(lens):
        mask[bi, 0, 0, s2 - pad - n_:s2 - pad] = False  # documented: keys [S - pad - len, S - pad)
    want = ref(q.cpu(), k.cpu(), v.cpu(), n, n, "BSND", mask=mask, scale=0.5)[0]
    close(out[:2], want[:2], device=device)
    assert torch.all(out[2] == 0)  # start S - pad - len < 0: documented all-zero result
    # without actual_seq_lengths the padding size is ignored (right padding)
    out2 = torch_npu.npu_incre_flash_attention(q, k, v, num_heads=n, input_layout="BSND", scale_value=0.5,
                                               kv_padding_size=torch.tensor([pad]))
    close(out2, ref(q.cpu(), k.cpu(), v.cpu(), n, n, "BSND", scale=0.5)[0], device=device)


# ------------------------------------------------------------ fused infer attention score


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", ["BSH", "BSND", "BNSD"])
def test_fias(device, layout):
    b, s1, s2, n, n_kv, d = 2, 4, 6, 4, 2, 8
    q, k, v = make(layout, b, s1, s2, n, n_kv, d, device=device)
    m = torch.ones(s1, s2, dtype=torch.bool).triu(1 + s2 - s1)  # right-down causal
    out, lse = torch_npu.npu_fused_infer_attention_score(q, k, v, atten_mask=m.to(device), num_heads=n,
                                                         num_key_value_heads=n_kv, scale=0.3, input_layout=layout,
                                                         softmax_lse_flag=True, actual_seq_lengths_kv=[6, 5])
    want, wlse = ref(q.cpu(), k.cpu(), v.cpu(), n, n_kv, layout, mask=m, scale=0.3, kv_len=[6, 5])
    close(out, want, device=device)
    assert lse.shape == (b, n, s1, 1) and lse.dtype == torch.float32
    close(lse, wlse, device=device)
    out2, lse2 = torch_npu.npu_fused_infer_attention_score(q, k, v, num_heads=n, num_key_value_heads=n_kv,
                                                           scale=0.3, input_layout=layout)
    close(out2, ref(q.cpu(), k.cpu(), v.cpu(), n, n_kv, layout, scale=0.3)[0], device=device)
    assert lse2.numel() == 0 and lse2.device.type == device


@pytest.mark.parametrize("device", DEVICES)
def test_fias_decode_fp16(device):
    q, k, v = make("BNSD", 2, 1, 10, 8, 2, 16, dtype=torch.float16, device=device)
    out, lse = torch_npu.npu_fused_infer_attention_score(q, k, v, num_heads=8, num_key_value_heads=2,
                                                         scale=0.25, input_layout="BNSD", softmax_lse_flag=True)
    want, wlse = ref(q.cpu(), k.cpu(), v.cpu(), 8, 2, "BNSD", scale=0.25)
    assert out.dtype == torch.float16 and lse.dtype == torch.float32
    close(out, want, torch.float16, device)
    torch.testing.assert_close(lse.cpu().double(), wlse, rtol=1e-4, atol=1e-4)


def test_fias_unsupported():
    q, k, v = make("BSH", 1, 2, 2, 1, 1, 4)
    for kw, word in ((dict(sparse_mode=3), "sparse_mode"), (dict(kv_padding_size=torch.zeros(1)), "kv_padding_size"),
                     (dict(actual_seq_lengths=[1]), "actual_seq_lengths"), (dict(input_layout="TND"), "TND"),
                     (dict(antiquant_mode=1), "antiquant_mode"), (dict(query_rope=q), "query_rope")):
        with pytest.raises(NotImplementedError, match=word):
            torch_npu.npu_fused_infer_attention_score(q, k, v, **kw)


# ------------------------------------------------------------ explicit backward


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout,n,n_kv,use_pse,use_mask", [("BSH", 4, 4, False, False), ("BNSD", 4, 2, True, True),
                                                             ("BSND", 6, 3, False, True)])
def test_fa_grad(device, layout, n, n_kv, use_pse, use_mask):
    b, s1, s2, d = 2, 5, 6, 8
    q, k, v = make(layout, b, s1, s2, n, n_kv, d, device=device)
    pse = rand((b, n, s1, s2), device=device, seed=9) if use_pse else None
    m = None
    if use_mask:
        m = torch.rand(b, 1, s1, s2, generator=torch.Generator().manual_seed(4)) < 0.35
        m[..., 0] = False
    dy = rand(q.shape, device=device, seed=8)
    dq, dk, dv, dpse, dsink = torch_npu.npu_fusion_attention_grad(
        q, k, v, dy, n, layout, pse=pse, atten_mask=None if m is None else m.to(device), scale_value=0.3)
    rq, rk, rv = (t.cpu().double().requires_grad_() for t in (q, k, v))
    rp = pse.cpu().double().requires_grad_() if use_pse else None
    rout = ref(rq, rk, rv, n, n_kv, layout, mask=m, scale=0.3, pse=rp)[0]
    grads = torch.autograd.grad(rout, [rq, rk, rv] + ([rp] if use_pse else []), dy.cpu().double())
    for got, want, t in zip((dq, dk, dv), grads, (q, k, v)):
        assert got.shape == t.shape and got.dtype == t.dtype
        torch.testing.assert_close(got.cpu().double(), want, rtol=1e-4, atol=1e-4)
    if use_pse:
        torch.testing.assert_close(dpse.cpu().double(), grads[3], rtol=1e-4, atol=1e-4)
    else:
        assert dpse.numel() == 0
    assert dsink.numel() == 0 and dq.device.type == device


def test_fa_grad_fp16_causal_and_errors():
    q, k, v = make("BSH", 1, 4, 4, 2, 2, 4, dtype=torch.float16)
    dy = rand(q.shape, torch.float16, seed=8)
    compressed = torch.ones(2048, 2048, dtype=torch.bool).triu(1)
    dq, dk, dv, _, _ = torch_npu.npu_fusion_attention_grad(q, k, v, dy, 2, "BSH", atten_mask=compressed,
                                                           sparse_mode=2, scale_value=0.5)
    rq, rk, rv = (t.double().requires_grad_() for t in (q, k, v))
    rout = ref(rq, rk, rv, 2, 2, "BSH", mask=torch.ones(4, 4, dtype=torch.bool).triu(1), scale=0.5)[0]
    grads = torch.autograd.grad(rout, [rq, rk, rv], dy.double())
    for got, want in zip((dq, dk, dv), grads):
        assert got.dtype == torch.float16
        torch.testing.assert_close(got.double(), want, rtol=1e-2, atol=1e-2)
    with pytest.raises(RuntimeError, match="keep_prob"):
        torch_npu.npu_fusion_attention_grad(q, k, v, dy, 2, "BSH", keep_prob=1.5)
    with pytest.raises(NotImplementedError, match="sink"):
        torch_npu.npu_fusion_attention_grad(q, k, v, dy, 2, "BSH", sink=torch.zeros(2))


# ------------------------------------------------------------ meta shapes


def test_meta_shapes():
    meta = dict(device="meta", dtype=torch.float16)
    q, k = torch.empty(2, 8, 64, **meta), torch.empty(2, 12, 32, **meta)
    out = torch_npu.npu_prompt_flash_attention(q, k, k, num_heads=4, num_key_value_heads=2)
    assert out.shape == (2, 8, 64) and out.device.type == "meta"
    out, lse = torch_npu.npu_fused_infer_attention_score(q, k, k, num_heads=4, num_key_value_heads=2,
                                                         softmax_lse_flag=True)
    assert out.shape == (2, 8, 64) and lse.shape == (2, 4, 8, 1) and lse.dtype == torch.float32
    qd = torch.empty(2, 4, 1, 16, **meta)
    kd = torch.empty(2, 2, 12, 16, **meta)
    out = torch_npu.npu_incre_flash_attention(qd, kd, kd, num_heads=4, num_key_value_heads=2, input_layout="BNSD")
    assert out.shape == (2, 4, 1, 16)
    qg = torch.empty(2, 8, 64, **meta)
    dq, dk, dv, dpse, dsink = torch_npu.npu_fusion_attention_grad(qg, qg, qg, qg, 4, "BSH")
    assert dq.shape == dk.shape == dv.shape == (2, 8, 64) and dq.dtype == torch.float16
    assert dq.device.type == "meta"
