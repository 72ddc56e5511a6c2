"""Chip-numerics mode (torch_npu.emulator.set_numerics, TORCH_NPU_EMU_NUMERICS).

References are independent of the implementation: HF32 rounding is checked
against exact rational arithmetic (fractions.Fraction, round half to even)
and fp16 rounding against numpy's float32 -> float16 cast; op results against
the CPU op run on inputs rounded by those references.
"""
import math
import os
import struct
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import torch_npu
from torch_npu import emulator
from torch_npu.npu import _option_store

from _subproc import run_json

REPO = Path(__file__).resolve().parents[1]

# ---------------------------------------------------------------- references

_HF32_MAX = (2 - Fraction(1, 2 ** 11)) * Fraction(2) ** 127   # 11 explicit significand bits, fp32 exponents
_HF32_MIN_EXP = -126                                        # fp32's: subnormal step 2**(-126-11)


def _f32(bits):
    return struct.unpack("<f", struct.pack("<I", bits))[0]


def _bits(value):
    return struct.unpack("<I", struct.pack("<f", value))[0]


def hf32_reference(bits: int) -> int:
    """IEEE round-half-even of an fp32 value to 12 significant bits with fp32's
    exponent range (gradual underflow; overflow to infinity), by exact arithmetic."""
    x = _f32(bits)
    if math.isnan(x) or math.isinf(x) or x == 0.0:
        return bits
    v = Fraction(x)
    exp = max(math.floor(math.log2(abs(v))), _HF32_MIN_EXP)
    # log2 of a Fraction can be off by one near powers of two: fix exp exactly
    while abs(v) >= Fraction(2) ** (exp + 1):
        exp += 1
    while exp > _HF32_MIN_EXP and abs(v) < Fraction(2) ** exp:
        exp -= 1
    quantum = Fraction(2) ** (exp - 11)
    rounded = round(v / quantum) * quantum      # Fraction.__round__: half to even
    if abs(rounded) > _HF32_MAX:
        return _bits(math.copysign(math.inf, x))
    if rounded == 0:
        return _bits(math.copysign(0.0, x))
    return _bits(float(rounded))


def hf32_tensor(t: torch.Tensor) -> torch.Tensor:
    flat = t.detach().contiguous().view(torch.int32).flatten().tolist()
    out = [hf32_reference(b & 0xFFFFFFFF) for b in flat]
    return torch.tensor(np.array(out, dtype=np.uint32).view(np.int32)).view(torch.float32).view(t.shape)


def hf32_numpy(bits: np.ndarray) -> np.ndarray:
    """The same rounding as hf32_reference, vectorized in float64 (exact for these
    values): round half to even on a quantum of 2**(exponent - 11), the exponent
    clamped at fp32's smallest normal one; overflow to infinity; NaN kept."""
    with np.errstate(invalid="ignore"):                   # signalling NaNs
        x = bits.view(np.float32).astype(np.float64)
    finite = np.isfinite(x) & (x != 0)
    _, e = np.frexp(np.where(finite, x, 1.0))            # |x| = m * 2**e, m in [0.5, 1)
    quantum = np.ldexp(1.0, np.maximum(e - 1, _HF32_MIN_EXP) - 11)
    rounded = np.round(x / quantum) * quantum             # np.round: half to even
    rounded = np.where(np.abs(rounded) > float(_HF32_MAX), np.copysign(np.inf, x), rounded)
    with np.errstate(over="ignore"):
        out = np.where(finite, rounded, x).astype(np.float32).view(np.uint32)
    out = np.where(np.isnan(x), bits, out)                # NaN bits unchanged
    return np.where(out == 0, bits & 0x80000000, out).astype(np.uint32)   # a signed zero keeps its sign


def fp16_tensor(t: torch.Tensor) -> torch.Tensor:
    return torch.from_numpy(t.detach().numpy().astype(np.float16).astype(np.float32))


