"""Dynamo backends named as torch_npu's: ``npu``, ``npugraph_ex``, ``npugraphs``.

All three compile through the "compile as CPU" Inductor path
(``torch_npu._inductor``): on hardware ``npu`` builds a GE graph and the
other two capture aclgraphs; on the emulated device the fused CPU code is
what runs, so the three differ only in the options they accept.
"""
from torch._dynamo.backends.registry import register_backend, _COMPILER_FNS


def _npu_backend(gm, example_inputs, **kwargs):
    from torch_npu.dynamo.torchair import get_npu_backend
    return get_npu_backend(**kwargs)(gm, example_inputs)


def _npugraph_ex_backend(gm, example_inputs, options=None, **kwargs):
    from torch_npu._inductor import compile_fx_npu
    return compile_fx_npu(gm, example_inputs)


def _npugraphs_backend(gm, example_inputs, **kwargs):
    from torch_npu._inductor import compile_fx_npu
    return compile_fx_npu(gm, example_inputs)


def register() -> None:
    from torch_npu._inductor import _install_registry_inductor_route
    _install_registry_inductor_route()
    for name, fn in (("npu", _npu_backend), ("npugraph_ex", _npugraph_ex_backend),
                     ("npugraphs", _npugraphs_backend)):
        if name not in _COMPILER_FNS:
            register_backend(compiler_fn=fn, name=name)
