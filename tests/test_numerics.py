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


def test_rounding_rejects_what_it_cannot_round():
    with pytest.raises(RuntimeError, match="expects a float32 tensor"):
        torch_npu._C._emu_round_cube_input(torch.zeros(2, dtype=torch.float16), 0)
    with pytest.raises(RuntimeError, match="kind must be 0"):
        torch_npu._C._emu_round_cube_input(torch.zeros(2), 5)


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
    before = {op: torch._C._dispatch_dump(f"aten::{op}") for op in ("mm", "addmm", "convolution_overrideable")}
    emulator.set_numerics("chip")
    during = torch._C._dispatch_dump("aten::mm")
    emulator.set_numerics("exact")
    after = {op: torch._C._dispatch_dump(f"aten::{op}") for op in before}
    assert during != before["mm"]          # chip mode did install its kernel
    assert after == before
    torch.npu.conv.allow_hf32 = True
    x, w, b = _conv_inputs()
    assert _same_bits(F.conv2d(x.npu(), w.npu(), b.npu()), F.conv2d(x, w, b))


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