# Edge values: (bits, why)
EDGES = [
    (0x3F800000, "1.0, exact"),
    (0x3F800800, "tie, kept bit even: down"),
    (0x3F801800, "tie, kept bit odd: up"),
    (0x3F8007FF, "below the tie: down"),
    (0x3F800801, "above the tie: up"),
    (0x3FFFF800, "tie that carries into the exponent"),
    (0xBF800800, "negative tie, even: down (toward zero)"),
    (0xBF801800, "negative tie, odd: up in magnitude"),
    (0x00000000, "+0"),
    (0x80000000, "-0"),
    (0x00000001, "smallest subnormal: to +0"),
    (0x80000001, "negative smallest subnormal: to -0"),
    (0x00000800, "subnormal tie, even: to 0"),
    (0x00001800, "subnormal tie, odd: up"),
    (0x007FFFFF, "largest subnormal: to the smallest normal"),
    (0x00800000, "smallest normal"),
    (0x7F7FFFFF, "largest fp32: overflows to +inf"),
    (0xFF7FFFFF, "negative largest fp32: to -inf"),
    (0x7F7FF000, "largest HF32 value, exact"),
    (0x7F7FF7FF, "just below the overflow tie: down"),
    (0x7F7FF800, "overflow tie, kept bit odd: to inf"),
    (0x7F800000, "+inf"),
    (0xFF800000, "-inf"),
]
NANS = [0x7FC00000, 0x7F800001, 0xFFC00001, 0x7FFFFFFF, 0x7F800800]


def _round(bits_list, kind):
    t = torch.tensor(np.array(bits_list, dtype=np.uint32).view(np.int32)).view(torch.float32)
    out, changed = torch_npu._C._emu_round_cube_input(t, kind)
    return [b & 0xFFFFFFFF for b in out.view(torch.int32).tolist()], changed


@pytest.fixture
def chip():
    """Chip mode with the switches at their defaults; everything restored after."""
    saved = dict(_option_store._options)
    emulator.set_numerics("chip")
    emulator.reset_numerics_report()
    try:
        yield
    finally:
        emulator.set_numerics("exact")
        emulator.reset_numerics_report()
        _option_store._options.clear()
        _option_store._options.update(saved)


def _same_bits(a, b):
    a, b = a.detach().cpu(), b.detach().cpu()
    assert a.shape == b.shape and a.dtype == b.dtype
    return torch.equal(a.view(torch.int32), b.view(torch.int32))


# ---------------------------------------------------------------- bit level

@pytest.mark.parametrize("bits,why", EDGES, ids=[w for _, w in EDGES])
def test_hf32_rounding_edge_values(bits, why):
    (got,), changed = _round([bits], 0)
    want = hf32_reference(bits)
    assert got == want, f"{why}: {bits:#010x} -> {got:#010x}, expected {want:#010x}"
    assert changed == int(want != bits)


def test_hf32_rounding_ties_go_both_ways():
    # the two ties of the table: one rounds down, one up (to even)
    assert _round([0x3F800800], 0)[0] == [0x3F800000]
    assert _round([0x3F801800], 0)[0] == [0x3F802000]


def test_hf32_rounding_keeps_nan_and_counts_nothing():
    out, changed = _round(NANS, 0)
    assert all(math.isnan(_f32(b)) for b in out) and changed == 0


def test_hf32_rounding_random_bit_patterns():
    rng = np.random.default_rng(0)
    bits = rng.integers(0, 2 ** 32, size=3000, dtype=np.uint64).astype(np.uint32)
    # plus every pattern of the 13 low bits around one significand
    bits = np.concatenate([bits, 0x40490000 + np.arange(0x2000, dtype=np.uint32)])
    finite = [int(b) for b in bits if not math.isnan(_f32(int(b)))]
    got, changed = _round(finite, 0)
    want = [hf32_reference(b) for b in finite]
    assert got == want
    assert changed == sum(w != b for w, b in zip(want, finite))


def test_fp16_rounding_matches_numpy_cast():
    rng = np.random.default_rng(1)
    vals = np.concatenate([rng.standard_normal(2000).astype(np.float32) * np.float32(3.0),
                           np.array([65504.0, 65519.99, 65520.0, 1e-8, 6e-8, -2.98e-8, 1e5, -0.0, np.inf],
                                    dtype=np.float32)])
    got, changed = _round(vals.view(np.uint32).tolist(), 1)
    with np.errstate(over="ignore"):                       # 65520 and 1e5 overflow to inf, as intended
        want = vals.astype(np.float16).astype(np.float32).view(np.uint32)
    assert got == want.tolist()
    assert changed == int((want != vals.view(np.uint32)).sum())


