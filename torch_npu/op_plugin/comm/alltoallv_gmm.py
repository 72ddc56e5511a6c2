"""npu_alltoallv_gmm / npu_gmm_alltoallv: MoE expert-parallel AlltoAllv fused with grouped matmul.

Documented (torch_npu docs, the real op's test golden): with ``W = ep_world_size`` ranks and ``e``
local experts, ``send_counts[r * e + j]`` / ``recv_counts[r * e + j]`` are the tokens exchanged
with rank ``r`` for expert ``j`` (of the receiving rank).

* ``npu_alltoallv_gmm``: ``gmm_x`` rows are ordered (destination rank, expert); AlltoAllv with
  per-rank sums of the counts; Permute regroups the received rows (source rank, expert) to
  (expert, source rank); ``gmm_y[expert j rows] = permute_out[rows] @ gmm_weight[j]``. Outputs
  ``gmm_y (A, N1)``, ``mm_y = mm_x @ mm_weight`` and ``permute_out (A, H1)``.
* ``npu_gmm_alltoallv``: the inverse order: ``gmm_x`` rows are (expert, destination rank); grouped
  matmul, Unpermute to (destination rank, expert), AlltoAllv. Outputs ``y (BSK, N1)`` and ``mm_y``.

Outputs the real op leaves undefined (``mm_y`` without ``mm_x``/``mm_weight``, ``permute_out``
without ``permute_out_flag``) are empty ``(0,)`` tensors here (a Python kernel cannot return an
undefined tensor). Without torch.distributed (or a one-rank ``hcom`` group) the AlltoAllv is the
identity and ``ep_world_size`` must be 1; with more ranks ``hcom`` is resolved to its process group
and ``torch.distributed.all_to_all_single`` runs on it (not differentiated through). Matmuls
accumulate in float32. ``send_counts_tensor``/``recv_counts_tensor`` ("not supported in the current
version") and ``comm_mode`` raise NotImplementedError.
"""
import torch
import torch.distributed as dist

from torch_npu.op_plugin._common import acc, check
from torch_npu.op_plugin._opaque_vjp import recompute_autograd
from torch_npu.op_plugin._registry import opaque_kernel
from torch_npu.op_plugin.comm.matmul_collectives import _world

__all__ = []


def _check_common(op, gmm_x, gmm_weight, world, send_counts, recv_counts, extra):
    for name, value in extra:
        if value is not None:
            raise NotImplementedError("%s: %s is not emulated by the CPU-emulated NPU" % (op, name))
    check(gmm_x.dim() == 2 and gmm_weight.dim() == 3, op, "gmm_x must be 2D and gmm_weight 3D (e, H1, N1)")
    check(gmm_x.is_floating_point() and gmm_weight.dtype == gmm_x.dtype, op,
          "gmm_x and gmm_weight must be float16/bfloat16 of the same dtype")
    e = gmm_weight.shape[0]
    check(len(send_counts) == len(recv_counts) == e * world, op,
          "send_counts and recv_counts must have e * ep_world_size = %d entries, got %d and %d",
          (e * world, len(send_counts), len(recv_counts)))
    return e


def _weight(w, transposed):
    return acc(w.transpose(1, 2) if transposed else w)


def _grouped_mm(rows, weight, sizes, dtype):
    parts = torch.split(acc(rows), sizes)
    return torch.cat([part @ weight[j] for j, part in enumerate(parts)]).to(dtype)


def _shared(op, mm_x, mm_weight, trans, like):
    if mm_x is None or mm_weight is None:
        check(mm_x is None and mm_weight is None, op, "mm_x and mm_weight must be given together")
        return like.new_empty((0,))
    w = mm_weight.t() if trans else mm_weight
    return (acc(mm_x) @ acc(w)).to(mm_x.dtype)


def _blocks(counts, order):
    """Row indices that reorder consecutive blocks of sizes ``counts`` into ``order``."""
    starts = [0]
    for c in counts:
        starts.append(starts[-1] + c)
    index = []
    for b in order:
        index.extend(range(starts[b], starts[b] + counts[b]))
    return index


def _alltoallv(x, group, send_counts, recv_counts, world, e):
    send = [sum(send_counts[r * e:(r + 1) * e]) for r in range(world)]
    recv = [sum(recv_counts[r * e:(r + 1) * e]) for r in range(world)]
    if group is None:
        check(send == recv, "alltoallv", "on one rank send_counts must equal recv_counts")
        return x
    out = x.new_empty((sum(recv),) + tuple(x.shape[1:]))
    dist.all_to_all_single(out, x.contiguous(), recv, send, group=group)
    return out


