"""Inductor for the npu device ("compile as CPU", see ``compile_fx``).

Nothing here imports Inductor at ``import torch_npu``; it is loaded on the
first ``torch.compile`` that meets an npu tensor.
"""
import functools

import torch

__all__ = ["compile_fx_npu"]


def compile_fx_npu(model_, example_inputs_, config_patches=None, **kwargs):
    from torch_npu._inductor.compile_fx import compile_fx_npu as _impl
    return _impl(model_, example_inputs_, config_patches=config_patches, **kwargs)


_patched = False


def _install_default_inductor_route():
    """Make ``torch.compile(backend="inductor")`` (the default) serve npu graphs.

    torch.compile builds a ``_TorchCompileInductorWrapper`` that calls
    Inductor's compile_fx directly; graphs that touch npu (an npu input, an
    npu value or an npu device argument anywhere, see
    ``device_rewrite.graph_npu_device``) are sent to ``compile_fx_npu``
    instead, everything else is untouched.
    """
    global _patched
    if _patched:
        return
    wrapper_cls = torch._TorchCompileInductorWrapper
    original_call = wrapper_cls.__call__

    def __call__(self, model_, inputs_, *, config_patches=None):
        from torch_npu._inductor.device_rewrite import graph_npu_device
        if graph_npu_device(model_, inputs_) is not None:
            all_patches = {**self.config, **(config_patches or {})}
            return compile_fx_npu(model_, inputs_, config_patches=all_patches,
                                  compile_region_name=getattr(self, "name", None))
        return original_call(self, model_, inputs_, config_patches=config_patches)

    __call__.__wrapped__ = original_call
    wrapper_cls.__call__ = __call__
    _patched = True


def _install_registry_inductor_route():
    """Make dynamo's registered ``"inductor"`` backend serve npu graphs too.

    ``torch.compile(backend="inductor")`` goes through the wrapper above, but
    ``torch._dynamo.lookup_backend("inductor")`` (``torch._dynamo.optimize``,
    ``CompileCounterWithBackend("inductor")``, libraries that look backends up
    by name) calls Inductor's compile_fx directly. Runs once dynamo is loaded.
    """
    from torch._dynamo.backends import inductor as _registers_inductor  # noqa: F401
    from torch._dynamo.backends.registry import _COMPILER_FNS

    original = _COMPILER_FNS.get("inductor")
    if original is None or getattr(original, "_npu_routed", False):
        return

    @functools.wraps(original)
    def inductor(model_, example_inputs_, **kwargs):
        from torch_npu._inductor.device_rewrite import graph_npu_device
        if graph_npu_device(model_, example_inputs_) is not None:
            return compile_fx_npu(model_, example_inputs_, **kwargs)
        return original(model_, example_inputs_, **kwargs)

    inductor._npu_routed = True
    _COMPILER_FNS["inductor"] = inductor
