"""npu_kv_rmsnorm_rope_cache (+ _v2, _v2_functional) against the op-plugin golden formula."""
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from _op_helpers import zeros as z

npu = torch.ops.npu


f16, f32, i8, i32, i64 = torch.float16, torch.float32, torch.int8, torch.int32, torch.int64


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
