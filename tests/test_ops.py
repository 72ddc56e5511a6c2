"""Op execution semantics of the emulated ``npu`` device.

Every check compares an npu computation with the same computation on CPU
tensors holding identical inputs (the independent reference). Deterministic
ops must match bitwise: npu ops run the stock CPU kernels on the same memory.
"""
import copy
import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

import torch_npu  # noqa: F401

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

ALL_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.int16, torch.int32,
              torch.int64, torch.uint8, torch.bool, torch.complex64]


# ----------------------------------------------------------------------------- helpers

def make(shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if dtype.is_complex:
        return torch.randn(shape, generator=g, dtype=dtype) * 2
    if dtype.is_floating_point:
        return (torch.randn(shape, generator=g, dtype=torch.float64) * 3).to(dtype)
    info = torch.iinfo(dtype)
    return torch.randint(max(info.min, -50), min(info.max, 50), shape, generator=g, dtype=dtype)


def _bytes(t):
    t = t.detach().cpu().resolve_conj().resolve_neg().contiguous().reshape(-1)
    return t.view(torch.uint8)


def assert_bitwise(got, expected, device_type="npu"):
    """``got`` (npu result) equals ``expected`` (CPU result) bit for bit."""
    if isinstance(expected, (tuple, list)):
        assert isinstance(got, (tuple, list)) and len(got) == len(expected), (type(got), type(expected))
        for g, e in zip(got, expected):
            assert_bitwise(g, e, device_type)
        return
    if not isinstance(expected, torch.Tensor):
        assert got == expected
        return
    assert isinstance(got, torch.Tensor), type(got)
    assert got.device.type == device_type, got.device
    assert got.dtype == expected.dtype, (got.dtype, expected.dtype)
    assert got.shape == expected.shape, (got.shape, expected.shape)
    gb, eb = _bytes(got), _bytes(expected)
    if not torch.equal(gb, eb):
        torch.testing.assert_close(got.detach().cpu(), expected.detach(), rtol=0, atol=0, equal_nan=True)
        raise AssertionError("values equal but bit patterns differ (e.g. -0.0 vs 0.0 or NaN payload)")


def assert_close_npu(got, expected, rtol, atol):
    assert got.device.type == "npu", got.device
    assert got.dtype == expected.dtype
    torch.testing.assert_close(got.detach().cpu(), expected.detach(), rtol=rtol, atol=atol)


def run_both(fn, *cpu_args):
    """Run ``fn`` on CPU arguments and on npu copies; if the CPU raises, the npu must raise too."""
    npu_args = [a.npu() if isinstance(a, torch.Tensor) else a for a in cpu_args]
    for a, b in zip(npu_args, cpu_args):
        if isinstance(a, torch.Tensor):
            assert a.device.type == "npu" and torch.equal(_bytes(a), _bytes(b))
    try:
        expected = fn(*cpu_args)
    except Exception as e:  # the op is not defined for this dtype on CPU
        with pytest.raises(type(e)):
            fn(*npu_args)
        return None, None
    got = fn(*npu_args)
    assert_bitwise(got, expected)
    return got, expected


# ----------------------------------------------------------------------------- elementwise / reduction / matmul

BINARY = {
    "add": lambda a, b: a + b,
    "add_alpha": lambda a, b: torch.add(a, b, alpha=2),
    "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b,
    "div": lambda a, b: a / b,
    "div_floor": lambda a, b: torch.div(a, b, rounding_mode="floor"),
    "remainder": lambda a, b: torch.remainder(a, b),
    "maximum": torch.maximum,
    "minimum": torch.minimum,
    "eq": torch.eq,
    "ne": torch.ne,
    "lt": torch.lt,
    "ge": torch.ge,
    "logical_and": torch.logical_and,
    "bitwise_xor": torch.bitwise_xor,
    "atan2": torch.atan2,
    "pow_scalar": lambda a, b: a ** 2,
    "add_scalar": lambda a, b: a + 3,
    "mul_broadcast": lambda a, b: a * b[:1],
    "where": lambda a, b: torch.where(a.real > b.real if a.is_complex() else a > b, a, b),
}

UNARY = {
    "neg": torch.neg,
    "abs": torch.abs,
    "sign": torch.sign,
    "exp": torch.exp,
    "log": lambda a: torch.log(a.abs() + 1),
    "sqrt": lambda a: torch.sqrt(a.abs()),
    "sin": torch.sin,
    "tanh": torch.tanh,
    "sigmoid": torch.sigmoid,
    "floor": torch.floor,
    "round": torch.round,
    "clamp": lambda a: torch.clamp(a, -1, 1),
    "square": torch.square,
    "reciprocal": torch.reciprocal,
    "bitwise_not": torch.bitwise_not,
    "logical_not": torch.logical_not,
    "to_float32": lambda a: a.to(torch.float32),
    "to_int32": lambda a: a.to(torch.int32),
    "relu": torch.relu,
    "clone": torch.clone,
    "flip": lambda a: torch.flip(a, [1]),
    "roll": lambda a: torch.roll(a, 5, 1),
    "tril": torch.tril,
    "isnan": torch.isnan,
}

REDUCTIONS = {
    "sum": torch.sum,
    "sum_dim": lambda a: a.sum(dim=1),
    "sum_keepdim": lambda a: a.sum(dim=0, keepdim=True),
    "prod_dim": lambda a: a.prod(dim=0),
    "mean": torch.mean,
    "mean_dim": lambda a: a.mean(dim=1),
    "amax": lambda a: a.amax(dim=1),
    "amin": lambda a: a.amin(dim=0),
    "argmax": lambda a: a.argmax(dim=1),
    "argmin": lambda a: a.argmin(),
    "max_dim": lambda a: tuple(a.max(dim=1)),
    "min_all": torch.min,
    "std": torch.std,
    "var_dim": lambda a: a.var(dim=1),
    "norm": torch.norm,
    "all": torch.all,
    "any_dim": lambda a: a.any(dim=1),
    "cumsum": lambda a: a.cumsum(dim=1),
    "cumprod": lambda a: a.cumprod(dim=0),
    "logsumexp": lambda a: torch.logsumexp(a, dim=1),
    "softmax": lambda a: torch.softmax(a, dim=-1),
    "log_softmax": lambda a: torch.log_softmax(a, dim=0),
    "count_nonzero": torch.count_nonzero,
}

MATMUL = {
    "matmul": lambda a, b: a @ b.T,
    "mm": lambda a, b: torch.mm(a, b.T),
    "bmm": lambda a, b: torch.bmm(a.reshape(1, *a.shape), b.T.reshape(1, *b.T.shape)),
    "mv": lambda a, b: torch.mv(a, b[0]),
    "dot": lambda a, b: torch.dot(a[0], b[0]),
    "addmm": lambda a, b: torch.addmm(a[:, :a.shape[0]], a, b.T),
    "einsum": lambda a, b: torch.einsum("ij,kj->ik", a, b),
    "linear": lambda a, b: F.linear(a, b),
}


def _dt_id(dt):
    return str(dt).replace("torch.", "")


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=_dt_id)
@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary_bitwise(name, dtype):
    a, b = make((37, 53), dtype, 1), make((37, 53), dtype, 2)
    if name in ("div", "div_floor", "remainder") and not (dtype.is_floating_point or dtype.is_complex):
        b = torch.where(b == 0, torch.ones_like(b), b)
    run_both(BINARY[name], a, b)


@pytest.mark.filterwarnings("ignore:Casting complex values to real")
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=_dt_id)
@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_bitwise(name, dtype):
    run_both(UNARY[name], make((37, 53), dtype, 3))


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=_dt_id)
@pytest.mark.parametrize("name", sorted(REDUCTIONS))
def test_reduction_bitwise(name, dtype):
    a = make((37, 53), dtype, 4)
    if name in ("prod_dim", "cumprod") and (dtype.is_floating_point or dtype.is_complex):
        a = a / 4  # keep products finite
    run_both(REDUCTIONS[name], a)


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=_dt_id)
@pytest.mark.parametrize("name", sorted(MATMUL))
def test_matmul_bitwise(name, dtype):
    run_both(MATMUL[name], make((19, 33), dtype, 5), make((23, 33), dtype, 6))


