"""NPU graphs (aclgraph, torch_npu's CUDA-graph analogue) on the emulated device.

Capture records every ATen op issued on the capturing thread (a dispatch
mode) together with the tensors it read and wrote; replay re-executes the
recorded ops on those same tensors, writing each result into the memory the
op wrote at capture. So, as on hardware, a graph replays on static memory:
new data goes in by copying into the captured input tensors, results are read
from the captured outputs. Ops that need the host during capture
(``.item()``, copies to the CPU) raise, as a capturing stream refuses them;
an input that changed shape or address since capture makes replay raise.

The emulated device runs ops synchronously, so capture also executes them
(on hardware capture only records); the captured outputs therefore already
hold the results of the capture run.
"""
import gc
import itertools
import threading
from typing import Any, List, Optional

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils import _pytree as pytree

import torch_npu
from torch_npu.utils._error_code import ErrCode, pta_error
from torch_npu.npu._npugraph_handlers import find_handler

__all__ = ["is_current_stream_capturing", "graph_pool_handle", "graph_task_group_begin", "graph_task_group_end",
           "graph_task_update_begin", "graph_task_update_end", "NPUGraph", "graph", "make_graphed_callables",
           "super_kernel_scope_begin", "super_kernel_scope_end"]

_capture_state = threading.local()
_pool_ids = itertools.count(1)

_NOT_PERMITTED = "operation not permitted when stream is capturing"
_HOST_OPS = {torch.ops.aten._local_scalar_dense.default, torch.ops.aten.item.default}


def graph_pool_handle():
    """An opaque token for sharing a memory pool between captures (``graph(pool=...)``)."""
    return (0, next(_pool_ids))


def is_current_stream_capturing() -> bool:
    """True while a graph capture is under way on this thread's current stream."""
    graph_obj = getattr(_capture_state, "graph", None)
    if graph_obj is None:
        return False
    return _stream_key(torch_npu.npu.current_stream()) == graph_obj._capture_stream_key


def _stream_key(stream):
    return (stream.device_index, stream.stream_id)


def _is_host_copy(func, args, kwargs) -> bool:
    """An op that moves npu data to host memory (a D2H copy)."""
    if func is torch.ops.aten._to_copy.default:
        dev = kwargs.get("device")
        return dev is not None and torch.device(dev).type == "cpu" and \
            isinstance(args[0], torch.Tensor) and args[0].device.type == "npu"
    if func is torch.ops.aten.copy_.default:
        dst, src = args[0], args[1]
        return dst.device.type == "cpu" and src.device.type == "npu"
    return False


class _RecordedOp:
    __slots__ = ("func", "args", "kwargs", "outs")

    def __init__(self, func, args, kwargs, outs):
        self.func, self.args, self.kwargs, self.outs = func, args, kwargs, outs


class _TaskGroupHandle:
    """A range of recorded ops of one graph (``graph_task_group_end``'s result)."""

    def __init__(self, npu_graph, start, end):
        self.graph, self.start, self.end = npu_graph, start, end


class _GraphDispatchRecord:
    """An op captured under ``auto_dispatch_capture``: what ``NPUGraph.update`` changes."""

    def __init__(self, handle, func, args, kwargs, handler):
        self.handle, self.op_cache_entry, self.handler = handle, func, handler
        self.args, self.kwargs = list(args), kwargs
        self.event = None


class _CaptureMode(TorchDispatchMode):
    def __init__(self, ops: List[_RecordedOp], npu_graph=None):
        super().__init__()
        self.ops = ops
        self.graph = npu_graph

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _HOST_OPS or _is_host_copy(func, args, kwargs):
            raise RuntimeError(f"NPU error: {func.name()}: {_NOT_PERMITTED}. Reading device values on the host "
                               f"is not allowed inside an NPU graph capture." + pta_error(ErrCode.NOT_SUPPORT))
        handler = find_handler(func) if self.graph is not None and self.graph.auto_dispatch_capture else None
        if handler is not None:
            return self._capture_updatable(handler, func, args, kwargs)
        out = func(*args, **kwargs)
        self.ops.append(_RecordedOp(func, args, kwargs, out))
        return out

    def _capture_updatable(self, handler, func, args, kwargs):
        """An op with a registered handler: its own task group, plus a dispatch record for ``update``."""
        func, args, kwargs = handler.prepare_capture(func, tuple(args), dict(kwargs))
        start = len(self.ops)
        out = func(*args, **kwargs)
        self.ops.append(_RecordedOp(func, tuple(args), kwargs, out))
        tensor_names = [a.name for a in func._schema.arguments] if hasattr(func, "_schema") else []
        stored = {k: handler.record_wrap_kwarg(k, v, tensor_names) for k, v in kwargs.items()}
        self.graph._dispatch_records.append(
            _GraphDispatchRecord(_TaskGroupHandle(self.graph, start, start + 1), func, args, stored, handler))
        return handler.postprocess_result(out, kwargs)