def test_rounding_keeps_strides_of_dense_inputs():
    t = torch.randn(6, 4).t()                   # dense, transposed strides
    out, _ = torch_npu._C._emu_round_cube_input(t, 0)
    assert out.stride() == t.stride()
    assert _same_bits(out, hf32_tensor(t))
    sliced = torch.randn(6, 8)[:, ::2]          # not dense: a contiguous copy
    out, _ = torch_npu._C._emu_round_cube_input(sliced, 0)
    assert _same_bits(out, hf32_tensor(sliced))


def _patterns(n, seed):
    """n fp32 bit patterns: random ones (every exponent, NaNs and infinities among
    them), with ties, subnormals and the largest finite values mixed in."""
    rng = np.random.default_rng(seed)
    bits = rng.integers(0, 2 ** 32, size=n, dtype=np.uint64).astype(np.uint32)
    edges = np.array([b for b, _ in EDGES] + NANS, dtype=np.uint32)
    at = rng.choice(n, size=min(n, 4 * len(edges)), replace=False)
    bits[at] = np.resize(edges, at.size)
    return bits


def _round_np(bits, kind, isa=2):
    t = torch.from_numpy(bits.view(np.int32).copy()).view(torch.float32)
    out, changed = torch_npu._C._emu_round_cube_input(t, kind, isa)
    return out.view(torch.int32).numpy().view(np.uint32), changed


def _fp16_numpy(bits):
    with np.errstate(over="ignore"):
        want = bits.view(np.float32).astype(np.float16).astype(np.float32).view(np.uint32)
    return np.where(np.isnan(bits.view(np.float32)), bits, want)   # NaN bits unchanged


def test_hf32_numpy_reference_agrees_with_the_exact_one():
    bits = _patterns(4000, 3)
    want = [hf32_reference(int(b)) if not math.isnan(_f32(int(b))) else int(b) for b in bits]
    assert hf32_numpy(bits).tolist() == want


_ISAS = {0: "portable", 1: "avx2", 2: "avx512"}


@pytest.mark.parametrize("n", [1, 7, 8, 9, 15, 16, 17, 31, 1000, 262145, 1000003])
@pytest.mark.parametrize("kind", [0, 1], ids=["hf32", "fp16"])
def test_every_instruction_set_rounds_every_size(kind, n):
    # sizes below, at and around the 8- and 16-lane steps (the scalar tail), and
    # above the parallel grain (262144) with a ragged end; each instruction set
    # this CPU has, the portable one included
    bits = _patterns(n, n)
    want = hf32_numpy(bits) if kind == 0 else _fp16_numpy(bits)
    for isa in range(torch_npu._C._emu_round_cube_input_isa() + 1):
        got, changed = _round_np(bits, kind, isa)
        assert np.array_equal(got, want), f"{_ISAS[isa]}: {np.flatnonzero(got != want)[:5]}"
        assert changed == int((want != bits).sum()), _ISAS[isa]


def test_the_best_instruction_set_the_cpu_has_is_used():
    flags = set()
    if Path("/proc/cpuinfo").exists():
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    if not flags:
        pytest.skip("no /proc/cpuinfo flags to check against")
    want = 2 if "avx512f" in flags else 1 if {"avx2", "f16c"} <= flags else 0
    assert torch_npu._C._emu_round_cube_input_isa() == want


@pytest.mark.parametrize("kind", [0, 1], ids=["hf32", "fp16"])
def test_rounding_non_contiguous_inputs(kind):
    ref = hf32_tensor if kind == 0 else fp16_tensor
    base = torch.randn(37, 45) * 1000
    for view in (base.t(), base[:, 3:40:2], base[5:30], base.t()[::3]):
        out, changed = torch_npu._C._emu_round_cube_input(view, kind)
        want = ref(view.contiguous())
        assert _same_bits(out, want)
        assert changed == int((want.view(torch.int32) != view.contiguous().view(torch.int32)).sum())
        if view.is_contiguous() or view.t().is_contiguous():
            assert out.stride() == view.stride()


