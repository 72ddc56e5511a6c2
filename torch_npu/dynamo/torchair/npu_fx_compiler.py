"""``get_npu_backend`` / ``get_compiler``: torchair's torch.compile entry points.

On hardware they lower the FX graph to a GE graph (or capture an aclgraph in
``reduce-overhead`` mode). Here both compile through the "compile as CPU"
Inductor path (``torch_npu._inductor``), with the pattern replacements
registered through ``register_replacement`` applied, whatever the mode.
"""
import functools

from torch_npu.dynamo.torchair.configs.compiler_config import CompilerConfig
from torch_npu.dynamo.torchair.core.utils import logger

__all__ = ["get_npu_backend", "get_compiler"]


def _check_config(compiler_config):
    if compiler_config is None:
        return CompilerConfig()
    if not isinstance(compiler_config, CompilerConfig):
        raise TypeError(f"compiler_config must be a torchair.CompilerConfig, got {type(compiler_config).__name__}")
    return compiler_config


def _npu_compile(compiler_config, gm, example_inputs):
    from torch_npu.npu.npugraph_ex._compile import compile_fx
    logger.debug("torchair (emulated): compiling a graph of %d nodes in mode %s",
                 len(gm.graph.nodes), compiler_config.mode)
    return compile_fx(gm, example_inputs)


def get_compiler(compiler_config: CompilerConfig = None):
    """The FX-graph compiler (no AOTAutograd around it, as in torchair)."""
    compiler_config = _check_config(compiler_config)
    return functools.partial(_npu_compile, compiler_config)


def get_npu_backend(*, compiler_config: CompilerConfig = None, custom_decompositions: dict = None):
    """A backend for ``torch.compile(model, backend=...)``."""
    compiler_config = _check_config(compiler_config)
    if custom_decompositions:
        raise NotImplementedError("custom_decompositions are not supported by the emulated torchair backend")

    def npu_backend(gm, example_inputs, **kwargs):
        return _npu_compile(compiler_config, gm, example_inputs)
    npu_backend.compiler_config = compiler_config
    return npu_backend
