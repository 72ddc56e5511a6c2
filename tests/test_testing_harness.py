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


# ---------------------------------------------------------------- assertEqual call forms of the real harness
# (Ascend/pytorch torch_npu/testing/testcase.py: a string in prec's place is the
# message; prec is an absolute tolerance defaulting to TestCase.precision, 1e-5;
# infinities fail unless allow_inf; exact_dtype defaults to the class attribute.)
_T = torch.tensor
_NAN, _INF = float("nan"), float("inf")
_EQUAL_FORMS = [
    # (id, call, expected outcome, text the failure must contain)
    ("positional_msg_pass", lambda t: t.assertEqual(_T([1.0]), _T([1.0]), "pos-msg"), "pass", None),
    ("positional_msg_fail", lambda t: t.assertEqual(_T([1.0]), _T([2.0]), "pos-msg"), "fail", "pos-msg"),
    ("positional_msg_numbers", lambda t: t.assertEqual(1, 2, "numbers-msg"), "fail", "numbers-msg"),
    ("positional_msg_strings", lambda t: t.assertEqual("a", "b", "str-msg"), "fail", "str-msg"),
    ("positional_msg_lists", lambda t: t.assertEqual([1, 2], [1, 3], "list-msg"), "fail", "list-msg"),
    ("positional_prec_pass", lambda t: t.assertEqual(_T([1.0]), _T([1.05]), 0.1), "pass", None),
    ("positional_prec_fail", lambda t: t.assertEqual(_T([1.0]), _T([1.2]), 0.1), "fail", None),
    ("keyword_prec_and_message", lambda t: t.assertEqual(1.0, 1.2, prec=0.1, message="kw-msg"), "fail", "kw-msg"),
    ("prec_then_message", lambda t: t.assertEqual(_T([0.0]), _T([1.0]), 0.5, "both-msg"), "fail", "both-msg"),
    ("msg_keyword", lambda t: t.assertEqual(_T([0.0]), _T([1.0]), msg="msg-kw"), "fail", "msg-kw"),
    ("default_precision_is_1e-5_pass", lambda t: t.assertEqual(1.0, 1.0 + 5e-6), "pass", None),
    ("default_precision_is_1e-5_fail", lambda t: t.assertEqual(1.0, 1.0 + 5e-5), "fail", None),
    ("atol_rtol_pass", lambda t: t.assertEqual(_T([100.0]), _T([101.0]), atol=0, rtol=0.02), "pass", None),
    ("atol_rtol_fail", lambda t: t.assertEqual(_T([100.0]), _T([103.0]), atol=0, rtol=0.02, msg="rt"),
     "fail", "rt"),
    ("npu_vs_cpu_tensor", lambda t: t.assertEqual(_T([1.0, 2.0]).npu(), _T([1.0, 2.0])), "pass", None),
    ("tensor_vs_number", lambda t: t.assertEqual(_T(3.0).npu(), 3), "pass", None),
    ("dtype_ignored_by_default", lambda t: t.assertEqual(_T([1, 2]), _T([1.0, 2.0])), "pass", None),
    ("exact_dtype", lambda t: t.assertEqual(_T([1, 2]), _T([1.0, 2.0]), exact_dtype=True), "fail", None),
    ("shape_mismatch", lambda t: t.assertEqual(_T([1.0]), _T([1.0, 1.0]), "shape-msg"), "fail", "shape-msg"),
    ("nan_same_places", lambda t: t.assertEqual(_T([_NAN, 1.0]), _T([_NAN, 1.0])), "pass", None),
    ("nan_other_places", lambda t: t.assertEqual(_T([_NAN, 1.0]), _T([1.0, _NAN]), "nan-msg"), "fail", "nan-msg"),
    ("inf_number_needs_allow_inf", lambda t: t.assertEqual(_INF, _INF), "fail", "Expected finite"),
    ("inf_number_allow_inf", lambda t: t.assertEqual(_INF, _INF, allow_inf=True), "pass", None),
    ("inf_tensor_allow_inf", lambda t: t.assertEqual(_T([_INF, 1.0]), _T([_INF, 1.0]), allow_inf=True),
     "pass", None),
    ("inf_tensor_sign", lambda t: t.assertEqual(_T([_INF]), _T([-_INF]), allow_inf=True), "fail", None),
    ("bool_tensors", lambda t: t.assertEqual(_T([True, False]), _T([True, True]), "bool-msg"), "fail", "bool-msg"),
    ("int8_no_wraparound", lambda t: t.assertEqual(_T([-128], dtype=torch.int8), _T([127], dtype=torch.int8)),
     "fail", None),
    ("dicts", lambda t: t.assertEqual({"a": _T([1.0]), "b": 2}, {"b": 2, "a": _T([1.0])}), "pass", None),
    ("dict_values", lambda t: t.assertEqual({"a": 1}, {"a": 2}, "dict-msg"), "fail", "dict-msg"),
    ("sets", lambda t: t.assertEqual({1, 2}, {1, 2}), "pass", None),
    ("numpy_bool", lambda t: t.assertEqual(np.bool_(True), _T(True)), "pass", None),
    ("nested_sequences", lambda t: t.assertEqual((_T([1.0]), [2, 3]), [_T([1.0]), (2, 3)]), "pass", None),
    ("not_equal_positional_msg", lambda t: t.assertNotEqual(_T([1.0]), _T([1.0]), "ne-msg"), "fail", "ne-msg"),
    ("not_equal_pass", lambda t: t.assertNotEqual(_T([1.0]), _T([2.0]), "ne-msg"), "pass", None),
    ("almost_equal_places", lambda t: t.assertAlmostEqual(1.0, 1.004, places=2), "pass", None),
    ("almost_equal_places_fail", lambda t: t.assertAlmostEqual(1.0, 1.2, places=2, msg="ae"), "fail", "ae"),
    ("almost_equal_delta", lambda t: t.assertAlmostEqual(1.0, 1.3, delta=0.5), "pass", None),
]


@pytest.mark.parametrize("call,expected,text", [f[1:] for f in _EQUAL_FORMS], ids=[f[0] for f in _EQUAL_FORMS])
def test_assert_equal_call_forms(call, expected, text):
    class Forms(TestCase):
        def test_it(self):
            call(self)
    outcome, result = _outcome(Forms, "test_it")
    assert not result.errors, result.errors  # a form the harness rejects is an error, not a failure
    assert outcome == expected, result.failures
    if text is not None:
        assert text in result.failures[0][1], result.failures[0][1]


def test_precision_property_and_class_defaults():
    class Loose(TestCase):
        exact_dtype = True

        def test_it(self):
            assert self.precision == 1e-5 and self.maxDiff is None
            self.precision = 0.5
            self.assertEqual(1.0, 1.4)                  # within the new default
            with self.assertRaises(AssertionError):
                self.assertEqual(_T([1]), _T([1.0]))    # exact_dtype from the class attribute
    outcome, result = _outcome(Loose, "test_it")
    assert outcome == "pass", result.failures + result.errors