def test_large_matmul_and_reduction_bitwise():
    a, b = make((256, 300), torch.float32, 7), make((300, 128), torch.float32, 8)
    run_both(lambda x, y: x @ y, a, b)
    run_both(lambda x: x.sum(), make((1000, 1001), torch.float32, 9))
    run_both(lambda x: x.sum(), make((1000, 1001), torch.float16, 9))


# ----------------------------------------------------------------------------- non-contiguous inputs

NONCONTIG = {
    "transposed": lambda t: t.t(),
    "strided_slice": lambda t: t[::2, 1::3],
    "negative_offset_slice": lambda t: t[3:, 5:-2],
    "expanded": lambda t: t[:1].expand(20, t.shape[1]),
    "permuted3d": lambda t: t.reshape(4, 10, -1).permute(2, 0, 1),
}


@pytest.mark.parametrize("layout", sorted(NONCONTIG))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64, torch.complex64, torch.float16,
                                   torch.bool], ids=_dt_id)
def test_noncontiguous_inputs(layout, dtype):
    base1, base2 = make((40, 60), dtype, 10), make((40, 60), dtype, 11)
    f = NONCONTIG[layout]
    c1, c2 = f(base1), f(base2)
    n1, n2 = f(base1.npu()), f(base2.npu())
    assert not n1.is_contiguous()
    assert n1.stride() == c1.stride() and n1.storage_offset() == c1.storage_offset()
    ops = [lambda x, y: x + y, lambda x, y: x * y, lambda x, y: x.eq(y), lambda x, y: x.clone(),
           lambda x, y: x.contiguous(), lambda x, y: x.sum(dim=-1), lambda x, y: x.flatten(),
           lambda x, y: torch.where(y.real > 0 if y.is_complex() else y.bool(), x, y)]
    if dtype != torch.bool:
        ops += [lambda x, y: x.sum(), lambda x, y: x.cumsum(-1), lambda x, y: x.abs()]
    if dtype in (torch.float32, torch.float64, torch.complex64):
        ops += [lambda x, y: x.exp(), lambda x, y: x @ y.transpose(-1, -2), lambda x, y: x.mean(0)]
    for op in ops:
        assert_bitwise(op(n1, n2), op(c1, c2))
    # in-place on a non-contiguous view writes only the viewed elements of the base
    b1c, b1n = base1.clone(), base1.npu()
    vc, vn = f(b1c), f(b1n)
    if dtype != torch.bool and layout != "expanded":
        vc.mul_(2 if dtype != torch.complex64 else 2j)
        vn.mul_(2 if dtype != torch.complex64 else 2j)
        assert_bitwise(b1n, b1c)


# ----------------------------------------------------------------------------- views share storage

VIEWS = {
    "view": (lambda t: t.view(4, 6), (6, 4), torch.float32, True),
    "view_dtype": (lambda t: t.view(torch.int32), (6, 4), torch.float32, True),
    "t": (lambda t: t.t(), (6, 4), torch.float32, True),
    "transpose": (lambda t: t.transpose(0, 2), (2, 3, 4), torch.float32, True),
    "permute": (lambda t: t.permute(1, 2, 0), (2, 3, 4), torch.float32, True),
    "narrow": (lambda t: t.narrow(1, 1, 2), (6, 4), torch.float32, True),
    "select": (lambda t: t.select(0, 2), (6, 4), torch.float32, True),
    "slicing": (lambda t: t[1:5:2, ::3], (6, 4), torch.float32, True),
    "index_int": (lambda t: t[3], (6, 4), torch.float32, True),
    "expand": (lambda t: t[:, :1].expand(6, 5), (6, 4), torch.float32, False),
    "unfold": (lambda t: t.unfold(0, 2, 1), (6, 4), torch.float32, False),
    "as_strided": (lambda t: t.as_strided((2, 2), (3, 1), 1), (6, 4), torch.float32, True),
    "as_strided_overlap": (lambda t: t.as_strided((3, 3), (1, 1), 2), (6, 4), torch.float32, False),
    "view_as_real": (lambda t: torch.view_as_real(t), (5, 3), torch.complex64, True),
    "view_as_complex": (lambda t: torch.view_as_complex(t), (5, 3, 2), torch.float32, True),
    "real": (lambda t: t.real, (5, 3), torch.complex64, True),
    "imag": (lambda t: t.imag, (5, 3), torch.complex64, True),
    "diagonal": (lambda t: t.diagonal(), (5, 5), torch.float32, True),
    "diagonal_offset": (lambda t: t.diagonal(offset=1), (5, 5), torch.float32, True),
    "unsqueeze": (lambda t: t.unsqueeze(1), (6, 4), torch.float32, True),
    "squeeze": (lambda t: t.squeeze(1), (6, 1, 4), torch.float32, True),
    "reshape_view": (lambda t: t.reshape(24), (6, 4), torch.float32, True),
    "flatten": (lambda t: t.flatten(1), (2, 3, 4), torch.float32, True),
    "chunk": (lambda t: t.chunk(3, 0)[1], (6, 4), torch.float32, True),
    "split": (lambda t: t.split([1, 3], 1)[1], (6, 4), torch.float32, True),
    "unbind": (lambda t: t.unbind(1)[2], (6, 4), torch.float32, True),
    "movedim": (lambda t: t.movedim(0, -1), (2, 3, 4), torch.float32, True),
    "detach": (lambda t: t.detach(), (6, 4), torch.float32, True),
    "alias_of_view": (lambda t: t[1:].t()[1:], (6, 4), torch.float32, True),
}


@pytest.mark.parametrize("name", sorted(VIEWS))
def test_view_shares_storage(name):
    fn, shape, dtype, writable = VIEWS[name]
    base_c = make(shape, dtype, 12)
    base_n = base_c.npu()
    vc, vn = fn(base_c), fn(base_n)
    assert vn.device == base_n.device
    assert vn._is_view() == vc._is_view()
    assert vn.untyped_storage().data_ptr() == base_n.untyped_storage().data_ptr()
    # same geometry and the same offset from the base (in bytes / elements) as on CPU
    assert vn.shape == vc.shape and vn.stride() == vc.stride()
    assert vn.storage_offset() == vc.storage_offset()
    assert vn.data_ptr() - base_n.data_ptr() == vc.data_ptr() - base_c.data_ptr()
    assert_bitwise(vn, vc)
    before = base_n.cpu()
    if writable:
        one = 1j if vc.is_complex() else 1
        vc.add_(one)
        vn.add_(one)
        assert_bitwise(base_n, base_c)
        assert not torch.equal(base_n.cpu(), before), "mutating the view did not reach the npu base"
    else:
        base_c.add_(1)
        base_n.add_(1)
        assert_bitwise(vn, vc)
        assert not torch.equal(vn.cpu(), fn(before)), "mutating the base did not reach the npu view"


def test_view_data_ptr_offsets_in_elements():
    c = torch.arange(60, dtype=torch.float64).reshape(6, 10)
    n = c.npu()
    for fn, elems in [(lambda t: t[2], 20), (lambda t: t[1:, 3:], 13), (lambda t: t.view(-1)[7:], 7),
                      (lambda t: t.t()[4], 4), (lambda t: t.diagonal(offset=2), 2)]:
        vn, vc = fn(n), fn(c)
        assert (vn.data_ptr() - n.data_ptr()) // n.element_size() == elems
        assert (vc.data_ptr() - c.data_ptr()) // c.element_size() == elems
        assert vn.storage_offset() == elems


def test_view_of_view_chain_and_base():
    n = torch.arange(24.).npu()
    v1 = n.view(4, 6)
    v2 = v1[1:3]
    v3 = v2.t()
    assert v3._base is n and v2._base is n and v1._base is n
    v3[0, 1] = -5
    assert n[12].item() == -5


# ----------------------------------------------------------------------------- in-place ops

