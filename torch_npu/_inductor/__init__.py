"""Inductor for the npu device ("compile as CPU", see ``compile_fx``).

Nothing here imports Inductor at ``import torch_npu``; it is loaded on the
first ``torch.compile`` that meets an npu tensor.
"""
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
