"""native_dropout and native_dropout_backward on npu: the CPU ops' bits.

PyTorch sends an npu tensor's dropout to these two fused ops (as on CUDA).
Their CPU kernels are ATen compositions: forward ``input.mul(mask).mul_(scale)``
with the mask cast to bool, backward ``grad * mask * scale``. The npu kernels
compute both in one pass for contiguous float, double, bfloat16 and (where
the CPU has F16C) half tensors (csrc/aten/Dropout.cpp) and run the ATen ops
for the rest;
these tests hold both ways to the
CPU ops, bit for bit, over dtypes, sizes around the loops' block and grain
sizes, infinities, signed zeros and NaNs (whose bfloat16 bits depend on where
the CPU's vector loop rounds them), and the layouts the one-pass loops leave
to the ATen ops.
"""
import itertools

import pytest
import torch
import torch.nn.functional as F

import torch_npu  # noqa: F401

_INT = {torch.float32: torch.int32, torch.float64: torch.int64, torch.float16: torch.int16,
        torch.bfloat16: torch.int16}
DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16]
SIZES = [1, 15, 16, 17, 1000, 70001]   # under, at and over the 16-wide block; over 32768 (two grains)
PS = [0.1, 0.3, 0.77, 0.0, 1.0]


def _bits(t):
    return t.contiguous().view(_INT[t.dtype])


def _values(n, dtype, seed):
    """Wide-range values (subnormal to overflowing in half types) with specials."""
    g = torch.Generator().manual_seed(seed)
    v = torch.randn(n, dtype=torch.float64, generator=g) * torch.exp(
        torch.randn(n, dtype=torch.float64, generator=g) * 8)
    v = v.to(dtype)
    if n >= 15:
        v[3], v[5], v[6], v[9] = float("inf"), -0.0, -float("inf"), 0.0
        v[4] = float("nan")
        v[n - 1] = -float("nan")                  # in the scalar tail of any vector loop
    if n >= 1000:
        v[500] = float("nan")                     # inside the vector loops
    return v


def _cpu_forward(x, keep, p):
    """CPU native_dropout's arithmetic for a given keep mask (its own code path)."""
    scale = 0.0 if p == 1.0 else 1.0 / (1.0 - p)
    return torch.ops.aten.mul_.Scalar(x.mul(keep.to(x.dtype)), scale)


def test_the_reference_is_cpu_native_dropout():
    # _cpu_forward is what the CPU op computes: check it against the op itself,
    # reading back the mask the CPU op drew.
    for dtype, p in itertools.product(DTYPES, [0.1, 0.3, 0.77]):
        x = _values(1000, dtype, 1)
        out, mask = torch.native_dropout(x, p, True)
        assert torch.equal(_bits(out), _bits(_cpu_forward(x, mask, p))), (dtype, p)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n", SIZES)
def test_forward_is_the_cpu_arithmetic_bitwise(dtype, n):
    for i, p in enumerate(PS):
        x = _values(n, dtype, 10 * n + i)
        out, mask = torch.native_dropout(x.npu(), p, True)
        assert out.device.type == "npu" and mask.dtype == torch.bool and out.dtype == dtype
        assert out.shape == x.shape and mask.shape == x.shape and out.is_contiguous()
        m = mask.cpu()
        assert torch.equal(_bits(out.cpu()), _bits(_cpu_forward(x, m, p))), p
        if p == 0.0:
            assert bool(m.all())
        if p == 1.0:
            assert not bool(m.any())


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n", SIZES)
def test_backward_is_the_cpu_op_bitwise(dtype, n):
    g = torch.Generator().manual_seed(n)
    for scale in [1.0 / 0.9, 1.0 / 0.7, 0.0, 3.0]:
        grad = _values(n, dtype, n + 7)
        mask = torch.rand(n, generator=g) > 0.3
        got = torch.ops.aten.native_dropout_backward(grad.npu(), mask.npu(), scale)
        want = torch.ops.aten.native_dropout_backward(grad, mask, scale)
        assert got.device.type == "npu" and got.dtype == want.dtype and got.stride() == want.stride()
        assert torch.equal(_bits(got.cpu()), _bits(want)), scale


