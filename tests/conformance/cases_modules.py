"""ModuleInfo test templates of the conformance suite: PyTorch's device-generic
module properties (the kinds of ``TestModule``), instantiated with
``instantiate_device_type_tests`` over the installed wheel's ``module_db`` for
the npu (PrivateUse1) and the CPU. Run by ``test_conformance.py``.

Every module is built on the CPU under a fixed seed and deep-copied to the
device, so both hold the same parameters; inputs are made on the CPU and
copied. Results, state and gradients are compared with the CPU's exactly.
"""
import copy
import inspect
import io

import torch
from torch.testing._internal.common_device_type import instantiate_device_type_tests
from torch.testing._internal.common_modules import module_db, modules
from torch.testing._internal.common_utils import TestCase, noncontiguous_like

import common
from common import Mismatch, assert_same, first_samples, move, run, same_outcome


def _module_inputs(module_info, dtype, training, requires_grad=False):
    torch.manual_seed(0)
    return [mi for mi in first_samples(module_info.module_inputs_func(
        module_info, device="cpu", dtype=dtype, requires_grad=requires_grad, training=training))
        if mi.forward_input is not None]


def _build(module_info, mi, training, **extra):
    torch.manual_seed(0)
    args, kwargs = mi.constructor_input.args, mi.constructor_input.kwargs
    m = module_info.module_cls(*args, **kwargs, **extra)
    m.train(training)
    return m


def _pair(module_info, mi, dtype, training, device):
    """(cpu module, device module with the same parameters). A lazy module is
    materialized on the CPU first (one forward on a copy of the input), so its
    parameters are the CPU's draws on both devices."""
    m = _build(module_info, mi, training).to(dtype)
    if module_info.is_lazy:
        with torch.no_grad():
            _forward(m, copy.deepcopy(_fwd_tree(mi)))
    return m, copy.deepcopy(m).to(device)


def _forward(m, fwd):
    args, kwargs = fwd
    torch.manual_seed(1)
    return m(*args, **kwargs)


def _fwd_tree(mi):
    return (tuple(mi.forward_input.args), dict(mi.forward_input.kwargs))


def _to(tree, device):
    moved, _ = move((None, list(tree[0]), tree[1]), device)
    return (tuple(moved[1]), moved[2])


