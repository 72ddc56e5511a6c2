"""Paged KV-cache gather / scatter (npu_gather_pa_kv_cache, npu_scatter_pa_cache.value) and
npu_scatter_list against loops over the documented layouts."""
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from _op_helpers import int_zeros as _ints, zeros as z

npu = torch.ops.npu


f16, f32, i8, i32, i64 = torch.float16, torch.float32, torch.int8, torch.int32, torch.int64


def _gather_reference(cache, block_tables, lens, offsets, nz):
    rows = []
    block_size = cache.size(2) if nz else cache.size(1)
    for b, n in enumerate(lens):
        for s in range(n):
            block = int(block_tables[b, offsets[b] // block_size + s // block_size])
            if nz:
                rows.append(cache[block, :, s % block_size, :].reshape(-1))
            else:
                rows.append(cache[block, s % block_size])
    return torch.stack(rows)


@pytest.mark.parametrize("device", ["cpu", "npu"])
@pytest.mark.parametrize("dtype", [f16, torch.bfloat16, i8])
@pytest.mark.parametrize("nz", [False, True])
@pytest.mark.parametrize("cumsum,with_offset", [(False, False), (True, False), (False, True)])
def test_gather_pa_kv_cache_matches_loop(device, dtype, nz, cumsum, with_offset):
    gen = torch.Generator().manual_seed(31)
    num_blocks, block_size, heads, dk, dv, a = 9, 4, 2, 8, 4, 4
    if nz:
        kc = torch.randint(-100, 100, (num_blocks, heads * dk // a, block_size, a), generator=gen).to(dtype)
        vc = torch.randint(-100, 100, (num_blocks, heads * dv // a, block_size, a), generator=gen).to(dtype)
    else:
        kc = torch.randint(-100, 100, (num_blocks, block_size, heads, dk), generator=gen).to(dtype)
        vc = torch.randint(-100, 100, (num_blocks, block_size, heads, dv), generator=gen).to(dtype)
    lens, offsets = [5, 0, 7], ([4, 0, 8] if with_offset else [0, 0, 0])
    tables = torch.tensor([[3, 1, 6, 0], [2, 2, 2, 2], [8, 5, 7, 4]], dtype=i32)
    seq_lens = torch.tensor([0, 5, 5, 12] if cumsum else lens, dtype=i32)
    rows = 14                                           # 12 gathered, the last 2 stay untouched
    kshape, vshape = ((rows, heads * dk), (rows, heads * dv)) if nz else ((rows, heads, dk), (rows, heads, dv))
    key, value = torch.full(kshape, 7).to(dtype), torch.full(vshape, 7).to(dtype)
    exp_k, exp_v = key.clone(), value.clone()
    exp_k[:12] = _gather_reference(kc, tables, lens, offsets, nz).reshape(exp_k[:12].shape)
    exp_v[:12] = _gather_reference(vc, tables, lens, offsets, nz).reshape(exp_v[:12].shape)
    offset = torch.tensor(offsets, dtype=i32).to(device) if with_offset else None
    args = [t.to(device) for t in (kc, vc, tables, seq_lens)]
    k_out, v_out = npu.npu_gather_pa_kv_cache_functional(*args, key.to(device), value.to(device), seq_offset=offset,
                                                         is_seq_lens_cumsum=cumsum)
    assert k_out.device.type == device and torch.equal(k_out.cpu(), exp_k) and torch.equal(v_out.cpu(), exp_v)
    key_d, value_d = key.to(device), value.to(device)
    assert npu.npu_gather_pa_kv_cache(*args, key_d, value_d, seq_offset=offset, is_seq_lens_cumsum=cumsum) is None
    assert torch.equal(key_d.cpu(), exp_k) and torch.equal(value_d.cpu(), exp_v)


def test_gather_pa_kv_cache_fake_and_errors():
    kc, vc, tables = z(4, 16, 2, 8), z(4, 16, 2, 4), z(2, 2, dtype=i32)
    with FakeTensorMode():
        k_out, v_out = npu.npu_gather_pa_kv_cache_functional(z(4, 16, 2, 8), z(4, 16, 2, 4), z(2, 2, dtype=i32),
                                                             _ints(2), z(10, 2, 8), z(10, 2, 4))
        assert (k_out.shape, v_out.shape) == ((10, 2, 8), (10, 2, 4))
    with pytest.raises(RuntimeError, match="hold 20 tokens"):
        npu.npu_gather_pa_kv_cache(kc, vc, tables, torch.tensor([10, 10], dtype=i32), z(10, 2, 8), z(10, 2, 4))
    with pytest.raises(RuntimeError, match="needs block_tables columns"):
        npu.npu_gather_pa_kv_cache(kc, vc, tables, torch.tensor([40, 0], dtype=i32), z(40, 2, 8), z(40, 2, 4))
    with pytest.raises(RuntimeError, match="block ids must be in"):
        npu.npu_gather_pa_kv_cache(kc, vc, torch.tensor([[9, 0], [0, 0]], dtype=i32), torch.tensor([3, 0], dtype=i32),
                                   z(4, 2, 8), z(4, 2, 4))
    with pytest.raises(RuntimeError, match=r"seq_lens must be \[batch \+ 1\]"):
        npu.npu_gather_pa_kv_cache(kc, vc, tables, torch.tensor([3, 0], dtype=i32), z(4, 2, 8), z(4, 2, 4),
                                   is_seq_lens_cumsum=True)
    with pytest.raises(RuntimeError, match="must end with the rows'"):
        npu.npu_gather_pa_kv_cache(kc, vc, tables, _ints(2), z(4, 3, 8), z(4, 2, 4))


@pytest.mark.parametrize("device", ["cpu", "npu"])
@pytest.mark.parametrize("dtype", [f16, torch.bfloat16, i8])
def test_scatter_pa_cache_writes_each_token_at_its_slot(device, dtype):
    gen = torch.Generator().manual_seed(41)
    key = torch.randint(-50, 50, (5, 2, 3), generator=gen).to(dtype)
    cache = torch.zeros(4, 3, 2, 3, dtype=dtype)
    slots = torch.tensor([7, 0, 11, 4, 5], dtype=i32)
    expected = cache.clone()
    for t, s in enumerate(slots.tolist()):
        expected[s // 3, s % 3] = key[t]
    cache_d = cache.to(device)
    out = npu.npu_scatter_pa_cache(key.to(device), slots.to(device), key_cache=cache_d)
    assert out is cache_d and torch.equal(cache_d.cpu(), expected)


def test_scatter_pa_cache_errors_and_fake():
    with FakeTensorMode():
        cache = z(2, 4, 2, 4)
        assert npu.npu_scatter_pa_cache(z(3, 2, 4), _ints(3), key_cache=cache) is cache
    with pytest.raises(RuntimeError, match="slot_mapping values must be in"):
        npu.npu_scatter_pa_cache(z(2, 2, 4), torch.tensor([0, 8], dtype=i32), key_cache=z(2, 4, 2, 4))
    with pytest.raises(RuntimeError, match="key_cache must be"):
        npu.npu_scatter_pa_cache(z(2, 2, 4), _ints(2), key_cache=z(2, 4, 3, 4))
    with pytest.raises(NotImplementedError, match="compressed scenarios"):
        npu.npu_scatter_pa_cache(z(2, 3, 2, 4), z(2, 2, dtype=i32), seq_lens=_ints(2), key_cache=z(2, 4, 1, 4))


@pytest.mark.parametrize("device", ["cpu", "npu"])
@pytest.mark.parametrize("axis", [-2, -1])
def test_scatter_list_replaces_one_row_per_tensor(device, axis):
    gen = torch.Generator().manual_seed(51)
    tensors = [torch.randn(3, 6, 5, generator=gen).to(f16) for _ in range(4)]
    indices = torch.tensor([0, 5, 2, 4] if axis == -2 else [4, 0, 3, 1], dtype=i32)
    upd_shape = (4, 3, 1, 5) if axis == -2 else (4, 3, 6, 1)
    updates = torch.randn(upd_shape, generator=gen).to(f16)
    expected = [t.clone() for t in tensors]
    for i, t in enumerate(expected):          # the op-plugin test's loop
        for j in range(t.shape[0]):
            if axis == -2:
                t[j][int(indices[i])] = updates[i][j][0]
            else:
                for k in range(t.shape[1]):
                    t[j][k][int(indices[i])] = updates[i][j][k][0]
    mask = torch.ones(4, dtype=torch.uint8)
    outs = npu.npu_scatter_list([t.to(device) for t in tensors], indices.to(device), updates.to(device),
                                mask.to(device), "update", axis)
    assert all(o.device.type == device and torch.equal(o.cpu(), e) for o, e in zip(outs, expected))
    inplace = [t.to(device) for t in tensors]
    assert npu.npu_scatter_list_(inplace, indices.to(device), updates.to(device), None, "update", axis) is None
    assert all(torch.equal(o.cpu(), e) for o, e in zip(inplace, expected))


def test_scatter_list_errors_and_fake():
    with FakeTensorMode():
        outs = npu.npu_scatter_list([z(2, 3, 4, dtype=f16)] * 2, _ints(2), z(2, 2, 1, 4, dtype=f16))
        assert [(o.shape, o.dtype) for o in outs] == [((2, 3, 4), f16)] * 2
    tensors = [z(2, 3, 4), z(2, 3, 4)]
    with pytest.raises(NotImplementedError, match="mask with zero entries"):
        npu.npu_scatter_list(tensors, _ints(2), z(2, 2, 1, 4), torch.tensor([1, 0], dtype=torch.uint8))
    with pytest.raises(NotImplementedError, match="updates of 2 rows"):
        npu.npu_scatter_list(tensors, _ints(2), z(2, 2, 2, 4))
    with pytest.raises(RuntimeError, match="reduce must be 'update'"):
        npu.npu_scatter_list(tensors, _ints(2), z(2, 2, 1, 4), None, "add")
    with pytest.raises(RuntimeError, match="indices must be 1-D"):
        npu.npu_scatter_list(tensors, _ints(3), z(2, 2, 1, 4))
