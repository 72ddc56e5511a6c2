"""The emulated torch_npu CPU fallback.

Ops with a CPU kernel but no NPU kernel in the real torch_npu 2.13.0 (e.g.
``aten::fmax.out``) warn once per op on stderr with torch_npu's exact text,
really copy their arguments to the host and results back, and raise the real
error under TORCH_NPU_FALLBACK_CPU_DISABLE=1. Native ops do none of that.
"""
import json
import os
import re
import subprocess
import sys
import time

import pytest
import torch

import torch_npu

CAUTION = ("CAUTION: The operator 'aten::fmax.out' is not currently supported on the NPU backend and will "
           "fall back to run on the CPU. This may have performance implications.")


def _run(code, **env):
    e = dict(os.environ)
    e.pop("TORCH_NPU_FALLBACK_CPU_DISABLE", None)
    e.update(env)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=e, timeout=120)
    return p


def test_warns_once_per_op_on_stderr_with_the_real_text():
    code = """
import json, torch, torch_npu
a = torch.tensor([1., 5., float('nan')]); b = torch.tensor([3., 2., 4.])
out = torch.empty(3, device='npu')
for _ in range(3):
    r = torch.fmax(a.npu(), b.npu(), out=out)
x = torch.randn(4).npu() + 1   # native: no warning
print(json.dumps({"same": r is out, "vals": out.cpu().tolist(), "ref": torch.fmax(a, b).tolist()}))
"""
    p = _run(code)
    assert p.returncode == 0, p.stderr
    res = json.loads(p.stdout.strip().splitlines()[-1])
    assert res["same"] is True
    assert res["vals"] == res["ref"]
    lines = [ln for ln in p.stderr.splitlines() if "CAUTION" in ln]
    assert len(lines) == 1, p.stderr  # once per op, not once per call
    assert CAUTION in lines[0]
    # rendered like a c10 warning line (the pid field depends on the torch build), not a Python warning
    assert re.match(r"\[W\d{4} [\d:.]+( \d+)? VariableFallbackKernel\.cpp:\d+\] Warning: CAUTION", lines[0]), lines[0]
    assert lines[0].endswith("(function npu_cpu_fallback)")
    assert "UserWarning" not in p.stderr


def test_disabled_fallback_raises_the_real_error():
    code = """
import torch, torch_npu
a = torch.randn(3).npu()
try:
    torch.fmax(a, a, out=torch.empty(3, device='npu'))
    print("NO ERROR")
except RuntimeError as e:
    print(str(e))
"""
    p = _run(code, TORCH_NPU_FALLBACK_CPU_DISABLE="1")
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith(
        "The operator 'aten::fmax.out' would execute its main computation on CPU through dispatcher backend "
        "fallback because no kernel is registered for the NPU PrivateUse1 backend, but CPU fallback is disabled "
        "by TORCH_NPU_FALLBACK_CPU_DISABLE=1."), p.stdout
    assert "ERR01007 OPS feature not supported" in p.stdout
    assert "CAUTION" not in p.stderr


def test_report_counts_calls_and_bytes_copied():
    torch_npu.emulator.reset_fallback_report()
    a = torch.randn(10).npu()
    b = torch.randn(10).npu()
    out = torch.empty(10, device="npu")
    t0 = time.perf_counter_ns()
    torch.fmax(a, b, out=out)
    torch.fmax(a, b, out=out)
    elapsed = time.perf_counter_ns() - t0
    torch.add(a, b)  # native
    rep = {e["op"]: e for e in torch_npu.emulator.fallback_report()}
    assert set(rep) == {"aten::fmax.out"}
    e = rep["aten::fmax.out"]
    assert e["calls"] == 2
    # per call: self, other and out go to the host (3 x 40 bytes); out comes back (40 bytes)
    assert e["bytes_to_cpu"] == 2 * 3 * 40
    assert e["bytes_to_npu"] == 2 * 40
    assert 0 < e["ns"] <= elapsed  # time inside the two fallbacks
    torch_npu.emulator.reset_fallback_report()
    assert torch_npu.emulator.fallback_report() == []


