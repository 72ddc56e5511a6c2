"""npu_mla_prolog / npu_mla_prolog_v2 against a float64 reference of the whole
documented pipeline, written here with per-token loops (RmsNorm, W^UQ_QR / W^UK up-projections, the
de-interleaving ROPE of the aclnnMlaProlog design note, the paged cache scatter in PA_BSND and
PA_NZ layouts, and the per-token dynamic quantisation of the quantised scenarios)."""
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import torch_npu

from _op_helpers import DEVICES


# small stand-ins for He=7168, Hcq=1536, N, D=128, Dr=64, Hckv=512
HE, HCQ, N, D, DR, HCKV = 64, 48, 4, 16, 16, 32
BLOCK_NUM, BLOCK_SIZE = 3, 16


def rope_ref(v, cos, sin):
    """Formula 15 of the design note, element by element: out[i] = v[2i] cos[i] - v[2i+1] sin[i],
    out[Dr/2 + i] = v[2i+1] cos[Dr/2 + i] + v[2i] sin[Dr/2 + i]."""
    half = v.shape[-1] // 2
    out = torch.empty_like(v)
    for i in range(half):
        out[..., i] = v[..., 2 * i] * cos[..., i] - v[..., 2 * i + 1] * sin[..., i]
        out[..., half + i] = v[..., 2 * i + 1] * cos[..., half + i] + v[..., 2 * i] * sin[..., half + i]
    return out


def rms_ref(v, gamma, eps):
    return gamma * v / torch.sqrt((v * v).mean() + eps)


def quant_ref(row, smooth):
    """Per-token dynamic quant: (integer row, scale)."""
    scaled = row * smooth if smooth is not None else row
    scale = scaled.abs().max() / 127
    return torch.round(scaled / scale), scale


