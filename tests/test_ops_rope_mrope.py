"""npu_mrope (multimodal rotary embedding) against a float64 reference."""
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import torch_npu

from _op_helpers import DEVICES, close_scaled as close, randn_scaled as rand


def ref_mrope(positions, x, cache, head_size, section, neox, interleave_cache):
    """x [T, N*hs] -> float64, one rotation pair at a time."""
    t_count = positions.shape[-1]
    rot = cache.shape[1]
    half = rot // 2
    x = x.double().reshape(t_count, -1, head_size)
    out = x.clone()
    for t in range(t_count):
        for c in range(half):
            if positions.dim() == 1:
                row = 0
            elif not interleave_cache:
                row = 0 if c < section[0] else (1 if c < section[0] + section[1] else 2)
            else:  # rows 1 and 2 take every third column from 1 and 2, below 3 * section[1]
                row = 1 if (c % 3 == 1 and c < 3 * section[1]) else (2 if (c % 3 == 2 and c < 3 * section[1]) else 0)
            p = int(positions[t] if positions.dim() == 1 else positions[row, t])
            cs, sn = float(cache[p, c]), float(cache[p, half + c])
            for h in range(x.shape[1]):
                i1, i2 = (c, half + c) if neox else (2 * c, 2 * c + 1)
                a, b = float(x[t, h, i1]), float(x[t, h, i2])
                out[t, h, i1] = a * cs - b * sn
                out[t, h, i2] = b * cs + a * sn
    return out.reshape(t_count, -1)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("rotary_mode", ["half", "interleave"])
def test_mrope_plain_positions(device, dtype, rotary_mode):
    t, nq, nk, hs, rot = 5, 3, 1, 12, 8
    positions = torch.tensor([4, 0, 7, 2, 2])
    q, k = rand((t, nq * hs), dtype, 1), rand((t, nk * hs), dtype, 2)
    cache = rand((9, rot), dtype, 3)
    qo, ko = torch_npu.npu_mrope(positions.to(device), q.to(device), k.to(device), cache.to(device), hs,
                                 rotary_mode=rotary_mode)
    assert qo.dtype == dtype and qo.device.type == device and qo.shape == q.shape and ko.shape == k.shape
    neox = rotary_mode == "half"
    close(qo, ref_mrope(positions, q, cache, hs, None, neox, False), dtype, 2)
    close(ko, ref_mrope(positions, k, cache, hs, None, neox, False), dtype, 2)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cache_mode", ["default", "interleave"])
@pytest.mark.parametrize("rotary_mode", ["half", "interleave"])
def test_mrope_multimodal_sections(device, cache_mode, rotary_mode):
    t, nq, nk, hs, rot = 4, 2, 2, 20, 16
    section = [2, 3, 3]
    g = torch.Generator().manual_seed(5)
    positions = torch.randint(0, 10, (3, t), generator=g)
    q, k = rand((t, nq * hs), seed=6), rand((t, nk * hs), seed=7)
    cache = rand((10, rot), seed=8)
    qo, ko = torch_npu.npu_mrope(positions.to(device), q.to(device), k.to(device), cache.to(device), hs,
                                 mrope_section=section, rotary_mode=rotary_mode, cache_mode=cache_mode)
    neox, inter = rotary_mode == "half", cache_mode == "interleave"
    close(qo, ref_mrope(positions, q, cache, hs, section, neox, inter), torch.float32)
    close(ko, ref_mrope(positions, k, cache, hs, section, neox, inter), torch.float32)
    # the pass-through part of each head is untouched
    assert torch.equal(qo.cpu().reshape(t, nq, hs)[..., rot:], q.reshape(t, nq, hs)[..., rot:])


def test_mrope_errors_and_fake():
    pos, q, cache = torch.arange(4), torch.randn(4, 16), torch.randn(4, 16)
    with pytest.raises(RuntimeError, match="cache_mode only support default or interleave"):
        torch_npu.npu_mrope(pos, q, q, cache, 16, cache_mode="invalid_mode")
    with pytest.raises(RuntimeError, match="rotary_mode only support half or interleave"):
        torch_npu.npu_mrope(pos, q, q, cache, 16, rotary_mode="full")
    with FakeTensorMode():
        qo, ko = torch_npu.npu_mrope(torch.zeros(3, 6, dtype=torch.long), torch.empty(6, 64, dtype=torch.bfloat16),
                                     torch.empty(6, 32, dtype=torch.bfloat16), torch.empty(8, 16), 32,
                                     mrope_section=[2, 3, 3])
    assert qo.shape == (6, 64) and ko.shape == (6, 32) and qo.dtype == torch.bfloat16
