"""npu_scatter_pa_kv_cache(+_functional) and npu_advance_step_flashattn against references
written here with per-token Python loops over the documented slot arithmetic."""
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import torch_npu

from _op_helpers import DEVICES

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.int8]


def rnd(shape, seed, dtype):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * 10).to(dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_scatter_pa_kv_cache_nd(device, dtype):
    tokens, heads, dk, dv, nb, bs = 6, 2, 4, 8, 3, 4
    key, value = rnd((tokens, heads, dk), 0, dtype), rnd((tokens, heads, dv), 1, dtype)
    kc, vc = rnd((nb, bs, heads, dk), 2, dtype), rnd((nb, bs, heads, dv), 3, dtype)
    slots = torch.tensor([5, 0, 11, 7, 2, 9], dtype=torch.int32)
    want_k, want_v = kc.clone(), vc.clone()
    for t, s in enumerate(slots.tolist()):
        want_k[s // bs, s % bs] = key[t]
        want_v[s // bs, s % bs] = value[t]
    kc_d, vc_d = kc.clone().to(device), vc.clone().to(device)
    ret = torch_npu.npu_scatter_pa_kv_cache(key.to(device), value.to(device), kc_d, vc_d, slots.to(device))
    assert ret is None
    assert torch.equal(kc_d.cpu(), want_k) and torch.equal(vc_d.cpu(), want_v)


@pytest.mark.parametrize("device", DEVICES)
def test_scatter_pa_kv_cache_nz_shapes(device):
    # documented scenario 1: cache (num_blocks, heads*head_size/last, block_size, last)
    bs_tokens, heads, dk, dv, nb, last, block = 5, 4, 32, 64, 2, 16, 32
    key, value = rnd((bs_tokens, heads, dk), 4, torch.float16), rnd((bs_tokens, heads, dv), 5, torch.float16)
    kc = rnd((nb, heads * dk // last, block, last), 6, torch.float16)
    vc = torch.zeros(nb, heads * dv // last, block, last, dtype=torch.float16)
    slots = torch.tensor([3, 40, 63, 0, 33], dtype=torch.int64)
    want_k, want_v = kc.clone(), vc.clone()
    for t, s in enumerate(slots.tolist()):
        kf, vf = key[t].reshape(-1), value[t].reshape(-1)
        for c in range(heads * dk // last):
            want_k[s // block, c, s % block] = kf[c * last:(c + 1) * last]
        for c in range(heads * dv // last):
            want_v[s // block, c, s % block] = vf[c * last:(c + 1) * last]
    kc_d, vc_d = kc.clone().to(device), vc.clone().to(device)
    torch_npu.npu_scatter_pa_kv_cache(key.to(device), value.to(device), kc_d, vc_d, slots.to(device))
    assert torch.equal(kc_d.cpu(), want_k) and torch.equal(vc_d.cpu(), want_v)
    fk, fv = torch.ops.npu.npu_scatter_pa_kv_cache_functional(key, value, kc, vc, slots)
    assert torch.equal(fk, want_k) and torch.equal(fv, want_v)
    assert not torch.equal(kc, want_k)  # the functional form leaves its inputs alone


def test_scatter_pa_kv_cache_errors_and_meta():
    key = torch.ones(2, 1, 4)
    kc = torch.zeros(1, 4, 1, 4)
    with pytest.raises(RuntimeError, match="slot_mapping values"):
        torch_npu.npu_scatter_pa_kv_cache(key, key, kc, kc.clone(), torch.tensor([0, 4]))
    with pytest.raises(NotImplementedError, match="compressed scenario"):
        torch_npu.npu_scatter_pa_kv_cache(key, key, kc, kc.clone(), torch.tensor([0, 1]),
                                          seq_lens=torch.tensor([2]))
    with FakeTensorMode():
        key = torch.empty(3, 2, 8)
        kc = torch.empty(2, 4, 2, 8)
        torch_npu.npu_scatter_pa_kv_cache(key, key, kc, kc, torch.zeros(3, dtype=torch.int64))


def ref_advance(tokens, sampled, positions, seq_lens, slots, tables, nq, bs):
    tokens, positions, seq_lens, slots = (t.clone() for t in (tokens, positions, seq_lens, slots))
    for i in range(nq):
        pos = seq_lens[i].item()
        tokens[i] = sampled[i, 0]
        positions[i] = pos
        seq_lens[i] = pos + 1
        slots[i] = tables[i, pos // bs].item() * bs + pos % bs
    return tokens, positions, seq_lens, slots


@pytest.mark.parametrize("device", DEVICES)
def test_advance_step_flashattn(device):
    g = torch.Generator().manual_seed(7)
    num_seqs, nq, bs = 8, 5, 4
    tokens = torch.randint(1, 100, (num_seqs,), generator=g)
    sampled = torch.randint(1, 100, (nq, 1), generator=g)
    positions = torch.randint(1, 30, (num_seqs,), generator=g)
    seq_lens = torch.randint(1, 30, (num_seqs,), generator=g)
    slots = torch.randint(1, 30, (num_seqs,), generator=g)
    tables = torch.randint(1, 50, (num_seqs, 30 // bs + 1), generator=g)
    want = ref_advance(tokens, sampled, positions, seq_lens, slots, tables, nq, bs)
    got = [t.to(device) for t in (tokens, positions, seq_lens, slots)]
    ret = torch_npu.npu_advance_step_flashattn(got[0], sampled.to(device), got[1], got[2], got[3],
                                               tables.to(device), num_seqs, nq, bs)
    assert ret is None
    for g_t, w_t in zip(got, want):
        assert torch.equal(g_t.cpu(), w_t)
    assert torch.equal(got[0].cpu()[nq:], tokens[nq:])  # untouched past num_queries


def test_advance_step_errors():
    t = torch.ones(4, dtype=torch.int64)
    with pytest.raises(NotImplementedError, match="speculative"):
        torch_npu.npu_advance_step_flashattn(t, t.reshape(4, 1), t, t, t, t.reshape(4, 1), 4, 4, 2,
                                             spec_token=t.reshape(4, 1), accepted_num=t)
    with pytest.raises(RuntimeError, match="block_tables has 1 columns"):
        torch_npu.npu_advance_step_flashattn(t, t.reshape(4, 1), t, t * 5, t.clone(), t.reshape(4, 1), 4, 4, 2)
