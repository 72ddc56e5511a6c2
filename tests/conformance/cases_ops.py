"""OpInfo test templates of the conformance suite: PyTorch's device-generic op
properties (the kinds of ``TestCommon`` / ``TestMathBits``), instantiated with
``instantiate_device_type_tests`` over the installed wheel's ``op_db`` for
the npu (PrivateUse1) and the CPU. Not collected by pytest directly: the
driver ``test_conformance.py`` runs them in crash-isolated workers.

Each test takes samples made on the CPU (``op.sample_inputs("cpu", dtype)``),
runs them on its device and compares with the CPU result of the same sample.
"""
import torch
from torch.testing._internal.common_device_type import OpDTypes, instantiate_device_type_tests, ops
from torch.testing._internal.common_dtype import all_types_and_complex_and
from torch.testing._internal.common_methods_invocations import op_db
from torch.testing._internal.common_utils import TestCase
from torch.utils import _pytree as pytree

import common
from common import Mismatch, assert_same, first_samples, run, same_outcome

_out_ops = [op for op in op_db if op.supports_out]
# Ops whose out= is filled in Python with copy_ (torch/functional.py): no device
# check on any accelerator, CUDA included, so a CPU out= is accepted there too.
_OUT_COPIED_IN_PYTHON = {"lu"}
_ALL_DTYPES = all_types_and_complex_and(torch.half, torch.bfloat16, torch.bool)


def move(tree, device, op=None):
    """``common.move``; args the OpInfo requires on the CPU on every device stay there."""
    return common.move(tree, device, keep_args_on_cpu=op is not None and
                       op.full_name in common.sweep.opinfo_exclusions.CPU_ARGUMENTS)


def _call(op_fn, tree, **extra):
    inp, args, kwargs = tree
    return op_fn(inp, *args, **kwargs, **extra)


def _out_like(result, make):
    """The out= argument for ``result`` (a tensor or a tuple of tensors), built by ``make``."""
    if isinstance(result, torch.Tensor):
        return make(result)
    return tuple(make(t) for t in result)


def _is_tensor_result(r):
    return isinstance(r, torch.Tensor) or (isinstance(r, (tuple, list)) and r and
                                           all(isinstance(t, torch.Tensor) for t in r))


def _strided(t):
    """An uninitialised tensor like ``t`` whose last dim has stride 2 (a non-contiguous out=)."""
    if t.dim() == 0:
        return torch.empty_like(t)
    shape = list(t.shape)
    shape[-1] *= 2
    return torch.empty(shape, dtype=t.dtype, device=t.device)[..., ::2]


def _geometry(out):
    return [(t.shape, t.stride(), t.dtype) for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]


def _wrong_dtype(t):
    return torch.int64 if t.dtype.is_floating_point or t.dtype.is_complex else torch.float32