def test_fallback_results_equal_cpu_and_stay_on_npu():
    x = torch.rand(6, 5) + 0.1
    cases = [
        (lambda t: torch.special.i0e(t, out=torch.empty_like(t)), "aten::special_i0e.out"),
        (lambda t: torch.hypot(t, t * 2, out=torch.empty_like(t)), "aten::hypot.out"),
        (lambda t: torch.linalg.matrix_exp(t[:5, :5]), "aten::linalg_matrix_exp"),
        (lambda t: torch.mode(t, 1)[0], "aten::mode"),
    ]
    torch_npu.emulator.reset_fallback_report()
    for fn, op in cases:
        ref = fn(x)
        got = fn(x.npu())
        assert got.device.type == "npu"
        torch.testing.assert_close(got.cpu(), ref, rtol=0, atol=0)
    ops = {e["op"] for e in torch_npu.emulator.fallback_report()}
    assert ops == {op for _, op in cases}


def test_out_argument_keeps_cpu_geometry():
    # linalg_lstsq.out restrides its outputs (column-major) on CPU: the npu out must match
    a = torch.randn(5, 3)
    b = torch.randn(5, 2)
    ref = torch.linalg.lstsq(a, b, driver="gelsd").solution
    got = torch.linalg.lstsq(a.npu(), b.npu()).solution
    assert got.stride() == torch.linalg.lstsq(a, b).solution.stride()
    torch.testing.assert_close(got.cpu(), ref, rtol=1e-4, atol=1e-5)


def test_random_fallback_op_draws_from_the_npu_generator():
    rates = torch.full((1000,), 3.0)
    torch.npu.manual_seed(7)
    a = torch.poisson(rates.npu())
    torch.manual_seed(123)  # the CPU generator must not matter
    torch.npu.manual_seed(7)
    b = torch.poisson(rates.npu())
    assert a.device.type == "npu"
    assert torch.equal(a.cpu(), b.cpu())
    torch.npu.manual_seed(8)
    assert not torch.equal(torch.poisson(rates.npu()).cpu(), a.cpu())
    assert abs(a.float().mean().item() - 3.0) < 0.3


def test_registration_covers_the_real_fallback_set():
    reg = torch_npu.emulator.kernel_registration()
    # 225 overloads fall back on real torch_npu 2.13; a few are emulated natively
    # here (efficient zero tensors, the CPU flash-attention kernels behind SDPA).
    assert 210 <= reg["emulated_fallback"] <= 225
    # explicit zero-copy kernels: boxed, and unboxed for the hottest ops (aten/UnboxedKernels.cpp)
    assert reg["unboxed"] >= 100
    assert reg["zero_copy_explicit"] + reg["unboxed"] > 400


def test_native_ops_do_not_fall_back():
    torch_npu.emulator.reset_fallback_report()
    m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.LayerNorm(8), torch.nn.GELU()).npu()
    q = torch.randn(2, 2, 4, 8).npu()
    loss = m(torch.randn(4, 8).npu()).sum() + torch.nn.functional.scaled_dot_product_attention(q, q, q).sum()
    loss.backward()
    assert torch_npu.emulator.fallback_report() == []


def test_fallback_ops_check_devices_and_generators_like_native_ones():
    a = torch.randn(4).npu()
    with pytest.raises(RuntimeError, match=re.escape(
            "Expected all tensors to be on the same device, but found at least two devices, npu:0 and cpu! "
            "(when checking argument for argument other in method wrapper_NPU__fmax_out)")):
        torch.fmax(a, torch.randn(4), out=torch.empty(4, device="npu"))
    with pytest.raises(RuntimeError, match="Expected a 'npu' device type for generator but found 'cpu'"):
        torch.poisson(torch.full((4,), 2.0).npu(), generator=torch.Generator())
