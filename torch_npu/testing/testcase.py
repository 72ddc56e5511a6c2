"""``TestCase`` and ``run_tests`` of torch_npu.testing.

``TestCase`` selects the test device once per class (``SET_NPU_DEVICE``,
default 0) and seeds Python, NumPy and torch (all devices) with ``SEED``
(default 666) before every test. ``assertRtolEqual`` compares like the real
harness: NumPy arrays/tensors, with a relative tolerance ``prec`` (``prec16``
for float16/bfloat16), counting elements whose relative error exceeds it.
``assertEqual`` compares tensors (any devices, moved to CPU), numbers and
sequences with an absolute tolerance ``prec``.
"""
import os
import random
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

from torch_npu.testing.common_utils import set_npu_device

__all__ = ["TestCase", "run_tests"]

SEED = int(os.getenv("SEED", "666"))


def _to_numpy(x):
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu()
        if x.dtype == torch.bfloat16:
            x = x.float()
        return x.numpy()
    return np.asarray(x)


class TestCase(expecttest.TestCase):
    _precision = 1e-5

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
    def assertEqual(self, x, y, prec=None, message="", allow_inf=False, exact_dtype=None):
        prec = self._precision if prec is None else prec
        if isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor):
            xt = x if isinstance(x, torch.Tensor) else torch.as_tensor(x)
            yt = y if isinstance(y, torch.Tensor) else torch.as_tensor(y)
            if exact_dtype and xt.dtype != yt.dtype:
                self.fail(f"dtype mismatch: {xt.dtype} vs {yt.dtype} {message}")
            xt, yt = xt.detach().cpu(), yt.detach().cpu()
            if xt.numel() == 0 and yt.numel() == 0:
                return
            self.assertEqual(tuple(xt.shape), tuple(yt.shape), message=message)
            if xt.is_complex() or yt.is_complex() or xt.is_floating_point() or yt.is_floating_point():
                torch.testing.assert_close(xt.to(torch.promote_types(xt.dtype, yt.dtype)),
                                           yt.to(torch.promote_types(xt.dtype, yt.dtype)),
                                           atol=prec, rtol=0, equal_nan=True, msg=message or None)
            else:
                if not torch.equal(xt, yt.to(xt.dtype)):
                    self.fail(f"tensors differ {message}")
            return
        if isinstance(x, (list, tuple)) and isinstance(y, (list, tuple)):
            self.assertEqual(len(x), len(y), message=message)
            for a, b in zip(x, y):
                self.assertEqual(a, b, prec, message, allow_inf, exact_dtype)
            return
        if isinstance(x, (int, float)) and isinstance(y, (int, float)) and not isinstance(x, bool):
            if allow_inf and x == y:
                return
            if abs(x - y) > prec:
                self.fail(f"{x} != {y} within {prec} {message}")
            return
        super().assertEqual(x, y, message or None)

    def assertNotEqual(self, x, y, prec=None, message=""):
        try:
            self.assertEqual(x, y, prec, message)
        except AssertionError:
            return
        self.fail(f"{x} == {y} {message}")

    def assertAlmostEqual(self, x, y, places=None, msg=None, delta=None, allow_inf=None):
        prec = delta if delta is not None else (10 ** (-places) if places is not None else None)
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
    if os.getenv("IN_CI") == "1":
        try:
            import xmlrunner
        except ImportError:
            xmlrunner = None
        if xmlrunner is not None:
            out = os.getenv("TEST_REPORT_PATH", "test-reports")
            unittest.main(module="__main__", argv=argv, testRunner=xmlrunner.XMLTestRunner(output=out))
            return
    unittest.main(module="__main__", argv=argv)
