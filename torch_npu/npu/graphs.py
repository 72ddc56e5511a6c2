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

__all__ = ["NPUGraph", "graph", "graph_pool_handle", "is_current_stream_capturing", "make_graphed_callables"]

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


class _CaptureMode(TorchDispatchMode):
    def __init__(self, ops: List[_RecordedOp]):
        super().__init__()
        self.ops = ops

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _HOST_OPS or _is_host_copy(func, args, kwargs):
            raise RuntimeError(f"NPU error: {func.name()}: {_NOT_PERMITTED}. Reading device values on the host "
                               f"is not allowed inside an NPU graph capture." + pta_error(ErrCode.NOT_SUPPORT))
        out = func(*args, **kwargs)
        self.ops.append(_RecordedOp(func, args, kwargs, out))
        return out


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
        self._mode = _CaptureMode(recorded)
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
