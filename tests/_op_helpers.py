"""Helpers shared by the custom-op tests (tests/test_ops_*.py): the devices every op runs on,
seeded random inputs and tolerance-aware comparisons against a float64 reference."""
import torch

# every op test runs on the CPU and on the emulated npu device
DEVICES = ["cpu", "npu"]


def randn(shape, dtype=torch.float32, device="cpu", seed=0, scale=1.0):
    """Seeded standard-normal values drawn in float64 (times ``scale``), then cast to ``dtype``
    and moved to ``device``: the same values for every dtype up to its rounding."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g, dtype=torch.float64) * scale).to(dtype).to(device)


def uniform(shape, dtype=torch.float32, device="cpu", seed=0, low=-2.0, high=2.0, grad=False):
    """Seeded uniform values in ``[low, high)`` drawn in float64, cast to ``dtype`` on ``device``
    (a leaf that requires grad with ``grad=True``)."""
    g = torch.Generator().manual_seed(seed)
    t = torch.rand(shape, generator=g, dtype=torch.float64) * (high - low) + low
    return t.to(dtype).to(device).requires_grad_(grad)


def close_tol(actual, expected, atol, rtol):
    """``actual`` (detached, on any device) equals ``expected`` within ``atol`` / ``rtol``,
    compared in float64."""
    torch.testing.assert_close(actual.detach().cpu().double(), expected.double(), atol=atol, rtol=rtol)


def close_to(actual, expected, tol, dtype=None, device=None):
    """``actual`` has ``dtype`` and lives on ``device`` (when given), has ``expected``'s shape, and
    equals ``expected`` rounded to ``actual``'s dtype within ``tol`` (``rtol`` / ``atol`` keywords)."""
    if dtype is not None:
        assert actual.dtype == dtype, (actual.dtype, dtype)
    if device is not None:
        assert actual.device.type == device
    assert tuple(actual.shape) == tuple(expected.shape), (actual.shape, expected.shape)
    torch.testing.assert_close(actual.detach().cpu().double(),
                               expected.detach().cpu().to(actual.dtype).double(), **tol)


def zeros(*shape, dtype=torch.float32):
    """Zeros of ``shape``: inputs of shape checks and Meta / FakeTensor calls, where values do not matter."""
    return torch.zeros(shape, dtype=dtype)


def randn_scaled(shape, dtype=torch.float32, seed=0, scale=1.0):
    """:func:`randn` on the CPU with ``seed`` and ``scale`` as the third and fourth positional arguments."""
    return randn(shape, dtype, "cpu", seed, scale)


# a few ulps of each dtype, relative to the largest reference magnitude (see close_scaled)
ULPS = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2, torch.float64: 1e-12}


def close_scaled(actual, expected, dtype, scale=1.0):
    """``actual`` equals ``expected`` within ``ULPS[dtype] * max(1, max |expected|) * scale`` (absolute)."""
    tol = ULPS[dtype] * max(1.0, float(expected.abs().max())) * scale
    torch.testing.assert_close(actual.cpu().double(), expected.double(), atol=tol, rtol=0)


def randn_dims(*shape, seed=0, dtype=torch.float64):
    """Seeded standard-normal values of ``shape`` (given as separate dims), drawn in ``dtype``."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=dtype)


def int_zeros(n):
    """``n`` int32 zeros (index / length inputs of shape-only calls)."""
    return zeros(n, dtype=torch.int32)


def autograd_grads(fn, inputs, grad_out):
    """Gradients of ``fn(*inputs)`` w.r.t. fresh leaf copies of ``inputs`` for ``grad_out``: the reference
    a backward op is compared with."""
    leaves = [t.detach().clone().requires_grad_(True) for t in inputs]
    out = fn(*leaves)
    return torch.autograd.grad(out, leaves, grad_out)


def close_cpu(actual, expected, atol=1e-9, rtol=1e-7):
    """``actual`` (moved to the CPU, dtype kept) equals ``expected`` within ``atol`` / ``rtol``."""
    torch.testing.assert_close(actual.cpu(), expected, atol=atol, rtol=rtol)


def close_as_expected(actual, expected, atol=1e-9, rtol=1e-7):
    """``actual`` (moved to the CPU, cast to ``expected``'s dtype) equals ``expected`` within ``atol`` / ``rtol``."""
    torch.testing.assert_close(actual.cpu().to(expected.dtype), expected, atol=atol, rtol=rtol)


def int8_ref(v):
    """Round half to even, saturated to int8 (float64 reference of an int8 quantisation)."""
    return torch.round(v).clamp(-128, 127)


def assert_int8_close(got, ref, min_equal=0.98):
    """float32 (device) vs float64 (reference) arithmetic may land on the other side of a
    rounding boundary: at most 1 apart, and at least ``min_equal`` of the values equal."""
    diff = (got.cpu().double() - ref).abs()
    assert got.dtype == torch.int8
    assert float(diff.max()) <= 1.0
    assert float((diff == 0).double().mean()) >= min_equal


def assert_int8_close_97(got, ref):
    """:func:`assert_int8_close` with 97 % of the values equal (quantisations after a SwiGLU / norm)."""
    assert_int8_close(got, ref, min_equal=0.97)


def e8m0(raw):
    """The float value of an e8m0 (power-of-two) scale byte."""
    return 2.0 ** (raw - 127)


def small_int_fp8(shape, dtype, gen):
    """Random small integers in [-5, 5] as ``dtype``: exact in both float8 formats."""
    return torch.randint(-5, 6, shape, generator=gen).to(dtype)


def close_ref(a, e, dtype=None, device=None, rtol=1e-5, atol=1e-5):
    """``a`` has ``dtype`` / lives on ``device`` (when given), has the shape of the reference ``e``
    (a tensor or nested numbers) and equals it within ``rtol`` / ``atol``, compared in float64."""
    if dtype is not None:
        assert a.dtype == dtype
    if device is not None:
        assert a.device.type == device
    e = torch.as_tensor(e)
    assert tuple(a.shape) == tuple(e.shape), (a.shape, e.shape)
    torch.testing.assert_close(a.detach().cpu().double(), e.double(), rtol=rtol, atol=atol)


def generator(seed):
    """A CPU ``torch.Generator`` seeded with ``seed``."""
    return torch.Generator().manual_seed(seed)
