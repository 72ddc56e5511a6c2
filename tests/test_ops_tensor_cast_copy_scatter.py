"""Tensor ops (torch_npu/op_plugin/tensor/: dtype_cast, copy_view, scatter, sort, stride_add), the
batch-norm statistics merge, the quantize_per_* kernels, and the meta-only tensor ops.

References: PyTorch autograd of the loss functions on CPU in float64, the op-plugin goldens
re-written here as loops, and formulas written out in the tests.
"""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import torch_npu
from torch_npu.op_plugin._registry import not_emulated_message

from _op_helpers import DEVICES, randn_dims as _rand


# ----------------------------------------------------------------- dtype casts and copies


@pytest.mark.parametrize("device", DEVICES)
def test_dtype_casts(device):
    x = _rand(3, 4, dtype=torch.float32).to(device)
    y = torch.ops.npu._npu_dtype_cast(x, torch.float16)
    assert y.dtype == torch.float16 and torch.equal(y.cpu(), x.cpu().half())
    assert torch.ops.npu._npu_dtype_cast_backward(y, torch.float32).dtype == torch.float32
    # an int code (how a torch.dtype reaches an int schema slot) and a torch_npu constant
    assert torch_npu.npu_dtype_cast(x, torch.bfloat16).dtype == torch.bfloat16
    z = torch_npu.npu_dtype_cast(x, torch_npu.float16)
    assert z.dtype == torch.float16 and torch.equal(z.cpu(), x.cpu().half())
    # float8 torch dtypes reach the int slot as ScalarType codes 23 / 24; torch_npu's constants too
    for dt, code in ((torch.float8_e5m2, torch_npu.float8_e5m2), (torch.float8_e4m3fn, torch_npu.float8_e4m3fn)):
        expected = x.cpu().to(dt).view(torch.uint8)
        assert torch.equal(torch_npu.npu_dtype_cast(x, dt).cpu().view(torch.uint8), expected)
        assert torch.equal(torch_npu.npu_dtype_cast(x, code).cpu().view(torch.uint8), expected)
    with pytest.raises(NotImplementedError, match="torch_npu.hifloat8"):
        torch_npu.npu_dtype_cast(x, torch_npu.hifloat8)
    assert torch_npu.npu_dtype_cast_backward(z, torch.float32).dtype == torch.float32
    dst = torch.zeros(3, 4, dtype=torch.float16, device=device)
    assert torch_npu.npu_dtype_cast_(dst, x) is dst
    assert torch.equal(dst.cpu(), x.cpu().half())
    # autograd flows through the cast
    leaf = x.clone().requires_grad_(True)
    torch_npu.npu_dtype_cast(leaf, torch.float16).float().sum().backward()
    assert torch.equal(leaf.grad.cpu(), torch.ones(3, 4))


def test_copy_memory_and_views():
    a = torch.zeros(2, 3, device="npu")
    b = _rand(2, 3, dtype=torch.float32).npu()
    assert torch_npu.copy_memory_(a, b) is a and torch.equal(a.cpu(), b.cpu())
    with pytest.raises(RuntimeError, match="only supports npu tensors"):
        torch_npu.copy_memory_(torch.zeros(2, 3), torch.ones(2, 3))
    with pytest.raises(RuntimeError, match="dtype"):
        torch_npu.copy_memory_(a, b.half())
    base = torch.zeros(4, 4, device="npu")
    view = base[:, 1]
    torch_npu.npu_view_copy(view, torch.arange(4.0, device="npu"), False)
    assert torch.equal(base[:, 1].cpu(), torch.arange(4.0))
    assert torch.equal(torch.ops.npu.one_(torch.zeros(2, 2, device="npu")).cpu(), torch.ones(2, 2))


@pytest.mark.parametrize("device", DEVICES)
def test_reshape_stride_copy_and_storage_size(device):
    x = torch.arange(24.0).reshape(4, 6).to(device)
    r = torch_npu.npu_reshape(x, [6, 4])
    assert r.shape == (6, 4) and torch.equal(r.cpu(), torch.arange(24.0).reshape(6, 4))
    assert r.data_ptr() != x.data_ptr()  # a new tensor, not a view
    out = torch.empty(0, device=device)
    torch.ops.npu.npu_reshape.out(x, [3, 8], out=out)
    assert torch.equal(out.cpu(), torch.arange(24.0).reshape(3, 8))
    s = torch_npu.npu_stride_copy(x, [2, 3], [6, 2], 1)
    expected = torch.tensor([[1.0, 3.0, 5.0], [7.0, 9.0, 11.0]])
    assert s.is_contiguous() and torch.equal(s.cpu(), expected)
    out = torch.empty(0, device=device)
    torch.ops.npu.npu_stride_copy.out(x, [2, 3], [6, 2], 1, out=out)
    assert torch.equal(out.cpu(), expected)
    assert torch_npu.get_storage_size(x[1:, 2:]) == 24