def _same_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.data_ptr() == b.data_ptr() and a.size() == b.size() and a.stride() == b.stride()


class NPUGraph:
    """A captured sequence of NPU work, replayable on the memory it was captured on."""

    def __new__(cls, keep_graph=False):
        return super().__new__(cls)

    def __init__(self, keep_graph=False):
        self.keep_graph = keep_graph
        self._ops: Optional[List[_RecordedOp]] = None
        self._mode: Optional[_CaptureMode] = None
        self._pool = None
        self._capture_stream_key = None
        self._inputs = []   # (tensor, data_ptr, size, stride) of tensors the graph read but did not make
        self.auto_dispatch_capture = False
        self._dispatch_records: List[_GraphDispatchRecord] = []
        self._group_start = None
        self.super_kernel_options = None

    def capture_begin(self, pool=None, capture_error_mode="global"):
        if self._ops is not None or self._mode is not None:
            raise RuntimeError("This NPUGraph instance already owns a captured graph. To capture a new graph, "
                               "create a new instance." + pta_error(ErrCode.PARAM))
        if capture_error_mode not in ("global", "thread_local", "relaxed"):
            raise ValueError(f"Unknown capture_error_mode '{capture_error_mode}'" + pta_error(ErrCode.VALUE))
        if getattr(_capture_state, "graph", None) is not None:
            raise RuntimeError("Cannot begin an NPU graph capture while another capture is under way on this "
                               "thread." + pta_error(ErrCode.NOT_SUPPORT))
        stream = torch_npu.npu.current_stream()
        if _stream_key(stream) == _stream_key(torch_npu.npu.default_stream(stream.device_index)):
            raise RuntimeError("NPU graphs must be captured on a non-default stream. (However, after capture, "
                               "it's ok to replay them on the default stream.)" + pta_error(ErrCode.NOT_SUPPORT))
        self._pool = pool if pool is not None else graph_pool_handle()
        self._capture_stream_key = _stream_key(stream)
        recorded: List[_RecordedOp] = []
        self._mode = _CaptureMode(recorded, self)
        _capture_state.graph = self
        self._mode.__enter__()

    def capture_end(self):
        if self._mode is None:
            raise RuntimeError("Called NPUGraph::capture_end without a preceding capture_begin."
                               + pta_error(ErrCode.PARAM))
        mode, self._mode = self._mode, None
        mode.__exit__(None, None, None)
        _capture_state.graph = None
        self._ops = mode.ops
        self._inputs = self._external_inputs(self._ops)

    @staticmethod
    def _external_inputs(ops):
        produced = set()
        inputs = []
        for op in ops:
            for a in pytree.tree_leaves((op.args, op.kwargs)):
                if isinstance(a, torch.Tensor) and id(a) not in produced:
                    inputs.append((a, a.data_ptr(), a.size(), a.stride()))
                    produced.add(id(a))
            for o in pytree.tree_leaves(op.outs):
                if isinstance(o, torch.Tensor):
                    produced.add(id(o))
        return inputs

    def replay(self):
        if self._ops is None:
            raise RuntimeError("Called NPUGraph::replay without a preceding successful capture."
                               + pta_error(ErrCode.PARAM))
        for t, ptr, size, stride in self._inputs:
            if t.data_ptr() != ptr or t.size() != size or t.stride() != stride:
                raise RuntimeError(
                    f"NPUGraph replay: a captured tensor changed since capture (shape {tuple(size)} -> "
                    f"{tuple(t.size())}, address {'changed' if t.data_ptr() != ptr else 'unchanged'}). Graphs "
                    f"replay on static shapes and addresses: copy new data into the captured tensors instead."
                    + pta_error(ErrCode.PARAM))
        for op in self._ops:
            fresh = op.func(*op.args, **op.kwargs)
            for new, old in zip(pytree.tree_leaves(fresh), pytree.tree_leaves(op.outs)):
                if isinstance(old, torch.Tensor) and isinstance(new, torch.Tensor) and not _same_memory(new, old):
                    old.copy_(new)

    def reset(self):
        self._ops = None
        self._inputs = []
        self._dispatch_records = []

    def update(self, cpu_update_input):
        """New argument values for the ops captured with handlers (``auto_dispatch_capture=True``), in capture
        order; a single dict applies to all of them. The next ``replay`` runs them with these values."""
        if not self.auto_dispatch_capture:
            raise RuntimeError("The current graph configuration does not support update,"
                               "Try to capture by setting auto_dispatch_capture=True during capture"
                               + pta_error(ErrCode.PARAM))
        records = self._dispatch_records
        if len(cpu_update_input) == 1:
            cpu_update_input = [dict(cpu_update_input[0]) for _ in records]
        if len(cpu_update_input) != len(records):
            raise RuntimeError(f"Currently, there are {len(records)} operators that need to be updated by capture, "
                               f"and there are only {len(cpu_update_input)} elements in the incoming "
                               f"cpu_update_input list" + pta_error(ErrCode.PARAM))
        for record, update_input in zip(records, cpu_update_input):
            schema = getattr(record.op_cache_entry, "_schema", None)
            # Keys naming an argument already passed positionally are left to the handler's update_args.
            positional = {a.name for a in schema.arguments[:len(record.args)]} if schema is not None else set()
            for key, value in update_input.items():
                if key not in positional:
                    record.kwargs[key] = value
            record.handler.update_args(record, update_input)
            op = self._ops[record.handle.start]
            op.args, op.kwargs = tuple(record.args), dict(record.kwargs)
        self._inputs = self._external_inputs(self._ops)

    def super_kernel_optimize(self, optimize_options=None, debug_options=None):
        """Fuse the captured tasks into super kernels (hardware). The emulated device has no kernel launch cost
        to save: the options are checked and kept (``super_kernel_options``); replay is unchanged."""
        if self._ops is None:
            raise RuntimeError("Called NPUGraph::super_kernel_optimize without a preceding successful capture."
                               + pta_error(ErrCode.PARAM))
        for name, opts in (("optimize_options", optimize_options), ("debug_options", debug_options)):
            if opts is not None and not isinstance(opts, dict):
                raise TypeError(f"{name} must be a dict or None, got {type(opts).__name__}"
                                + pta_error(ErrCode.TYPE))
        self.super_kernel_options = (dict(optimize_options or {}), dict(debug_options or {}))

    def pool(self):
        if self._pool is None:
            raise RuntimeError("Called NPUGraph::pool without a preceding capture." + pta_error(ErrCode.PARAM))
        return self._pool

    def enable_debug_mode(self):
        self._debug = True

    def debug_dump(self, debug_path):
        with open(debug_path, "w", encoding="utf-8") as f:
            for op in self._ops or []:
                f.write(f"{op.func.name()}\n")

    def replay_ops(self) -> List[str]:
        """Names of the recorded ops, in replay order (emulator introspection)."""
        return [op.func.name() for op in self._ops or []]