def test_rounding_rejects_what_it_cannot_round():
    with pytest.raises(RuntimeError, match="expects a float32 tensor"):
        torch_npu._C._emu_round_cube_input(torch.zeros(2, dtype=torch.float16), 0)
    with pytest.raises(RuntimeError, match="kind must be 0"):
        torch_npu._C._emu_round_cube_input(torch.zeros(2), 5)
    with pytest.raises(RuntimeError, match="isa must be 0, 1 or 2"):
        torch_npu._C._emu_round_cube_input(torch.zeros(2), 0, 3)


# ---------------------------------------------------------------- switches

def test_mode_api_and_bad_values():
    assert emulator.get_numerics() == "exact"
    for bad in ("CHIP", "hf32", None, 1):
        with pytest.raises(ValueError, match="numerics mode must be 'exact' or 'chip'"):
            emulator.set_numerics(bad)
    assert emulator.get_numerics() == "exact"


def _conv_inputs():
    torch.manual_seed(0)
    return torch.randn(2, 3, 9, 9), torch.randn(4, 3, 3, 3), torch.randn(4)


def test_conv_rounds_to_hf32_by_default(chip):
    x, w, b = _conv_inputs()
    got = F.conv2d(x.npu(), w.npu(), b.npu(), padding=1)
    want = F.conv2d(hf32_tensor(x), hf32_tensor(w), b, padding=1)
    assert _same_bits(got, want)
    assert not _same_bits(got, F.conv2d(x, w, b, padding=1))   # the rounding shows
    torch.npu.conv.allow_hf32 = False
    assert _same_bits(F.conv2d(x.npu(), w.npu(), b.npu(), padding=1), F.conv2d(x, w, b, padding=1))


def test_conv_backward_rounds_its_inputs(chip):
    x, w, b = _conv_inputs()
    xn, wn = x.npu().requires_grad_(), w.npu().requires_grad_()
    out = F.conv2d(xn, wn, None, padding=1)
    g = torch.randn(out.shape)
    out.backward(g.npu())
    gi, gw, _ = torch.ops.aten.convolution_backward(hf32_tensor(g), hf32_tensor(x), hf32_tensor(w), [4], [1, 1],
                                                    [1, 1], [1, 1], False, [0, 0], 1, [True, True, False])
    assert _same_bits(xn.grad, gi) and _same_bits(wn.grad, gw)


def test_matmul_is_exact_by_default_and_hf32_when_allowed(chip):
    torch.manual_seed(1)
    a, m, bias = torch.randn(5, 7), torch.randn(7, 3), torch.randn(3)
    assert _same_bits(a.npu() @ m.npu(), a @ m)                      # matmul.allow_hf32 defaults to False
    torch.npu.matmul.allow_hf32 = True
    assert _same_bits(a.npu() @ m.npu(), hf32_tensor(a) @ hf32_tensor(m))
    # addmm (nn.Linear): the product's inputs are rounded, the bias is not
    got = torch.addmm(bias.npu(), a.npu(), m.npu())
    assert _same_bits(got, torch.addmm(bias, hf32_tensor(a), hf32_tensor(m)))
    b1, b2 = torch.randn(2, 5, 7), torch.randn(2, 7, 3)
    assert _same_bits(torch.bmm(b1.npu(), b2.npu()), torch.bmm(hf32_tensor(b1), hf32_tensor(b2)))
    c = torch.randn(2, 5, 3)
    assert _same_bits(torch.baddbmm(c.npu(), b1.npu(), b2.npu()),
                      torch.baddbmm(c, hf32_tensor(b1), hf32_tensor(b2)))


def _mats(*shapes):
    torch.manual_seed(3)
    return [torch.randn(*shape) for shape in shapes]


