"""The unboxed zero-copy kernels of the hottest ops (csrc/aten/UnboxedKernels.cpp) behave
exactly as the boxed kernel and as the CPU: results, identity of in-place results, aliasing
checks, views, device errors."""
import pytest
import torch

import torch_npu


def _bits(t):
    t = t.detach().cpu()
    return t.view(torch.int32) if t.dtype == torch.float32 else t


def test_the_hot_ops_are_registered_unboxed():
    # every entry of the table that would otherwise run the boxed zero-copy kernel
    # registers: native torch_npu ops, and structured ops' functional forms whose
    # NPU kernel is their .out (argmax, gelu, cumprod, index_add_); the train steps' group
    # norm and dropout backward included
    assert torch_npu._kernel_registration["unboxed"] >= 107


CASES = {
    "add": lambda a, b: a + b,
    "add_alpha": lambda a, b: torch.add(a, b, alpha=0.5),
    "sub": lambda a, b: a - b,
    "mul_scalar_tensor": lambda a, b: a * torch.tensor(3.0),
    "div_mode": lambda a, b: torch.div(a, b, rounding_mode="floor"),
    "pow": lambda a, b: a.abs().pow(1.5),
    "where": lambda a, b: torch.where(a > b, a, b),
    "masked_fill": lambda a, b: a.clone().masked_fill_(b > 0, -1.0),
    "softmax": lambda a, b: torch.softmax(a, -1),
    "log_softmax": lambda a, b: torch.log_softmax(a, 0),
    "layer_norm": lambda a, b: torch.nn.functional.layer_norm(a, (a.shape[-1],)),
    "mm": lambda a, b: a @ b.t(),
    "addmm": lambda a, b: torch.addmm(a[:, :4], a, b.t()),
    "sum_dim": lambda a, b: a.sum(1, keepdim=True),
    "mean_dim": lambda a, b: a.mean((0, 1)),
    "amax": lambda a, b: a.amax(-1),
    "cumsum": lambda a, b: a.cumsum(0),
    "cat": lambda a, b: torch.cat([a, b, a], 1),
    "index_select": lambda a, b: a.index_select(0, torch.tensor([2, 0], device=a.device)),
    "gelu_tanh": lambda a, b: torch.nn.functional.gelu(a, approximate="tanh"),
    "silu": lambda a, b: torch.nn.functional.silu(a),
    "argmax": lambda a, b: a.argmax(1),
    "any": lambda a, b: (a > 1).any(),
    "bitwise": lambda a, b: ~((a > 0) | (b > 0)) & (a < b),
    "lerp_": lambda a, b: a.clone().lerp_(b, 0.3),
    "addcmul_": lambda a, b: a.clone().addcmul_(a, b, value=2.0),
    "addcdiv_": lambda a, b: a.clone().addcdiv_(a, b.abs() + 1, value=0.5),
    "group_norm": lambda a, b: torch.nn.functional.group_norm(a.reshape(2, 4, 3), 2, b[0, :4], b[1, :4]),
    "dropout_backward": lambda a, b: torch.ops.aten.native_dropout_backward(a, b > 0, 1.25),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_results_are_bitwise_the_cpu_results(name):
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(4, 6, generator=g), torch.randn(4, 6, generator=g)
    want = CASES[name](a, b)
    got = CASES[name](a.npu(), b.npu())
    assert got.device.type == "npu"
    assert got.dtype == want.dtype and got.shape == want.shape
    assert torch.equal(_bits(got), _bits(want))


def test_group_norm_gradients_are_the_cpu_gradients():
    # native_group_norm_backward (unboxed) returns all three gradients
    g = torch.Generator().manual_seed(3)
    x, w, b, dy = (torch.randn(*s, generator=g) for s in ((2, 6, 5), (6,), (6,), (2, 6, 5)))
    grads = []
    for dev in ("cpu", "npu"):
        xs = [t.detach().to(dev).requires_grad_() for t in (x, w, b)]
        torch.nn.functional.group_norm(xs[0], 3, xs[1], xs[2]).backward(dy.to(dev))
        grads.append([t.grad.cpu() for t in xs])
    for want, got in zip(*grads):
        assert torch.equal(_bits(got), _bits(want))


def test_max_dim_returns_both_results_on_npu():
    a = torch.randn(3, 5)
    v, i = a.npu().max(1)
    wv, wi = a.max(1)
    assert v.device.type == i.device.type == "npu"
    assert torch.equal(v.cpu(), wv) and torch.equal(i.cpu(), wi)


def test_in_place_returns_the_same_tensor_and_writes_npu_memory():
    a, b = torch.randn(5).npu(), torch.randn(5).npu()
    before = a.cpu()
    r = a.add_(b)
    assert r is a
    assert torch.equal(a.cpu(), before + b.cpu())
    x = torch.randn(5).npu()
    y = x.cpu()
    assert x.mul_(x) is x  # the same tensor twice: one alias
    assert torch.equal(x.cpu(), y * y)


def test_partial_overlap_in_place_is_refused_as_on_cpu():
    def run(dev):
        x = torch.arange(6.0, device=dev)
        x[1:].add_(x[:-1])
    with pytest.raises(RuntimeError) as cpu:
        run("cpu")
    with pytest.raises(RuntimeError) as npu:
        run("npu")
    assert str(npu.value) == str(cpu.value)


def test_a_view_written_in_place_changes_its_base():
    base = torch.zeros(4, 4).npu()
    base[1].fill_(2.0)
    base[:, 2].zero_()
    want = torch.zeros(4, 4)
    want[1].fill_(2.0)
    want[:, 2].zero_()
    assert torch.equal(base.cpu(), want)


def test_clone_of_a_view_owns_its_memory():
    base = torch.randn(4, 4).npu()
    c = base[:, 1].clone()
    assert c.untyped_storage().data_ptr() != base.untyped_storage().data_ptr()
    assert c.is_contiguous() and torch.equal(c.cpu(), base.cpu()[:, 1])


def test_device_errors_keep_their_texts():
    a = torch.randn(3).npu()
    with pytest.raises(RuntimeError, match=r"Expected all tensors to be on the same device, but found at least "
                                           r"two devices, npu:0 and cpu!"):
        a + torch.randn(3)
    with pytest.raises(RuntimeError, match=r"Expected all tensors to be on the same device"):
        torch.cat([a, torch.randn(3)])
    with pytest.raises(RuntimeError, match=r"Expected all tensors to be on the same device"):
        torch.randn(3).add_(a)


def test_npu_results_come_from_the_device_pool():
    torch.npu.synchronize()
    before = torch.npu.memory_allocated()
    a = torch.randn(1024).npu()
    r = torch.exp(a)
    assert torch.npu.memory_allocated() >= before + 2 * 4096
    del r


def test_a_result_relabelled_in_place_is_an_npu_tensor_through_and_through():
    # a fresh result's TensorImpl and storage become the npu tensor's (CpuAlias.cpp,
    # adopt_result_in_place): its storage is on the npu, grows from the device pool,
    # and goes back to the pool when freed
    def block(nbytes):  # torch_npu pads a request by 32 bytes, then rounds it up to 512
        return (nbytes + 32 + 511) // 512 * 512

    import gc
    gc.collect()                         # earlier tests' garbage must not be freed mid-count
    torch.npu.synchronize()
    a = torch.randn(1024).npu()
    base = torch.npu.memory_allocated()
    r = a + 1
    st = r.untyped_storage()
    assert r.device == st.device == torch.device("npu", 0)
    assert torch.npu.memory_allocated() == base + block(4096)
    r.resize_(4096)                      # regrows through the storage's allocator: the pool
    assert r.untyped_storage().device.type == "npu"
    assert torch.npu.memory_allocated() == base + block(4 * 4096)
    assert torch.equal(r[:1024].cpu(), a.cpu() + 1)
    del r, st
    assert torch.npu.memory_allocated() == base


# index.Tensor: x[idx] with one 1-D integer index on dim 0 of a contiguous x runs as a row
# gather (index_select) on npu; everything else runs CPU index itself. Either way the
# result, its sizes and strides, and its errors are CPU index's.
def _index_cases():
    g = torch.Generator().manual_seed(1)
    for shape in [(5,), (5, 3), (1, 1, 2), (4, 1, 3), (3, 2, 1, 4), (8, 256, 64)]:
        for idx in ([0], [4, 0, 2, 2], [-1, 0], [0, 0, 0], []):
            idx = [i % shape[0] if i >= 0 else i for i in idx]
            for dtype in (torch.float32, torch.bfloat16, torch.int64, torch.bool):
                for idtype in (torch.int64, torch.int32):
                    x = (torch.randn(shape, generator=g) * 10).to(dtype)
                    yield x, torch.tensor(idx, dtype=idtype)


def _same(got, want):
    assert got.device.type == "npu"
    assert (got.dtype, got.shape, got.stride(), got.storage_offset()) == (
        want.dtype, want.shape, want.stride(), want.storage_offset())
    assert torch.equal(got.cpu().view(torch.uint8) if got.dtype == torch.bfloat16 else got.cpu(),
                       want.view(torch.uint8) if want.dtype == torch.bfloat16 else want)


def test_index_by_one_integer_tensor_is_the_cpu_result():
    n = 0
    for x, idx in _index_cases():
        _same(x.npu()[idx.npu()], x[idx])
        n += 1
    assert n == 6 * 5 * 4 * 2


def test_index_outside_the_row_gather_is_the_cpu_result():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(4, 5, 6, generator=g)
    i, j = torch.tensor([3, 0, 3]), torch.tensor([1, 4, 4])
    cases = [
        lambda t, i, j: t[:, i],                     # not dim 0
        lambda t, i, j: t[i, j],                     # two indices
        lambda t, i, j: t.transpose(0, 1)[j],        # non-contiguous self
        lambda t, i, j: t[t[:, 0, 0] > 0],           # bool mask
        lambda t, i, j: t[i.view(3, 1)],             # 2-D index
        lambda t, i, j: t[i[:0]],                    # empty index: CPU index's own strides
        lambda t, i, j: t.new_zeros(4, 0, 1)[i],     # empty x: CPU index's own strides
        lambda t, i, j: t[..., j],
    ]
    for f in cases:
        _same(f(x.npu(), i.npu(), j.npu()), f(x, i, j))


def test_index_errors_keep_the_cpu_texts():
    x = torch.randn(4, 3)
    for bad in ([4], [0, -5]):
        with pytest.raises(IndexError) as cpu:
            x[torch.tensor(bad)]
        with pytest.raises(IndexError) as npu:
            x.npu()[torch.tensor(bad).npu()]
        assert str(npu.value).split("\n")[0] == str(cpu.value).split("\n")[0]


def test_index_by_a_cpu_index_tensor_and_under_autograd():
    x = torch.randn(6, 4, requires_grad=True)
    idx = torch.tensor([5, 1, 1])
    xn = x.detach().npu().requires_grad_()
    _same(xn[idx].detach(), x[idx].detach())          # CPU indices with an npu self, as on CUDA
    x[idx].sum().backward()
    xn[idx.npu()].sum().backward()
    assert torch.equal(xn.grad.cpu(), x.grad)


# The CPU aliases of unboxed calls are reused from a per-thread pool (CpuAlias.cpp). A reused
# alias must behave as a new one: across inference mode (whose tensors have no autograd keys),
# across threads, and for two arguments sharing one storage.
def _mixed_ops(a, b):
    return [a + b, (a * b).sum(0), torch.cat([a, b[:1]]), a[torch.tensor([2, 0], device=a.device)],
            torch.where(a > b, a, b), a.clone().add_(b[0]), a @ b.t(), torch.softmax(a, -1),
            # two views of one storage as the two arguments: one shared alias storage, whose
            # aliases do not go back to the pool
            a[:, :4] + a[:, :4].t(), a[1:] * a[:-1], a[:, 1:] - a[:, :-1]]


def test_pooled_aliases_across_inference_mode_threads_and_shared_storage():
    import threading
    g = torch.Generator().manual_seed(3)
    a, b = torch.randn(4, 6, generator=g), torch.randn(4, 6, generator=g)
    an, bn = a.npu(), b.npu()
    for mode in (False, True, False, True):
        with torch.inference_mode(mode):
            for got, want in zip(_mixed_ops(an, bn), _mixed_ops(a, b)):
                assert got.is_inference() == want.is_inference() == mode
                assert torch.equal(got.cpu(), want)
    # a reused alias takes each argument's own offset and strides: one-argument calls (their
    # alias goes back to the pool, last in, first out) on views alike but for offset or strides
    sq, sqn = a[:, :4], an[:, :4]
    for _ in range(3):
        assert torch.equal(an[1:].neg().cpu(), a[1:].neg())
        assert torch.equal(an[:-1].neg().cpu(), a[:-1].neg())
        assert torch.equal(sqn.exp().cpu(), sq.exp())
        assert torch.equal(sqn.t().exp().cpu(), sq.t().exp())
    # two views of one storage as two arguments: the kernel still sees them overlap
    with pytest.raises(RuntimeError) as cpu:
        a.view(-1)[1:5].add_(a.view(-1)[0:4])
    with pytest.raises(RuntimeError) as npu:
        an.view(-1)[1:5].add_(an.view(-1)[0:4])
    assert str(npu.value) == str(cpu.value)
    errors = []

    def worker(seed):
        try:
            gg = torch.Generator().manual_seed(seed)
            x, y = torch.randn(4, 6, generator=gg), torch.randn(4, 6, generator=gg)
            xn, yn = x.npu(), y.npu()
            for _ in range(50):
                for got, want in zip(_mixed_ops(xn, yn), _mixed_ops(x, y)):
                    assert torch.equal(got.cpu(), want)
        except Exception as e:  # reported below, with the thread's seed
            errors.append((seed, repr(e)))

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


# An alias takes the npu tensor's sizes, strides, numel and cached contiguity flags as they are
# (AliasImpl, CpuAlias.cpp); CPU kernels choose their result layouts from those flags. A pooled
# alias goes from one layout to the next, so the layouts run one after another, twice.
LAYOUTS = {
    "channels_last": ((2, 3, 4, 5), lambda x: x.contiguous(memory_format=torch.channels_last)),
    "channels_last_3d": ((2, 3, 4, 5, 6), lambda x: x.contiguous(memory_format=torch.channels_last_3d)),
    "channels_last_size_one": ((2, 1, 4, 1), lambda x: x.contiguous(memory_format=torch.channels_last)),
    # not dense: clone's preserve_format goes by the channels-last flags
    "channels_last_sliced": ((2, 3, 4, 6), lambda x: x.contiguous(memory_format=torch.channels_last)[..., ::2]),
    "channels_last_3d_sliced": ((2, 3, 4, 5, 4),
                                lambda x: x.contiguous(memory_format=torch.channels_last_3d)[..., ::2]),
    "permuted_4d": ((2, 3, 4, 5), lambda x: x.permute(0, 2, 1, 3)),
    "permuted_5d": ((2, 3, 4, 5, 6), lambda x: x.permute(0, 2, 4, 3, 1)),
    "transposed": ((4, 6), lambda x: x.t()),
    "expanded": ((4, 1), lambda x: x.expand(4, 5)),
    "strided_slice": ((6, 8), lambda x: x[1:5:2, ::3]),
    "zero_dim": ((), lambda x: x),
    "empty": ((0, 4), lambda x: x),
    "seven_dims": ((2, 1, 2, 1, 2, 1, 2), lambda x: x.transpose(0, 6)),
}
LAYOUT_OPS = [lambda a: a + 1, lambda a: a * a, torch.exp, lambda a: a.clone(),
              lambda a: torch.where(a > 0, a, a * 2), lambda a: a.sum(-1) if a.dim() else a.sum(),
              # the result's memory format is the input's suggest_memory_format (its flags)
              lambda a: torch.nn.functional.interpolate(a, scale_factor=2) if a.dim() in (4, 5) else a - 1]


def _formats(t):
    # (channels_last applies to 4-d tensors, channels_last_3d to 5-d ones)
    formats = [torch.contiguous_format] + ([torch.channels_last] if t.dim() == 4 else []) + \
        ([torch.channels_last_3d] if t.dim() == 5 else [])
    return [t.is_contiguous(memory_format=f) for f in formats]


def test_results_keep_the_cpu_layouts_and_memory_formats():
    g = torch.Generator().manual_seed(5)
    for _ in range(2):
        for name, (shape, view) in LAYOUTS.items():
            base = torch.randn(shape, generator=g)
            c, n = view(base.clone()), view(base.npu())
            assert n.stride() == c.stride(), name
            for i, op in enumerate(LAYOUT_OPS):
                want, got = op(c), op(n)
                assert got.shape == want.shape and got.stride() == want.stride(), (name, i)
                assert _formats(got) == _formats(want), (name, i)
                assert torch.equal(got.cpu(), want), (name, i)