def _prepare(op, gmm_x, gmm_weight, ep_world_size, send_counts, recv_counts, send_counts_tensor,
             recv_counts_tensor, comm_mode, mm_x, mm_weight, trans_gmm_weight, trans_mm_weight):
    """The checks both float ops share; returns (send_counts, recv_counts as ints, experts per rank,
    the gmm weight as [e, H1, N], the shared-expert matmul's output or None)."""
    send_counts, recv_counts = [int(c) for c in send_counts], [int(c) for c in recv_counts]
    e = _check_common(op, gmm_x, gmm_weight, ep_world_size, send_counts, recv_counts,
                      (("send_counts_tensor", send_counts_tensor), ("recv_counts_tensor", recv_counts_tensor),
                       ("comm_mode", comm_mode)))
    check(sum(send_counts) == gmm_x.shape[0], op, "gmm_x has %d rows, send_counts sum to %d",
          (gmm_x.shape[0], sum(send_counts)))
    weight = _weight(gmm_weight, trans_gmm_weight)
    check(weight.shape[1] == gmm_x.shape[1], op, "H1 of gmm_x and gmm_weight differ")
    return send_counts, recv_counts, e, weight, _shared(op, mm_x, mm_weight, trans_mm_weight, gmm_x)


def _expert_major(recv_counts, world, e, device):
    """Received rows arrive as blocks (rank r, expert j); returns the index that reorders them to
    (expert j, rank r) and the rows per expert."""
    order = [r * e + j for j in range(e) for r in range(world)]
    index = torch.tensor(_blocks(recv_counts, order), dtype=torch.long, device=device)
    return index, [sum(recv_counts[r * e + j] for r in range(world)) for j in range(e)]


def _rank_major(send_counts, world, e, device):
    """Grouped-matmul rows are blocks (expert j, rank r); returns the rows per expert and the index
    that reorders them to (rank r, expert j), the order the exchange sends."""
    sizes = [sum(send_counts[r * e + j] for r in range(world)) for j in range(e)]
    block_counts = [send_counts[r * e + j] for j in range(e) for r in range(world)]
    order = [j * world + r for r in range(world) for j in range(e)]
    return sizes, torch.tensor(_blocks(block_counts, order), dtype=torch.long, device=device)


def _npu_alltoallv_gmm(shapes_only, gmm_x, gmm_weight, hcom, ep_world_size, send_counts, recv_counts, *,
                       send_counts_tensor=None, recv_counts_tensor=None, mm_x=None, mm_weight=None,
                       trans_gmm_weight=False, trans_mm_weight=False, permute_out_flag=False, comm_mode=None):
    """See the module doc."""
    op = "npu_alltoallv_gmm"
    send_counts, recv_counts, e, weight, mm_y = _prepare(
        op, gmm_x, gmm_weight, ep_world_size, send_counts, recv_counts, send_counts_tensor, recv_counts_tensor,
        comm_mode, mm_x, mm_weight, trans_gmm_weight, trans_mm_weight)
    a = sum(recv_counts)
    if shapes_only:  # the fake kernel: shapes only, no exchange
        permute = gmm_x.new_empty((a, gmm_x.shape[1]))
        gmm_y = gmm_x.new_empty((a, weight.shape[2]))
    else:
        group = _world(op, hcom, ep_world_size)
        received = _alltoallv(gmm_x, group, send_counts, recv_counts, ep_world_size, e)
        index, sizes = _expert_major(recv_counts, ep_world_size, e, gmm_x.device)
        permute = received.index_select(0, index)
        gmm_y = _grouped_mm(permute, weight, sizes, gmm_x.dtype)
    return gmm_y, mm_y, permute if permute_out_flag else gmm_x.new_empty((0,))


def _npu_gmm_alltoallv(shapes_only, gmm_x, gmm_weight, hcom, ep_world_size, send_counts, recv_counts, *,
                       send_counts_tensor=None, recv_counts_tensor=None, mm_x=None, mm_weight=None,
                       trans_gmm_weight=False, trans_mm_weight=False, comm_mode=None):
    """See the module doc."""
    op = "npu_gmm_alltoallv"
    send_counts, recv_counts, e, weight, mm_y = _prepare(
        op, gmm_x, gmm_weight, ep_world_size, send_counts, recv_counts, send_counts_tensor, recv_counts_tensor,
        comm_mode, mm_x, mm_weight, trans_gmm_weight, trans_mm_weight)
    if shapes_only:  # the fake kernel: shapes only, no exchange
        return gmm_x.new_empty((sum(recv_counts), weight.shape[2])), mm_y
    world = ep_world_size
    group = _world(op, hcom, world)
    sizes, index = _rank_major(send_counts, world, e, gmm_x.device)
    gmm_y = _grouped_mm(gmm_x, weight, sizes, gmm_x.dtype)
    unpermuted = gmm_y.index_select(0, index)
    return _alltoallv(unpermuted, group, send_counts, recv_counts, world, e), mm_y


# Registered opaque: with more than one rank the AlltoAllv runs on the process group, which
# FakeTensors cannot do; under torch.compile the op stays one graph node running the kernel,
# the fake kernel giving the shapes (no world-size check: no group is consulted). Autograd
# recomputes the kernel's math (the exchange itself is not differentiated, as before).
npu_alltoallv_gmm = opaque_kernel("npu_alltoallv_gmm", _npu_alltoallv_gmm)
npu_gmm_alltoallv = opaque_kernel("npu_gmm_alltoallv", _npu_gmm_alltoallv)


recompute_autograd("npu_alltoallv_gmm", npu_alltoallv_gmm)
recompute_autograd("npu_gmm_alltoallv", npu_gmm_alltoallv)
