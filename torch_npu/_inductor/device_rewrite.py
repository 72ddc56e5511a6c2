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
    if not isinstance(node, torch.fx.Node):
        return None
    # AOTAutograd/Inductor graphs carry "val"; Dynamo's own output graph
    # (what a backend is first handed) carries "example_value".
    val = node.meta.get("val")
    return node.meta.get("example_value") if val is None else val


def _graph_modules(gm: torch.fx.GraphModule) -> List[torch.fx.GraphModule]:
    """``gm`` and every GraphModule nested in it: the bodies of higher-order
    ops (flex attention's score/mask functions, cond, while_loop, ...) are
    submodules reached through get_attr nodes, not nodes of ``gm.graph``."""
    return [m for m in gm.modules() if isinstance(m, torch.fx.GraphModule)]


def _npu_index_in(x: Any) -> Optional[int]:
    """Device index if ``x`` (possibly nested in lists/tuples/dicts) names or
    holds npu, else None."""
    found: List[int] = []

    def visit(v):
        if found:
            return v
        if isinstance(v, torch.Tensor) and v.device.type == "npu":
            found.append(v.device.index or 0)
        elif _is_npu_device(v):
            found.append(torch.device(v).index or 0)
        return v

    map_aggregate(x, visit)
    return found[0] if found else None


def graph_npu_device(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Optional[int]:
    """Index of the npu device the graph works on, or None if it never touches npu.

    A graph touches npu through an input, through a value it computes, or
    through a device argument: ``torch.arange(n, device="npu")`` in a graph
    without tensor inputs (compiled ``create_block_mask``) is npu work too.
    Nested higher-order-op bodies are searched as well.
    """
    for x in example_inputs:
        if isinstance(x, torch.Tensor) and x.device.type == "npu":
            return x.device.index or 0
    for module in _graph_modules(gm):
        for node in module.graph.nodes:
            index = _npu_index_in(_val_of(node))
            if index is None:
                index = _npu_index_in((node.args, node.kwargs))
            if index is not None:
                return index
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
    """Replace every npu device argument in the graph and its nested
    higher-order-op bodies by cpu; returns how many."""
    changed = 0

    def to_cpu(x):
        nonlocal changed
        if _is_npu_device(x):
            changed += 1
            return "cpu" if isinstance(x, str) else _CPU
        return x

    for module in _graph_modules(gm):
        for node in module.graph.nodes:
            if getattr(node.target, "namespace", None) == "streams":
                continue  # stream/device synchronisation stays addressed to the npu
            if node.op in ("call_function", "call_method"):
                node.args = map_aggregate(node.args, to_cpu)
                node.kwargs = map_aggregate(node.kwargs, to_cpu)
        module.recompile()
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
    """Recompute every node's ``meta['val']`` on the CPU fake inputs.

    Propagation runs the root graph only; the nested bodies of higher-order
    ops keep the values they were traced with, so their npu fake values are
    moved to CPU in place (Inductor checks them against what the parent
    passes in, device included)."""
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp
    FakeTensorProp(gm, mode=fake_mode).propagate_dont_convert_inputs(*cpu_inputs)

    def to_cpu(v):
        return cpu_fake_inputs([v], fake_mode)[0] if isinstance(v, torch.Tensor) else v

    for module in _graph_modules(gm)[1:]:
        for node in module.graph.nodes:
            if "val" in node.meta:
                node.meta["val"] = map_aggregate(node.meta["val"], to_cpu)