def reference(inp, eps_cq=1e-5, eps_ckv=1e-5, cache_mode="PA_BSND", quant=None, qc=1.0, kc=1.0, with_cq=False):
    """float64 loops over tokens; returns (query [T,N,Hckv], query_rope [T,N,Dr], kv_cache, kr_cache)
    (+ c^Q [T, Hcq] with ``with_cq``); ``qc``/``kc`` are v3's qc_qr_scale / kc_scale."""
    f = {k: (v.double() if torch.is_tensor(v) and v.is_floating_point() else v) for k, v in inp.items()}
    x = f["token_x"].reshape(-1, HE).double()
    t = x.shape[0]
    cos, sin = f["rope_cos"].reshape(t, DR), f["rope_sin"].reshape(t, DR)
    slots = inp["cache_index"].reshape(t) if "cache_index" in inp else None
    kv, kr = f["kv_cache"].clone(), f["kr_cache"].clone()
    query = torch.zeros(t, N, HCKV, dtype=torch.float64)
    query_rope = torch.zeros(t, N, DR, dtype=torch.float64)
    c_q = torch.zeros(t, HCQ, dtype=torch.float64)
    w_uq_qr = f["weight_uq_qr"].double()
    for i in range(t):
        cq = x[i] @ f["weight_dq"].double()
        ckr = x[i] @ f["weight_dkv_kr"].double()
        if quant == "full":
            cq = cq * f["dequant_scale_x"].reshape(-1)[i] * f["dequant_scale_w_dq"][0]
            ckr = ckr * f["dequant_scale_x"].reshape(-1)[i] * f["dequant_scale_w_dkv_kr"][0]
        cq = qc * rms_ref(cq, f["rmsnorm_gamma_cq"], eps_cq)
        c_q[i] = cq
        if quant is None:
            qall = cq @ w_uq_qr
        else:
            smooth = f.get("smooth_scales_cq")
            qi, s = quant_ref(cq, None if smooth is None else smooth[0])
            qall = (qi @ w_uq_qr) * s * f["dequant_scale_w_uq_qr"][0]
        for h in range(N):
            seg = qall[h * (D + DR):(h + 1) * (D + DR)]
            query[i, h] = seg[:D] @ f["weight_uk"][h]
            query_rope[i, h] = rope_ref(seg[D:], cos[i], sin[i])
        ckv = kc * rms_ref(ckr[:HCKV], f["rmsnorm_gamma_ckv"], eps_ckv)
        krope = rope_ref(ckr[HCKV:], cos[i], sin[i])
        for cache, val in ((kv, ckv), (kr, krope)):
            if cache_mode in ("BSND", "TND"):  # one row per token, in token order
                cache.reshape(t, -1, val.numel())[i, :, :] = val
                continue
            blk, row = int(slots[i]) // BLOCK_SIZE, int(slots[i]) % BLOCK_SIZE
            if cache_mode == "PA_BSND":
                cache[blk, row, :, :] = val
            else:  # NZ inside each block: 32-byte pieces, piece c of row r at c*BS*c0 + r*c0
                c0 = 32 // inp["kv_cache"].element_size()
                flat = cache.view(-1)
                base = blk * BLOCK_SIZE * cache.shape[2] * cache.shape[3]
                for e in range(val.numel()):
                    flat[base + (e // c0) * BLOCK_SIZE * c0 + row * c0 + e % c0] = val[e]
    return (query, query_rope, kv, kr, c_q) if with_cq else (query, query_rope, kv, kr)


def make_inputs(dtype, lead=(2, 3), gen=None, seed=0, int8_uqqr=False, full_quant=False):
    gen = torch.Generator().manual_seed(seed)
    t = 1
    for s in lead:
        t *= s

    def r(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen) * scale).to(dtype)

    def i8(*shape):
        return torch.randint(-100, 101, shape, generator=gen, dtype=torch.int8)

    inp = dict(
        token_x=i8(*lead, HE) if full_quant else r(*lead, HE),
        weight_dq=i8(HE, HCQ) if full_quant else r(HE, HCQ, scale=HE ** -0.5),
        weight_uq_qr=i8(HCQ, N * (D + DR)) if int8_uqqr or full_quant else r(HCQ, N * (D + DR), scale=HCQ ** -0.5),
        weight_uk=r(N, D, HCKV, scale=D ** -0.5),
        weight_dkv_kr=i8(HE, HCKV + DR) if full_quant else r(HE, HCKV + DR, scale=HE ** -0.5),
        rmsnorm_gamma_cq=(1 + 0.1 * torch.randn(HCQ, generator=gen)).to(dtype),
        rmsnorm_gamma_ckv=(1 + 0.1 * torch.randn(HCKV, generator=gen)).to(dtype),
        rope_sin=torch.rand(*lead, DR, generator=gen).to(dtype),
        rope_cos=torch.rand(*lead, DR, generator=gen).to(dtype),
        cache_index=torch.randperm(BLOCK_NUM * BLOCK_SIZE, generator=gen)[:t].reshape(lead),
        kv_cache=r(BLOCK_NUM, BLOCK_SIZE, 1, HCKV),
        kr_cache=r(BLOCK_NUM, BLOCK_SIZE, 1, DR),
    )
    if int8_uqqr or full_quant:
        inp["dequant_scale_w_uq_qr"] = torch.rand(1, N * (D + DR), generator=gen) / 100 / HCQ ** 0.5
        inp["smooth_scales_cq"] = 0.5 + torch.rand(1, HCQ, generator=gen)
    if full_quant:
        inp["dequant_scale_x"] = torch.rand(t, 1, generator=gen) / 100
        inp["dequant_scale_w_dq"] = torch.rand(1, HCQ, generator=gen) / 100
        inp["dequant_scale_w_dkv_kr"] = torch.rand(1, HCKV + DR, generator=gen) / 100
    return inp


POSITIONAL = ["token_x", "weight_dq", "weight_uq_qr", "weight_uk", "weight_dkv_kr", "rmsnorm_gamma_cq",
              "rmsnorm_gamma_ckv", "rope_sin", "rope_cos", "cache_index", "kv_cache", "kr_cache"]


def call(fn, inp, device, **kwargs):
    moved = {k: v.to(device) for k, v in inp.items()}
    args = [moved.pop(k) for k in POSITIONAL]
    return fn(*args, **moved, **kwargs), args


def assert_close(out, ref, rel):
    """max |out - ref| <= rel * max |ref| (tolerance relative to the tensor's scale)."""
    err = (out.double().cpu() - ref).abs().max().item()
    assert err <= rel * ref.abs().max().item(), (err, ref.abs().max().item())


# fp32: only float32 accumulation differs from float64; low precision: the inputs are exact in the
# reference (same rounded values), the op rounds c^Q and q^C to the weight dtype and the outputs.
TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 2e-3}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("lead", [(2, 3), (5,)])
def test_mla_prolog_non_quant(device, dtype, lead):
    inp = make_inputs(dtype, lead)
    (query, query_rope, kv_out, kr_out), args = call(torch_npu.npu_mla_prolog, inp, device,
                                                    rmsnorm_epsilon_cq=1e-5, rmsnorm_epsilon_ckv=1e-6)
    q_ref, qr_ref, kv_ref, kr_ref = reference(inp, eps_ckv=1e-6)
    assert query.shape == lead + (N, HCKV) and query_rope.shape == lead + (N, DR)
    assert query.dtype == dtype and query_rope.dtype == dtype and query.device.type == device
    assert_close(query.reshape(-1, N, HCKV), q_ref, TOL[dtype])
    assert_close(query_rope.reshape(-1, N, DR), qr_ref, TOL[dtype])
    # caches: updated in place and returned as the same tensors; untouched slots keep their values
    assert kv_out is args[10] and kr_out is args[11]
    assert_close(kv_out, kv_ref, TOL[dtype])
    assert_close(kr_out, kr_ref, TOL[dtype])
    written = torch.zeros(BLOCK_NUM * BLOCK_SIZE, dtype=torch.bool)
    written[inp["cache_index"].reshape(-1)] = True
    assert torch.equal(kv_out.cpu().reshape(-1, HCKV)[~written], inp["kv_cache"].reshape(-1, HCKV)[~written])


