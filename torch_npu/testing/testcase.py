"""``TestCase`` and ``run_tests`` of torch_npu.testing.

``TestCase`` selects the test device once per class (``SET_NPU_DEVICE``,
default 0) and seeds Python, NumPy and torch (all devices) with ``SEED``
(default 666) before every test. ``assertRtolEqual`` compares like the real
harness: NumPy arrays/tensors, with a relative tolerance ``prec`` (``prec16``
for float16/bfloat16), counting elements whose relative error exceeds it.
``assertEqual`` compares tensors (any devices, moved to CPU), numbers and
sequences with an absolute tolerance ``prec``.
"""
import math
import os
import random
from collections import OrderedDict
from numbers import Number
import sys
import unittest
import warnings

import numpy as np
import torch

try:
    import expecttest
except ModuleNotFoundError as _e:
    if _e.name != "expecttest":
        raise
    raise ModuleNotFoundError("torch_npu.testing needs expecttest, which is not installed: pip install expecttest "
                              "(or install torch_npu with its [testing] extra)", name="expecttest") from None
from torch_npu import _settings

from torch_npu.testing.common_utils import is_iterable, set_npu_device

__all__ = ["TestCase", "run_tests"]

SEED = _settings.get("SEED")


def _to_numpy(x):
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu()
        if x.dtype == torch.bfloat16:
            x = x.float()
        return x.numpy()
    return np.asarray(x)