def test_out_overloads_round_and_write_out(chip):
    torch.npu.matmul.allow_hf32 = True
    h = hf32_tensor
    a, m, bias = _mats((5, 7), (7, 3), (5, 3))
    b1, b2, c = _mats((2, 5, 7), (2, 7, 3), (2, 5, 3))
    cases = [
        ("mm.out", lambda *x, out: torch.mm(*x, out=out), (a, m), torch.mm(h(a), h(m))),
        ("bmm.out", lambda *x, out: torch.bmm(*x, out=out), (b1, b2), torch.bmm(h(b1), h(b2))),
        ("addmm.out", lambda *x, out: torch.addmm(*x, beta=0.5, alpha=2.0, out=out), (bias, a, m),
         torch.addmm(bias, h(a), h(m), beta=0.5, alpha=2.0)),
        ("baddbmm.out", lambda *x, out: torch.baddbmm(*x, out=out), (c, b1, b2), torch.baddbmm(c, h(b1), h(b2))),
        ("addbmm.out", lambda *x, out: torch.addbmm(*x, out=out), (bias, b1, b2), torch.addbmm(bias, h(b1), h(b2))),
    ]
    for name, fn, args, want in cases:
        out = torch.empty(0, device="npu")                  # resized by the kernel, as on CPU
        got = fn(*[x.npu() for x in args], out=out)
        assert got is out and out.device.type == "npu"
        assert _same_bits(out, want), name
    report = {e["op"]: e for e in emulator.numerics_report()}
    assert sorted(report) == sorted(name for name, *_ in cases)
    assert report["mm.out"]["elements"] == a.numel() + m.numel() and report["mm.out"]["rounding"] == "hf32"


def test_out_may_alias_an_input(chip):
    # the rounded copy is not the out tensor: the product reads the rounded inputs
    torch.npu.matmul.allow_hf32 = True
    a, m = _mats((4, 4), (4, 4))
    an = a.npu()
    torch.mm(an, m.npu(), out=an)
    assert _same_bits(an, hf32_tensor(a) @ hf32_tensor(m))
    c = torch.randn(4, 4)
    cn = c.npu()
    torch.addmm(cn, cn, m.npu(), out=cn)                     # self, mat1 and out all one tensor
    assert _same_bits(cn, torch.addmm(c, hf32_tensor(c), hf32_tensor(m)))


def test_inplace_variants_return_self(chip):
    torch.npu.matmul.allow_hf32 = True
    h = hf32_tensor
    a, m, bias = _mats((5, 7), (7, 3), (5, 3))
    b1, b2, c = _mats((2, 5, 7), (2, 7, 3), (2, 5, 3))
    for name, self_, args, want in [
        ("addmm_", bias, (a, m), torch.addmm(bias, h(a), h(m))),
        ("baddbmm_", c, (b1, b2), torch.baddbmm(c, h(b1), h(b2))),
        ("addbmm_", bias, (b1, b2), torch.addbmm(bias, h(b1), h(b2))),
    ]:
        sn = self_.npu()
        assert getattr(sn, name)(*[x.npu() for x in args]) is sn
        assert _same_bits(sn, want), name
    # self also a factor of the product: rounded as an input, written as the result
    x, y = _mats((4, 4), (4, 4))
    xn = x.npu()
    xn.addmm_(xn, y.npu())
    assert _same_bits(xn, torch.addmm(x, h(x), h(y)))


def test_non_contiguous_inputs_keep_their_layout(chip):
    torch.npu.matmul.allow_hf32 = True
    base, other = _mats((9, 12), (12, 9))
    # transposed (dense): the rounded copy keeps the strides, BLAS takes the same path
    got = torch.mm(base.npu().t(), other.npu().t())
    assert _same_bits(got, torch.mm(hf32_tensor(base).t(), hf32_tensor(other).t()))
    # sliced (not dense): rounded into a contiguous copy
    got = torch.mm(base.npu()[:, ::2], other.npu()[::2, :])
    assert _same_bits(got, torch.mm(hf32_tensor(base[:, ::2].contiguous()), hf32_tensor(other[::2, :].contiguous())))


def test_the_same_tensor_twice_counts_twice(chip):
    torch.npu.matmul.allow_hf32 = True
    (a,) = _mats((6, 6))
    assert _same_bits(a.npu() @ a.npu().t(), hf32_tensor(a) @ hf32_tensor(a).t())
    an = a.npu()
    assert _same_bits(torch.mm(an, an), hf32_tensor(a) @ hf32_tensor(a))
    changed = int((hf32_tensor(a) != a).sum())
    assert {e["op"]: e for e in emulator.numerics_report()}["mm"]["elements"] == 4 * a.numel()
    assert {e["op"]: e for e in emulator.numerics_report()}["mm"]["changed"] == 4 * changed