# ----------------------------------------------------------------- scatter / sort / fill


@pytest.mark.parametrize("device", DEVICES)
def test_npu_scatter_doc_example_and_dims(device):
    x = torch.tensor([[1.6279, 0.1226], [0.9041, 1.0980]], device=device)
    out = torch_npu.npu_scatter(x, torch.tensor([0, 1], dtype=torch.int32, device=device),
                                torch.tensor([-1.1993, -1.5247], device=device), 0)
    assert torch.equal(out.cpu(), torch.tensor([[-1.1993, 0.1226], [0.9041, -1.5247]]))
    # 3-D, dim 1: out[i, idx[i, k], k] = upd[i, k]
    x3 = _rand(2, 4, 3, dtype=torch.float32)
    idx = torch.tensor([[3, 0, 1], [2, 2, 0]], dtype=torch.int32)
    upd = _rand(2, 3, seed=1, dtype=torch.float32)
    ref = x3.clone()
    for i in range(2):
        for k in range(3):
            ref[i, idx[i, k], k] = upd[i, k]
    got = torch_npu.npu_scatter(x3.to(device), idx.to(device), upd.to(device), 1)
    assert torch.equal(got.cpu(), ref)


@pytest.mark.parametrize("device", DEVICES)
def test_sort_v2(device):
    x = _rand(3, 5, dtype=torch.float32)
    for dim, desc in ((-1, False), (0, True)):
        assert torch.equal(torch_npu.npu_sort_v2(x.to(device), dim, desc).cpu(), torch.sort(x, dim, desc).values)
    out = torch.empty(0, device=device)
    torch.ops.npu.npu_sort_v2.out(x.to(device), out=out)
    assert torch.equal(out.cpu(), torch.sort(x).values)


def _masked_fill_range_golden(x, start, end, value, axis):
    """The op-plugin test's loop, written again."""
    out = x.clone()
    dim = x.dim()
    for i in range(start.shape[0]):
        for j in range(start.shape[1]):
            for k in range(int(start[i, j]), int(end[i, j])):
                if dim == 1:
                    out[k] = value[i]
                elif dim == 2:
                    if axis == 0:
                        out[k, :] = value[i]
                    else:
                        out[j, k] = value[i]
                else:
                    if axis == 0:
                        out[k, :, :] = value[i]
                    elif axis == 1:
                        out[:, k, :] = value[i]
                    else:
                        out[j, :, k] = value[i]
    return out


@pytest.mark.parametrize("device", DEVICES)
def test_masked_fill_range(device):
    a = torch.tensor([[0.9419, 0.4919, 0.2874, 0.6560], [0.6691, 0.6668, 0.0330, 0.1006],
                      [0.3888, 0.7011, 0.7141, 0.7878], [0.0366, 0.9738, 0.4689, 0.0979]])
    start = torch.tensor([[0, 1, 2]], dtype=torch.int32)
    end = torch.tensor([[1, 2, 3]], dtype=torch.int32)
    value = torch.tensor([1.0])
    out = torch_npu.npu_masked_fill_range(a.to(device), start.to(device), end.to(device), value.to(device), 1)
    expected = a.clone()
    expected[0, 0] = expected[1, 1] = expected[2, 2] = 1.0
    assert torch.equal(out.cpu(), expected)  # the documented example
    g = torch.Generator().manual_seed(3)
    for shape, axis in (((9,), 0), ((5, 9), 0), ((5, 9), 1), ((4, 6, 7), 0), ((4, 6, 7), 1), ((4, 6, 7), 2)):
        x = torch.randint(0, 100, shape, generator=g).to(torch.int32)
        n = shape[0] if len(shape) > 1 else 3
        length = shape[axis]
        s = torch.randint(0, length, (2, n), generator=g, dtype=torch.int32)
        e = torch.clamp(s + torch.randint(0, 4, (2, n), generator=g, dtype=torch.int32), max=length)
        v = torch.tensor([-1, -2], dtype=torch.int32)
        ref = _masked_fill_range_golden(x, s, e, v, axis)
        got = torch_npu.npu_masked_fill_range(x.to(device), s.to(device), e.to(device), v.to(device), axis)
        assert torch.equal(got.cpu(), ref), (shape, axis)


@pytest.mark.parametrize("device", DEVICES)
def test_stride_add(device):
    x1 = torch.tensor([[[[[1.0]]]]], device=device)
    out = torch_npu.npu_stride_add(x1, x1, 0, 0, 1)
    expected = torch.zeros(1, 16, 1, 1, 1)
    expected[0, 0] = 2.0
    assert torch.equal(out.cpu(), expected)  # the op-plugin golden
    a, b = _rand(2, 5, 2, 2, 16, dtype=torch.float32), _rand(2, 7, 2, 2, 16, seed=1, dtype=torch.float32)
    got = torch_npu.npu_stride_add(a.to(device), b.to(device), 1, 3, 1)
    ref = torch.zeros(2, 16, 2, 2, 16)
    ref[:, :4] += a[:, 1:]
    ref[:, :4] += b[:, 3:]
    assert torch.equal(got.cpu(), ref)


