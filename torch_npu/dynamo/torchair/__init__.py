"""torchair, the torch.compile backend torch_npu documents, on the emulated NPU.

``import torchair`` (after ``import torch_npu``) and ``torch_npu.dynamo.torchair``
are this package, laid out as torchair is: ``configs.compiler_config``,
``core.utils``, ``npu_fx_compiler``, ``npu_export``, ``experimental.inference``,
``inference``, ``patterns.pattern_pass_manager``. ``get_npu_backend()`` returns
a dynamo backend that compiles npu graphs with PyTorch's Inductor through the
"compile as CPU" path (``torch_npu._inductor``); on hardware torchair lowers
to a GE graph instead. Importing this package does not import dynamo or
Inductor.
"""
from torch_npu.dynamo.torchair.npu_fx_compiler import get_compiler, get_npu_backend
from torch_npu.dynamo.torchair.npu_export import dynamo_export
from torch_npu.dynamo.torchair.configs.compiler_config import CompilerConfig
from torch_npu.dynamo.torchair.experimental.inference import use_internal_format_weight, npu_format_cast_via_cpu
from torch_npu.dynamo.torchair.core.utils import logger
from torch_npu.dynamo.torchair.patterns.pattern_pass_manager import register_replacement
from torch_npu.dynamo.torchair import inference  # noqa: F401  (torchair.inference.cache_compile, ...)

__all__ = ["get_compiler", "get_npu_backend", "dynamo_export", "CompilerConfig", "use_internal_format_weight",
           "logger", "register_fx_node_ge_converter", "patch_for_hcom", "register_replacement",
           "npu_format_cast_via_cpu"]


def register_fx_node_ge_converter(aten_op):
    """Decorator registering a GE converter for ``aten_op`` on hardware.

    There is no GE graph here (graphs compile with Inductor), so the converter
    is never called: the decorator returns the function unchanged.
    """
    def register(converter):
        logger.debug("torchair (emulated): GE converter for %s recorded, not used", aten_op)
        return converter
    return register


def patch_for_hcom():
    """On hardware (torch < 2.3.1) swaps torch.distributed collectives for
    GE-traceable ones. torch 2.13 traces collectives as they are: like
    torchair, only warns that the call is no longer needed."""
    logger.warning('For versions 2.3.1 and above of PyTorch, there is no need to call patch_for_hcom anymore.')