class graph:
    """Context manager capturing NPU work into an :class:`NPUGraph`, as ``torch.cuda.graph``."""

    default_capture_stream: Optional[Any] = None

    def __init__(self, npu_graph, pool=None, stream=None, auto_dispatch_capture=False,
                 capture_error_mode: str = "global"):
        if not isinstance(npu_graph, NPUGraph):
            raise TypeError(f"npu_graph must be an NPUGraph, got {type(npu_graph).__name__}"
                            + pta_error(ErrCode.TYPE))
        if self.__class__.default_capture_stream is None:
            self.__class__.default_capture_stream = torch_npu.npu.Stream()
        self.pool = () if pool is None else (pool,)
        self.capture_stream = stream if stream is not None else self.__class__.default_capture_stream
        self.stream_ctx = torch_npu.npu.stream(self.capture_stream)
        self.npu_graph = npu_graph
        self.capture_error_mode = capture_error_mode
        self.npu_graph.auto_dispatch_capture = auto_dispatch_capture

    def __enter__(self):
        torch_npu.npu.synchronize()
        gc.collect()
        torch_npu.npu.empty_cache()
        self.stream_ctx.__enter__()
        self.npu_graph.capture_begin(*self.pool, capture_error_mode=self.capture_error_mode)

    def __exit__(self, exc_type, exc, tb):
        try:
            self.npu_graph.capture_end()
        finally:
            self.stream_ctx.__exit__(exc_type, exc, tb)
        return False