INPLACE = {
    "add_": lambda t: t.add_(1.5),
    "add_tensor_": lambda t: t.add_(torch.ones_like(t), alpha=3),
    "mul_": lambda t: t.mul_(torch.arange(t.shape[1], dtype=t.dtype, device=t.device)),
    "clamp_": lambda t: t.clamp_(-0.5, 0.5),
    "zero_": lambda t: t.zero_(),
    "fill_": lambda t: t.fill_(2.25),
    "copy_": lambda t: t.copy_(torch.full_like(t, 4)),
    "masked_fill_": lambda t: t.masked_fill_(t > 0, -1.0),
    "index_fill_": lambda t: t.index_fill_(1, torch.tensor([0, 2], device=t.device), 9.0),
    "relu_": lambda t: t.relu_(),
    "sigmoid_": lambda t: t.sigmoid_(),
    "div_floor_": lambda t: t.div_(0.3, rounding_mode="floor"),
    "exp_": lambda t: t.exp_(),
    "t_": lambda t: t.t_(),
    "unsqueeze_": lambda t: t.unsqueeze_(0),
    "transpose_": lambda t: t.transpose_(0, 1),
    "squeeze_": lambda t: t.unsqueeze_(1).squeeze_(1),
    "setitem": lambda t: t.__setitem__((slice(1, 3), 0), 7.0) or t,
    "addcmul_": lambda t: t.addcmul_(t, t, value=0.5),
    "lerp_": lambda t: t.lerp_(torch.zeros_like(t), 0.25),
    "pow_": lambda t: t.pow_(2),
}


@pytest.mark.parametrize("name", sorted(INPLACE))
def test_inplace_returns_self(name):
    c = make((5, 7), torch.float32, 13)
    n = c.npu()
    ptr = n.data_ptr()
    rc = INPLACE[name](c)
    rn = INPLACE[name](n)
    assert rn is n
    assert rc is c
    assert n.data_ptr() == ptr
    assert_bitwise(n, c)


def test_inplace_on_int_and_bool():
    for dtype in (torch.int32, torch.int64, torch.uint8, torch.bool):
        c = make((8, 9), dtype, 14)
        n = c.npu()
        ptr = n.data_ptr()
        if dtype == torch.bool:
            r = n.logical_not_()
            c.logical_not_()
        else:
            r = n.add_(3).mul_(2)
            c.add_(3).mul_(2)
        assert r is n and n.data_ptr() == ptr
        assert_bitwise(n, c)


# ----------------------------------------------------------------------------- out= with resize

OUT_OPS = {
    "add": (lambda a, b, out: torch.add(a, b, out=out), torch.float32),
    "mul_int": (lambda a, b, out: torch.mul(a.long(), b.long(), out=out), torch.int64),
    "mm": (lambda a, b, out: torch.mm(a, b.t(), out=out), torch.float32),
    "matmul": (lambda a, b, out: torch.matmul(a, b.t(), out=out), torch.float32),
    "sum_dim": (lambda a, b, out: torch.sum(a, 1, out=out), torch.float32),
    "cat": (lambda a, b, out: torch.cat([a, b], 0, out=out), torch.float32),
    "cumsum": (lambda a, b, out: torch.cumsum(a, 0, out=out), torch.float32),
    "index_select": (lambda a, b, out: torch.index_select(a, 0, torch.tensor([3, 0, 3], device=a.device),
                                                          out=out), torch.float32),
    "exp": (lambda a, b, out: torch.exp(a, out=out), torch.float32),
    "gt": (lambda a, b, out: torch.gt(a, b, out=out), torch.bool),
    "where": (lambda a, b, out: torch.where(a > 0, a, b, out=out), torch.float32),
    "arange": (lambda a, b, out: torch.arange(0, 11, 2, out=out), torch.float32),
}


@pytest.mark.parametrize("name", sorted(OUT_OPS))
def test_out_with_resize(name):
    fn, dtype = OUT_OPS[name]
    a, b = make((6, 5), torch.float32, 15), make((6, 5), torch.float32, 16)
    out_c = torch.empty(0, dtype=dtype)
    out_n = torch.empty(0, dtype=dtype, device="npu")
    rc = fn(a, b, out_c)
    rn = fn(a.npu(), b.npu(), out_n)
    assert rn is out_n
    assert out_n.device.type == "npu"
    assert out_n.shape == out_c.shape and out_n.numel() > 0
    assert_bitwise(out_n, out_c)
    assert_bitwise(rn, rc)


def test_out_sort_tuple_and_wrong_shape_warning():
    a = make((4, 9), torch.float32, 17)
    vc, ic = torch.empty(0), torch.empty(0, dtype=torch.long)
    vn, in_ = torch.empty(0, device="npu"), torch.empty(0, dtype=torch.long, device="npu")
    torch.sort(a, 1, out=(vc, ic))
    rv, ri = torch.sort(a.npu(), 1, out=(vn, in_))
    assert rv is vn and ri is in_
    assert_bitwise(vn, vc)
    assert_bitwise(in_, ic)
    # a non-empty out of the wrong shape is resized with the same warning as on CPU
    out = torch.zeros(3, device="npu")
    with pytest.warns(UserWarning, match="resized"):
        torch.add(a.npu(), 1, out=out)
    assert out.shape == a.shape and out.device.type == "npu"
    assert_bitwise(out, a + 1)


def test_out_on_other_device_raises():
    a = torch.ones(3, 3, device="npu")
    with pytest.raises(RuntimeError):
        torch.add(a, a, out=torch.empty(3, 3))


# ----------------------------------------------------------------------------- lazy conj / neg bits (subprocess)

_CONJ_PRELUDE = """
import torch, torch_npu
def same(n, c):
    assert n.device.type == "npu", n.device
    n = n.cpu().resolve_conj().resolve_neg(); c = c.resolve_conj().resolve_neg()
    assert n.dtype == c.dtype and n.shape == c.shape, (n.dtype, c.dtype, n.shape, c.shape)
    assert torch.equal(n.contiguous().reshape(-1).view(torch.uint8), c.contiguous().reshape(-1).view(torch.uint8)), (n, c)
g = torch.Generator().manual_seed(0)
x = torch.randn(64, generator=g, dtype=torch.complex64)
y = torch.randn(64, generator=g, dtype=torch.complex64)
m = torch.randn(8, 8, generator=g, dtype=torch.complex64)
xn, yn, mn = x.npu(), y.npu(), m.npu()
"""

CONJ_CASES = {
    "conj": """
v = xn.conj()
assert v.is_conj() and v.device.type == "npu"
assert v.untyped_storage().data_ptr() == xn.untyped_storage().data_ptr()
same(v, x.conj())
same(v.resolve_conj(), x.conj().resolve_conj())
same(v.clone(), x.conj().clone())
same(v + yn, x.conj() + y)
same(v * yn, x.conj() * y)
vc = v.cpu()
assert vc.device.type == "cpu"
assert torch.equal(vc.resolve_conj(), x.conj().resolve_conj())
same(xn.conj_physical(), x.conj_physical())
same(x.conj().npu(), x.conj())          # cpu -> npu copy of a conj-bit tensor
same(x.conj().to("npu:1"), x.conj())
same(xn.conj().to("npu:2"), x.conj())   # npu -> npu copy of a conj-bit tensor
dst = torch.empty(64, dtype=torch.complex64, device="npu")
dst.copy_(xn.conj())
same(dst, x.conj())
""",
    "conj_abs": """
same(xn.conj().abs(), x.conj().abs())
same(x.to(torch.complex64).npu().conj().abs(), x.conj().abs())
same(mn.conj().abs().sum(), m.conj().abs().sum())
same(torch.angle(xn.conj()), torch.angle(x.conj()))
""",
    "fft_ifft": """
same(torch.fft.ifft(xn), torch.fft.ifft(x))
same(torch.fft.fft(xn), torch.fft.fft(x))
same(torch.fft.ifft(xn.conj()), torch.fft.ifft(x.conj()))
same(torch.fft.ifft2(mn), torch.fft.ifft2(m))
""",
    "fft_hfft": """
same(torch.fft.hfft(xn), torch.fft.hfft(x))
same(torch.fft.hfft(xn, n=30), torch.fft.hfft(x, n=30))
same(torch.fft.ihfft(xn.real), torch.fft.ihfft(x.real))
same(torch.fft.irfft(xn), torch.fft.irfft(x))
""",
    "neg_and_matmul": """
vi = xn.conj().imag  # carries the lazy neg bit
assert vi.is_neg()
same(vi, x.conj().imag)
same(vi + 1, x.conj().imag + 1)
same(torch._neg_view(xn), torch._neg_view(x))
same(torch._neg_view(xn).abs(), torch._neg_view(x).abs())
same(mn.conj() @ mn, m.conj() @ m)
same(mn.mH @ mn, m.mH @ m)
same(torch.vdot(xn, yn), torch.vdot(x, y))
""",
}


_CONJ_PROCS = {}