@pytest.mark.parametrize("device", DEVICES)
def test_mla_prolog_pa_nz_cache_layout(device):
    inp = make_inputs(torch.bfloat16, (2, 2), seed=3)
    (query, _, kv_out, kr_out), _ = call(torch_npu.npu_mla_prolog, inp, device, cache_mode="PA_NZ")
    q_ref, _, kv_ref, kr_ref = reference(inp, cache_mode="PA_NZ")
    assert_close(query.reshape(-1, N, HCKV), q_ref, TOL[torch.bfloat16])
    assert_close(kv_out, kv_ref, TOL[torch.bfloat16])
    assert_close(kr_out, kr_ref, TOL[torch.bfloat16])
    # the NZ order really differs from the ND one (same values, other places)
    _, _, kv_nd, _ = reference(inp, cache_mode="PA_BSND")
    assert not torch.allclose(kv_nd, kv_ref)


@pytest.mark.parametrize("device", DEVICES)
def test_mla_prolog_v2_non_quant(device):
    inp = make_inputs(torch.bfloat16, (3, 2), seed=5)
    (query, query_rope, kv_out, kr_out, deq), args = call(torch_npu.npu_mla_prolog_v2, inp, device)
    q_ref, qr_ref, kv_ref, kr_ref = reference(inp)
    assert query.dtype == torch.bfloat16 and query_rope.dtype == torch.bfloat16
    assert deq.shape == (1,) and deq.dtype == torch.float32
    assert kv_out is args[10] and kr_out is args[11]
    assert_close(query.reshape(-1, N, HCKV), q_ref, TOL[torch.bfloat16])
    assert_close(query_rope.reshape(-1, N, DR), qr_ref, TOL[torch.bfloat16])
    assert_close(kv_out, kv_ref, TOL[torch.bfloat16])
    assert_close(kr_out, kr_ref, TOL[torch.bfloat16])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", ["npu_mla_prolog", "npu_mla_prolog_v2"])
@pytest.mark.parametrize("smooth", [True, False])
def test_partial_quant_int8_weight_uq_qr(device, op, smooth):
    inp = make_inputs(torch.bfloat16, (2, 3), seed=7, int8_uqqr=True)
    if not smooth:
        del inp["smooth_scales_cq"]
    outs, _ = call(getattr(torch_npu, op), inp, device)
    q_ref, qr_ref, kv_ref, kr_ref = reference(inp, quant="partial")
    assert_close(outs[0].reshape(-1, N, HCKV), q_ref, TOL[torch.bfloat16])
    assert_close(outs[1].reshape(-1, N, DR), qr_ref, TOL[torch.bfloat16])
    assert_close(outs[2], kv_ref, TOL[torch.bfloat16])
    assert_close(outs[3], kr_ref, TOL[torch.bfloat16])


@pytest.mark.parametrize("device", DEVICES)
def test_v2_full_quant_bf16_cache(device):
    inp = make_inputs(torch.bfloat16, (4,), seed=11, full_quant=True)
    (query, query_rope, kv_out, kr_out, deq), _ = call(torch_npu.npu_mla_prolog_v2, inp, device)
    q_ref, qr_ref, kv_ref, kr_ref = reference(inp, quant="full")
    assert query.dtype == torch.bfloat16 and deq.shape == (1,)
    assert_close(query.reshape(-1, N, HCKV), q_ref, TOL[torch.bfloat16])
    assert_close(query_rope.reshape(-1, N, DR), qr_ref, TOL[torch.bfloat16])
    assert_close(kv_out, kv_ref, TOL[torch.bfloat16])
    assert_close(kr_out, kr_ref, TOL[torch.bfloat16])


