"""npu_pad, npu_indexing, npu_sim_exponential_, npu_prefetch, empty_with_swapped_memory
(torch_npu/op_plugin/tensor/pad_index.py) and npu_gather_sparse_index (tensor/gather.py) against
references written here."""
import math

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import torch_npu

from _op_helpers import DEVICES


def test_pad_doc_example_and_reference():
    x = torch.tensor([[20, 20, 10, 10]], dtype=torch.float16).npu()
    out = torch_npu.npu_pad(x, [1, 1, 1, 1])
    assert out.dtype == torch.float16 and out.device.type == "npu"
    assert out.cpu().tolist() == [[0] * 6, [0, 20, 20, 10, 10, 0], [0] * 6]
    y = torch.arange(24.).reshape(2, 3, 4)
    out = torch_npu.npu_pad(y, [0, 1, 2, 0, 1, 3])
    exp = torch.zeros(3, 5, 8)
    exp[0:2, 2:5, 1:5] = y
    assert torch.equal(out, exp)


def test_pad_grad_meta_errors():
    x = torch.randn(2, 3, dtype=torch.float64, requires_grad=True)
    torch.autograd.gradcheck(lambda t: torch_npu.npu_pad(t, [1, 0, 2, 1]), (x,))
    assert torch_npu.npu_pad(torch.empty(2, 3, device="meta"), [1, 0, 2, 1]).shape == (3, 6)
    with pytest.raises(RuntimeError, match="pair per dim"):
        torch_npu.npu_pad(x, [1, 1, 1])


def ref_strided_slice(x, spec):
    """Reference: build the Python index expression the masks describe."""
    return x[spec]


@pytest.mark.parametrize("device", DEVICES)
def test_indexing_doc_example_and_masks(device):
    x = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8]], dtype=torch.int32).to(device)
    assert torch_npu.npu_indexing(x, [0, 0], [2, 2], [1, 1]).cpu().tolist() == [[1, 2], [5, 6]]
    t = torch.arange(2 * 3 * 4 * 5).reshape(2, 3, 4, 5).to(device)
    cases = [
        # (begin, end, strides, masks dict, python index)
        ([0, 1, 3], [2, 3, 0], [1, 1, -2], {}, (slice(0, 2), slice(1, 3), slice(3, 0, -2))),
        ([1, 0], [0, 2], [1, 2], {"begin_mask": 0b10, "end_mask": 0b01}, (slice(1, None), slice(None, 2, 2))),
        ([1, 0, -1], [2, 0, 0], [1, 1, 1], {"ellipsis_mask": 0b010, "shrink_axis_mask": 0b101},
         (1, Ellipsis, -1)),
        ([0, 0, 1], [1, 0, 3], [1, 1, 1], {"new_axis_mask": 0b010, "shrink_axis_mask": 0b001},
         (0, None, slice(1, 3))),
        ([-3, 0], [100, -1], [1, 1], {}, (slice(-3, 100), slice(0, -1))),
    ]
    for begin, end, strides, masks, index in cases:
        out = torch_npu.npu_indexing(t, begin, end, strides, **masks)
        exp = t.cpu().numpy()[index]  # numpy supports negative steps
        assert out.shape == exp.shape, (begin, masks)
        assert out.cpu().numpy().tolist() == exp.tolist(), (begin, masks)
        o = torch.empty(0, dtype=t.dtype, device=device)
        assert torch_npu.npu_indexing(t, begin, end, strides, **masks, out=o) is o
        assert o.cpu().numpy().tolist() == exp.tolist()


def test_indexing_grad_and_fake():
    x = torch.randn(4, 5, dtype=torch.float64, requires_grad=True)
    torch.autograd.gradcheck(lambda t: torch_npu.npu_indexing(t, [3, 0], [0, 5], [-1, 2]), (x,))
    with FakeTensorMode():
        f = torch.empty(4, 5, device="npu")
        assert torch_npu.npu_indexing(f, [0, 1], [4, 5], [2, 2]).shape == (2, 2)


