"""npu_qkv_rms_norm_rope_cache (+ _functional) against the op-plugin golden."""
import math

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from _op_helpers import DEVICES


def _qkv_cache_ref(qkv, q_gamma, k_gamma, cos, sin, index, k_cache, v_cache, b, s, heads, d, k_scale, v_scale,
                   k_offset, eps=1e-6):
    """The op-plugin golden / CANN README, float64 loops; caches are updated copies."""
    nq, nk, nv = heads
    t = b * s
    x = qkv.double().reshape(t, nq + nk + nv, d)
    c, sn = cos.double().reshape(t, d), sin.double().reshape(t, d)

    def rms_rope(vec, gamma, row):
        ms = sum(e * e for e in vec) / d
        y = [vec[j] / math.sqrt(ms + eps) * float(gamma[j]) for j in range(d)]
        h = d // 2
        rot = [-y[h + j] for j in range(h)] + [y[j] for j in range(h)]
        return [y[j] * float(c[row, j]) + rot[j] * float(sn[row, j]) for j in range(d)]

    q = torch.zeros(t, nq, d, dtype=torch.float64)
    k = torch.zeros(t, nk, d, dtype=torch.float64)
    v = x[:, nq + nk:].clone()
    for r in range(t):
        for h in range(nq):
            q[r, h] = torch.tensor(rms_rope(x[r, h].tolist(), q_gamma.double(), r), dtype=torch.float64)
        for h in range(nk):
            k[r, h] = torch.tensor(rms_rope(x[r, nq + h].tolist(), k_gamma.double(), r), dtype=torch.float64)
    kc, vc = k_cache.clone(), v_cache.clone()
    for vals, cache, scale, offset in ((k, kc, k_scale, k_offset), (v, vc, v_scale, None)):
        bn, _, bs, c0 = cache.shape
        n = vals.shape[1]
        view = cache.view(bn, n, d // c0, bs, c0)
        for r in range(t):
            p = int(index[r])
            if p < 0:
                continue
            row = vals[r]
            if scale is not None:
                row = row / scale.double()
                if offset is not None:
                    row = row + offset.double()
                row = torch.round(row).clamp(-128, 127)
            for i in range(d // c0):
                view[p // bs, :, i, p % bs, :] = row[:, i * c0:(i + 1) * c0].to(cache.dtype)
    return q.reshape(t, nq * d), k.reshape(t, nk * d), v.reshape(t, nv * d), kc, vc


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("quant", [False, True])
def test_qkv_rms_norm_rope_cache(device, dtype, quant):
    torch.manual_seed(10)
    b, s, heads, d = 2, 3, (2, 1, 1), 32
    t, n = b * s, sum(heads)
    bn, bs = 2, 4
    c0 = 32 if quant else 16
    cache_dtype = torch.int8 if quant else dtype
    qkv = torch.randn(t, n * d).to(dtype)
    q_gamma, k_gamma = torch.randn(d).to(dtype), torch.randn(d).to(dtype)
    cos, sin = torch.randn(t, d).to(dtype), torch.randn(t, d).to(dtype)
    index = torch.tensor([5, -1, 0, 7, 2, -1])
    k_cache = torch.full((bn, heads[1] * d // c0, bs, c0), 9).to(cache_dtype)
    v_cache = torch.full((bn, heads[2] * d // c0, bs, c0), 9).to(cache_dtype)
    q_out = torch.zeros(t, heads[0] * d, dtype=dtype)
    k_scale = torch.rand(heads[1], d) * 0.05 + 0.01 if quant else None
    v_scale = torch.rand(heads[2], d) * 0.05 + 0.01 if quant else None
    k_offset = torch.randint(-3, 4, (heads[1], d)).float() if quant else None
    ref_q, ref_k, ref_v, ref_kc, ref_vc = _qkv_cache_ref(qkv, q_gamma, k_gamma, cos, sin, index, k_cache, v_cache,
                                                         b, s, heads, d, k_scale, v_scale, k_offset)
    dev = lambda a: None if a is None else a.to(device)
    qo, kc, vc = dev(q_out), dev(k_cache), dev(v_cache)
    args = (dev(qkv), dev(q_gamma), dev(k_gamma), dev(cos), dev(sin), dev(index))
    kw = dict(k_scale=dev(k_scale), v_scale=dev(v_scale), k_offset=dev(k_offset), is_output_qkv=True)
    # functional first: inputs untouched, updated copies returned
    outs = torch.ops.npu.npu_qkv_rms_norm_rope_cache_functional(*args, qo, kc, vc, [b, s, n, d], list(heads), **kw)
    assert torch.equal(kc.cpu(), k_cache) and torch.equal(qo.cpu(), q_out)
    bq, bk, bv, fq, fk, fv = outs
    before = (bq, bk, bv)
    got = torch.ops.npu.npu_qkv_rms_norm_rope_cache(*args, qo, kc, vc, [b, s, n, d], list(heads), **kw)
    tol = 2e-2 if dtype == torch.bfloat16 else 3e-3
    for g, f, ref in zip(got, before, (ref_q, ref_k, ref_v)):
        assert g.dtype == dtype and g.device.type == device
        torch.testing.assert_close(g.cpu().double(), ref, rtol=tol, atol=tol)
        assert torch.equal(g.cpu(), f.cpu())
    torch.testing.assert_close(qo.cpu().double(), ref_q, rtol=tol, atol=tol)    # q_out written in place
    assert torch.equal(fq.cpu(), qo.cpu()) and torch.equal(fk.cpu(), kc.cpu()) and torch.equal(fv.cpu(), vc.cpu())
    for cache, ref in ((kc, ref_kc), (vc, ref_vc)):
        assert cache.dtype == cache_dtype
        if quant:   # float32 vs float64 rounding: at most 1 apart, untouched slots exact
            diff = (cache.cpu().double() - ref.double()).abs()
            assert float(diff.max()) <= 1 and float((diff == 0).double().mean()) >= 0.97
        else:
            torch.testing.assert_close(cache.cpu().double(), ref.double(), rtol=tol, atol=tol)
    # skipped tokens / unused slots keep the old value 9
    assert int((kc.cpu().double() == 9).sum()) >= k_cache.numel() - 4 * heads[1] * d


def test_qkv_rms_norm_rope_cache_placeholders_errors_and_fake():
    t, d = 2, 16
    op = torch.ops.npu.npu_qkv_rms_norm_rope_cache
    args = lambda: (torch.randn(t, 3 * d).half(), torch.ones(d).half(), torch.ones(d).half(), torch.ones(t, d).half(),
                    torch.zeros(t, d).half(), torch.tensor([0, 1]), torch.zeros(t, d).half(),
                    torch.zeros(1, d // 16, 2, 16).half(), torch.zeros(1, d // 16, 2, 16).half())
    outs = op(*args(), [1, 2, 3, d], [1, 1, 1])
    assert [tuple(o.shape) for o in outs] == [(), (), ()]
    with pytest.raises(NotImplementedError, match="cache_mode='PA'"):
        op(*args(), [1, 2, 3, d], [1, 1, 1], cache_mode="PA")
    with pytest.raises(RuntimeError, match="qkv must be"):
        op(*args(), [1, 2, 4, d], [2, 1, 1])
    with pytest.raises(RuntimeError, match="k_scale is required"):
        a = list(args())
        a[7] = torch.zeros(1, d // 32 or 1, 2, 32, dtype=torch.int8)
        op(*a, [1, 2, 3, d], [1, 1, 1])
    with pytest.raises(NotImplementedError, match="k_offset without k_scale"):
        op(*args(), [1, 2, 3, d], [1, 1, 1], k_offset=torch.zeros(1, d))
    with FakeTensorMode():
        f16 = torch.float16
        qkv, g = torch.empty(6, 4 * 32, dtype=f16), torch.empty(32, dtype=f16)
        cs = torch.empty(6, 32, dtype=f16)
        kc = torch.empty(2, 1, 32, 32, dtype=torch.int8)
        outs = torch.ops.npu.npu_qkv_rms_norm_rope_cache_functional(
            qkv, g, g, cs, cs, torch.empty(6, dtype=torch.int64), torch.empty(6, 64, dtype=f16), kc, kc.clone(),
            [2, 3, 4, 32], [2, 1, 1], k_scale=torch.empty(1, 32), v_scale=torch.empty(1, 32), is_output_qkv=True)
        assert [(tuple(o.shape), o.dtype) for o in outs] == [
            ((6, 64), f16), ((6, 32), f16), ((6, 32), f16), ((6, 64), f16), ((2, 1, 32, 32), torch.int8),
            ((2, 1, 32, 32), torch.int8)]