def _capturing_graph(stream, what):
    graph_obj = getattr(_capture_state, "graph", None)
    if graph_obj is None or _stream_key(stream) != graph_obj._capture_stream_key:
        raise RuntimeError(f"{what}: the stream is not capturing an NPU graph on this thread."
                           + pta_error(ErrCode.NOT_SUPPORT))
    return graph_obj


def graph_task_group_begin(stream):
    """Start a task group on the capturing ``stream``: the ops issued until ``graph_task_group_end``."""
    graph_obj = _capturing_graph(stream, "graph_task_group_begin")
    if graph_obj._group_start is not None:
        raise RuntimeError("graph_task_group_begin: a task group is already open on this capture."
                           + pta_error(ErrCode.NOT_SUPPORT))
    graph_obj._group_start = len(graph_obj._mode.ops)


def graph_task_group_end(stream):
    """Close the task group; returns its handle, for ``graph_task_update_begin``."""
    graph_obj = _capturing_graph(stream, "graph_task_group_end")
    if graph_obj._group_start is None:
        raise RuntimeError("graph_task_group_end: no task group was begun on this capture."
                           + pta_error(ErrCode.NOT_SUPPORT))
    handle = _TaskGroupHandle(graph_obj, graph_obj._group_start, len(graph_obj._mode.ops))
    graph_obj._group_start = None
    return handle


class _UpdateMode(TorchDispatchMode):
    """Records the ops that replace a task group's (they also run now: the device is synchronous)."""

    def __init__(self, handle):
        super().__init__()
        self.handle, self.ops = handle, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        self.ops.append(_RecordedOp(func, args, kwargs, out))
        return out


def graph_task_update_begin(stream, handle):
    """Start re-issuing the ops of task group ``handle`` with new arguments (after capture, on any stream)."""
    if not isinstance(handle, _TaskGroupHandle):
        raise TypeError("graph_task_update_begin: handle must come from graph_task_group_end, got "
                        f"{type(handle).__name__}" + pta_error(ErrCode.TYPE))
    if handle.graph._ops is None:
        raise RuntimeError("graph_task_update_begin: the graph of this task group has not finished capture."
                           + pta_error(ErrCode.NOT_SUPPORT))
    if getattr(_capture_state, "update", None) is not None:
        raise RuntimeError("graph_task_update_begin: a task update is already under way on this thread."
                           + pta_error(ErrCode.NOT_SUPPORT))
    mode = _UpdateMode(handle)
    _capture_state.update = (_stream_key(stream), mode)
    mode.__enter__()


def graph_task_update_end(stream):
    """Finish the update: the group's recorded ops become the ones just issued, writing the captured outputs."""
    state = getattr(_capture_state, "update", None)
    if state is None or state[0] != _stream_key(stream):
        raise RuntimeError("graph_task_update_end: no task update was begun on this stream."
                           + pta_error(ErrCode.NOT_SUPPORT))
    _capture_state.update = None
    key, mode = state
    mode.__exit__(None, None, None)
    handle = mode.handle
    old = handle.graph._ops[handle.start:handle.end]
    if len(mode.ops) != len(old):
        raise RuntimeError(f"graph_task_update_end: the update issued {len(mode.ops)} ops, the task group "
                           f"captured {len(old)}; an update must issue the same tasks." + pta_error(ErrCode.PARAM))
    # An op issued by the update may read a tensor produced earlier in the same update (an
    # intermediate of a composite op). At replay that producer writes its *captured* outputs, so
    # the consumer must read those, not the update's own (stale) intermediates.
    captured_of = {}
    replaced = []
    for new, prev in zip(mode.ops, old):
        def remap(a):
            return captured_of.get(id(a), a) if isinstance(a, torch.Tensor) else a
        args, kwargs = pytree.tree_map(remap, (new.args, new.kwargs))
        replaced.append(_RecordedOp(new.func, args, kwargs, prev.outs))
        for produced, captured in zip(pytree.tree_leaves(new.outs), pytree.tree_leaves(prev.outs)):
            if isinstance(produced, torch.Tensor) and isinstance(captured, torch.Tensor):
                captured_of[id(produced)] = captured
    handle.graph._ops[handle.start:handle.end] = replaced
    handle.graph._inputs = handle.graph._external_inputs(handle.graph._ops)


_super_kernel_scopes = threading.local()


def super_kernel_scope_begin(scope_name: Optional[str] = None):
    """Open a super-kernel scope (a fusion hint of graph compilation). Eager work is unaffected: the scope
    names are only kept, per thread, for ``super_kernel_scope_end``."""
    if scope_name is not None and not isinstance(scope_name, str):
        raise TypeError(f"scope_name must be a str or None, got {type(scope_name).__name__}"
                        + pta_error(ErrCode.TYPE))
    _super_kernel_scopes.__dict__.setdefault("stack", []).append(scope_name)