_NANS = {torch.bfloat16: [0x7FC0, 0xFFC0, 0x7FC1, 0xFF81, 0x7F81],
         torch.float16: [0x7E00, 0xFE00, 0x7E01, 0xFC01, 0x7C01]}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_nan_bits_in_half_types_are_the_cpu_ops_wherever_they_fall(dtype):
    # Quiet, negative and payload-carrying NaNs, at every position of a vector
    # block and of the scalar tail: the CPU gives them different bits by position.
    raw = torch.tensor(_NANS[dtype], dtype=torch.int32).to(torch.int16)  # wraps to the bits
    for pos in range(40):
        x = torch.linspace(-3, 3, 40).to(dtype)
        x.view(torch.int16)[pos] = raw[pos % len(raw)]
        mask = torch.arange(40) % 3 != 0
        got = torch.ops.aten.native_dropout_backward(x.npu(), mask.npu(), 1.0 / 0.7)
        want = torch.ops.aten.native_dropout_backward(x, mask, 1.0 / 0.7)
        assert torch.equal(_bits(got.cpu()), _bits(want)), pos
        out, m = torch.native_dropout(x.npu(), 0.3, True)
        assert torch.equal(_bits(out.cpu()), _bits(_cpu_forward(x, m.cpu(), 0.3))), pos


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_every_half_type_value_is_the_cpu_result(dtype):
    # All 65536 bit patterns as input and as gradient: rounding at every exponent,
    # subnormals, overflow to infinity, both zeros, infinities and NaNs.
    x = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(dtype)
    for p in [0.1, 0.3, 0.77]:
        out, m = torch.native_dropout(x.npu(), p, True)
        assert torch.equal(_bits(out.cpu()), _bits(_cpu_forward(x, m.cpu(), p))), p
        scale = 1.0 / (1.0 - p)
        got = torch.ops.aten.native_dropout_backward(x.npu(), m, scale)
        want = torch.ops.aten.native_dropout_backward(x, m.cpu(), scale)
        assert torch.equal(_bits(got.cpu()), _bits(want)), p
    finite = x[torch.isfinite(x)]     # no NaN: the one-pass loops' own bits, not the fallback's
    for p in [0.1, 0.3]:
        out, m = torch.native_dropout(finite.npu(), p, True)
        want = _cpu_forward(finite, m.cpu(), p)
        assert torch.equal(_bits(out.cpu()), _bits(want)), p
        got = torch.ops.aten.native_dropout_backward(finite.npu(), m, 1.0 / (1.0 - p))
        want = torch.ops.aten.native_dropout_backward(finite, m.cpu(), 1.0 / (1.0 - p))
        assert torch.equal(_bits(got.cpu()), _bits(want)), p


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_other_layouts_keep_the_cpu_results_and_strides(dtype):
    base = _values(8 * 6 * 5, dtype, 3).reshape(8, 6, 5)
    cl = _values(2 * 3 * 4 * 5, dtype, 4).reshape(2, 3, 4, 5).contiguous(memory_format=torch.channels_last)
    for x in [base.transpose(0, 2), base[:, ::2], base.expand(2, 8, 6, 5), cl, base[0, 0, 0]]:
        out, mask = torch.native_dropout(x.npu(), 0.4, True)
        want = _cpu_forward(x, mask.cpu(), 0.4)
        assert out.stride() == want.stride() and mask.shape == x.shape
        assert torch.equal(_bits(out.cpu()), _bits(want))
        grad = _values(x.numel(), dtype, 5).reshape(x.shape)
        for g, m in [(grad, mask.cpu()), (grad.transpose(0, -1).contiguous().transpose(0, -1), mask.cpu()),
                     (grad, mask.cpu().transpose(0, -1).contiguous().transpose(0, -1))]:
            got = torch.ops.aten.native_dropout_backward(g.npu(), m.npu(), 1.0 / 0.6)
            want_g = torch.ops.aten.native_dropout_backward(g, m, 1.0 / 0.6)
            assert got.stride() == want_g.stride()
            assert torch.equal(_bits(got.cpu()), _bits(want_g))


def test_broadcast_and_non_bool_masks_go_to_the_cpu_op():
    g = torch.randn(4, 5)
    for mask in [torch.rand(5) > 0.5, (torch.rand(4, 5) > 0.5).float(), (torch.rand(4, 5) > 0.5).to(torch.uint8)]:
        got = torch.ops.aten.native_dropout_backward(g.npu(), mask.npu(), 2.0)
        want = torch.ops.aten.native_dropout_backward(g, mask, 2.0)
        assert got.dtype == want.dtype and torch.equal(got.cpu(), want)


def test_dropout_training_gradient_is_mask_times_scale():
    torch.npu.manual_seed(5)
    x = torch.randn(3, 70, 33, device="npu", requires_grad=True)
    y = F.dropout(x, 0.25, training=True)
    y.backward(torch.ones_like(y))
    kept = y.detach() != 0
    scale = torch.tensor(1.0 / 0.75)                       # float(scale), as mul(Scalar) takes it
    assert torch.equal(x.grad.cpu(), kept.cpu().float() * scale)
    assert torch.equal(y.detach().cpu(), _cpu_forward(x.detach().cpu(), kept.cpu(), 0.25))


def test_eval_and_empty_inputs():
    x = torch.randn(6, 7, device="npu")
    out, mask = torch.native_dropout(x, 0.5, False)
    assert torch.equal(out.cpu(), x.cpu()) and bool(mask.all()) and out.data_ptr() != x.data_ptr()
    e = torch.empty(0, 3, device="npu")
    out, mask = torch.native_dropout(e, 0.5, True)
    assert out.shape == (0, 3) and mask.shape == (0, 3) and mask.dtype == torch.bool
    got = torch.ops.aten.native_dropout_backward(e, mask, 2.0)
    assert got.shape == (0, 3) and got.device.type == "npu"


def test_the_draw_follows_the_npu_generator():
    x = torch.ones(5000, device="npu")
    torch.npu.manual_seed(11)
    a = torch.native_dropout(x, 0.5, True)[1].cpu()
    torch.npu.manual_seed(11)
    b = torch.native_dropout(x, 0.5, True)[1].cpu()
    assert torch.equal(a, b) and 0.45 < a.float().mean().item() < 0.55
