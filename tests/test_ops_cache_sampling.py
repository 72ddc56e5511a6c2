"""npu_top_k_top_p against its documented formula."""
import math

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from _op_helpers import int_zeros as _ints, zeros as z

npu = torch.ops.npu


f16, f32, i8, i32, i64 = torch.float16, torch.float32, torch.int8, torch.int32, torch.int64


def _top_k_top_p_reference(logits, p, k):
    """Row by row in float64 from the documented formula; -inf marks a dropped logit."""
    out = torch.full(logits.shape, float("-inf"), dtype=torch.float64)
    for b, row in enumerate(logits.double().tolist()):
        vocab = len(row)
        keep = [True] * vocab
        if k is not None and 0 < int(k[b]) < vocab:
            threshold = sorted(row)[vocab - int(k[b])]
            keep = [v >= threshold for v in row]
        if p is not None:
            order = sorted(range(vocab), key=lambda i: row[i])           # ascending, stable
            kept = [row[i] for i in order if keep[i]]
            top = max(kept)
            norm = sum(math.exp(v - top) for v in kept)
            cumulative = 0.0
            for rank, i in enumerate(order):
                if keep[i]:
                    cumulative += math.exp(row[i] - top) / norm
                if rank < vocab - 1 and cumulative <= 1 - float(p[b]):
                    keep[i] = False
        for i in range(vocab):
            if keep[i]:
                out[b, i] = row[i]
    return out


@pytest.mark.parametrize("device", ["cpu", "npu"])
@pytest.mark.parametrize("dtype", [f32, f16, torch.bfloat16])
@pytest.mark.parametrize("use_p,use_k", [(True, True), (True, False), (False, True)])
def test_top_k_top_p_matches_formula(device, dtype, use_p, use_k):
    gen = torch.Generator().manual_seed(21)
    logits = (torch.randn(5, 40, generator=gen) * 2).to(dtype)
    p = torch.tensor([0.5, 0.9, 0.0, 1.0, 0.3]).to(dtype) if use_p else None
    # k = 0 and k >= vocab skip top-k for that row
    k = torch.tensor([3, 0, 40, 7, 55], dtype=i32) if use_k else None
    expected = _top_k_top_p_reference(logits, p, k)
    out = npu.npu_top_k_top_p(logits.to(device), None if p is None else p.to(device),
                              None if k is None else k.to(device))
    assert out.device.type == device and out.dtype == dtype and out.shape == logits.shape
    assert torch.equal(out.cpu().double().isinf(), expected.isinf())
    # kept logits are copied unchanged
    assert torch.equal(out.cpu().double()[~expected.isinf()], expected[~expected.isinf()])


def test_top_k_top_p_keeps_ties_at_the_threshold_and_the_largest():
    logits = torch.tensor([[1.0, 3.0, 2.0, 3.0, 0.5]])
    out = npu.npu_top_k_top_p(logits, None, torch.tensor([1], dtype=i32))
    assert out.tolist() == [[float("-inf"), 3.0, float("-inf"), 3.0, float("-inf")]]
    out = npu.npu_top_k_top_p(logits, torch.tensor([0.0]), None)       # p = 0: only the largest survives
    assert out.isfinite().sum() == 1 and out[0, 3] == 3.0                # stable sort: index 3 is last


def test_top_k_top_p_fake_and_errors():
    with FakeTensorMode():
        out = npu.npu_top_k_top_p(z(3, 10, dtype=torch.bfloat16), z(3, dtype=torch.bfloat16), _ints(3))
        assert (out.shape, out.dtype) == ((3, 10), torch.bfloat16)
    with pytest.raises(RuntimeError, match="p and k must not both be None"):
        npu.npu_top_k_top_p(z(2, 4))
    with pytest.raises(RuntimeError, match="p must have logits' dtype"):
        npu.npu_top_k_top_p(z(2, 4), z(2, dtype=f16), None)
    with pytest.raises(RuntimeError, match="k must be int32"):
        npu.npu_top_k_top_p(z(2, 4), None, z(2, dtype=i64))
    with pytest.raises(RuntimeError, match="logits must be 2-D"):
        npu.npu_top_k_top_p(z(2, 2, 4), None, _ints(2))