def super_kernel_scope_end(scope_name: Optional[str] = None):
    """Close the innermost super-kernel scope (see ``super_kernel_scope_begin``)."""
    if scope_name is not None and not isinstance(scope_name, str):
        raise TypeError(f"scope_name must be a str or None, got {type(scope_name).__name__}"
                        + pta_error(ErrCode.TYPE))
    stack = _super_kernel_scopes.__dict__.setdefault("stack", [])
    if stack:
        stack.pop()


def make_graphed_callables(callables, sample_args, num_warmup_iters=3, allow_unused_input=False, pool=None):
    """Graphed versions of callables/modules (forward and backward each replay a graph)."""
    just_one = not isinstance(callables, tuple)
    if just_one:
        callables, sample_args = (callables,), (sample_args,)
    graphed = []
    shared_pool = pool if pool is not None else graph_pool_handle()
    for fn, args in zip(callables, sample_args):
        graphed.append(_make_graphed(fn, tuple(args), num_warmup_iters, allow_unused_input, shared_pool))
    return graphed[0] if just_one else tuple(graphed)


def _make_graphed(fn, sample_args, num_warmup_iters, allow_unused_input, pool):
    if isinstance(fn, torch.nn.Module) and (fn._backward_hooks or fn._forward_hooks or fn._forward_pre_hooks):
        raise RuntimeError("Modules must not have hooks registered at the time they are passed. However, "
                           "registering hooks on modules after passing them through make_graphed_callables is "
                           "allowed." + pta_error(ErrCode.NOT_SUPPORT))
    for a in sample_args:
        if not isinstance(a, torch.Tensor):
            raise TypeError("In the beta API, sample_args for each callable must contain only Tensors. Other "
                            "types are not allowed." + pta_error(ErrCode.TYPE))
    params = tuple(fn.parameters()) if isinstance(fn, torch.nn.Module) else ()
    static_inputs = sample_args + params
    grad_inputs = tuple(t for t in static_inputs if t.requires_grad)

    def run_backward(outputs, grad_outputs):
        pairs = [(o, g) for o, g in zip(outputs, grad_outputs) if o.requires_grad]
        if not pairs or not grad_inputs:
            return ()
        return torch.autograd.grad(tuple(o for o, _ in pairs), grad_inputs, tuple(g for _, g in pairs),
                                   allow_unused=allow_unused_input)

    side = torch_npu.npu.Stream()
    with torch_npu.npu.stream(side):
        for _ in range(num_warmup_iters):
            outs = pytree.tree_leaves(fn(*sample_args))
            run_backward(outs, [torch.ones_like(o) for o in outs])
        del outs

    fwd_graph, bwd_graph = NPUGraph(), NPUGraph()
    with graph(fwd_graph, pool=pool):
        static_out = fn(*sample_args)
    flat_out, out_spec = pytree.tree_flatten(static_out)
    static_grad_outputs = [torch.empty_like(o) if o.requires_grad else None for o in flat_out]
    with graph(bwd_graph, pool=pool):
        static_grad_inputs = run_backward(flat_out, static_grad_outputs)

    # Gradients per static input (None where it does not require grad).
    grads_by_input = []
    it = iter(static_grad_inputs)
    for t in static_inputs:
        grads_by_input.append(next(it, None) if t.requires_grad else None)

    class Graphed(torch.autograd.Function):
        @staticmethod
        def forward(ctx, *inputs):
            for static, new in zip(sample_args, inputs[:len(sample_args)]):
                if static.data_ptr() != new.data_ptr():
                    static.copy_(new)
            fwd_graph.replay()
            return tuple(o.detach() for o in flat_out)

        @staticmethod
        def backward(ctx, *grads):
            for static, g in zip(static_grad_outputs, grads):
                if static is not None and g is not None:
                    static.copy_(g)
            bwd_graph.replay()
            return tuple(g.detach() if g is not None else None for g in grads_by_input)

    def functionalized(*user_args):
        out = Graphed.apply(*(tuple(user_args) + params))
        return pytree.tree_unflatten(list(out), out_spec)

    if isinstance(fn, torch.nn.Module):
        original_forward = fn.forward

        def forward(*user_args):
            return functionalized(*user_args) if fn.training == graph_training else original_forward(*user_args)
        graph_training = fn.training
        fn.forward = forward
        return fn
    return functionalized