class TestModuleConformance(TestCase):
    """npu vs CPU over module_db: forward, inplace, factory kwargs, repr, pickle, non-contiguous, grads."""

    def _each(self, module_info, dtype, training, requires_grad=False):
        inputs = _module_inputs(module_info, dtype, training, requires_grad)
        if not inputs:
            self.skipTest("no module inputs with a forward input")
        return inputs

    @modules(module_db)
    def test_forward(self, device, dtype, module_info, training):
        """Outputs and the module's state after forward (e.g. running stats) equal the CPU's."""
        for mi in self._each(module_info, dtype, training):
            cm, dm = _pair(module_info, mi, dtype, training, device)
            fwd = _fwd_tree(mi)
            if same_outcome(run(_forward, dm, _to(fwd, device))[:2], run(_forward, cm, fwd)[:2], device, "forward"):
                assert_same(dict(dm.state_dict()), dict(cm.state_dict()), device, "state after forward")

    @modules([m for m in module_db if "inplace" in inspect.signature(m.module_cls).parameters])
    def test_inplace(self, device, dtype, module_info, training):
        """inplace=True writes the out-of-place result into its input, as on CPU."""
        for mi in self._each(module_info, dtype, training):
            fwd = _fwd_tree(mi)
            if not fwd[0] or not isinstance(fwd[0][0], torch.Tensor):
                continue
            cm = _build(module_info, mi, training, inplace=True).to(dtype)
            dm = copy.deepcopy(cm).to(device)
            ref = _forward(_build(module_info, mi, training, inplace=False).to(dtype), fwd)
            cfwd, dfwd = _to(fwd, "cpu"), _to(fwd, device)
            if same_outcome(run(_forward, dm, dfwd)[:2], run(_forward, cm, cfwd)[:2], device, "inplace forward"):
                assert_same(dfwd[0][0], ref, device, "input after the in-place forward")

    @modules(module_db)
    def test_factory_kwargs(self, device, dtype, module_info, training):
        """device=/dtype= at construction put every parameter and float buffer there, as on CPU."""
        params = inspect.signature(module_info.module_cls).parameters
        if "device" not in params or "dtype" not in params:
            self.skipTest("the module takes no factory kwargs")
        for mi in self._each(module_info, dtype, training):
            c = run(_build, module_info, mi, training, device="cpu", dtype=dtype)
            d = run(_build, module_info, mi, training, device=device, dtype=dtype)
            if (c[1] is None) != (d[1] is None):
                raise Mismatch(f"construction: cpu {common._exc(c[1])} / {device} {common._exc(d[1])}")
            if c[1] is not None:
                continue
            cs, ds = c[0].state_dict(keep_vars=True), d[0].state_dict(keep_vars=True)
            self.assertEqual(list(ds), list(cs))
            for k, t in ds.items():
                want = cs[k]
                lazy = isinstance(t, torch.nn.parameter.UninitializedTensorMixin)
                self.assertEqual(lazy, isinstance(want, torch.nn.parameter.UninitializedTensorMixin), msg=k)
                if not lazy:  # an uninitialized (lazy) parameter has no shape yet
                    self.assertEqual(t.shape, want.shape, msg=k)
                self.assertEqual(t.dtype, want.dtype, msg=k)
                self.assertEqual(t.device.type, common.device_type(device), msg=k)

    @modules(module_db)
    def test_repr(self, device, dtype, module_info, training):
        """repr() of the module on the device is the CPU module's."""
        for mi in self._each(module_info, dtype, training):
            cm, dm = _pair(module_info, mi, dtype, training, device)
            self.assertEqual(repr(dm), repr(cm))

    @modules(module_db)
    def test_pickle(self, device, dtype, module_info, training):
        """torch.save / torch.load of the module and of its state_dict keep device, values and outputs."""
        for mi in self._each(module_info, dtype, training):
            cm, dm = _pair(module_info, mi, dtype, training, device)
            buf = io.BytesIO()
            torch.save(dm.state_dict(), buf)
            buf.seek(0)
            sd = torch.load(buf)
            assert_same(dict(sd), dict(cm.state_dict()), device, "loaded state_dict")
            fresh = copy.deepcopy(cm).to(device)
            fresh.load_state_dict(sd)
            buf = io.BytesIO()
            torch.save(dm, buf)
            buf.seek(0)
            whole = torch.load(buf, weights_only=False)
            fwd = _fwd_tree(mi)
            ref = run(_forward, cm, fwd)[:2]
            same_outcome(run(_forward, fresh, _to(fwd, device))[:2], ref, device, "forward after load_state_dict")
            same_outcome(run(_forward, whole, _to(fwd, device))[:2], ref, device, "forward of the loaded module")

    @modules(module_db)
    def test_non_contiguous_tensors(self, device, dtype, module_info, training):
        """Non-contiguous inputs give the CPU's outputs and gradients."""
        for mi in self._each(module_info, dtype, training, requires_grad=True):
            cm, dm = _pair(module_info, mi, dtype, training, device)
            fwd = _fwd_tree(mi)
            nc = ((tuple(noncontiguous_like(a.detach()).requires_grad_(a.requires_grad)
                         if isinstance(a, torch.Tensor) and a.numel() > 1 else a for a in fwd[0])), fwd[1])
            self._compare_grads(cm, dm, nc, device, "non-contiguous input")

    @modules(module_db)
    def test_grad(self, device, dtype, module_info, training):
        """Gradients of parameters and inputs equal the CPU's."""
        for mi in self._each(module_info, dtype, training, requires_grad=True):
            cm, dm = _pair(module_info, mi, dtype, training, device)
            self._compare_grads(cm, dm, _fwd_tree(mi), device, "grad")

    def _compare_grads(self, cm, dm, fwd, device, what):
        dfwd = _to(fwd, device)
        cfwd = _to(fwd, "cpu")
        c = run(_forward, cm, cfwd)[:2]
        d = run(_forward, dm, dfwd)[:2]
        if not same_outcome(d, c, device, f"{what}: forward"):
            return
        couts = common.sweep.grad_outputs(c[0])
        douts = common.sweep.grad_outputs(d[0])
        if not couts:
            return
        gen = torch.Generator().manual_seed(2)
        weights = [torch.randn(o.shape, dtype=common.sweep.weight_dtype(o), generator=gen) for o in couts]
        cin = [t for t in list(cm.parameters()) + common.tensors(cfwd) if t.requires_grad and t.is_leaf]
        din = [t for t in list(dm.parameters()) + common.tensors(dfwd) if t.requires_grad and t.is_leaf]
        cg = run(torch.autograd.grad, common.sweep.scalar_loss(couts, weights), cin, allow_unused=True)[:2]
        dg = run(torch.autograd.grad, common.sweep.scalar_loss(douts, [w.to(device) for w in weights]), din,
                 allow_unused=True)[:2]
        if cg[1] is None and dg[1] is None:
            cg = ([g for g in cg[0] if g is not None], None)
            dg = ([g for g in dg[0] if g is not None], None)
        same_outcome(dg, cg, device, f"{what}: gradients")


# The test kinds (generic names), read by worker.py to name each instantiated test's kind.
TestModuleConformance.generic_kinds = tuple(n for n in vars(TestModuleConformance) if n.startswith("test_"))

instantiate_device_type_tests(TestModuleConformance, globals(), only_for=("cpu", "npu"))