def test_empty_tokens_leave_caches_untouched():
    inp = make_inputs(torch.bfloat16, (0, 2))
    kv_before = inp["kv_cache"].clone()
    (query, query_rope, kv_out, _), _ = call(torch_npu.npu_mla_prolog, inp, "cpu")
    assert query.shape == (0, 2, N, HCKV) and query_rope.shape == (0, 2, N, DR)
    assert torch.equal(kv_out, kv_before)


def test_fake_tensor_shapes():
    with FakeTensorMode():
        inp = make_inputs(torch.bfloat16, (2, 3))
        q, qr, kv, kr, deq = torch_npu.npu_mla_prolog_v2(*[inp[k] for k in POSITIONAL])
        assert q.shape == (2, 3, N, HCKV) and qr.shape == (2, 3, N, DR) and qr.dtype == torch.bfloat16
        assert kv.shape == (BLOCK_NUM, BLOCK_SIZE, 1, HCKV) and kr.shape == (BLOCK_NUM, BLOCK_SIZE, 1, DR)
        assert deq.shape == (1,)
        inp = make_inputs(torch.bfloat16, (5,))
        q, qr, _, _ = torch_npu.npu_mla_prolog(*[inp[k] for k in POSITIONAL], cache_mode="PA_NZ")
        assert q.shape == (5, N, HCKV) and qr.shape == (5, N, DR)


def test_errors():
    op = torch_npu.npu_mla_prolog
    inp = make_inputs(torch.bfloat16, (2, 2))
    args = [inp[k] for k in POSITIONAL]
    with pytest.raises(RuntimeError, match="cache_mode"):
        op(*args, cache_mode="BNSD")
    with pytest.raises(RuntimeError, match="smooth_scales_cq must be None"):
        op(*args, smooth_scales_cq=torch.ones(1, HCQ))
    with pytest.raises(RuntimeError, match="dequant_scale_x must be None"):
        op(*args, dequant_scale_x=torch.ones(4, 1))
    with pytest.raises(RuntimeError, match="weight_uk dim num should be 3"):
        op(*args[:3], args[3][0], *args[4:])
    bad = list(args)
    bad[2] = args[2][:, :-1]
    with pytest.raises(RuntimeError, match="weight_uq_qr must have shape"):
        op(*bad)
    bad = list(args)
    bad[9] = torch.tensor([[0, 1], [2, BLOCK_NUM * BLOCK_SIZE]])
    with pytest.raises(RuntimeError, match="cache_index values"):
        op(*bad)
    bad = list(args)
    bad[10] = torch.zeros(BLOCK_NUM, BLOCK_SIZE, 1, HCKV, dtype=torch.int8)
    bad[11] = torch.zeros(BLOCK_NUM, BLOCK_SIZE, 1, DR, dtype=torch.int8)
    with pytest.raises(NotImplementedError, match="int8 kv_cache"):
        op(*bad)
    q8 = make_inputs(torch.bfloat16, (2, 2), int8_uqqr=True)
    del q8["dequant_scale_w_uq_qr"]
    with pytest.raises(RuntimeError, match="dequant_scale_w_uq_qr must have shape"):
        op(*[q8[k] for k in POSITIONAL])
    full = make_inputs(torch.bfloat16, (2, 2), full_quant=True)
    with pytest.raises(RuntimeError, match="token_x must be bfloat16"):
        op(*[full[k] for k in POSITIONAL], dequant_scale_w_uq_qr=full["dequant_scale_w_uq_qr"])


V3_POSITIONAL = [k for k in POSITIONAL if k != "cache_index"]


def call_v3(fn, inp, device, **kwargs):
    moved = {k: v.to(device) for k, v in inp.items()}
    args = [moved.pop(k) for k in V3_POSITIONAL]
    return fn(*args, **moved, **kwargs), args


