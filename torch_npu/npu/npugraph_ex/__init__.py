"""``torch_npu.npu.npugraph_ex``: the aclgraph compile path (``torch.compile(backend="npugraph_ex")``) by hand.

``compile_fx`` compiles a dynamo graph as the backend does: on the emulated
device that is the "compile as CPU" Inductor path (``torch_npu._inductor``;
no aclgraph is captured, the fused CPU code runs on the npu tensors).
``register_replacement`` adds an FX pattern rewrite (PyTorch's Inductor pattern
matcher) that ``compile_fx`` applies to every post-grad ATen graph it compiles,
as the real backend applies its registered fusions.
"""
from torch_npu.npu.npugraph_ex import inference, scope  # noqa: F401
from torch_npu.npu.npugraph_ex._replacements import register_replacement
from torch_npu.npu.npugraph_ex._compile import compile_fx

__all__ = ["compile_fx", "register_replacement"]
