"""``torch.ops.npu``: the torch_npu 2.13.0 custom-op library on the CPU-emulated NPU.

Importing this package (``import torch_npu`` does) defines all custom-op schemas
in the ``npu`` namespace, registers the emulated implementations (every public
module of this package is a family: ``norm``, ``activation``, ``attention``, …; each a
CompositeImplicitAutograd kernel of ATen ops, so CPU and npu tensors, Meta /
FakeTensor and autograd all work), gives every other op kernels that raise
``NotImplementedError``, and exports ``torch_npu.<op>``, ``torch_npu.__all__``
and the deprecated ``torch.<op>`` names. ``docs/ops.md`` lists every op and its
state (``python tools/gen_ops_doc.py`` regenerates it).
"""
from torch_npu.op_plugin import _registry

_registry.define_all()

def _import_families():
    """Import every family module (public module names in this package); each
    registers its kernels at import. Done before the not-emulated stubs so
    that implemented ops keep their kernels."""
    import importlib
    import pkgutil
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if not info.name.startswith("_"):
            importlib.import_module(f"{__name__}.{info.name}")


_import_families()

_registry.register_not_emulated()

from torch_npu.op_plugin import _exports  # noqa: E402

_exports.export()

__all__ = []
