"""torchair, the torch.compile backend torch_npu documents, on the emulated NPU.

``import torchair`` (after ``import torch_npu``) and ``torch_npu.dynamo.torchair``
are this module. ``get_npu_backend()`` returns a dynamo backend that compiles
npu graphs with PyTorch's Inductor through the "compile as CPU" path
(``torch_npu._inductor``); on hardware torchair lowers to a GE graph instead.
Importing this module does not import dynamo or Inductor.
"""
import functools
import logging

from torch_npu.dynamo.torchair.configs import CompilerConfig

__all__ = ["get_compiler", "get_npu_backend", "dynamo_export", "CompilerConfig", "use_internal_format_weight",
           "logger"]

logger = logging.getLogger("torchair")


def _check_config(compiler_config):
    if compiler_config is None:
        return CompilerConfig()
    if not isinstance(compiler_config, CompilerConfig):
        raise TypeError(f"compiler_config must be a torchair.CompilerConfig, got {type(compiler_config).__name__}")
    return compiler_config


def _npu_compile(compiler_config, gm, example_inputs):
    from torch_npu._inductor import compile_fx_npu
    logger.debug("torchair (emulated): compiling a graph of %d nodes in mode %s",
                 len(gm.graph.nodes), compiler_config.mode)
    return compile_fx_npu(gm, example_inputs)


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


def dynamo_export(*args, model, export_path="export_graphs", export_name="export", dynamic=False,
                  config=None, **kwargs):
    """On hardware: writes an offline GE model (air). Here: exports the program
    with ``torch.export`` and saves it as ``<export_path>/<export_name>.pt2``."""
    import os
    import torch
    ep = torch.export.export(model, tuple(args), kwargs or None)
    os.makedirs(export_path, exist_ok=True)
    path = os.path.join(export_path, export_name + ".pt2")
    torch.export.save(ep, path)
    return path


def use_internal_format_weight(model):
    """NPU private weight formats do not exist on the emulated device: a no-op."""
    return model