class TestCase(expecttest.TestCase):
    _precision = 1e-5
    maxDiff = None
    exact_dtype = False

    def __init__(self, method_name="runTest"):
        super().__init__(method_name)

    @classmethod
    def setUpClass(cls):
        set_npu_device()

    def setUp(self):
        random.seed(SEED)
        np.random.seed(SEED)
        torch.manual_seed(SEED)  # seeds the npu generators too
        super().setUp()

    # ------------------------------------------------------------------ rtol comparison
    def assertRtolEqual(self, x, y, prec=1.e-4, prec16=1.e-3, auto_trans_dtype=False, message=None):
        x_np, y_np = _to_numpy(x), _to_numpy(y)
        if auto_trans_dtype:
            x_np = x_np.astype(y_np.dtype)
        is_half = any(isinstance(t, torch.Tensor) and t.dtype in (torch.float16, torch.bfloat16) for t in (x, y)) \
            or x_np.dtype == np.float16
        tolerance = prec16 if is_half else prec
        if x_np.shape != y_np.shape:
            self.fail(f"shape mismatch: {x_np.shape} vs {y_np.shape}" + (f" ({message})" if message else ""))
        if x_np.dtype != y_np.dtype:
            self.fail(f"dtype mismatch: {x_np.dtype} vs {y_np.dtype}" + (f" ({message})" if message else ""))
        if x_np.dtype == np.bool_ or np.issubdtype(x_np.dtype, np.integer):
            bad = int(np.count_nonzero(x_np != y_np))
            if bad:
                self.fail(f"{bad} of {x_np.size} elements differ" + (f": {message}" if message else ""))
            return
        xf, yf = x_np.astype(np.float64), y_np.astype(np.float64)
        nan_x, nan_y = np.isnan(xf), np.isnan(yf)
        if not np.array_equal(nan_x, nan_y):
            self.fail(message or "NaNs are not in the same positions")
        diff = np.abs(np.where(nan_x, 0.0, yf - xf))
        diff = np.where(np.isinf(xf) & (xf == yf), 0.0, diff)
        tiny = 6e-8 if is_half else 1e-9  # keeps the relative error finite next to zero
        rel = diff / (np.maximum(np.abs(xf), np.abs(yf)) + tiny)
        # An element is close if its absolute *or* relative error is within the
        # tolerance; a fraction `tolerance` of the elements may be off on both.
        abs_bad = int(np.count_nonzero(~(diff <= tolerance)))
        rel_bad = int(np.count_nonzero(~(rel <= tolerance)))
        allowed = x_np.size * tolerance
        if abs_bad and rel_bad and abs_bad > allowed and rel_bad > allowed:
            self.fail(f"result error: {min(abs_bad, rel_bad)} of {x_np.size} elements differ by more than "
                      f"{tolerance}" + (f": {message}" if message else ""))

    # ------------------------------------------------------------------ general equality
    @property
    def precision(self):
        """The default absolute tolerance of ``assertEqual`` (``prec=None``)."""
        return self._precision

    @precision.setter
    def precision(self, prec):
        self._precision = prec

    def _equal_args(self, prec, message, msg, atol, rtol):
        # The real harness reads a string in prec's place as the message.
        if isinstance(prec, str) and not message:
            message, prec = prec, None
        if msg is not None and not message:
            message = msg
        if message is None:
            message = ""
        if atol is not None or rtol is not None:
            return (float(atol or 0.0), float(rtol or 0.0)), message
        if prec is None:
            prec = self.precision
        return (prec, 0.0), message

    def assertEqual(self, x, y, prec=None, message="", allow_inf=False, exact_dtype=None, *,
                    msg=None, atol=None, rtol=None):
        """Assert ``x`` equals ``y`` within an absolute tolerance, as the real harness does.

        Call forms: ``assertEqual(x, y)``, ``(x, y, prec)``, ``(x, y, "message")``
        (a string in prec's place is the message), ``prec=``, ``message=`` or
        ``msg=``, ``allow_inf=`` (infinities must then match in place and sign;
        otherwise an infinite number fails), ``exact_dtype=`` (default: the
        class attribute ``exact_dtype``), and torch-style ``atol=``/``rtol=``
        (close when ``|x - y| <= atol + rtol * |y|``; they replace ``prec``).
        Numbers (and one-element tensors against numbers), tensors on any
        devices, NumPy bools, strings, sets, dicts and iterables are compared
        recursively; NaNs must sit in the same places. A failure message
        contains ``message``.
        """
        tol, message = self._equal_args(prec, message, msg, atol, rtol)
        if exact_dtype is None:
            exact_dtype = self.exact_dtype
        self._compare(x, y, tol, message, bool(allow_inf), exact_dtype)

    def _compare(self, x, y, tol, message, allow_inf, exact_dtype):
        base = super().assertEqual
        msg = message or None
        if isinstance(x, Number) or isinstance(y, Number):
            self._compare_numbers(x, y, tol, message, allow_inf)
        elif isinstance(x, np.bool_) or isinstance(y, np.bool_):
            base(x.item() if isinstance(x, torch.Tensor) else x, y.item() if isinstance(y, torch.Tensor) else y, msg)
        elif isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
            self._compare_tensors(x, y, tol, message, allow_inf, exact_dtype)
        elif isinstance(x, (str, bytes)) and isinstance(y, (str, bytes)):
            base(x, y, msg)
        elif type(x) is set and type(y) is set:
            base(x, y, msg)
        elif isinstance(x, dict) and isinstance(y, dict):
            if isinstance(x, OrderedDict) and isinstance(y, OrderedDict):
                self._compare(list(x.items()), list(y.items()), tol, message, allow_inf, exact_dtype)
            else:
                base(set(x), set(y), msg)
                keys = list(x)
                self._compare([x[k] for k in keys], [y[k] for k in keys], tol, message, allow_inf, exact_dtype)
        elif is_iterable(x) and is_iterable(y):
            x, y = list(x), list(y)
            base(len(x), len(y), msg)
            for a, b in zip(x, y):
                self._compare(a, b, tol, message, allow_inf, exact_dtype)
        else:
            base(x, y, msg)

    def _compare_numbers(self, x, y, tol, message, allow_inf):
        if isinstance(x, torch.Tensor):
            x = x.item()
        if isinstance(y, torch.Tensor):
            y = y.item()
        msg = message or None
        if not (isinstance(x, Number) and isinstance(y, Number)):
            super().assertEqual(x, y, msg)
            return
        if abs(x) == math.inf or abs(y) == math.inf:
            if not allow_inf:
                self.fail(f"Expected finite numeric values - x={x}, y={y}" + (f" : {message}" if message else ""))
            super().assertEqual(x, y, msg)
            return
        atol, rtol = tol
        self.assertLessEqual(abs(x - y), atol + rtol * abs(y), msg)

    def _compare_tensors(self, x, y, tol, message, allow_inf, exact_dtype):
        msg = message or None
        super().assertEqual(x.is_sparse, y.is_sparse, msg)
        if x.is_sparse:
            x, y = x.coalesce(), y.coalesce()
            self._compare_tensors(x._indices(), y._indices(), tol, message, allow_inf, exact_dtype)
            self._compare_tensors(x._values(), y._values(), tol, message, allow_inf, exact_dtype)
            return
        super().assertEqual(x.is_quantized, y.is_quantized, msg)
        if x.is_quantized:
            super().assertEqual(x.qscheme(), y.qscheme(), msg)
            x, y = x.dequantize(), y.dequantize()
        super().assertEqual(tuple(x.shape), tuple(y.shape), msg)
        if exact_dtype:
            super().assertEqual(x.dtype, y.dtype, msg)
        if x.numel() == 0:
            return
        if (x.dtype == torch.bool) != (y.dtype == torch.bool):
            raise TypeError("Was expecting both tensors to be bool type.")
        xs, ys = x.detach().cpu(), y.detach().cpu()
        if x.dtype == torch.bool:
            xs, ys = xs.to(torch.int64), ys.to(torch.int64)
        # y is compared in x's dtype, as the real harness does; the difference
        # is taken in double precision so that narrow integers cannot wrap.
        ys = ys.to(xs.dtype)
        wide = torch.complex128 if xs.is_complex() else torch.float64
        xw, yw = xs.to(wide), ys.to(wide)
        diff = (xw - yw).abs()
        if xs.is_floating_point() or xs.is_complex():
            nan_x, nan_y = torch.isnan(xw), torch.isnan(yw)
            self.assertTrue(torch.equal(nan_x, nan_y), message or "NaNs are not in the same places")
            diff[nan_x] = 0
            if allow_inf:
                inf_x = torch.isinf(xw)
                self.assertTrue(torch.equal(inf_x, torch.isinf(yw)) and torch.equal(xw[inf_x], yw[inf_x]),
                                message or "infinities differ")
                diff[inf_x] = 0
        atol, rtol = tol
        if diff.is_complex():
            diff = diff.real
        scale = torch.nan_to_num(yw.abs().real, nan=0.0, posinf=0.0)
        excess = diff - (atol + rtol * scale)
        worst = excess.max().item()
        if not worst <= 0:
            self.fail(f"Tensors differ: max abs difference {diff.max().item()} exceeds the tolerance "
                      f"(atol {atol}, rtol {rtol})" + (f" : {message}" if message else ""))

    def assertNotEqual(self, x, y, prec=None, message="", *, msg=None, atol=None, rtol=None):
        """Assert ``x`` and ``y`` are not equal within the tolerance; same call forms as ``assertEqual``."""
        tol, message = self._equal_args(prec, message, msg, atol, rtol)
        try:
            self._compare(x, y, tol, "", True, False)
        except (AssertionError, TypeError):
            return
        self.fail(f"{x!r} == {y!r}" + (f" : {message}" if message else ""))

    def assertAlmostEqual(self, x, y, places=None, msg=None, delta=None, allow_inf=None):
        """``assertEqual`` with tolerance ``delta``, or ``10 ** -places`` when ``places`` is given."""
        prec = 10 ** (-places) if places else delta
        self.assertEqual(x, y, prec, msg or "", bool(allow_inf))

    def assertTensorsSlowEqual(self, x, y, prec=None, message=""):
        prec = self._precision if prec is None else prec
        diff = (x.detach().cpu().double() - y.detach().cpu().double()).abs().max().item() if x.numel() else 0.0
        self.assertLessEqual(diff, prec, message)

    def assertObjectIn(self, obj, iterable):
        if not any(obj is item for item in iterable):
            self.fail(f"{obj!r} not found (by identity)")

    def assertExpectedRaises(self, exc_type, call_fn, *args, **kwargs):
        with self.assertRaises(exc_type) as cm:
            call_fn(*args, **kwargs)
        return cm.exception

    def assertExpectedStripMangled(self, s, subname=None):
        import re
        self.assertExpected(re.sub(r"__torch__[^ ]+", "", s), subname)

    def assertNotWarn(self, call_fn, msg=""):
        with warnings.catch_warnings(record=True) as ws:
            warnings.simplefilter("always")
            call_fn()
        self.assertTrue(len(ws) == 0, msg or f"unexpected warnings: {[str(w.message) for w in ws]}")

    def assertWarns(self, call_fn, msg=""):
        with warnings.catch_warnings(record=True) as ws:
            warnings.simplefilter("always")
            call_fn()
        self.assertTrue(len(ws) > 0, msg or "no warning raised")

    def maybeWarnsRegex(self, category, regex=""):
        return self.assertWarnsRegex(category, regex)

    # ------------------------------------------------------------------ sparse helpers (CPU tensors)
    def genSparseTensor(self, size, sparse_dim, nnz, is_uncoalesced, device="cpu"):
        v_size = [nnz] + list(size[sparse_dim:])
        v = torch.randn(*v_size, device=device)
        i = torch.rand(sparse_dim, nnz, device=device)
        i.mul_(torch.tensor(size[:sparse_dim]).unsqueeze(1).to(i))
        i = i.to(torch.long)
        if is_uncoalesced:
            v = torch.cat([v, torch.randn_like(v)], 0)
            i = torch.cat([i, i], 1)
        x = torch.sparse_coo_tensor(i, v, torch.Size(size))
        if not is_uncoalesced:
            x = x.coalesce()
        return x, x._indices().clone(), x._values().clone()

    def safeCoalesce(self, t):
        return t.coalesce()

    def safeToDense(self, t):
        return t.coalesce().to_dense()

    def run(self, result=None):
        return super().run(result)


def run_tests():
    r"""Run the calling module's tests; with ``IN_CI=1`` and xmlrunner installed,
    write JUnit XML under ``TEST_REPORT_PATH`` (default ``test-reports``)."""
    argv = sys.argv
    if _settings.get("IN_CI"):
        try:
            import xmlrunner
        except ImportError:
            xmlrunner = None
        if xmlrunner is not None:
            out = _settings.get("TEST_REPORT_PATH")
            unittest.main(module="__main__", argv=argv, testRunner=xmlrunner.XMLTestRunner(output=out))
            return
    unittest.main(module="__main__", argv=argv)