def test_report_names_both_kinds_of_one_op(chip):
    torch.npu.matmul.allow_hf32 = True
    a, m = _mats((3, 3), (3, 3))
    a.npu() @ m.npu()
    torch.npu.set_option({"ACL_PRECISION_MODE": "allow_fp32_to_fp16"})
    torch.npu.matmul.allow_hf32 = False
    assert _same_bits(a.npu() @ m.npu(), fp16_tensor(a) @ fp16_tensor(m))
    (entry,) = emulator.numerics_report()
    assert entry == {"op": "mm", "calls": 2, "rounding": "fp16/hf32", "elements": 36,
                     "changed": entry["changed"]}


def test_a_cube_math_type_chip_mode_cannot_read_is_refused(chip):
    torch.npu.matmul.allow_hf32 = True
    a, m = _mats((3, 3), (3, 3))
    with pytest.raises(ValueError, match="MATMUL_CUBE_MATH_TYPE is '7'"):
        torch.npu.set_option({"MATMUL_CUBE_MATH_TYPE": "7"})
    # refused as a whole: the store and the kernels keep the previous state
    assert _option_store.get_option("MATMUL_CUBE_MATH_TYPE") is None
    assert _same_bits(a.npu() @ m.npu(), hf32_tensor(a) @ hf32_tensor(m))
    # in exact mode the value is only stored; switching chip mode on then refuses
    emulator.set_numerics("exact")
    torch.npu.set_option({"MATMUL_CUBE_MATH_TYPE": "x"})
    with pytest.raises(ValueError, match="MATMUL_CUBE_MATH_TYPE is 'x'"):
        emulator.set_numerics("chip")
    assert emulator.get_numerics() == "exact"
    assert _same_bits(a.npu() @ m.npu(), a @ m)


def test_precision_mode_and_cube_math_type(chip):
    torch.manual_seed(2)
    a, m = torch.randn(6, 5) * 3, torch.randn(5, 4)
    # ACL_PRECISION_MODE=allow_fp32_to_fp16 alone: USE_FP16
    torch.npu.set_option({"ACL_PRECISION_MODE": "allow_fp32_to_fp16"})
    assert _same_bits(a.npu() @ m.npu(), fp16_tensor(a) @ fp16_tensor(m))
    x, w, b = _conv_inputs()
    # conv.allow_hf32 (default True) with it: ALLOW_FP32_DOWN_PRECISION, HF32 on a 910B
    assert _same_bits(F.conv2d(x.npu(), w.npu(), b.npu()), F.conv2d(hf32_tensor(x), hf32_tensor(w), b))
    torch.npu.set_option({"ACL_PRECISION_MODE": "must_keep_origin_dtype"})
    assert _same_bits(a.npu() @ m.npu(), a @ m)
    # an explicit matmul.cube_math_type wins over the switches for the matmul family
    torch.npu.matmul.cube_math_type = torch.npu.CubeMathType.USE_FP16
    assert _same_bits(a.npu() @ m.npu(), fp16_tensor(a) @ fp16_tensor(m))
    torch.npu.matmul.cube_math_type = torch.npu.CubeMathType.USE_HF32
    assert _same_bits(a.npu() @ m.npu(), hf32_tensor(a) @ hf32_tensor(m))
    for keep in (torch.npu.CubeMathType.KEEP_DTYPE, torch.npu.CubeMathType.USE_FP32_ADD):
        torch.npu.matmul.cube_math_type = keep
        assert _same_bits(a.npu() @ m.npu(), a @ m)


def test_non_fp32_inputs_are_not_rounded(chip):
    torch.npu.matmul.allow_hf32 = True
    a, m = torch.randn(4, 4, dtype=torch.float16), torch.randn(4, 4, dtype=torch.float16)
    assert _same_bits(a.npu() @ m.npu(), a @ m)
    assert emulator.numerics_report() == []


def test_numerics_report_counts_and_resets(chip):
    torch.npu.matmul.allow_hf32 = True
    a = torch.tensor([[1.0, _f32(0x3F800801)], [_f32(0x3F801800), 2.0]])   # 2 of 4 change
    m = torch.eye(2)                                                        # exact in HF32
    a.npu() @ m.npu()
    a.npu() @ m.npu()
    x, w, b = _conv_inputs()
    F.conv2d(x.npu(), w.npu(), b.npu())
    report = {e["op"]: e for e in emulator.numerics_report()}
    assert report["mm"] == {"op": "mm", "calls": 2, "rounding": "hf32", "elements": 16, "changed": 4}
    conv = report["convolution_overrideable"]
    n_changed = int((hf32_tensor(x) != x).sum() + (hf32_tensor(w) != w).sum())
    assert conv["calls"] == 1 and conv["elements"] == x.numel() + w.numel() and conv["changed"] == n_changed
    emulator.reset_numerics_report()
    assert emulator.numerics_report() == []


