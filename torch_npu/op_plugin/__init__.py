"""``torch.ops.npu``: the torch_npu 2.13.0 custom-op library on the CPU-emulated NPU.

Importing this package (``import torch_npu`` does) defines all custom-op schemas
in the ``npu`` namespace, registers the emulated implementations (every public
sub-package of this package is a family: ``norm``, ``activation``, ``attention``, …,
whose modules each hold one op or op group; every op a
CompositeImplicitAutograd kernel of ATen ops, so CPU and npu tensors, Meta /
FakeTensor and autograd all work), gives every other op kernels that raise
``NotImplementedError``, and exports ``torch_npu.<op>``, ``torch_npu.__all__``
and the deprecated ``torch.<op>`` names. ``docs/ops.md`` lists every op and its
state (``python tools/gen_ops_doc.py`` regenerates it).
"""
from torch_npu.op_plugin import _registry

_registry.define_all()

def _import_families():
    """Import every family sub-package (``attention``, ``moe``, ``quant``, …) and each of its
    public modules (one op or op group each), in name order; each module registers its
    kernels at import. Done before the not-emulated stubs so that implemented ops keep
    their kernels."""
    import importlib
    import pkgutil
    for info in sorted(pkgutil.walk_packages(__path__, prefix=__name__ + "."), key=lambda m: m.name):
        if not any(part.startswith("_") for part in info.name.split(".")[2:]):
            importlib.import_module(info.name)


_import_families()

_registry.register_not_emulated()

from torch_npu.op_plugin import _exports  # noqa: E402

_exports.export()

__all__ = []
