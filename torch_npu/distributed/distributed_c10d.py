"""torch_npu's additions to torch.distributed: is_hccl_available, reinit_process_group,
and the uneven / variable-count collectives of torch_npu.distributed."""
import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import _get_default_group

__all__ = ["is_hccl_available", "reinit_process_group", "reduce_scatter_tensor_uneven",
           "all_gather_into_tensor_uneven", "all_to_all_vc"]


def is_hccl_available():
    return "hccl" in dist.Backend.backend_list


def _hccl_backend(group):
    pg = group or _get_default_group()
    return pg._get_backend(torch.device("npu"))


def reinit_process_group(group=None, rebuild_link=True):
    """Re-establish a group's HCCL communicators after a failure.

    The emulated communicator is a Gloo mesh that holds no device state, so there
    is nothing to rebuild unless it was aborted; the group is returned as is."""
    pg = group or _get_default_group()
    _hccl_backend(pg)  # raises if the group has no hccl backend
    return pg


class _DoneWork:
    """What async_op=True returns for a collective made of several calls."""

    def __init__(self, works, finish):
        self._works, self._finish, self._done = works, finish, False

    def wait(self, timeout=None):
        if not self._done:
            for w in self._works:
                w.wait()
            self._finish()
            self._done = True
        return True

    def is_completed(self):
        return self._done


def _run(works, finish, async_op):
    work = _DoneWork(works, finish)
    if async_op:
        return work
    work.wait()
    return None


def reduce_scatter_tensor_uneven(output, input, input_split_sizes=None, op=dist.ReduceOp.SUM, group=None,
                                 async_op=False):
    """Reduce ``input`` over the group and give rank r the r-th piece along dim 0,
    pieces of ``input_split_sizes`` rows (even split when None)."""
    world = dist.get_world_size(group)
    rank = dist.get_rank(group)
    if input_split_sizes is None:
        if input.size(0) % world != 0:
            raise ValueError(f"input dim 0 ({input.size(0)}) is not divisible by the world size ({world}); "
                             "pass input_split_sizes")
        input_split_sizes = [input.size(0) // world] * world
    if len(input_split_sizes) != world or sum(input_split_sizes) != input.size(0):
        raise ValueError(f"input_split_sizes {list(input_split_sizes)} must have {world} entries summing to "
                         f"input.size(0)={input.size(0)}")
    if output.size(0) != input_split_sizes[rank]:
        raise ValueError(f"output dim 0 is {output.size(0)}, expected input_split_sizes[{rank}]="
                         f"{input_split_sizes[rank]}")
    reduced = input.clone()
    work = dist.all_reduce(reduced, op=op, group=group, async_op=True)
    start = sum(input_split_sizes[:rank])
    return _run([work], lambda: output.copy_(reduced.narrow(0, start, input_split_sizes[rank])), async_op)


def all_gather_into_tensor_uneven(output, input, output_split_sizes=None, group=None, async_op=False):
    """Gather every rank's ``input`` (rank r contributes ``output_split_sizes[r]`` rows)
    into ``output`` along dim 0."""
    world = dist.get_world_size(group)
    rank = dist.get_rank(group)
    if output_split_sizes is None:
        if output.size(0) % world != 0:
            raise ValueError(f"output dim 0 ({output.size(0)}) is not divisible by the world size ({world}); "
                             "pass output_split_sizes")
        output_split_sizes = [output.size(0) // world] * world
    if len(output_split_sizes) != world or sum(output_split_sizes) != output.size(0):
        raise ValueError(f"output_split_sizes {list(output_split_sizes)} must have {world} entries summing to "
                         f"output.size(0)={output.size(0)}")
    if input.size(0) != output_split_sizes[rank]:
        raise ValueError(f"input dim 0 is {input.size(0)}, expected output_split_sizes[{rank}]="
                         f"{output_split_sizes[rank]}")
    # Every rank pads its piece to the largest one, gathers, then keeps the real rows.
    longest = max(output_split_sizes)
    padded = input.new_zeros((longest,) + tuple(input.shape[1:]))
    padded[: input.size(0)] = input
    gathered = input.new_empty((longest * world,) + tuple(input.shape[1:]))
    work = dist.all_gather_into_tensor(gathered, padded.contiguous(), group=group, async_op=True)

    def finish():
        offset = 0
        for r, n in enumerate(output_split_sizes):
            output.narrow(0, offset, n).copy_(gathered.narrow(0, r * longest, n))
            offset += n
    return _run([work], finish, async_op)


def all_to_all_vc(output, input, send_count_matrix, group=None, async_op=False):
    """All-to-all with a full count matrix: ``send_count_matrix[i * world + j]``
    elements go from rank i to rank j (both tensors read flat)."""
    world = dist.get_world_size(group)
    rank = dist.get_rank(group)
    counts = [int(c) for c in send_count_matrix]
    if len(counts) != world * world:
        raise ValueError(f"send_count_matrix must have world_size**2 = {world * world} entries, got {len(counts)}")
    send = counts[rank * world:(rank + 1) * world]
    recv = [counts[i * world + rank] for i in range(world)]
    if sum(send) > input.numel() or sum(recv) > output.numel():
        raise ValueError(f"rank {rank} sends {sum(send)} of {input.numel()} input elements and receives "
                         f"{sum(recv)} into {output.numel()} output elements")
    flat_in = input.reshape(-1)[: sum(send)].contiguous()
    flat_out = output.new_empty(sum(recv))
    work = dist.all_to_all_single(flat_out, flat_in, output_split_sizes=recv, input_split_sizes=send, group=group,
                                  async_op=True)
    return _run([work], lambda: output.reshape(-1)[: sum(recv)].copy_(flat_out), async_op)