def _start_conj_cases():
    """Start every lazy-bit case in its own interpreter (a crash names its case). They are started when
    this module is imported, so they run while the in-process tests do."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    for name, body in CONJ_CASES.items():
        if name not in _CONJ_PROCS:
            code = _CONJ_PRELUDE + textwrap.dedent(body) + "\nprint('CASE-OK')\n"
            _CONJ_PROCS[name] = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, env=env,
                                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


_start_conj_cases()


@pytest.fixture(scope="module")
def conj_results():
    _start_conj_cases()
    results = {}
    for name, p in _CONJ_PROCS.items():
        out, err = p.communicate(timeout=240)
        results[name] = (p.returncode, out, err)
    return results


@pytest.mark.parametrize("case", sorted(CONJ_CASES))
def test_lazy_conj_neg_bits_subprocess(conj_results, case):
    rc, out, err = conj_results[case]
    assert rc == 0, f"case {case} exited with {rc}\nstdout:\n{out}\nstderr:\n{err[-3000:]}"
    assert "CASE-OK" in out


# ----------------------------------------------------------------------------- copies across devices

def test_copy_npu0_to_npu3():
    c = make((4, 6), torch.float32, 20)
    n0 = c.to("npu:0")
    n3 = n0.to("npu:3")
    assert n0.device == torch.device("npu:0") and n3.device == torch.device("npu:3")
    assert n3.data_ptr() != n0.data_ptr()
    assert_bitwise(n3, c)
    n3.add_(1)  # a copy, not an alias
    assert_bitwise(n0, c)
    # copy_ between two existing tensors on different npus
    dst = torch.zeros(4, 6, device="npu:2")
    dst.copy_(n0)
    assert dst.device == torch.device("npu:2")
    assert_bitwise(dst, c)
    # ops on npu:3 produce npu:3 results
    r = n3 * 2
    assert r.device == torch.device("npu:3")
    assert_bitwise(r, (c + 1) * 2)


def test_copy_cpu_npu_roundtrip_and_non_blocking():
    c = make((3, 5), torch.float64, 21)
    n = c.npu()
    assert n.device == torch.device("npu:0")
    assert_bitwise(n, c)
    back = n.cpu()
    assert back.device.type == "cpu" and torch.equal(back, c)
    nb = c.to("npu:1", non_blocking=True)
    assert nb.device == torch.device("npu:1")
    torch.npu.synchronize()
    assert_bitwise(nb, c)
    cb = nb.to("cpu", non_blocking=True)
    torch.npu.synchronize()
    assert cb.device.type == "cpu" and torch.equal(cb, c)
    pinned_dst = torch.empty(3, 5, dtype=torch.float64)
    pinned_dst.copy_(n, non_blocking=True)
    torch.npu.synchronize()
    assert torch.equal(pinned_dst, c)


@pytest.mark.parametrize("src_dt,dst_dt", [(torch.float32, torch.float16), (torch.float32, torch.int32),
                                           (torch.int64, torch.float64), (torch.float32, torch.bfloat16),
                                           (torch.bool, torch.float32), (torch.float32, torch.complex64),
                                           (torch.float64, torch.uint8)], ids=str)
def test_copy_with_dtype_conversion(src_dt, dst_dt):
    c = make((7, 3), src_dt, 22)
    expected = c.to(dst_dt)
    assert_bitwise(c.to("npu", dtype=dst_dt), expected)      # cpu -> npu with cast
    assert_bitwise(c.npu().to(dst_dt), expected)             # npu -> npu cast
    assert_bitwise(c.npu().to("npu:2", dst_dt), expected)    # cross-device cast
    back = c.npu().to("cpu", dst_dt)                         # npu -> cpu with cast
    assert back.device.type == "cpu" and torch.equal(_bytes(back), _bytes(expected))
    dst = torch.empty(7, 3, dtype=dst_dt, device="npu")
    dst.copy_(c)                                             # copy_ cpu -> npu with cast
    assert_bitwise(dst, expected)
    dst2 = torch.empty(7, 3, dtype=dst_dt, device="npu")
    dst2.copy_(c.npu())                                      # copy_ npu -> npu with cast
    assert_bitwise(dst2, expected)


def test_copy_broadcasting():
    row = make((5,), torch.float32, 23)
    col = make((4, 1), torch.float32, 24)
    for src in (row, row.npu(), row.unsqueeze(0).npu(), col, col.npu()):
        dst_n = torch.zeros(4, 5, device="npu")
        dst_c = torch.zeros(4, 5)
        r = dst_n.copy_(src)
        dst_c.copy_(src.cpu())
        assert r is dst_n
        assert_bitwise(dst_n, dst_c)
    # npu -> cpu with broadcasting
    dst = torch.zeros(4, 5)
    dst.copy_(row.npu())
    assert torch.equal(dst, row.expand(4, 5))
    # into a non-contiguous npu destination
    base = torch.zeros(5, 4, device="npu")
    base.t().copy_(col.npu())
    assert_bitwise(base, torch.zeros(5, 4).t().copy_(col).t())
    # 0-dim source
    dst_n = torch.zeros(3, 2, device="npu").copy_(torch.tensor(2.5))
    assert_bitwise(dst_n, torch.full((3, 2), 2.5))


# ----------------------------------------------------------------------------- resize_ / set_ / empty_strided

def test_resize_():
    c = torch.arange(6, dtype=torch.float32)
    n = c.npu()
    assert n.resize_(2, 3) is n
    assert n.shape == (2, 3) and n.is_contiguous()
    assert_bitwise(n, c.clone().resize_(2, 3))
    n.resize_(4, 5)
    assert n.shape == (4, 5) and n.device.type == "npu"
    assert n.untyped_storage().nbytes() >= 20 * 4
    assert torch.equal(n.reshape(-1)[:6].cpu(), c)  # old contents kept
    n.fill_(1.0)
    assert n.sum().item() == 20.0
    n.resize_(0)
    assert n.numel() == 0 and n.device.type == "npu"
    e = torch.empty(0, device="npu:2")
    e.resize_(3, 3)
    assert e.device == torch.device("npu:2") and e.shape == (3, 3)
    e.copy_(torch.eye(3))
    assert_bitwise(e, torch.eye(3))
    # resize with a memory format
    m = torch.empty(0, device="npu").resize_(2, 3, 4, 5, memory_format=torch.channels_last)
    assert m.stride() == torch.empty(0).resize_(2, 3, 4, 5, memory_format=torch.channels_last).stride()


def test_set_storage_offset_size_stride():
    base_c = torch.arange(20, dtype=torch.float32)
    base_n = base_c.npu()
    tc = torch.empty(0).set_(base_c.untyped_storage(), 3, (3, 4), (5, 1))
    tn = torch.empty(0, device="npu")
    r = tn.set_(base_n.untyped_storage(), 3, (3, 4), (5, 1))
    assert r is tn
    assert tn.device.type == "npu"
    assert tn.shape == (3, 4) and tn.stride() == (5, 1) and tn.storage_offset() == 3
    assert tn.untyped_storage().data_ptr() == base_n.untyped_storage().data_ptr()
    assert_bitwise(tn, tc)
    base_n[8] = 100.0  # shared memory: visible through the set_ tensor (row 1, col 0)
    assert tn[1, 0].item() == 100.0
    # set_(tensor)
    t2 = torch.empty(0, device="npu").set_(tn)
    assert t2.is_set_to(tn) and t2.shape == (3, 4) and t2.storage_offset() == 3
    # set_(storage) -> 1-d view of the whole storage
    t3 = torch.empty(0, device="npu").set_(base_n.untyped_storage())
    assert t3.shape == (20,)
    assert_bitwise(t3, base_n)
    # set_() -> empty
    t3.set_()
    assert t3.numel() == 0 and t3.device.type == "npu"
    # setting an npu tensor to a CPU storage is refused
    with pytest.raises(RuntimeError):
        torch.empty(0, device="npu").set_(base_c.untyped_storage(), 0, (2,), (1,))


def test_empty_strided():
    t = torch.empty_strided((3, 4), (1, 3), device="npu")
    ref = torch.empty_strided((3, 4), (1, 3))
    assert t.device == torch.device("npu:0") and t.shape == (3, 4) and t.stride() == (1, 3)
    assert t.dtype == torch.float32 and not t.is_contiguous()
    t.copy_(torch.arange(12.).reshape(3, 4))
    ref.copy_(torch.arange(12.).reshape(3, 4))
    assert_bitwise(t, ref)
    assert_bitwise(t.t().contiguous().view(-1), ref.t().contiguous().view(-1))
    t2 = torch.empty_strided((2, 3), (6, 2), dtype=torch.int16, device="npu:1")
    assert t2.device == torch.device("npu:1") and t2.dtype == torch.int16 and t2.stride() == (6, 2)
    assert t2.untyped_storage().nbytes() >= (1 * 6 + 2 * 2 + 1) * 2


# ----------------------------------------------------------------------------- item / tolist

@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=_dt_id)
def test_item_and_tolist(dtype):
    c = make((3, 4), dtype, 25)
    n = c.npu()
    assert n.tolist() == c.tolist()
    assert n[1].tolist() == c[1].tolist()
    it_n, it_c = n[2, 3].item(), c[2, 3].item()
    assert type(it_n) is type(it_c) and it_n == it_c
    assert n.reshape(-1)[5:6].item() == c.reshape(-1)[5:6].item()
    assert torch.tensor(7, dtype=torch.int64, device="npu").item() == 7
    assert bool(n.reshape(-1)[0] == c.reshape(-1)[0].npu())


# ----------------------------------------------------------------------------- convolutions

def _grads_equal(mod_c, mod_n, x_c, x_n, exact=True):
    for p_c, p_n in zip(mod_c.parameters(), mod_n.parameters()):
        assert p_n.grad is not None and p_n.grad.device.type == "npu"
        if exact:
            assert_bitwise(p_n.grad, p_c.grad)
        else:
            assert_close_npu(p_n.grad, p_c.grad, 1e-5, 1e-5)
    if exact:
        assert_bitwise(x_n.grad, x_c.grad)
    else:
        assert_close_npu(x_n.grad, x_c.grad, 1e-5, 1e-5)


CONVS = {
    "conv1d": (lambda: nn.Conv1d(3, 5, 3, stride=2, padding=1), (2, 3, 17)),
    "conv2d": (lambda: nn.Conv2d(3, 4, 3, padding=1, dilation=1), (2, 3, 9, 11)),
    "conv2d_groups_dilation": (lambda: nn.Conv2d(4, 6, 3, padding=2, dilation=2, groups=2), (2, 4, 8, 8)),
    "conv2d_nobias": (lambda: nn.Conv2d(3, 4, (2, 3), stride=(2, 1), bias=False), (1, 3, 7, 9)),
    "conv3d": (lambda: nn.Conv3d(2, 3, 3, padding=1), (1, 2, 5, 6, 7)),
    "conv_transpose1d": (lambda: nn.ConvTranspose1d(3, 2, 4, stride=2, padding=1), (2, 3, 9)),
    "conv_transpose2d": (lambda: nn.ConvTranspose2d(3, 4, 3, stride=2, padding=1, output_padding=1), (2, 3, 5, 6)),
    "conv_transpose2d_groups": (lambda: nn.ConvTranspose2d(4, 6, 3, stride=2, groups=2), (1, 4, 4, 4)),
    "conv_transpose3d": (lambda: nn.ConvTranspose3d(2, 2, 3, stride=2), (1, 2, 3, 4, 3)),
}


@pytest.mark.parametrize("name", sorted(CONVS))
def test_conv_forward_backward(name):
    ctor, shape = CONVS[name]
    torch.manual_seed(0)
    mod_c = ctor()
    mod_n = copy.deepcopy(mod_c).npu()
    assert all(p.device.type == "npu" for p in mod_n.parameters())
    x_c = make(shape, torch.float32, 26).requires_grad_()
    x_n = x_c.detach().npu().requires_grad_()
    y_c, y_n = mod_c(x_c), mod_n(x_n)
    assert_bitwise(y_n, y_c)
    g = make(tuple(y_c.shape), torch.float32, 27)
    y_c.backward(g)
    y_n.backward(g.npu())
    _grads_equal(mod_c, mod_n, x_c, x_n)


def test_conv2d_functional_channels_last_and_double():
    x = make((2, 3, 8, 8), torch.float64, 28)
    w = make((5, 3, 3, 3), torch.float64, 29)
    run_both(lambda a, b: F.conv2d(a, b, padding=1), x, w)
    xcl = x.float().contiguous(memory_format=torch.channels_last)
    run_both(lambda a, b: F.conv2d(a, b, stride=2), xcl, w.float())


# ----------------------------------------------------------------------------- scaled dot product attention

SDPA = {
    "plain": dict(),
    "causal": dict(is_causal=True),
    "bool_mask": dict(mask="bool"),
    "float_mask": dict(mask="float"),
    # masks whose last dimension does not have stride 1: the CPU runs its flash kernel
    # on them (only GPU backends require stride 1 there), so npu must too
    "float_mask_transposed": dict(mask="transposed"),
    "float_mask_expanded": dict(mask="expanded"),
    "scale": dict(scale=0.3, is_causal=True),
}


def _sdpa_mask(kind, device):
    if kind == "bool":
        mask = make((7, 7), torch.bool, 33)
        mask[:, 0] = True  # every query sees at least one key
        return mask.to(device)
    if kind == "float":
        return make((2, 1, 7, 7), torch.float32, 34).to(device)
    if kind == "transposed":
        return make((2, 1, 7, 7), torch.float32, 34).to(device).transpose(-1, -2)
    if kind == "expanded":
        return make((2, 1, 7, 1), torch.float32, 34).to(device).expand(2, 1, 7, 7)
    return None


class _AtenOps(TorchDispatchMode):
    """Records the names of the ATen ops a block dispatches."""

    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(func.name())
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("name", sorted(SDPA))
def test_scaled_dot_product_attention(name):
    cfg = dict(SDPA[name])
    q, k, v = (make((2, 3, 7, 8), torch.float32, s) for s in (30, 31, 32))
    kind = cfg.pop("mask", None)
    kw = dict(cfg)
    mask, mask_n = _sdpa_mask(kind, "cpu"), _sdpa_mask(kind, "npu")
    if mask is not None:
        assert mask_n.stride() == mask.stride()
    leaves_c = [t.clone().requires_grad_() for t in (q, k, v)]
    leaves_n = [t.npu().requires_grad_() for t in (q, k, v)]
    with _AtenOps() as ops_c:
        out_c = F.scaled_dot_product_attention(*leaves_c, attn_mask=mask, **kw)
    with _AtenOps() as ops_n:
        out_n = F.scaled_dot_product_attention(*leaves_n, attn_mask=mask_n, **kw)
    assert ops_n.names == ops_c.names  # the same kernel (flash or math) as on CPU
    assert_bitwise(out_n, out_c)
    g = make(tuple(out_c.shape), torch.float32, 35)
    out_c.backward(g)
    out_n.backward(g.npu())
    for lc, ln in zip(leaves_c, leaves_n):
        assert_bitwise(ln.grad, lc.grad)


# ----------------------------------------------------------------------------- dropout

@pytest.mark.parametrize("p", [0.2, 0.5, 0.8])
def test_dropout_scaling_and_mask(p):
    x = make((100, 100), torch.float32, 36).abs() + 0.5  # no zeros in the input
    xn = x.npu()
    y = F.dropout(xn, p=p, training=True)
    assert y.device.type == "npu" and y.shape == x.shape and y.dtype == x.dtype
    kept = (y != 0).cpu()
    frac = kept.float().mean().item()
    assert abs(frac - (1 - p)) < 0.03, frac
    assert kept.any() and (~kept).any()
    torch.testing.assert_close(y.cpu()[kept], x[kept] / (1 - p), rtol=1e-6, atol=0)
    assert torch.equal(y.cpu()[~kept], torch.zeros(int((~kept).sum())))
    # the module and the autograd path use the same scaling; grad = mask / (1 - p)
    xg = xn.clone().requires_grad_()
    drop = nn.Dropout(p).npu()
    out = drop(xg)
    out.sum().backward()
    kept2 = (out != 0).detach().cpu()
    expected_grad = kept2.float() / (1 - p)
    torch.testing.assert_close(xg.grad.cpu(), expected_grad, rtol=1e-6, atol=0)


def test_dropout_eval_and_edge_cases():
    x = make((10, 10), torch.float32, 37).npu()
    m = nn.Dropout(0.5).npu().eval()
    assert_bitwise(m(x), x.cpu())
    assert_bitwise(F.dropout(x, 0.5, training=False), x.cpu())
    assert_bitwise(F.dropout(x, 0.0, training=True), x.cpu())
    dropped_all = F.dropout(x, 1.0, training=True)
    assert bool((dropped_all == 0).all())
    assert_bitwise(dropped_all, F.dropout(x.cpu(), 1.0, training=True))
    out, mask = torch.native_dropout(x, 0.3, True)
    assert mask.dtype == torch.bool and mask.device.type == "npu"
    torch.testing.assert_close(out.cpu(), (x * mask).cpu() / 0.7, rtol=1e-6, atol=0)
    e = torch.empty(0, 3, device="npu")
    assert F.dropout(e, 0.5).shape == (0, 3)
    # dropout2d zeroes whole channels
    y = F.dropout2d(torch.ones(4, 16, 3, 3, device="npu"), 0.5, training=True)
    per_channel = y.cpu().reshape(4, 16, 9)
    assert torch.all((per_channel == 0).all(-1) | (per_channel == 2).all(-1))


# ----------------------------------------------------------------------------- recurrent layers

RNNS = {
    "lstm": lambda: nn.LSTM(6, 8, num_layers=2, batch_first=True, bidirectional=True),
    "lstm_nobias": lambda: nn.LSTM(6, 8, bias=False),
    "gru": lambda: nn.GRU(6, 8, num_layers=2, batch_first=True, bidirectional=True),
    "gru_single": lambda: nn.GRU(6, 8),
    "rnn_tanh": lambda: nn.RNN(6, 8, num_layers=2, bidirectional=True),
    "rnn_relu": lambda: nn.RNN(6, 8, nonlinearity="relu", batch_first=True),
}


@pytest.mark.parametrize("name", sorted(RNNS))
def test_rnn_forward_backward(name):
    torch.manual_seed(1)
    mod_c = RNNS[name]()
    mod_n = copy.deepcopy(mod_c).npu()
    x_c = make((3, 5, 6), torch.float32, 38).requires_grad_()
    x_n = x_c.detach().npu().requires_grad_()
    out_c, h_c = mod_c(x_c)
    out_n, h_n = mod_n(x_n)
    assert_close_npu(out_n, out_c, 1e-5, 1e-5)
    if isinstance(h_c, tuple):
        for a, b in zip(h_n, h_c):
            assert_close_npu(a, b, 1e-5, 1e-5)
        h_c, h_n = h_c[0] + 2 * h_c[1], h_n[0] + 2 * h_n[1]
    else:
        assert_close_npu(h_n, h_c, 1e-5, 1e-5)
    (out_c.pow(2).sum() + h_c.sum()).backward()
    (out_n.pow(2).sum() + h_n.sum()).backward()
    _grads_equal(mod_c, mod_n, x_c, x_n, exact=False)


def test_lstm_with_initial_state_and_cells():
    torch.manual_seed(2)
    lstm_c = nn.LSTM(4, 5)
    lstm_n = copy.deepcopy(lstm_c).npu()
    x = make((6, 2, 4), torch.float32, 39)
    h0, c0 = make((1, 2, 5), torch.float32, 40), make((1, 2, 5), torch.float32, 41)
    out_c, (hc, cc) = lstm_c(x, (h0, c0))
    out_n, (hn, cn) = lstm_n(x.npu(), (h0.npu(), c0.npu()))
    assert_close_npu(out_n, out_c, 1e-5, 1e-5)
    assert_close_npu(cn, cc, 1e-5, 1e-5)
    for cell_ctor in (lambda: nn.LSTMCell(4, 5), lambda: nn.GRUCell(4, 5), lambda: nn.RNNCell(4, 5)):
        cell_c = cell_ctor()
        cell_n = copy.deepcopy(cell_c).npu()
        xc = x[0].clone().requires_grad_()
        xn = x[0].npu().requires_grad_()
        rc, rn = cell_c(xc), cell_n(xn)
        if isinstance(rc, tuple):
            assert_close_npu(rn[1], rc[1], 1e-5, 1e-5)
            rc, rn = rc[0] + rc[1], rn[0] + rn[1]
        assert_close_npu(rn, rc, 1e-5, 1e-5)
        rc.pow(2).sum().backward()
        rn.pow(2).sum().backward()
        _grads_equal(cell_c, cell_n, xc, xn, exact=False)


# ----------------------------------------------------------------------------- embedding

@pytest.mark.parametrize("padding_idx", [None, 0, 3])
def test_embedding_forward_backward(padding_idx):
    torch.manual_seed(3)
    emb_c = nn.Embedding(10, 4, padding_idx=padding_idx)
    emb_n = copy.deepcopy(emb_c).npu()
    idx = torch.tensor([[0, 3, 3, 9], [1, 0, 3, 2]])
    out_c, out_n = emb_c(idx), emb_n(idx.npu())
    assert_bitwise(out_n, out_c)
    g = make((2, 4, 4), torch.float32, 42)
    out_c.backward(g)
    out_n.backward(g.npu())
    assert_bitwise(emb_n.weight.grad, emb_c.weight.grad)
    if padding_idx is not None:
        assert torch.count_nonzero(emb_n.weight.grad[padding_idx]).item() == 0
    assert torch.count_nonzero(emb_n.weight.grad[3]).item() > 0 or padding_idx == 3
    # F.embedding with int32 indices
    assert_bitwise(F.embedding(idx.int().npu(), emb_n.weight), F.embedding(idx.int(), emb_c.weight))


# ----------------------------------------------------------------------------- indexing

def test_indexing_with_npu_and_cpu_index_tensors():
    x = make((8, 6), torch.float32, 43)
    xn = x.npu()
    idx = torch.tensor([5, 0, 5, 7])
    assert_bitwise(xn[idx.npu()], x[idx])
    assert_bitwise(xn[idx], x[idx])                 # CPU long index on an npu tensor
    assert_bitwise(xn[:, idx[:2]], x[:, idx[:2]])
    assert_bitwise(xn[idx.npu(), idx.npu() % 6], x[idx, idx % 6])
    assert_bitwise(xn[[1, 2], [3, 4]], x[[1, 2], [3, 4]])
    assert_bitwise(xn[-1], x[-1])
    mask = x > 0
    assert_bitwise(xn[mask.npu()], x[mask])
    assert_bitwise(xn[mask], x[mask])
    assert_bitwise(xn[mask[:, 0].npu()], x[mask[:, 0]])
    assert_bitwise(xn[None, ..., 2], x[None, ..., 2])
    # setitem through indices and masks
    yc, yn = x.clone(), xn.clone()
    yc[idx] = 1.5
    yn[idx.npu()] = 1.5
    yc[mask] = torch.arange(int(mask.sum()), dtype=torch.float32)
    yn[mask.npu()] = torch.arange(int(mask.sum()), dtype=torch.float32, device="npu")
    assert_bitwise(yn, yc)


def test_index_put_accumulate_and_friends():
    x = make((6, 4), torch.float32, 44)
    idx = torch.tensor([1, 3, 1, 1, 5])
    vals = make((5, 4), torch.float32, 45)
    rc = x.clone().index_put_((idx,), vals, accumulate=True)
    n = x.npu()
    rn = n.index_put_((idx.npu(),), vals.npu(), accumulate=True)
    assert rn is n
    assert_bitwise(rn, rc)
    rn2 = x.npu().index_put_((idx,), vals.npu(), accumulate=True)  # CPU index tensor
    assert_bitwise(rn2, rc)
    assert_bitwise(x.npu().index_put_((idx.npu(),), vals.npu()), x.clone().index_put_((idx,), vals))
    # index_select / gather / scatter_add_ / index_add_
    assert_bitwise(torch.index_select(x.npu(), 1, torch.tensor([3, 0], device="npu")),
                   torch.index_select(x, 1, torch.tensor([3, 0])))
    gi = torch.tensor([[0, 1, 1, 0], [2, 2, 0, 3]])
    assert_bitwise(torch.gather(x.npu(), 1, gi.npu()), torch.gather(x, 1, gi))
    si = torch.tensor([[0, 1, 2, 0], [1, 0, 0, 5]])
    src = make((2, 4), torch.float32, 46)
    sc = torch.zeros(6, 4).scatter_add_(0, si, src)
    sn_t = torch.zeros(6, 4, device="npu")
    sn = sn_t.scatter_add_(0, si.npu(), src.npu())
    assert sn is sn_t
    assert_bitwise(sn, sc)
    assert_bitwise(torch.zeros(6, 4, device="npu").scatter_(0, si.npu(), src.npu()),
                   torch.zeros(6, 4).scatter_(0, si, src))
    assert_bitwise(x.npu().index_add_(0, idx.npu(), vals.npu()), x.clone().index_add_(0, idx, vals))
    assert_bitwise(x.npu().masked_fill(x.npu() < 0, 0.0), x.masked_fill(x < 0, 0.0))


def test_sort_topk_unique_nonzero():
    x = torch.tensor([[3., 1., 2., 1., 3., -0.5], [0., 0., 7., -1., 7., 2.]])
    xn = x.npu()
    assert_bitwise(torch.sort(xn, dim=1, stable=True), torch.sort(x, dim=1, stable=True))
    assert_bitwise(torch.sort(xn, dim=1, descending=True, stable=True),
                   torch.sort(x, dim=1, descending=True, stable=True))
    assert_bitwise(torch.sort(xn.reshape(-1)), torch.sort(x.reshape(-1)))
    assert_bitwise(torch.argsort(xn, dim=1, stable=True), torch.argsort(x, dim=1, stable=True))
    big = make((1000,), torch.float32, 47)
    assert_bitwise(torch.sort(big.npu()), torch.sort(big))
    assert_bitwise(torch.topk(big.npu(), 10), torch.topk(big, 10))
    assert_bitwise(torch.topk(xn, 2, dim=1, largest=False), torch.topk(x, 2, dim=1, largest=False))
    assert_bitwise(torch.unique(xn), torch.unique(x))
    assert_bitwise(torch.unique(xn, return_inverse=True, return_counts=True),
                   torch.unique(x, return_inverse=True, return_counts=True))
    assert_bitwise(torch.unique(xn, dim=1), torch.unique(x, dim=1))
    assert_bitwise(torch.unique_consecutive(xn.reshape(-1), return_counts=True),
                   torch.unique_consecutive(x.reshape(-1), return_counts=True))
    assert_bitwise(torch.nonzero(xn), torch.nonzero(x))
    assert_bitwise(torch.nonzero(xn, as_tuple=True), torch.nonzero(x, as_tuple=True))
    assert_bitwise(torch.argwhere(xn > 1), torch.argwhere(x > 1))
    assert_bitwise(torch.masked_select(xn, xn > 1), torch.masked_select(x, x > 1))
    assert_bitwise(torch.masked_select(xn, torch.tensor([True, False, True, True, False, True]).npu()),
                   torch.masked_select(x, torch.tensor([True, False, True, True, False, True])))
    assert_bitwise(torch.kthvalue(xn, 2, dim=1), torch.kthvalue(x, 2, dim=1))
    assert_bitwise(torch.median(big.npu()), torch.median(big))
    assert_bitwise(torch.searchsorted(torch.sort(big.npu())[0], xn), torch.searchsorted(torch.sort(big)[0], x))
    assert_bitwise(torch.bincount(torch.tensor([1, 4, 4, 0]).npu()), torch.bincount(torch.tensor([1, 4, 4, 0])))


def test_cumsum_and_where():
    for dtype in (torch.float32, torch.float64, torch.int32, torch.int64, torch.bool, torch.float16):
        c = make((9, 31), dtype, 48)
        assert_bitwise(torch.cumsum(c.npu(), 1), torch.cumsum(c, 1))
        assert_bitwise(torch.cumsum(c.npu(), 0, dtype=torch.float64), torch.cumsum(c, 0, dtype=torch.float64))
    a, b = make((5, 6), torch.float32, 49), make((5, 6), torch.float32, 50)
    cond = a > b
    assert_bitwise(torch.where(cond.npu(), a.npu(), b.npu()), torch.where(cond, a, b))
    assert_bitwise(torch.where(cond.npu(), a.npu(), 0.0), torch.where(cond, a, 0.0))
    assert_bitwise(torch.where(cond.npu(), 1, 0), torch.where(cond, 1, 0))
    assert_bitwise(torch.where(cond.npu()), torch.where(cond))
    assert_bitwise(torch.where(cond[:, :1].npu(), a.npu(), b[:1].npu()), torch.where(cond[:, :1], a, b[:1]))


def test_foreach_add_on_npu_lists():
    shapes = [(3,), (4, 5), (2, 3, 4), ()]
    cs = [make(s, torch.float32, 51 + i) for i, s in enumerate(shapes)]
    others = [make(s, torch.float32, 61 + i) for i, s in enumerate(shapes)]
    ns = [c.npu() for c in cs]
    ptrs = [n.data_ptr() for n in ns]
    torch._foreach_add_(cs, 1.5)
    torch._foreach_add_(ns, 1.5)
    torch._foreach_add_(cs, others, alpha=0.5)
    torch._foreach_add_(ns, [o.npu() for o in others], alpha=0.5)
    for n, c, p in zip(ns, cs, ptrs):
        assert n.data_ptr() == p
        assert_bitwise(n, c)
    rn = torch._foreach_mul(ns, 2.0)
    rc = torch._foreach_mul(cs, 2.0)
    assert_bitwise(list(rn), list(rc))
    assert_bitwise(list(torch._foreach_norm(ns)), list(torch._foreach_norm(cs)))
    torch._foreach_lerp_(cs, others, 0.3)
    torch._foreach_lerp_(ns, [o.npu() for o in others], 0.3)
    assert_bitwise(ns, cs)


def test_cat_and_stack():
    a, b = make((2, 3), torch.float32, 70), make((4, 3), torch.float32, 71)
    assert_bitwise(torch.cat([a.npu(), b.npu()]), torch.cat([a, b]))
    assert_bitwise(torch.cat([a.npu(), b.npu().to(torch.float64)]), torch.cat([a, b.to(torch.float64)]))
    assert_bitwise(torch.cat([a.t().npu(), b.t().npu()], dim=1), torch.cat([a.t(), b.t()], dim=1))
    assert_bitwise(torch.cat([a.npu(), torch.empty(0, device="npu"), a.npu()]), torch.cat([a, torch.empty(0), a]))
    assert_bitwise(torch.stack([a.npu(), a.npu() * 2], dim=1), torch.stack([a, a * 2], dim=1))
    assert_bitwise(torch.hstack([a.npu(), a.npu()]), torch.hstack([a, a]))
    r = torch.cat([a.to("npu:1"), b.to("npu:1")])
    assert r.device == torch.device("npu:1")
    with pytest.raises(RuntimeError, match="same device"):
        torch.cat([a.npu(), b])


def test_cpu_scalar_tensor_mixes_with_npu():
    x = make((4, 5), torch.float32, 72)
    xn = x.npu()
    s = torch.tensor(2.5)
    assert_bitwise(xn + s, x + s)
    assert_bitwise(s * xn, s * x)
    assert_bitwise(xn / torch.tensor(3), x / torch.tensor(3))
    assert_bitwise(torch.where(xn > 0, xn, torch.tensor(0.0)), torch.where(x > 0, x, torch.tensor(0.0)))
    assert_bitwise(torch.maximum(xn, torch.tensor(0.1)), torch.maximum(x, torch.tensor(0.1)))
    y = xn.clone()
    assert y.add_(s) is y
    assert_bitwise(y, x + s)
    assert_bitwise(xn.to("npu:2") * s, x * s)
    assert (xn.to("npu:2") * s).device == torch.device("npu:2")
    with pytest.raises(RuntimeError, match="same device"):
        xn + torch.ones(5)


FACTORIES = {
    "zeros": (lambda d: torch.zeros(2, 3, device=d), lambda: torch.zeros(2, 3)),
    "ones_int": (lambda d: torch.ones(4, dtype=torch.int32, device=d), lambda: torch.ones(4, dtype=torch.int32)),
    "full": (lambda d: torch.full((2, 2), 7.5, device=d), lambda: torch.full((2, 2), 7.5)),
    "full_bool": (lambda d: torch.full((3,), True, device=d), lambda: torch.full((3,), True)),
    "arange": (lambda d: torch.arange(0, 10, 3, device=d), lambda: torch.arange(0, 10, 3)),
    "arange_float": (lambda d: torch.arange(0, 1, 0.1, device=d), lambda: torch.arange(0, 1, 0.1)),
    "arange_end": (lambda d: torch.arange(5, device=d), lambda: torch.arange(5)),
    "arange_float_end": (lambda d: torch.arange(2.5, device=d), lambda: torch.arange(2.5)),
    "arange_start": (lambda d: torch.arange(-2, 9, device=d), lambda: torch.arange(-2, 9)),
    "arange_negative_step": (lambda d: torch.arange(3, -3, -0.7, device=d), lambda: torch.arange(3, -3, -0.7)),
    "arange_int32": (lambda d: torch.arange(1, 20, 4, dtype=torch.int32, device=d),
                     lambda: torch.arange(1, 20, 4, dtype=torch.int32)),
    "arange_float64": (lambda d: torch.arange(0, 1, 1 / 3, dtype=torch.float64, device=d),
                       lambda: torch.arange(0, 1, 1 / 3, dtype=torch.float64)),
    "arange_empty": (lambda d: torch.arange(4, 4, device=d), lambda: torch.arange(4, 4)),
    "linspace": (lambda d: torch.linspace(0, 1, 7, device=d), lambda: torch.linspace(0, 1, 7)),
    "logspace": (lambda d: torch.logspace(0, 2, 5, device=d), lambda: torch.logspace(0, 2, 5)),
    "eye": (lambda d: torch.eye(3, 4, device=d), lambda: torch.eye(3, 4)),
    "tril_indices": (lambda d: torch.tril_indices(4, 3, device=d), lambda: torch.tril_indices(4, 3)),
    "triu_indices": (lambda d: torch.triu_indices(3, 5, 1, device=d), lambda: torch.triu_indices(3, 5, 1)),
    "tensor": (lambda d: torch.tensor([[1, 2], [3, 4]], device=d), lambda: torch.tensor([[1, 2], [3, 4]])),
    "zeros_like": (lambda d: torch.zeros_like(torch.empty(2, 5, device=d, dtype=torch.float16)),
                   lambda: torch.zeros(2, 5, dtype=torch.float16)),
    "full_like": (lambda d: torch.full_like(torch.empty(3, device=d), 4.0), lambda: torch.full((3,), 4.0)),
    "hann_window": (lambda d: torch.hann_window(8, device=d), lambda: torch.hann_window(8)),
    "scalar_tensor": (lambda d: torch.scalar_tensor(3.5, device=d), lambda: torch.scalar_tensor(3.5)),
    "new_zeros": (lambda d: torch.empty(1, device=d).new_zeros(2, 3), lambda: torch.zeros(2, 3)),
    "new_tensor": (lambda d: torch.empty(1, device=d).new_tensor([1.5, 2.5]), lambda: torch.tensor([1.5, 2.5])),
    "new_full": (lambda d: torch.empty(1, device=d, dtype=torch.int16).new_full((2,), 9),
                 lambda: torch.full((2,), 9, dtype=torch.int16)),
}


@pytest.mark.parametrize("dev", ["npu", "npu:2"])
@pytest.mark.parametrize("name", sorted(FACTORIES))
def test_factories(name, dev):
    fn, ref = FACTORIES[name]
    t = fn(dev)
    assert t.device == torch.device("npu:0" if dev == "npu" else dev)
    assert_bitwise(t, ref())


def test_arange_errors_keep_their_texts():
    # arange has an npu kernel (aten/DirectKernels.cpp): a zero step raises the CPU kernel's
    # error; pinned or sparse requests go the composite's way, to the npu empty's errors
    for kwargs, text in ((dict(end=5, pin_memory=True), "Only dense CPU tensors can be pinned"),
                         (dict(end=5, layout=torch.sparse_coo), "not currently supported on the NPU backend")):
        with pytest.raises(RuntimeError, match=text):
            torch.arange(device="npu", **kwargs)
    with pytest.raises(RuntimeError) as cpu:
        torch.arange(0, 10, 0)
    with pytest.raises(RuntimeError) as npu:
        torch.arange(0, 10, 0, device="npu")
    assert str(npu.value) == str(cpu.value)


@pytest.mark.parametrize("dev", ["npu", "npu:2"])
def test_factories_empty_and_randperm(dev):
    e = torch.empty(2, 3, dtype=torch.float64, device=dev)
    assert e.device == torch.device("npu:0" if dev == "npu" else dev)
    assert e.shape == (2, 3) and e.dtype == torch.float64 and e.is_contiguous()
    e2 = torch.empty((4, 5), device=dev, memory_format=torch.contiguous_format).fill_(1)
    assert e2.sum().item() == 20
    p = torch.randperm(50, device=dev)
    assert p.device == e.device and p.dtype == torch.int64
    assert torch.equal(torch.sort(p)[0].cpu(), torch.arange(50))
    assert not torch.equal(p.cpu(), torch.arange(50))
    r = torch.rand(100, device=dev)
    assert r.device == e.device and bool(((r >= 0) & (r < 1)).all())


# ----------------------------------------------------------------------------- device checks and memory overlap

def test_mixed_npu_devices_raise():
    a0, a1 = torch.ones(3, device="npu:0"), torch.ones(3, device="npu:1")
    with pytest.raises(RuntimeError, match="npu:0 and npu:1"):
        a0 + a1
    with pytest.raises(RuntimeError, match="same device"):
        a0 + torch.tensor(2.0, device="npu:1")  # only CPU scalars may mix, not other-device ones
    with pytest.raises(RuntimeError, match="same device"):
        torch.cat([a0, a1])
    with pytest.raises(RuntimeError, match="same device"):
        torch.add(a0, a0, out=torch.empty(3, device="npu:1"))
    with pytest.raises(RuntimeError, match="npu:0 and cpu"):
        a0 + torch.ones(3)


def test_cpu_tensor_indexed_with_npu_indices_raises():
    x = torch.arange(5.0)
    with pytest.raises((IndexError, RuntimeError), match="indices should be either on cpu or on the same device"):
        x[torch.tensor([1, 2], device="npu")]


OVERLAP_CASES = {
    "copy_transposed_self": (lambda a: a.copy_(a.t()), lambda: torch.arange(9.).reshape(3, 3)),
    "copy_shifted": (lambda a: a[1:].copy_(a[:-1]), lambda: torch.arange(6.)),
    "add_transposed_self": (lambda a: a.add_(a.t()), lambda: torch.arange(9.).reshape(3, 3)),
    "mul_shifted": (lambda a: a[1:].mul_(a[:-1]), lambda: torch.arange(6.)),
    "index_select_out_self": (lambda a: torch.index_select(a, 0, torch.tensor([2, 0, 1], device=a.device), out=a),
                              lambda: torch.arange(9.).reshape(3, 3)),
    "cat_out_overlaps_input": (lambda a: torch.cat([a[:1], a[1:2]], out=a[1:3]),
                               lambda: torch.arange(9.).reshape(3, 3)),
    "gather_out_self": (lambda a: torch.gather(a, 1, torch.tensor([[2, 1, 0]] * 3, device=a.device), out=a),
                        lambda: torch.arange(9.).reshape(3, 3)),
    "where_out_overlaps": (lambda a: torch.where(a > 3, a.t(), a, out=a), lambda: torch.arange(9.).reshape(3, 3)),
}


@pytest.mark.parametrize("name", sorted(OVERLAP_CASES))
def test_partial_memory_overlap_raises_like_cpu(name):
    fn, mk = OVERLAP_CASES[name]
    with pytest.raises(RuntimeError, match="single memory location"):
        fn(mk())  # the CPU reference raises
    with pytest.raises(RuntimeError, match="single memory location"):
        fn(mk().npu())


def test_full_overlap_inplace_is_fine():
    # full overlap (same memory, same strides) is legal and must give the CPU result
    for fn in (lambda a: a.add_(a), lambda a: torch.mul(a, a, out=a), lambda a: a.copy_(a.view(-1).view(3, 3)),
               lambda a: torch.cumsum(a, 0, out=a), lambda a: torch.mm(a, a, out=a)):
        c = torch.arange(9.).reshape(3, 3)
        n = c.npu()
        fn(c)
        fn(n)
        assert_bitwise(n, c)


def test_autograd_version_counter_on_npu():
    x = torch.ones(3, device="npu", requires_grad=True)
    y = x.sigmoid()
    y.mul_(2)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()
    base = torch.zeros(4, 3, device="npu")
    v = base[1]
    ver = base._version
    v.add_(1)
    assert base._version > ver