@pytest.mark.parametrize("device", DEVICES)
def test_v3_scales_and_query_norm(device):
    inp = make_inputs(torch.bfloat16, (2, 3), seed=13)
    (query, query_rope, deq_nope, query_norm, deq_norm), args = call_v3(
        torch_npu.npu_mla_prolog_v3, inp, device, kc_scale=2.0, query_norm_flag=True)
    q_ref, qr_ref, kv_ref, kr_ref, cq_ref = reference(inp, kc=2.0, with_cq=True)
    assert deq_nope.shape == (0,) and deq_norm.shape == (0,) and query_rope.dtype == torch.bfloat16
    assert query_norm.shape == (2, 3, HCQ) and query_norm.dtype == torch.bfloat16
    assert_close(query_norm.reshape(-1, HCQ), cq_ref, TOL[torch.bfloat16])
    assert_close(query.reshape(-1, N, HCKV), q_ref, TOL[torch.bfloat16])
    assert_close(query_rope.reshape(-1, N, DR), qr_ref, TOL[torch.bfloat16])
    assert_close(args[9], kv_ref, TOL[torch.bfloat16])  # kv_cache updated in place
    assert_close(args[10], kr_ref, TOL[torch.bfloat16])
    (query, query_rope, _, query_norm, _), _ = call_v3(torch_npu.npu_mla_prolog_v3, inp, device, qc_qr_scale=0.25)
    q_ref, qr_ref, _, _ = reference(inp, qc=0.25)
    assert query_norm.shape == (0,)
    assert_close(query.reshape(-1, N, HCKV), q_ref, TOL[torch.bfloat16])
    assert_close(query_rope.reshape(-1, N, DR), qr_ref, TOL[torch.bfloat16])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cache_mode,lead", [("BSND", (2, 3)), ("TND", (5,))])
def test_v3_token_ordered_caches(device, cache_mode, lead):
    inp = make_inputs(torch.bfloat16, lead, seed=17)
    del inp["cache_index"]
    inp["kv_cache"] = torch.randn(*lead, 1, HCKV).bfloat16()
    inp["kr_cache"] = torch.randn(*lead, 1, DR).bfloat16()
    outs, args = call_v3(torch_npu.npu_mla_prolog_v3, inp, device, cache_mode=cache_mode)
    _, _, kv_ref, kr_ref = reference(inp, cache_mode=cache_mode)
    assert_close(args[9], kv_ref, TOL[torch.bfloat16])
    assert_close(args[10], kr_ref, TOL[torch.bfloat16])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode", [0, 1, 2])
def test_v3_functional_leaves_inputs(device, mode):
    inp = make_inputs(torch.bfloat16, (3, 2), seed=19, int8_uqqr=mode == 1, full_quant=mode == 2)
    if mode == 2:
        inp["dequant_scale_x"] = inp["dequant_scale_x"].reshape(-1)  # v3 also takes (T,)
    outs, args = call_v3(torch_npu.npu_mla_prolog_v3_functional, inp, device, weight_quant_mode=mode,
                         kc_scale=0.5)
    assert len(outs) == 7
    ref = reference(inp, quant={0: None, 1: "partial", 2: "full"}[mode], kc=0.5)
    assert torch.equal(args[9].cpu(), inp["kv_cache"]) and torch.equal(args[10].cpu(), inp["kr_cache"])
    assert_close(outs[0].reshape(-1, N, HCKV), ref[0], TOL[torch.bfloat16])
    assert_close(outs[1].reshape(-1, N, DR), ref[1], TOL[torch.bfloat16])
    assert_close(outs[5], ref[2], TOL[torch.bfloat16])
    assert_close(outs[6], ref[3], TOL[torch.bfloat16])


def test_v3_fake_and_errors():
    with FakeTensorMode():
        inp = make_inputs(torch.bfloat16, (4,))
        outs = torch_npu.npu_mla_prolog_v3_functional(*[inp[k] for k in V3_POSITIONAL],
                                                      cache_index=inp["cache_index"], query_norm_flag=True)
        assert [tuple(o.shape) for o in outs] == [(4, N, HCKV), (4, N, DR), (0,), (4, HCQ), (0,),
                                                  (BLOCK_NUM, BLOCK_SIZE, 1, HCKV), (BLOCK_NUM, BLOCK_SIZE, 1, DR)]
    inp = make_inputs(torch.bfloat16, (2, 2))
    args = [inp[k] for k in V3_POSITIONAL]
    op = torch_npu.npu_mla_prolog_v3
    for kwargs, text in (({"kv_cache_quant_mode": 1}, "kv_cache_quant_mode"),
                         ({"cache_mode": "PA_BLK_BSND"}, "PA_BLK_BSND"),
                         ({"token_x_dtype": 27}, "token_x_dtype"),
                         ({"weight_quant_mode": 3}, "weight_quant_mode=3"),
                         ({"query_norm_flag": True, "qc_qr_scale": 2.0}, "qc_qr_scale")):
        with pytest.raises(NotImplementedError, match=text):
            op(*args, cache_index=inp["cache_index"], **kwargs)
    with pytest.raises(RuntimeError, match="weight_quant_mode=1 needs int8"):
        op(*args, cache_index=inp["cache_index"], weight_quant_mode=1)
    with pytest.raises(RuntimeError, match="cache_index is required"):
        op(*args)
