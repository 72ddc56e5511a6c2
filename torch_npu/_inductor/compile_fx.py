"""Inductor for npu tensors: "compile as CPU".

AOTAutograd traces the program on npu (so autograd, optimizers and the npu
generator see npu tensors); each forward/backward/inference graph it hands to
Inductor is rewritten to CPU devices, compiled by the stock CPU Inductor
(C++/OpenMP kernels, fusion, FX graph cache) and wrapped in
:class:`NpuCompiledGraph`, which runs it on zero-copy aliases of the npu data.

The AOTAutograd cache is bypassed for these graphs: a hit there would load
the CPU kernels without this wrapper and return CPU tensors. The FX graph
cache (inside ``compile_fx_inner``) stays on, so a warm start skips Inductor's
code generation and still returns npu tensors.
"""
from typing import Any, Sequence

import torch

from torch_npu._inductor import device_rewrite
from torch_npu._inductor.flex_attention import inline_dense_flex_attention
from torch_npu._inductor.npu_compiled_graph import NpuCompiledGraph
from torch_npu._inductor.rng import graph_has_random_ops


def npu_inner_compile(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], **kwargs):
    """``inner_compile`` for compile_fx: npu graphs are compiled as CPU graphs."""
    from torch._inductor.compile_fx import compile_fx_inner
    from torch._guards import detect_fake_mode

    device_index = device_rewrite.graph_npu_device(gm, example_inputs)
    if device_index is None:
        return compile_fx_inner(gm, example_inputs, **kwargs)
    npu_outputs = device_rewrite.npu_output_mask(gm)
    device_rewrite.rewrite_devices_to_cpu(gm)
    fake_mode = detect_fake_mode(example_inputs)
    if fake_mode is None:
        fake_mode = torch._subclasses.FakeTensorMode(allow_non_fake_inputs=True)
    cpu_inputs = device_rewrite.cpu_fake_inputs(example_inputs, fake_mode)
    device_rewrite.repropagate_fake_values(gm, cpu_inputs, fake_mode)
    if inline_dense_flex_attention(gm, fake_mode):
        device_rewrite.repropagate_fake_values(gm, cpu_inputs, fake_mode)
    has_random = graph_has_random_ops(gm)
    compiled = compile_fx_inner(gm, cpu_inputs, **kwargs)
    return NpuCompiledGraph(compiled, device_index, npu_outputs, has_random)


def has_npu_inputs(example_inputs: Sequence[Any]) -> bool:
    return any(isinstance(x, torch.Tensor) and x.device.type == "npu" for x in example_inputs)


def compile_fx_npu(model_: torch.fx.GraphModule, example_inputs_: Sequence[Any], config_patches=None,
                   **kwargs):
    """Drop-in for ``torch._inductor.compile_fx.compile_fx`` that also serves npu graphs."""
    from torch._inductor.compile_fx import compile_fx
    import torch._functorch.config as functorch_config

    with functorch_config.patch(enable_autograd_cache=False):
        return compile_fx(model_, example_inputs_, inner_compile=npu_inner_compile,
                          config_patches=config_patches, **kwargs)
