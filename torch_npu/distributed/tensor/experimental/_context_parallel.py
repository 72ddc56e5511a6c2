"""``context_parallel`` for npu tensors: ring attention over the SDPA kernel the NPU runs.

PyTorch's context parallelism dispatches the CUDA SDPA kernels
(``_scaled_dot_product_flash_attention`` …) to ring attention. On the
emulated NPU, ``F.scaled_dot_product_attention`` runs the CPU flash kernel
``_scaled_dot_product_flash_attention_for_cpu`` (+ ``_backward``), which upstream
has no ring version of, so inside the context these two ops get one here,
built on upstream's ring-attention templates (same load balancing, same
rotation). The other names are upstream's."""
import contextlib

import torch
from torch.distributed.tensor import DTensor, Shard
from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta
from torch.distributed.tensor.experimental import context_parallel as _torch_context_parallel
from torch.distributed.tensor.experimental._context_parallel import (  # noqa: F401
    _CausalBehavior, _context_parallel_shard, _ContextParallel, _cp_options,
    _disable_context_parallel_dispatcher, _enable_context_parallel_dispatcher, _HeadTailLoadBalancer,
    _is_causal_behavior, _LoadBalancer, _PerDocumentHeadTailLoadBalancer, _RotateMethod,
    context_parallel_unshard, set_rotate_method)
from torch.distributed.tensor.experimental._context_parallel._attention import (
    _templated_ring_attention, _templated_ring_attention_backward)

__all__ = ["_CausalBehavior", "_context_parallel_shard", "_ContextParallel", "_cp_options",
           "_disable_context_parallel_dispatcher", "_enable_context_parallel_dispatcher", "_is_causal_behavior",
           "_RotateMethod", "context_parallel", "context_parallel_unshard", "set_rotate_method",
           "_HeadTailLoadBalancer", "_LoadBalancer", "_PerDocumentHeadTailLoadBalancer"]

_aten = torch.ops.aten
_SEQ_DIM = 2  # (batch, heads, seq, head_dim), as upstream assumes


def _local(x):
    return x.to_local() if isinstance(x, DTensor) else x


def _wrap_seq_sharded(local, mesh):
    """A DTensor sharded on the sequence dim around a local result (its global shape follows)."""
    shape = list(local.shape)
    shape[_SEQ_DIM] *= mesh.size()
    stride = torch.empty(shape, device="meta").stride()
    spec = DTensorSpec(mesh, (Shard(_SEQ_DIM),), TensorMeta(torch.Size(shape), stride, local.dtype))
    return DTensor(local, spec, requires_grad=False)


def _mesh_of(args):
    return next(a.device_mesh for a in args if isinstance(a, DTensor))


def _ring_flash_cpu(op_call, args, kwargs):
    mesh = _mesh_of(args)
    query, key, value, *rest = map(_local, args)
    dropout_p = rest[0] if len(rest) > 0 else kwargs.get("dropout_p", 0.0)
    is_causal = rest[1] if len(rest) > 1 else kwargs.get("is_causal", False)
    if kwargs.get("attn_mask") is not None:
        raise NotImplementedError("context_parallel on npu: attn_mask is not supported (use is_causal)")
    out, lse = _templated_ring_attention(
        mesh.get_group(), _SEQ_DIM, _aten._scaled_dot_product_flash_attention_for_cpu,
        query=query, key=key, value=value, is_causal=is_causal, dropout_p=dropout_p,
        scale=kwargs.get("scale"))[:2]
    return _wrap_seq_sharded(out, mesh), _wrap_seq_sharded(lse, mesh)


def _ring_flash_cpu_backward(op_call, args, kwargs):
    mesh = _mesh_of(args)
    grad_out, query, key, value, out, lse, dropout_p, is_causal = map(_local, args[:8])
    if kwargs.get("attn_mask") is not None:
        raise NotImplementedError("context_parallel on npu: attn_mask is not supported (use is_causal)")
    grads = _templated_ring_attention_backward(
        mesh.get_group(), _SEQ_DIM, _aten._scaled_dot_product_flash_attention_for_cpu_backward.default,
        grad_out=grad_out, grad_out_name="grad_out", query=query, key=key, value=value, out=out,
        logsumexp=lse, is_causal=is_causal, dropout_p=dropout_p, scale=kwargs.get("scale"))
    return tuple(_wrap_seq_sharded(g, mesh) for g in grads[:3])


_NPU_SDPA_HANDLERS = {
    _aten._scaled_dot_product_flash_attention_for_cpu.default: _ring_flash_cpu,
    _aten._scaled_dot_product_flash_attention_for_cpu_backward.default: _ring_flash_cpu_backward,
}


@contextlib.contextmanager
def context_parallel(mesh, *, buffers=None, buffer_seq_dims=None, no_restore_buffers=None):
    """``torch.distributed.tensor.experimental.context_parallel`` whose SDPA also rings on npu.

    Not available yet: the ring handlers for the npu SDPA kernel below give
    causal results that differ from full attention, so rather than a silent
    wrong answer this raises (docs/distributed.md)."""
    raise NotImplementedError(
        "torch_npu.distributed.tensor.experimental.context_parallel is not emulated yet on the CPU-emulated NPU: "
        "ring attention over the npu SDPA kernel does not match full attention yet.")
    with _torch_context_parallel(mesh, buffers=buffers, buffer_seq_dims=buffer_seq_dims,
                                 no_restore_buffers=no_restore_buffers):
        # upstream installed its handler dict on entry and replaces it on exit
        DTensor._op_dispatcher._custom_op_handlers.update(_NPU_SDPA_HANDLERS)
        yield
