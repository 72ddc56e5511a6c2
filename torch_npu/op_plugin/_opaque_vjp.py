"""Autograd for ops registered with ``_registry.opaque``.

``non_differentiable(name)``: for an opaque op the real op gives no backward (index
selections, host geometry, int8/float8 matmuls): an Autograd kernel that runs the op below
autograd, so its outputs never require grad and a backward through them fails loudly ("does
not require grad") instead of PyTorch's autograd-not-implemented fallback (a warning, then
whatever gradients the kernel's host code happens to leave).

An opaque op has CPU / npu kernels and a fake kernel, no CompositeImplicitAutograd kernel,
so autograd no longer sees the ATen ops its kernel runs. ``recompute_autograd(name,
kernel)`` registers an Autograd kernel for ``npu::<name>``: the forward runs the op below
autograd (the opaque kernel, or the fake kernel while tracing) and saves its tensor
arguments; the backward runs ``kernel`` again on them with autograd enabled and returns
the vector-Jacobian product for every floating-point tensor argument, positional *or*
keyword-only (``torch.library.register_autograd`` refuses keyword-only tensors, which
several of these schemas have). So eager gradients are those of the kernel's own math,
as before the op became opaque; with ``create_graph`` the recomputation is recorded on the
saved inputs, so double backward works too. Under ``torch.compile`` the backward is traced on
FakeTensors: where the kernel reads tensor values on the host that trace fails loudly and
Dynamo falls back to running the frame eagerly (a graph break), never a wrong gradient.
"""
import torch
from torch.utils import _pytree

from torch_npu.op_plugin._registry import _library

__all__ = []


class _Call:
    """The non-tensor part of one call: pytree spec, leaves, where the tensors go."""

    def __init__(self, keyset, args, kwargs):
        self.keyset = keyset
        self.leaves, self.spec = _pytree.tree_flatten((args, kwargs))
        self.slots = [i for i, leaf in enumerate(self.leaves) if isinstance(leaf, torch.Tensor)]

    def tensors(self):
        return [self.leaves[i] for i in self.slots]

    def rebuild(self, tensors):
        leaves = list(self.leaves)
        for i, t in zip(self.slots, tensors):
            leaves[i] = t
        return _pytree.tree_unflatten(leaves, self.spec)


def _below_autograd(op, call, args, kwargs):
    with torch._C._AutoDispatchBelowAutograd():
        return op.redispatch(call.keyset & torch._C._after_autograd_keyset, *args, **kwargs)


def recompute_autograd(name, kernel):
    """Register the Autograd kernel of opaque ``npu::<name>`` (see the module docstring)."""
    base, _, overload = name.partition(".")
    op = getattr(getattr(torch.ops.npu, base), overload or "default")

    class Recompute(torch.autograd.Function):
        @staticmethod
        def forward(ctx, call, *tensors):
            args, kwargs = call.rebuild(tensors)
            ctx.call = call
            ctx.save_for_backward(*tensors)
            return _below_autograd(op, call, args, kwargs)

        @staticmethod
        def backward(ctx, *grads):
            saved = ctx.saved_tensors
            wants = ctx.needs_input_grad[1:]
            # create_graph (grad mode on here): recompute on the saved inputs themselves so the
            # gradient stays differentiable (double backward); otherwise on detached copies
            create = torch.is_grad_enabled()
            if create:
                inputs = list(saved)
                wanted = [i for i, (t, w) in enumerate(zip(saved, wants)) if w and t.requires_grad]
            else:
                inputs = [t.detach().requires_grad_(w and t.is_floating_point()) for t, w in zip(saved, wants)]
                wanted = [i for i, t in enumerate(inputs) if t.requires_grad]
            args, kwargs = ctx.call.rebuild(inputs)
            with torch.enable_grad():
                out = kernel(*args, **kwargs)
            outs = out if isinstance(out, (tuple, list)) else (out,)
            pairs = [(o, g) for o, g in zip(outs, grads)
                     if isinstance(o, torch.Tensor) and o.requires_grad and g is not None]
            result = [None] * len(inputs)
            if pairs and wanted:
                got = torch.autograd.grad([o for o, _ in pairs], [inputs[i] for i in wanted],
                                          [g for _, g in pairs], allow_unused=True, create_graph=create)
                for i, g in zip(wanted, got):
                    result[i] = g
            return (None, *result)

    Recompute.__name__ = "Recompute_" + name.replace(".", "_")

    def autograd_kernel(keyset, *args, **kwargs):
        call = _Call(keyset, args, kwargs)
        tensors = call.tensors()
        if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
            return Recompute.apply(call, *tensors)
        return _below_autograd(op, call, args, kwargs)

    _library().impl(name, autograd_kernel, "Autograd", with_keyset=True)
    return kernel


def non_differentiable(*names):
    """Autograd kernels without a backward for opaque ops (module docstring)."""
    for name in names:
        base, _, overload = name.partition(".")
        op = getattr(getattr(torch.ops.npu, base), overload or "default")

        def below_autograd(keyset, *args, _op=op, **kwargs):
            with torch._C._AutoDispatchBelowAutograd():
                return _op.redispatch(keyset & torch._C._after_autograd_keyset, *args, **kwargs)
        _library().impl(name, below_autograd, "Autograd", with_keyset=True)