# ----------------------------------------------------------------- loss gradients


# ----------------------------------------------------------------- dropout, AMP, SyncBN, Adam, quantize


@pytest.mark.parametrize("device", DEVICES)
def test_batch_norm_gather_stats_update(device):
    eps, momentum = 1e-5, 0.1
    chunks = [_rand(n, 3, 2, seed=n) * (n + 1) + n for n in (4, 6, 3)]  # three "ranks"
    means, invstds = [], []
    for c in chunks:
        flat = c.transpose(0, 1).reshape(3, -1)
        means.append(flat.mean(1))
        invstds.append(1 / torch.sqrt(flat.var(1, unbiased=False) + eps))
    counts = torch.tensor([float(c.numel() // 3) for c in chunks], dtype=torch.float64)
    every = torch.cat([c.transpose(0, 1).reshape(3, -1) for c in chunks], 1)
    n = every.shape[1]
    rm, rv = torch.zeros(3, dtype=torch.float64), torch.ones(3, dtype=torch.float64)
    rm_d, rv_d = rm.clone().to(device), rv.clone().to(device)
    mean, invstd = torch.ops.npu.batch_norm_gather_stats_update(
        chunks[0].to(device), torch.stack(means).to(device), torch.stack(invstds).to(device), rm_d, rv_d,
        momentum, eps, counts.to(device))
    torch.testing.assert_close(mean.cpu(), every.mean(1))
    torch.testing.assert_close(invstd.cpu(), 1 / torch.sqrt(every.var(1, unbiased=False) + eps))
    torch.testing.assert_close(rm_d.cpu(), momentum * every.mean(1))
    torch.testing.assert_close(rv_d.cpu(), (1 - momentum) * rv + momentum * every.var(1, unbiased=True))
    assert n == 13 * 2


@pytest.mark.parametrize("device", DEVICES)
def test_quantize_impl_out(device):
    x = _rand(3, 4, dtype=torch.float32) * 50
    result = torch.empty(3, 4, dtype=torch.int8, device=device)
    torch.ops.npu._quantize_per_tensor_impl.out(x.to(device), torch.tensor([0.5], device=device),
                                                torch.tensor([3], device=device), torch.qint8, result=result)
    ref = torch.quantize_per_tensor(x, 0.5, 3, torch.qint8).int_repr()
    assert torch.equal(result.cpu(), ref)
    scales, zps = torch.tensor([0.3, 0.7, 1.1], dtype=torch.float64), torch.tensor([0, 10, 250])
    result = torch.empty(3, 4, dtype=torch.uint8, device=device)
    torch.ops.npu._quantize_per_channel_impl.out(x.to(device), scales.to(device), zps.to(device), 0, torch.quint8,
                                                 result=result)
    ref = torch.quantize_per_channel(x, scales, zps, 0, torch.quint8).int_repr()
    assert torch.equal(result.cpu(), ref)


# ----------------------------------------------------------------- meta-only ops


def test_meta_only_ops_shapes_and_raise():
    with FakeTensorMode():
        x = torch.empty(2, 3, 5)
        assert torch.ops.npu._npu_dropout_gen_mask.Tensor(x, [300], 0.1, 1, 2).shape == (48,)
        assert torch.ops.npu._npu_index_add(x, torch.empty(2, dtype=torch.int64), torch.empty(2, 3, 5)).shape == x.shape
        s, q = torch.ops.npu.batch_norm_reduce(torch.empty(4, 6, 5, 5), 1e-5)
        assert s.shape == (6,) and q.shape == (6,) and s.dtype == torch.float32
        assert torch_npu.npu_normalize_batch(x, torch.empty(2, dtype=torch.int32), 1).shape == x.shape
    for name, call in (("npu_normalize_batch", lambda: torch_npu.npu_normalize_batch(
                           torch.zeros(2, 3, 5), torch.tensor([3, 4], dtype=torch.int32), 0)),
                       ("batch_norm_reduce", lambda: torch.ops.npu.batch_norm_reduce(torch.zeros(2, 3, 4), 1e-5))):
        with pytest.raises(NotImplementedError) as info:
            call()
        assert str(info.value) == not_emulated_message(name)


def test_fake_tensor_shapes_of_emulated_ops():
    with FakeTensorMode():
        x = torch.empty(4, 6)
        assert torch_npu.npu_reshape(x, [3, 8]).shape == (3, 8)
        assert torch_npu.npu_scatter(x, torch.empty(6, dtype=torch.int32), torch.empty(6), 0).shape == (4, 6)
        assert torch_npu.npu_stride_add(torch.empty(1, 3, 2, 2, 16), torch.empty(1, 2, 2, 2, 16), 0, 0, 1).shape == \
            (1, 16, 2, 2, 16)
