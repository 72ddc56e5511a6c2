"""torch_npu.testing: a test file written for the real harness runs unchanged
(spec: SURFACE.md §8; assertRtolEqual criterion of the real testcase.py)."""
import subprocess
import sys
import textwrap
import unittest

import numpy as np
import pytest
import torch

import torch_npu
from torch_npu.testing.testcase import TestCase
from torch_npu.testing.common_utils import (SupportedDevices, SkipIfNotGteCANNVersion, create_common_tensor,
                                            create_dtype_tensor, freeze_rng_state, check_operators_in_prof)
from torch_npu.testing.common_distributed import skipIfUnsupportMultiNPU, TEST_SKIPS
from torch_npu.testing.decorator import Dtypes, Formats, instantiate_tests


def _outcome(case_cls, name):
    result = unittest.TestResult()
    case_cls(name).run(result)
    return ("skip" if result.skipped else "fail" if result.failures or result.errors else "pass"), result


class _Rtol(TestCase):
    __test__ = False  # run through _outcome, not collected by pytest
    def test_close(self):
        self.assertRtolEqual(torch.tensor([1.0, 2.0]), torch.tensor([1.00005, 2.0001]))

    def test_far(self):
        self.assertRtolEqual(torch.ones(100), torch.ones(100) * 1.01)

    def test_few_outliers_allowed_fp16(self):
        x = torch.ones(2000, dtype=torch.float16)
        y = x.clone()
        y[0] = 2.0          # 1 of 2000 off: within the prec16 fraction (2 elements)
        self.assertRtolEqual(x, y)

    def test_nan_positions(self):
        self.assertRtolEqual(torch.tensor([float("nan"), 1.0]), torch.tensor([1.0, float("nan")]))

    def test_npu_vs_cpu(self):
        cpu, npu = create_common_tensor([np.float32, 2, (4, 5)], -1, 1)
        self.assertRtolEqual((cpu * 2).numpy(), (npu * 2).cpu().numpy())
        self.assertEqual(npu.device.type, "npu")


@pytest.mark.parametrize("name,expected", [("test_close", "pass"), ("test_far", "fail"),
                                           ("test_few_outliers_allowed_fp16", "pass"),
                                           ("test_nan_positions", "fail"), ("test_npu_vs_cpu", "pass")])
def test_assert_rtol_equal(name, expected):
    assert _outcome(_Rtol, name)[0] == expected


def test_setup_seeds_every_test():
    draws = []

    class Seeded(TestCase):
        def test_a(self):
            draws.append((torch.rand(3), torch.rand(3, device="npu").cpu(), np.random.rand()))
    _outcome(Seeded, "test_a")
    _outcome(Seeded, "test_a")
    assert torch.equal(draws[0][0], draws[1][0]) and torch.equal(draws[0][1], draws[1][1])
    assert draws[0][2] == draws[1][2]


def test_gates_follow_the_emulated_device_and_cann():
    class Gated(TestCase):
        @SupportedDevices(["Ascend910B"])
        def test_910b(self):
            pass

        @SupportedDevices(["Ascend910A", "Ascend310P"])
        def test_other(self):
            pass

        @SkipIfNotGteCANNVersion("8.1.RC1")
        def test_cann_old_enough(self):
            pass

        @SkipIfNotGteCANNVersion("99.0.0")
        def test_cann_future(self):
            pass

        @skipIfUnsupportMultiNPU(2)
        def test_two_npus(self):
            pass

        @skipIfUnsupportMultiNPU(1000)
        def test_many_npus(self):
            pass
    assert torch.npu.get_device_name(0).startswith("Ascend910B")
    outcomes = {n: _outcome(Gated, n)[0] for n in ("test_910b", "test_other", "test_cann_old_enough",
                                                   "test_cann_future", "test_two_npus", "test_many_npus")}
    assert outcomes == {"test_910b": "pass", "test_other": "skip", "test_cann_old_enough": "pass",
                        "test_cann_future": "skip", "test_two_npus": "pass", "test_many_npus": "skip"}
    assert TEST_SKIPS["multi-npu"].exit_code == 75


def test_decorator_instantiates_dtypes_and_formats():
    seen = []

    @instantiate_tests
    class Param(TestCase):
        @Dtypes(torch.float, torch.half)
        @Formats(0, 2)
        def test_op(self, device, dtype, npu_format):
            cpu, npu = create_dtype_tensor((2, 3), dtype, npu_format, device=device)
            self.assertRtolEqual(cpu, npu.cpu())
            seen.append((device, dtype, npu_format))
    names = sorted(n for n in dir(Param) if n.startswith("test_op"))
    assert names == ["test_op_npu_float16_0", "test_op_npu_float16_2", "test_op_npu_float32_0",
                     "test_op_npu_float32_2"]
    for n in names:
        assert _outcome(Param, n)[0] == "pass"
    assert sorted(seen, key=str) == sorted([("npu", d, f) for d in (torch.float, torch.half) for f in (0, 2)], key=str)


def test_freeze_rng_state_and_profiler_check():
    torch.manual_seed(0)
    with freeze_rng_state():
        a = torch.rand(2, device="npu").cpu()
    b = torch.rand(2, device="npu").cpu()
    assert torch.equal(a, b)
    with torch.profiler.profile() as prof:
        torch.ones(3, device="npu").add(1)
    assert check_operators_in_prof(["aten::add"], prof)
    assert not check_operators_in_prof(["aten::add"], prof, unexpected_operators=["aten::ones"])
    assert not check_operators_in_prof(["aten::mm"], prof)


def test_real_style_test_file_runs_unchanged(tmp_path):
    # A test file as upstream writes them, including a PyTorch device-generic test.
    src = textwrap.dedent('''
        import torch
        import torch_npu
        from torch_npu.testing.testcase import TestCase, run_tests
        from torch_npu.testing.common_utils import create_common_tensor, SupportedDevices
        from torch.testing._internal.common_device_type import instantiate_device_type_tests, onlyCUDA
        import numpy as np

        class TestAdd(TestCase):
            @SupportedDevices(["Ascend910B"])
            def test_add(self):
                cpu, npu = create_common_tensor([np.float32, 0, (3, 4)], -1, 1)
                self.assertRtolEqual((cpu + cpu).numpy(), (npu + npu).cpu().numpy())

        class TestGeneric(TestCase):
            @onlyCUDA
            def test_on_accelerator(self, device):
                x = torch.ones(2, device=device)
                assert x.device.type == "npu", device

        instantiate_device_type_tests(TestGeneric, globals())

        if __name__ == "__main__":
            run_tests()
    ''')
    path = tmp_path / "test_upstream_style.py"
    path.write_text(src)
    proc = subprocess.run([sys.executable, str(path), "-v"], capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "test_add" in proc.stderr and "test_on_accelerator_npu" in proc.stderr
    assert "Ran 2 tests" in proc.stderr and "OK" in proc.stderr
