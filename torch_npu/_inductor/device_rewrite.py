"""Rewrite an ATen-level FX graph traced on npu so that it describes CPU work.

The traced graph and its fake values carry ``npu`` devices; Inductor only has
CPU code generation for host memory, so every device argument becomes
``cpu`` and the fake values are recomputed on CPU fake inputs. What the
original graph produced on npu is recorded first, so the runtime can hand
those outputs back as npu tensors and leave genuine CPU outputs on the CPU.
"""
from typing import Any, List, Optional, Sequence, Tuple

import torch
from torch.fx.node import map_aggregate

_CPU = torch.device("cpu")


def _is_npu_device(x: Any) -> bool:
    if isinstance(x, torch.device):
        return x.type == "npu"
    if isinstance(x, str):
        return x == "npu" or x.startswith("npu:")
    return False


def _val_of(node: Any):
    return node.meta.get("val") if isinstance(node, torch.fx.Node) else None


def graph_npu_device(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Optional[int]:
    """Index of the npu device the graph works on, or None if it never touches npu."""
    for x in example_inputs:
        if isinstance(x, torch.Tensor) and x.device.type == "npu":
            return x.device.index or 0
    for node in gm.graph.nodes:
        val = _val_of(node)
        if isinstance(val, torch.Tensor) and val.device.type == "npu":
            return val.device.index or 0
        for a in list(node.args) + list(node.kwargs.values()):
            if _is_npu_device(a):
                return torch.device(a).index or 0
    return None


def npu_output_mask(gm: torch.fx.GraphModule) -> List[bool]:
    """Per graph output: True unless the traced graph returned a CPU tensor there."""
    out_node = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    outs = out_node.args[0]
    if not isinstance(outs, (list, tuple)):
        outs = (outs,)
    mask = []
    for o in outs:
        val = _val_of(o)
        mask.append(not (isinstance(val, torch.Tensor) and val.device.type == "cpu"))
    return mask


def rewrite_devices_to_cpu(gm: torch.fx.GraphModule) -> int:
    """Replace every npu device argument in the graph by cpu; returns how many."""
    changed = 0

    def to_cpu(x):
        nonlocal changed
        if _is_npu_device(x):
            changed += 1
            return "cpu" if isinstance(x, str) else _CPU
        return x

    for node in gm.graph.nodes:
        if getattr(node.target, "namespace", None) == "streams":
            continue  # stream/device synchronisation stays addressed to the npu
        if node.op in ("call_function", "call_method"):
            node.args = map_aggregate(node.args, to_cpu)
            node.kwargs = map_aggregate(node.kwargs, to_cpu)
    gm.recompile()
    return changed


def _storage_extent(t: torch.Tensor):
    extent = 1
    for size, stride in zip(t.size(), t.stride()):
        extent = extent + (size - 1) * stride
    return extent


def cpu_fake_inputs(example_inputs: Sequence[Any], fake_mode) -> Tuple[List[Any], bool]:
    """CPU fake tensors with the sizes, strides and offsets of the npu ones."""
    out = []
    for x in example_inputs:
        if isinstance(x, torch.Tensor) and x.device.type == "npu":
            with fake_mode:
                offset = x.storage_offset()
                if offset == 0:
                    y = torch.empty_strided(x.size(), x.stride(), dtype=x.dtype, device=_CPU)
                else:
                    base = torch.empty((offset + _storage_extent(x),), dtype=x.dtype, device=_CPU)
                    y = base.as_strided(x.size(), x.stride(), offset)
            out.append(y)
        else:
            out.append(x)
    return out


def repropagate_fake_values(gm: torch.fx.GraphModule, cpu_inputs: Sequence[Any], fake_mode) -> None:
    """Recompute every node's ``meta['val']`` on the CPU fake inputs."""
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp
    FakeTensorProp(gm, mode=fake_mode).propagate_dont_convert_inputs(*cpu_inputs)