def test_sim_exponential_distribution_and_generator():
    x = torch.empty(40000, device="npu")
    assert torch_npu.npu_sim_exponential_(x, 2.0) is x
    v = x.cpu().double()
    assert v.min() >= 0
    # mean 1/lambd and P(X > t) = exp(-lambd t), within 5 standard errors
    assert abs(v.mean().item() - 0.5) < 5 * 0.5 / math.sqrt(v.numel())
    p = math.exp(-2.0 * 0.7)
    assert abs((v > 0.7).double().mean().item() - p) < 5 * math.sqrt(p * (1 - p) / v.numel())
    g1 = torch.Generator(device="npu").manual_seed(7)
    g2 = torch.Generator(device="npu").manual_seed(7)
    a = torch_npu.npu_sim_exponential_(torch.empty(100, device="npu"), generator=g1)
    b = torch_npu.npu_sim_exponential_(torch.empty(100, device="npu"), generator=g2)
    assert torch.equal(a.cpu(), b.cpu())


def test_prefetch_and_swapped_memory():
    x = torch.randn(16, device="npu")
    before = x.clone()
    assert torch_npu.npu_prefetch(x, None, 64) is None
    assert torch.equal(x, before)
    with pytest.raises(RuntimeError, match="max_size must be > 0"):
        torch_npu.npu_prefetch(x, None, 0)
    s = torch_npu.empty_with_swapped_memory([2, 2], dtype=torch.float32, device=torch.device("npu:0"))
    assert s.device.type == "npu" and s.shape == (2, 2) and s.dtype == torch.float32
    tmp = s.fill_(3.14)
    out = torch.empty_like(s).fill_(1).mul_(tmp)
    assert out.cpu().reshape(-1).tolist() == pytest.approx([3.14] * 4)
    assert torch_npu.empty_with_swapped_memory([3]).device.type == "npu"
    with pytest.raises(RuntimeError, match="must be an npu device"):
        torch_npu.empty_with_swapped_memory([3], device="cpu")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.int8])
def test_gather_sparse_index(device, dtype):
    x = torch.tensor([[1, 2, 3], [4, 5, 6], [7, 8, 9]]).to(dtype).to(device)
    out = torch_npu.npu_gather_sparse_index(x, torch.tensor([1, 0]).to(device))  # documented example
    assert out.dtype == dtype and out.cpu().tolist() == [[4, 5, 6], [1, 2, 3]]
    t = torch.arange(16 * 4 * 2).reshape(16, 4, 2).to(dtype).to(device)
    idx = torch.tensor([[3, 3, 15], [0, 7, 1]], dtype=torch.int32)
    out = torch_npu.npu_gather_sparse_index(t, idx.to(device))
    assert out.shape == (2, 3, 4, 2)
    tl = t.cpu().tolist()
    assert out.cpu().tolist() == [[tl[i] for i in row] for row in idx.tolist()]


def test_gather_sparse_index_grad_backward_op_meta():
    x = torch.randn(5, 3, dtype=torch.float64, requires_grad=True)
    idx = torch.tensor([[4, 0], [4, 2]])
    torch.autograd.gradcheck(lambda t: torch_npu.npu_gather_sparse_index(t, idx), (x,))
    g = torch.arange(12, dtype=torch.float64).reshape(2, 2, 3)
    back = torch_npu.npu_gather_sparse_index_backward(g, [5, 3], idx)
    exp = torch.zeros(5, 3, dtype=torch.float64)
    for (i, j), r in zip([(0, 0), (0, 1), (1, 0), (1, 1)], [4, 0, 4, 2]):
        exp[r] += g[i, j]
    assert torch.equal(back, exp)
    with FakeTensorMode():
        f = torch_npu.npu_gather_sparse_index(torch.empty(16, 32, device="npu"),
                                              torch.empty(2, 3, dtype=torch.int64, device="npu"))
        assert f.shape == (2, 3, 32)
