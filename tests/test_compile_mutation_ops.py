"""torch.compile of emulated ops that write into their inputs or tag storages (issue 3, round 9).

Each compiled call is compared with the eager call on fresh copies of the same inputs (values,
in-place cache updates, storage-format tags, errors) and, where the test can write it in a few
lines, with the documented formula computed here in float64. aot_eager runs the AOTAutograd
graph on the npu tensors; "inductor" is torch_npu's default backend (stock CPU Inductor on
zero-copy CPU aliases of the npu memory), kept to a few small graphs because it compiles slowly.
"""
import pytest
import torch
import torch._dynamo
from torch._subclasses.fake_tensor import FakeTensorMode

import torch_npu
from test_ops_attention_mla_prolog import POSITIONAL, make_inputs, reference as mla_reference

npu = torch.ops.npu
NZ, ND = 29, 2


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def compiled(fn, backend, fullgraph=True):
    return torch.compile(fn, backend=backend, fullgraph=fullgraph)


# ----------------------------------------------------------------- npu_kv_rmsnorm_rope_cache (v1)
# Its schema, as the real one, does not mark the caches as written.

RMS, ROPE, BS = 16, 8, 4


def _kv_inputs(device, b=2, s=3):
    gen = torch.Generator().manual_seed(5)
    kv = torch.randn(b, 1, s, RMS + ROPE, generator=gen)
    gamma = torch.rand(RMS, generator=gen) + 0.5
    angle = torch.rand(b, 1, s, ROPE, generator=gen) * 6
    index = torch.tensor([9, 0, -1, 14, 5, 2])[:b * s]      # PA_BNSD offsets; -1 is skipped
    return [t.to(device) for t in (kv, gamma, angle.cos(), angle.sin(), index)]


def _kv_caches(device):
    return torch.full((5, BS, 1, ROPE), 7.0, device=device), torch.full((5, BS, 1, RMS), 7.0, device=device)


