"""``torch.ops.npu``: the torch_npu 2.13.0 custom-op library on the CPU-emulated NPU.

Importing this package (``import torch_npu`` does) defines all custom-op schemas
in the ``npu`` namespace, registers the emulated implementations (family
modules ``norm``, ``activation``, ``softmax``, ``rotary``, ``misc``, ``attention``; each a
CompositeImplicitAutograd kernel of ATen ops, so CPU and npu tensors, Meta /
FakeTensor and autograd all work), gives every other op kernels that raise
``NotImplementedError``, and exports ``torch_npu.<op>``, ``torch_npu.__all__``
and the deprecated ``torch.<op>`` names. ``docs/ops.md`` lists every op and its
state (``python tools/gen_ops_doc.py`` regenerates it).
"""
from torch_npu.op_plugin import _registry

_registry.define_all()

from torch_npu.op_plugin import activation, attention, misc, norm, rotary, softmax  # noqa: E402,F401  (register kernels)

_registry.register_not_emulated()

from torch_npu.op_plugin import _exports  # noqa: E402

_exports.export()

__all__ = []