class TestOpConformance(TestCase):
    """npu vs CPU over op_db: out=, variants, noncontiguous samples, errors, meta, dtypes, math bits."""

    exact_dtype = True

    def _samples(self, op, dtype, **kw):
        torch.manual_seed(0)
        return first_samples(op.sample_inputs("cpu", dtype, **kw))

    def _expected(self, op, sample):
        """(cpu tree, cpu result) or skip when the sample does not run on CPU."""
        tree = common.sweep.sample_tree(sample)
        r, e, _ = run(_call, op, tree)
        return tree, r, e

    @ops(_out_ops, dtypes=OpDTypes.any_one)
    def test_out(self, device, dtype, op):
        """out=: result and returned object, non-contiguous out keeps its strides, empty out is
        resized, a wrong-dtype out behaves as on CPU, and a CPU out next to device inputs raises."""
        checked = 0
        for sample in self._samples(op, dtype):
            tree, expected, e = self._expected(op, sample)
            if e is not None or not _is_tensor_result(expected):
                continue
            cases = {"matching": lambda t: torch.empty_like(t), "strided": _strided,
                     "empty": lambda t: t.new_empty((0,))}
            accepted = False
            for case, make in cases.items():
                cpu_out = _out_like(expected, make)
                dev_tree, _ = move(tree, device, op)
                dev_out = _out_like(expected, lambda t: make(t.to(device)))
                geo = _geometry(dev_out)
                cr, ce, _ = run(_call, op, tree, out=cpu_out)
                dr, de, _ = run(_call, op, dev_tree, out=dev_out)
                if not same_outcome((dr, de), (cr, ce), device, f"out= ({case})"):
                    continue
                accepted = accepted or case == "matching"
                assert_same(dev_out, cpu_out, device, f"out= ({case}) tensor")
                if isinstance(dr, torch.Tensor):
                    self.assertTrue(dr is dev_out, f"out= ({case}): the op did not return its out tensor")
                if case == "strided" and _geometry(cpu_out) == [(s, st, d) for s, st, d in geo]:
                    self.assertEqual(_geometry(dev_out), geo, msg="out= (strided): strides of out changed")
            # A wrong-dtype out: raises exactly where the CPU raises (else same values).
            cpu_out = _out_like(expected, lambda t: torch.empty_like(t, dtype=_wrong_dtype(t)))
            dev_tree, _ = move(tree, device, op)
            dev_out = _out_like(expected, lambda t: torch.empty_like(t, dtype=_wrong_dtype(t), device=device))
            same_outcome(run(_call, op, dev_tree, out=dev_out)[:2], run(_call, op, tree, out=cpu_out)[:2],
                         device, "out= (wrong dtype)")
            # A CPU out next to device inputs (0-dim ones included) raises, as on CUDA.
            if accepted and common.device_type(device) != "cpu" and common.tensors(dev_tree) \
                    and op.full_name not in _OUT_COPIED_IN_PYTHON:
                r, e, _ = run(_call, op, dev_tree, out=_out_like(expected, torch.empty_like))
                if e is None:
                    raise Mismatch(f"out= on the CPU next to {device} inputs did not raise")
                self.assertIsInstance(e, RuntimeError)
            checked += 1
        if not checked:
            self.skipTest("no sample gives a tensor result on the CPU")

    @ops(_out_ops, dtypes=OpDTypes.any_one)
    def test_out_warning(self, device, dtype, op):
        """Resizing a non-empty out= of the wrong shape warns exactly as on CPU."""
        checked = 0
        for sample in self._samples(op, dtype):
            tree, expected, e = self._expected(op, sample)
            if e is not None or not _is_tensor_result(expected):
                continue
            make = lambda t, dev: torch.zeros((t.numel() + 2,), dtype=t.dtype, device=dev)  # noqa: E731
            dev_tree, _ = move(tree, device, op)
            cr, ce, cw = run(_call, op, tree, out=_out_like(expected, lambda t: make(t, "cpu")))
            dr, de, dw = run(_call, op, dev_tree, out=_out_like(expected, lambda t: make(t, device)))
            same_outcome((dr, de), (cr, ce), device, "out= (wrong shape)")
            self.assertEqual(dw, cw, msg="resize warnings differ from the CPU's")
            checked += 1
        if not checked:
            self.skipTest("no sample gives a tensor result on the CPU")

    @ops(op_db, dtypes=OpDTypes.any_one)
    def test_variant_consistency(self, device, dtype, op):
        """Function, method, in-place and alias variants agree with the CPU (and each other, as on CPU)."""
        variants = {"function": op.op, "method": op.method_variant, "inplace": op.inplace_variant}
        for a in op.aliases:
            variants.update({f"alias {a.name}": a.op, f"alias {a.name} method": a.method_variant,
                             f"alias {a.name} inplace": a.inplace_variant})
        variants = {k: v for k, v in variants.items() if v is not None}
        checked = 0
        for sample in self._samples(op, dtype):
            tree, expected, e = self._expected(op, sample)
            for name, fn in variants.items():
                if "inplace" in name and not isinstance(tree[0], torch.Tensor):
                    continue
                cpu_tree, _ = move(tree, "cpu", op)
                dev_tree, _ = move(tree, device, op)
                c = run(_call, fn, cpu_tree)[:2]
                d = run(_call, fn, dev_tree)[:2]
                if same_outcome(d, c, device, name):
                    # (Args the OpInfo keeps on the CPU are compared through the outputs only.)
                    pick = (lambda t: t[0]) if op.full_name in common.sweep.opinfo_exclusions.CPU_ARGUMENTS \
                        else (lambda t: t)
                    assert_same(common.tensors(pick(dev_tree)), common.tensors(pick(cpu_tree)), device,
                                f"{name}: input tensors after the call")
                checked += 1
        if not checked:
            self.skipTest("no variant/sample to compare")

    @ops(op_db, allowed_dtypes=(torch.float32, torch.long, torch.complex64))
    def test_noncontiguous_samples(self, device, dtype, op):
        """A sample's non-contiguous version gives the same result as on CPU (and as the contiguous one)."""
        for sample in self._samples(op, dtype):
            nc = sample.noncontiguous()
            tree = common.sweep.sample_tree(nc)
            dev_tree, _ = move(tree, device, op)
            c = run(_call, op, tree)[:2]
            d = run(_call, op, dev_tree)[:2]
            same_outcome(d, c, device, "non-contiguous sample")

    @ops(op_db, allowed_dtypes=(torch.cfloat,))
    def test_conj_view(self, device, dtype, op):
        """Inputs carrying the conj bit give the results of their physical copies, as on CPU."""
        self._math_view(device, dtype, op, lambda t: torch.conj(t.conj_physical()), "conj")

    @ops(op_db, allowed_dtypes=(torch.float32, torch.cfloat))
    def test_neg_view(self, device, dtype, op):
        """Inputs carrying the neg bit give the results of their physical copies, as on CPU."""
        self._math_view(device, dtype, op, lambda t: torch._neg_view(torch.neg(t)), "neg")

    def _math_view(self, device, dtype, op, view, what):
        checked = 0
        for sample in self._samples(op, dtype):
            inp = sample.input
            if not isinstance(inp, torch.Tensor) or inp.dtype != dtype:
                continue
            tree = common.sweep.sample_tree(sample)
            physical = run(_call, op, tree)[:2]
            dev_rest = move((None,) + tuple(tree[1:]), device, op)[0][1:]
            dev_view = view(inp.detach().to(device, copy=True))
            self.assertTrue(getattr(dev_view, f"is_{what}")(), f"the input does not carry the {what} bit")
            # The view must give what the physical input gives on the CPU.
            same_outcome(run(_call, op, (dev_view,) + tuple(dev_rest))[:2], physical, device, f"{what} view input")
            checked += 1
        if not checked:
            self.skipTest(f"no sample with a {dtype} tensor input")

    @ops([op for op in op_db if op.error_inputs_func is not None], dtypes=OpDTypes.none)
    def test_errors(self, device, op):
        """error_inputs raise the declared exception type and message on the device, as on CPU."""
        torch.manual_seed(0)
        checked = 0
        for ei in op.error_inputs("cpu"):
            tree = common.sweep.sample_tree(ei.sample_input)
            dev_tree, _ = move(tree, device, op)
            cpu = run(_call, op, tree)[1]
            if cpu is None or not isinstance(cpu, ei.error_type):
                continue  # the declared error is not the CPU's: not a device property
            with self.assertRaisesRegex(ei.error_type, ei.error_regex):
                _call(op, dev_tree)
            checked += 1
        if not checked:
            self.skipTest("no error input raises its declared error on the CPU")

    @ops(op_db, dtypes=OpDTypes.any_one)
    def test_meta(self, device, dtype, op):
        """The meta kernel's shapes and dtypes agree with the device's results."""
        checked = 0
        for sample in self._samples(op, dtype):
            tree = common.sweep.sample_tree(sample)
            d, de, _ = run(_call, op, move(tree, device, op)[0])
            m, me, _ = run(_call, op, move(tree, "meta", op)[0])
            if de is not None or me is not None:
                continue
            dl = [(t.shape, t.dtype) for t in common.tensors(d)]
            ml = [(t.shape, t.dtype) for t in common.tensors(m)]
            self.assertEqual(dl, ml, msg="device and meta results differ in shape/dtype")
            checked += 1
        if not checked:
            self.skipTest("no sample runs on both the device and meta")

    @ops(op_db, dtypes=OpDTypes.none)
    def test_dtypes(self, device, op):
        """For every dtype, the op runs on the device exactly where it runs on CPU (same error type)."""
        for dtype in _ALL_DTYPES:
            try:
                samples = self._samples(op, dtype)[:1]
            except Exception:  # noqa: BLE001  (no sample generator for this dtype)
                continue
            for sample in samples:
                tree = common.sweep.sample_tree(sample)
                c = run(_call, op, tree)
                d = run(_call, op, move(tree, device, op)[0])
                if (c[1] is None) != (d[1] is None) or (c[1] is not None and type(c[1]) is not type(d[1])):
                    raise Mismatch(f"{dtype}: cpu {common._exc(c[1])} / {device} {common._exc(d[1])}")


# The test kinds (generic names), read by worker.py to name each instantiated test's kind.
TestOpConformance.generic_kinds = tuple(n for n in vars(TestOpConformance) if n.startswith("test_"))

instantiate_device_type_tests(TestOpConformance, globals(), only_for=("cpu", "npu"))