def test_exact_mode_leaves_the_dispatch_table_as_it_was():
    before = {op: torch._C._dispatch_dump(f"aten::{op}")
              for op in ("mm", "addmm", "addmm_", "mm.out", "baddbmm.out", "convolution_overrideable",
                         "convolution_backward_overrideable")}
    emulator.set_numerics("chip")
    during = torch._C._dispatch_dump("aten::mm")
    emulator.set_numerics("exact")
    after = {op: torch._C._dispatch_dump(f"aten::{op}") for op in before}
    assert during != before["mm"]          # chip mode did install its kernel
    assert after == before
    torch.npu.conv.allow_hf32 = True
    x, w, b = _conv_inputs()
    assert _same_bits(F.conv2d(x.npu(), w.npu(), b.npu()), F.conv2d(x, w, b))


def test_switching_modes_is_silent():
    # the chip kernels replace registered npu kernels; the dispatcher's override
    # warning must not reach stderr or Python's warnings
    code = """
import torch, torch_npu, torch.nn.functional as F
from torch_npu import emulator
for mode in ("chip", "exact", "chip"):
    emulator.set_numerics(mode)
x = torch.randn(1, 2, 5, 5, device="npu")
F.conv2d(x, torch.randn(3, 2, 3, 3, device="npu"))
print([e["op"] for e in emulator.numerics_report()])
"""
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-W", "error", "-c", code], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "['convolution_overrideable']" and proc.stderr == ""


def test_env_var_starts_chip_mode_and_checks_the_soc():
    code = """
import torch, torch_npu, torch.nn.functional as F
from torch_npu import emulator
torch.manual_seed(0)
x, w = torch.randn(1, 2, 5, 5), torch.randn(3, 2, 3, 3)
got = F.conv2d(x.npu(), w.npu()).cpu()
emit({"mode": emulator.get_numerics(), "differs": not torch.equal(got, F.conv2d(x, w)),
      "ops": [e["op"] for e in emulator.numerics_report()]})
"""
    r = run_json(code, env={"TORCH_NPU_EMU_NUMERICS": "chip"})
    assert r == {"mode": "chip", "differs": True, "ops": ["convolution_overrideable"]}
    r = run_json("from torch_npu import emulator\nemit(catch(lambda: emulator.set_numerics('chip')))",
                 env={"TORCH_NPU_EMU_DEVICE_NAME": "Ascend910A"})
    assert r[0] == "ValueError" and "Ascend910A" in r[1] and "Ascend910B" in r[1]


def test_numerics_drift_example_smoke(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", MPLBACKEND="Agg")
    proc = subprocess.run([sys.executable, str(REPO / "examples" / "numerics_drift.py"), "--size", "tiny",
                           "--steps", "3", "--out-dir", str(tmp_path)],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    png = (tmp_path / "numerics_drift.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    import json
    data = json.loads((tmp_path / "numerics_drift.json").read_text())
    assert len(data["exact"]) == len(data["chip"]) == 3
    assert data["exact"] != data["chip"]                    # matmul HF32 on: the curves part
    assert {e["op"] for e in data["numerics_report"]} >= {"mm"}


def test_chip_kernels_appear_in_the_device_timeline(chip):
    x = torch.randn(8, 8, device="npu")
    w = torch.randn(2, 1, 3, 3, device="npu")
    C = torch_npu._C
    C._npu_timeline_drain()
    C._npu_timeline_enable(True)
    try:
        torch.mm(x, x)
        F.conv2d(x.view(1, 1, 8, 8), w)
    finally:
        C._npu_timeline_enable(False)
    names = [e[0] for e in C._npu_timeline_drain()]
    assert names.count("aten::mm") == 1 and names.count("aten::convolution_overrideable") == 1
