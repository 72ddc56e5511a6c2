"""Flex attention in npu graphs that the CPU Inductor template cannot take.

"Compile as CPU" hands the flex attention higher-order ops to Inductor's CPU
lowering, which only serves inference: it refuses the backward op and a
forward that must also produce the logsumexp (what training and
``return_lse``/``return_aux`` need). Real NPUs compile those too, so for npu
graphs each such op is replaced, before Inductor sees the graph, by the ATen
program of its dense reference implementation (the one PyTorch runs in
eager mode), traced on the graph's fake CPU values. Inductor then fuses that
program like any other. Inference-only forwards keep the CPU template, so
they compute exactly what compiled CPU code computes.
"""
import importlib
import operator
from typing import Any, Callable, List

import torch
import torch.utils._pytree as pytree

__all__ = []

_TRACED = object()


def _dense_impl(node: torch.fx.Node):
    """The dense implementation to inline for ``node``, or None to keep it
    (a forward whose auxiliary outputs nobody reads is switched to the
    inference template on the way)."""
    # The module, not the operator torch._higher_order_ops re-exports by that name.
    hop = importlib.import_module("torch._higher_order_ops.flex_attention")

    if node.op != "call_function":
        return None
    if node.target is torch.ops.higher_order.flex_attention_backward:
        return hop.sdpa_dense_backward
    if node.target is torch.ops.higher_order.flex_attention:
        kernel_options = node.args[6]
        if not (kernel_options.get("OUTPUT_LOGSUMEXP") or kernel_options.get("OUTPUT_MAX")):
            return None
        by_index = all(u.op == "call_function" and u.target is operator.getitem for u in node.users)
        if by_index and {u.args[1] for u in node.users} <= {0}:
            # Only the attention output is read (PyTorch asks for the
            # logsumexp whenever grad mode is on): this is inference, which
            # the CPU template serves, exactly as on CPU.
            args = list(node.args)
            args[6] = {**kernel_options, "OUTPUT_LOGSUMEXP": False, "OUTPUT_MAX": False}
            node.args = tuple(args)
            return None
        # The CPU template computes neither logsumexp nor max scores.
        return hop.sdpa_dense
    return None


def _trace_dense(gm: torch.fx.GraphModule, node: torch.fx.Node, impl: Callable, fake_mode):
    """Trace ``impl`` on the node's fake arguments; returns (graph module,
    the argument nodes that became its placeholders, in order)."""
    from torch._inductor.decomposition import select_decomp_table
    from torch._dispatch.python import enable_python_dispatcher
    from torch.fx.experimental.proxy_tensor import make_fx

    flat, spec = pytree.tree_flatten((node.args, node.kwargs))
    traced_nodes: List[torch.fx.Node] = []
    slots: List[Any] = []  # a fixed value, or _TRACED where a traced input goes
    for a in flat:
        if isinstance(a, torch.fx.Node):
            if a.op == "get_attr" and isinstance(getattr(gm, a.target, None), torch.fx.GraphModule):
                slots.append(getattr(gm, a.target))  # score/mask/joint bodies: code, not data
            else:
                slots.append(_TRACED)
                traced_nodes.append(a)
        else:
            slots.append(a)

    def dense(*values):
        it = iter(values)
        filled = [next(it) if s is _TRACED else s for s in slots]
        args, kwargs = pytree.tree_unflatten(filled, spec)
        return impl(*args, **kwargs)

    functional = torch.func.functionalize(dense, remove="mutations_and_views")
    example = [a.meta["val"] for a in traced_nodes]
    with fake_mode, enable_python_dispatcher():
        sub = make_fx(functional, select_decomp_table(), tracing_mode="real")(*example)
    return sub, traced_nodes


def _splice(gm: torch.fx.GraphModule, node: torch.fx.Node, sub: torch.fx.GraphModule,
            inputs: List[torch.fx.Node]) -> None:
    """Insert ``sub``'s nodes before ``node`` and route the node's (getitem)
    users to the matching outputs."""
    graph = gm.graph
    val_map = {}
    placeholders = [n for n in sub.graph.nodes if n.op == "placeholder"]
    for ph, a in zip(placeholders, inputs):
        val_map[ph] = a
    with graph.inserting_before(node):
        for n in sub.graph.nodes:
            if n.op == "get_attr":  # constants the trace lifted (e.g. -inf)
                name = n.target
                i = 0
                while hasattr(gm, f"{name}_dense{i}"):
                    i += 1
                gm.register_buffer(f"{name}_dense{i}", getattr(sub, n.target), persistent=False)
                val_map[n] = graph.get_attr(f"{name}_dense{i}")
        outputs = graph.graph_copy(sub.graph, val_map)

    def route(user_of: torch.fx.Node, value) -> None:
        for user in list(user_of.users):
            if user.op == "call_function" and user.target is operator.getitem:
                route(user, value[user.args[1]])
                graph.erase_node(user)
            elif isinstance(value, torch.fx.Node):
                user.replace_input_with(user_of, value)
            else:
                raise RuntimeError(
                    f"torch_npu: cannot inline {node.target}: its result is used whole by {user.format_node()}")

    route(node, outputs)
    graph.erase_node(node)


def inline_dense_flex_attention(gm: torch.fx.GraphModule, fake_mode) -> int:
    """Replace the flex attention ops of ``gm`` that the CPU template refuses
    by their dense ATen program; returns how many were replaced. The caller
    recomputes the fake values afterwards."""
    flex_ops = (torch.ops.higher_order.flex_attention, torch.ops.higher_order.flex_attention_backward)
    seen = [n for n in gm.graph.nodes if n.op == "call_function" and n.target in flex_ops]
    todo = [(n, impl) for n in seen for impl in (_dense_impl(n),) if impl is not None]
    for node, impl in todo:
        sub, inputs = _trace_dense(gm, node, impl, fake_mode)
        _splice(gm, node, sub, inputs)
    if seen:  # kept forwards may have had their options changed
        gm.graph.lint()
        gm.recompile()
    return len(todo)