def _kv_expected(kv, gamma, cos, sin, index):
    """float64: RMSNorm of the first RMS features, de-interleaved RoPE of the rest, written at
    block off // BS, row off % BS of fresh caches (filled with 7)."""
    x = kv.double().cpu()
    y = x[..., :RMS] / torch.sqrt(x[..., :RMS].pow(2).mean(-1, keepdim=True) + 1e-5) * gamma.double().cpu()
    r = x[..., RMS:]
    k = torch.cat((r[..., 0::2], r[..., 1::2]), -1)
    k = k * cos.double().cpu() + torch.cat((-k[..., ROPE // 2:], k[..., :ROPE // 2]), -1) * sin.double().cpu()
    k_cache, ckv_cache = (c.double().cpu() for c in _kv_caches("cpu"))
    b, _, s, _ = x.shape
    for t, off in enumerate(index.tolist()):
        if off >= 0:
            k_cache[off // BS, off % BS, 0] = k[t // s, 0, t % s]
            ckv_cache[off // BS, off % BS, 0] = y[t // s, 0, t % s]
    return k_cache, ckv_cache


def _kv_call_unused(kv, gamma, cos, sin, index, k_cache, ckv_cache):
    npu.npu_kv_rmsnorm_rope_cache(kv, gamma, cos, sin, index, k_cache, ckv_cache, cache_mode="PA_BNSD")
    return kv + 1


def _kv_call_read_around(kv, gamma, cos, sin, index, k_cache, ckv_cache):
    before = k_cache.sum()
    _, _, k_rope, _ = npu.npu_kv_rmsnorm_rope_cache(kv, gamma, cos, sin, index, k_cache, ckv_cache,
                                                    cache_mode="PA_BNSD")
    return before, k_cache.sum(), k_rope * 2


@pytest.mark.parametrize("backend,device", [("aot_eager", "npu"), ("aot_eager", "cpu"), ("inductor", "npu")])
def test_kv_rmsnorm_rope_cache_compiled_writes_caches(backend, device):
    args = _kv_inputs(device)
    exp_k, exp_ckv = _kv_expected(*args)
    # outputs unused: the call used to be dead-code eliminated (caches left untouched)
    kc, ckvc = _kv_caches(device)
    out = compiled(_kv_call_unused, backend)(*args, kc, ckvc)
    torch.testing.assert_close(out, args[0] + 1)
    torch.testing.assert_close(kc.cpu().double(), exp_k, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ckvc.cpu().double(), exp_ckv, atol=1e-5, rtol=1e-5)
    # reads of the cache before and after the call, inside one graph, see the old and new values
    torch._dynamo.reset()
    eager_caches, compiled_caches = _kv_caches(device), _kv_caches(device)
    eager = _kv_call_read_around(*args, *eager_caches)
    got = compiled(_kv_call_read_around, backend)(*args, *compiled_caches)
    assert got[0].item() == 7.0 * kc.numel()
    for e, g in zip(eager, got):
        torch.testing.assert_close(g, e, atol=1e-5, rtol=1e-5)
    for e, g in zip(eager_caches, compiled_caches):
        torch.testing.assert_close(g, e, atol=1e-5, rtol=1e-5)


def test_kv_rmsnorm_rope_cache_eager_returns_the_caches_and_compiled_errors_match():
    args = _kv_inputs("npu")
    kc, ckvc = _kv_caches("npu")
    out = npu.npu_kv_rmsnorm_rope_cache(*args, kc, ckvc, cache_mode="PA_BNSD")
    assert out[0] is kc and out[1] is ckvc
    bad = args[:4] + [torch.tensor([0, 1, 2, 3, 4, 40], device="npu")]
    for fn in (_kv_call_unused, compiled(_kv_call_unused, "aot_eager")):
        with pytest.raises(RuntimeError, match="index points past block_num 5"):
            fn(*bad, *_kv_caches("npu"))
    with FakeTensorMode():
        fake = npu.npu_kv_rmsnorm_rope_cache(*_kv_inputs("cpu"), *_kv_caches("cpu"), cache_mode="PA_BNSD")
        assert [tuple(t.shape) for t in fake] == [(5, BS, 1, ROPE), (5, BS, 1, RMS), (2, 1, 3, ROPE), (2, 1, 3, RMS)]


# ----------------------------------------------------------------- npu_mla_prolog / _v2 (caches written in place)

def _mla_args(device, inp):
    moved = {k: v.to(device) for k, v in inp.items()}
    return [moved.pop(k) for k in POSITIONAL]


def _mla_v1(*args):
    query, query_rope, kv, _ = npu.npu_mla_prolog(*args)
    return query, query_rope, kv * 1


def _mla_v2_query_only(*args):
    return npu.npu_mla_prolog_v2(*args)[0]


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_mla_prolog_compiled_updates_caches(backend):
    inp = make_inputs(torch.float32, lead=(2, 2))
    ref_q, ref_qr, ref_kv, ref_kr = mla_reference(inp)
    args = _mla_args("npu", inp)
    query, query_rope, kv_copy = compiled(_mla_v1, backend)(*args)
    rel = 1e-4
    for got, ref in ((query.reshape(ref_q.shape), ref_q), (query_rope.reshape(ref_qr.shape), ref_qr),
                     (args[10], ref_kv), (args[11], ref_kr), (kv_copy, ref_kv)):
        assert (got.cpu().double() - ref).abs().max() <= rel * ref.abs().max()
    # v2, only the query used: the cache writes still happen
    torch._dynamo.reset()
    args = _mla_args("npu", inp)
    compiled(_mla_v2_query_only, backend)(*args)
    assert (args[10].cpu().double() - ref_kv).abs().max() <= rel * ref_kv.abs().max()
    assert (args[11].cpu().double() - ref_kr).abs().max() <= rel * ref_kr.abs().max()


@pytest.mark.parametrize("backend", ["aot_eager"])
def test_mla_prolog_compiled_rejects_bad_slots_as_eager(backend):
    inp = make_inputs(torch.float32, lead=(1, 2))
    inp["cache_index"] = torch.tensor([[3, -1]])     # negative: indexing alone would write the last slot
    fn = compiled(_mla_v2_query_only, backend)
    for call in (_mla_v2_query_only, fn):
        args = _mla_args("npu", inp)
        kv_before = args[10].clone()
        with pytest.raises(RuntimeError, match="cache_index values must lie in"):
            call(*args)
        assert torch.equal(args[10][-1], kv_before[-1])


# ----------------------------------------------------------------- other composite ops writing their arguments

def _rotary(q, k, cos, sin):
    npu.npu_apply_rotary_pos_emb(q, k, cos, sin)
    return q.sum() * 0


def test_apply_rotary_pos_emb_compiled_updates_query_and_key():
    gen = torch.Generator().manual_seed(3)
    q, k = torch.randn(1, 3, 2, 8, generator=gen), torch.randn(1, 3, 1, 8, generator=gen)
    angle = torch.rand(1, 3, 1, 8, generator=gen)
    cos, sin = angle.cos(), angle.sin()

    def expected(x):  # 'half' rotary mode: rotate_half(x) = [-x2, x1]
        return x * cos + torch.cat((-x[..., 4:], x[..., :4]), -1) * sin
    qn, kn = q.to("npu"), k.to("npu")
    compiled(_rotary, "aot_eager")(qn, kn, cos.to("npu"), sin.to("npu"))
    torch.testing.assert_close(qn.cpu(), expected(q))
    torch.testing.assert_close(kn.cpu(), expected(k))


def _gather_stats(x, mean, invstd, running_mean, running_var, counts):
    return npu.batch_norm_gather_stats_update(x, mean, invstd, running_mean, running_var, 0.1, 1e-5, counts)


def test_batch_norm_gather_stats_update_compiled_updates_running_stats():
    gen = torch.Generator().manual_seed(4)
    mean, invstd = torch.randn(3, 5, generator=gen, dtype=torch.float64), torch.rand(3, 5, generator=gen,
                                                                                       dtype=torch.float64) + 0.5
    counts = torch.tensor([4.0, 6.0, 5.0], dtype=torch.float64)
    total = counts.sum()
    g_mean = (counts[:, None] * mean).sum(0) / total
    g_var = (counts[:, None] * (1 / invstd ** 2 - 1e-5 + (mean - g_mean) ** 2)).sum(0) / total
    rm, rv = torch.zeros(5, dtype=torch.float64, device="npu"), torch.ones(5, dtype=torch.float64, device="npu")
    x = torch.zeros(2, 5, dtype=torch.float64, device="npu")
    out_mean, out_invstd = compiled(_gather_stats, "aot_eager")(x, mean.to("npu"), invstd.to("npu"), rm, rv,
                                                               counts.to("npu"))
    torch.testing.assert_close(out_mean.cpu(), g_mean)
    torch.testing.assert_close(out_invstd.cpu(), 1 / torch.sqrt(g_var + 1e-5))
    torch.testing.assert_close(rm.cpu(), 0.1 * g_mean)
    torch.testing.assert_close(rv.cpu(), 0.9 + 0.1 * g_var * total / (total - 1))


def _scatter_pa(key, value, key_cache, value_cache, slots):
    npu.npu_scatter_pa_kv_cache(key, value, key_cache, value_cache, slots)
    return key * 1


def test_scatter_pa_kv_cache_compiled_writes_and_rejects_negative_slots():
    key, value = torch.randn(3, 2, 4, device="npu"), torch.randn(3, 2, 4, device="npu")
    fn = compiled(_scatter_pa, "aot_eager")
    kc, vc = torch.zeros(2, 4, 2, 4, device="npu"), torch.zeros(2, 4, 2, 4, device="npu")
    fn(key, value, kc, vc, torch.tensor([5, 0, 3], device="npu"))
    for t, s in enumerate([5, 0, 3]):
        assert torch.equal(kc[s // 4, s % 4], key[t]) and torch.equal(vc[s // 4, s % 4], value[t])
    assert int((kc != 0).any(-1).any(-1).sum()) == 3
    for call in (_scatter_pa, fn):
        with pytest.raises(RuntimeError, match="slot_mapping values must be in"):
            call(key, value, torch.zeros(2, 4, 2, 4, device="npu"), torch.zeros(2, 4, 2, 4, device="npu"),
                 torch.tensor([5, -1, 3], device="npu"))


# ----------------------------------------------------------------- npu_format_cast and storage-format tags

def _cast_nz(x):
    return torch_npu.npu_format_cast(x * 2, NZ)


def _cast_chain(x):
    y = torch_npu.npu_format_cast(x, NZ)
    return y, y + 1, torch_npu.npu_format_cast(y, ND)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compiled_format_cast_tags_the_result_at_run_time(backend):
    x = torch.randn(4, 16, device="npu")
    out = compiled(_cast_nz, backend)(x)
    assert out.device.type == "npu" and torch_npu.get_npu_format(out) == NZ
    assert torch.equal(out, x * 2) and torch_npu.get_npu_format(x) == ND
    torch._dynamo.reset()
    y, y1, back = compiled(_cast_chain, backend)(x)
    assert [torch_npu.get_npu_format(t) for t in (y, y1, back)] == [NZ, ND, ND]
    assert torch.equal(y, x) and torch.equal(back, x) and torch.equal(y1, x + 1)
    # an input that already is NZ: the compiled graph reads its tag at run time
    x_nz = torch_npu.npu_format_cast(torch.randn(4, 16, device="npu"), NZ)
    y, _, back = compiled(_cast_chain, backend)(x_nz)
    assert torch_npu.get_npu_format(y) == NZ and torch_npu.get_npu_format(back) == ND
    assert torch.equal(back, x_nz) and torch_npu.get_npu_format(x_nz) == NZ


def _format_times(x):
    return x * torch_npu.get_npu_format(x)


def _empty_nz(x):
    return torch_npu.empty_with_format((2, 16), dtype=torch.float32, device="npu", acl_format=NZ), x + 1


def _cast_like(x, dst):
    return torch_npu.npu_format_cast(x, dst) + 0, torch_npu.npu_format_cast(x, dst)


def test_format_queries_run_eagerly_under_compile():
    x_nz = torch_npu.npu_format_cast(torch.ones(2, 16, device="npu"), NZ)
    assert torch.equal(torch.compile(_format_times, backend="aot_eager")(x_nz), x_nz * NZ)
    assert torch.equal(torch.compile(_format_times, backend="aot_eager")(torch.ones(2, 16, device="npu")),
                       torch.full((2, 16), float(ND), device="npu"))
    torch._dynamo.reset()
    with pytest.raises(Exception, match="storage format of a tensor, which is only known at run time"):
        compiled(_format_times, "aot_eager")(x_nz)
    torch._dynamo.reset()
    _, like = torch.compile(_cast_like, backend="aot_eager")(torch.ones(2, 16, device="npu"), x_nz)
    assert torch_npu.get_npu_format(like) == NZ
    empty, _ = compiled(_empty_nz, "aot_eager")(x_nz)
    assert empty.shape == (2, 16) and torch_npu.get_npu_format(empty) == NZ


def test_npu_format_cast_eager_identity_fake_and_gradient():
    x = torch.randn(3, 16, device="npu")
    assert torch_npu.npu_format_cast(x, ND) is x                   # eager: already in that format
    x_nz = torch_npu.npu_format_cast(x, NZ)
    assert x_nz is not x and torch_npu.get_npu_format(x_nz) == NZ and torch_npu.npu_format_cast(x_nz, NZ) is x_nz
    copy = npu._npu_format_cast(x_nz, NZ)                          # the graph node always copies
    assert copy.data_ptr() != x_nz.data_ptr() and torch_npu.get_npu_format(copy) == NZ and torch.equal(copy, x)
    cpu = torch.randn(3, 4)
    assert torch.equal(npu._npu_format_cast(cpu, NZ), cpu) and torch_npu.get_npu_format(cpu) == ND
    with FakeTensorMode():
        fake = torch_npu.npu_format_cast(torch.empty(3, 16), NZ)
        assert fake.shape == (3, 16) and fake.dtype == torch.float32
    with pytest.raises(RuntimeError, match="is not a torch_npu.Format value"):
        npu._npu_format_cast(x, 1234)
    # op-plugin derivatives.yaml: _npu_format_cast passes the gradient through
    leaf = torch.randn(3, 4, dtype=torch.float64, device="npu", requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: npu._npu_format_cast(t, NZ) * t, (leaf,))
    weights = torch.randn(3, 4, device="npu")
    xg = torch.randn(3, 4, device="npu", requires_grad=True)
    compiled(lambda t, w: (torch_npu.npu_format_cast(t, NZ) * w).sum(), "aot_eager")(xg, weights).backward()
    torch.testing.assert_close(xg.grad, weights)


# ----------------------------------------------------------------- npu_scatter_list(_) mask (a value check)

def _lists(device):
    gen = torch.Generator().manual_seed(8)
    tensors = [torch.randn(2, 4, 3, generator=gen).to(device) for _ in range(3)]
    return tensors, torch.tensor([1, 3, 0], device=device), torch.randn(3, 2, 1, 3, generator=gen).to(device)


def _scatter_list(tensors, indices, updates, mask):
    return npu.npu_scatter_list(tensors, indices, updates, mask)


def _scatter_list_inplace(tensors, indices, updates, mask):
    npu.npu_scatter_list_(tensors, indices, updates, mask)
    return updates * 1


@pytest.mark.parametrize("backend,device", [("aot_eager", "npu"), ("aot_eager", "cpu"), ("inductor", "npu")])
def test_scatter_list_compiled_matches_formula_and_rejects_zero_masks(backend, device):
    tensors, indices, updates = _lists(device)
    ones = torch.ones(3, dtype=torch.uint8, device=device)
    expected = [t.clone() for t in tensors]
    for i, t in enumerate(expected):          # axis -2: row indices[i] of tensor i <- updates[i]
        t[:, int(indices[i]), :] = updates[i][:, 0, :]
    got = compiled(_scatter_list, backend)(tensors, indices, updates, ones)
    assert all(torch.equal(g, e) for g, e in zip(got, expected))
    inplace = [t.clone() for t in tensors]
    compiled(_scatter_list_inplace, backend)(inplace, indices, updates, ones)
    assert all(torch.equal(g, e) for g, e in zip(inplace, expected))
    zero = torch.tensor([1, 0, 1], dtype=torch.uint8, device=device)
    for fn in (_scatter_list, compiled(_scatter_list, backend), _scatter_list_inplace,
               compiled(_scatter_list_inplace, backend)):
        with pytest.raises(NotImplementedError, match="a mask with zero entries is not emulated"):
            fn([t.clone() for t in tensors], indices, updates, zero)


def test_scatter_list_fake_shapes_and_no_gradient():
    with FakeTensorMode():
        tensors, indices, updates = _lists("cpu")
        out = npu.npu_scatter_list(tensors, indices, updates, torch.ones(3, dtype=torch.uint8))
        assert [tuple(t.shape) for t in out] == [(2, 4, 3)] * 3
    tensors, indices, updates = _lists("npu")
    out = npu.npu_scatter_list(tensors, indices, updates.requires_grad_())
    assert not any(t.requires_grad for t in out)                  # no backward in op-plugin
    with pytest.raises(RuntimeError, match="updates must be"):
        npu.npu_scatter_list(tensors, indices, updates[:, :, :, :2])
