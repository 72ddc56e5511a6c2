"""Attention dropout: the keep mask as a pure function of (seed, offset).

As on the NPU, the forward takes a Philox ``(seed, offset)`` pair from the device's
default generator (advancing its offset by 10) and returns it; the backward
(``npu_fusion_attention_grad``) regenerates the very same keep mask from that pair.
Here the mask of a block of ``BLOCK_ROWS`` query rows of one segment comes from a CPU
``torch.Generator`` seeded with a mix of (seed, offset, segment, block): any chunking
of the rows gives the same mask, and nothing of size [B, N, S1, S2] is ever stored.
The bits differ from the NPU's Philox stream (only the distribution and the
reproducibility are emulated).

The (seed, offset) pair and the mask are made on the host, so they cannot be recorded in a
graph. While only shapes are inferred (Meta, a plain FakeTensorMode) a placeholder pair and
an all-kept mask stand in; while a graph is being built (a TracingContext: torch.compile's
Dynamo and AOTAutograd, torch.export; or a proxy mode: make_fx) dropout raises
``DropoutNotTraceable`` (a NotImplementedError that Dynamo takes as a data-dependent operator):
torch.compile then graph-breaks and runs the attention call eagerly, with the eager dropout;
``fullgraph=True`` and make_fx fail loudly. Never attention without dropout.
"""
import torch

__all__ = []

BLOCK_ROWS = 16
# torch_npu's philox_engine_inputs(10): each fusion-attention call advances the offset by 10
_OFFSET_STEP = 10
_MASK64 = (1 << 64) - 1


def _signed64(x):
    x &= _MASK64
    return x - (1 << 64) if x >= (1 << 63) else x


def _is_symbolic(t):
    from torch._subclasses.fake_tensor import is_fake
    return t.device.type == "meta" or is_fake(t)


def _not_traceable_type():
    from torch._subclasses.fake_tensor import DataDependentOutputException

    class DropoutNotTraceable(DataDependentOutputException, NotImplementedError):
        """Dropout's host-side randomness met graph building (see the module docstring)."""
    return DropoutNotTraceable


_NOT_TRACEABLE = []


def _refuse_graph_recording():
    from torch._guards import TracingContext
    from torch.fx.experimental.proxy_tensor import get_proxy_mode
    if TracingContext.try_get() is not None or get_proxy_mode() is not None:
        if not _NOT_TRACEABLE:
            _NOT_TRACEABLE.append(_not_traceable_type())
        raise _NOT_TRACEABLE[0](
            "attention dropout (keep_prob < 1) draws its mask on the host from the npu generator; the "
            "CPU-emulated NPU cannot record it in a graph: torch.compile runs this call eagerly (a graph "
            "break), fullgraph=True / make_fx / torch.export cannot take it (use keep_prob=1 there)")


def draw_seed_offset(like):
    """(seed, offset) for one dropout call from the npu default generator of ``like``'s
    device (the current npu device for CPU tensors), advancing its offset; (0, 0) while
    only shapes are inferred (meta / FakeTensor); NotImplementedError while a graph is
    recorded (see the module docstring), with real tensors too (make_fx's real mode would
    bake this draw into the graph)."""
    _refuse_graph_recording()
    if _is_symbolic(like):
        return 0, 0
    import torch_npu
    idx = like.device.index if like.device.type == "npu" and like.device.index is not None \
        else torch_npu.npu.current_device()
    # the generator's state is [seed: uint64 | offset: int64] (get_rng_state's 16 bytes);
    # read and advanced in place rather than through a state tensor round trip
    torch_npu.npu._lazy_init()
    gen = torch_npu.npu.random._generator(idx)
    seed, offset = gen.initial_seed(), _signed64(gen.get_offset())
    gen.set_offset((offset + _OFFSET_STEP) & _MASK64)
    return _signed64(seed), offset


def _block_seed(seed, offset, segment, block):
    # splitmix64-style mixing: distinct (seed, offset, segment, block) -> unrelated streams
    x = (seed & _MASK64) ^ ((offset & _MASK64) * 0x9E3779B97F4A7C15) ^ (segment * 0xBF58476D1CE4E5B9) \
        ^ (block * 0x94D049BB133111EB)
    x &= _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def keep_rows(seed, offset, segment, i0, i1, lead, s2, keep_prob, like):
    """bool keep mask [*lead, i1 - i0, S2] for query rows [i0, i1) of ``segment``
    (True = kept, probability ``keep_prob``), on ``like``'s device."""
    shape = list(lead) + [i1 - i0, s2]
    _refuse_graph_recording()
    if _is_symbolic(like):
        return torch.ones(shape, dtype=torch.bool, device=like.device)
    parts = []
    for block in range(i0 // BLOCK_ROWS, (i1 + BLOCK_ROWS - 1) // BLOCK_ROWS):
        b0 = block * BLOCK_ROWS
        gen = torch.Generator().manual_seed(_block_seed(seed, offset, segment, block))
        u = torch.rand(list(lead) + [BLOCK_ROWS, s2], generator=gen)
        lo, hi = max(i0, b0) - b0, min(i1, b0 + BLOCK_ROWS) - b0
        parts.append(u[..., lo:hi, :] < keep_prob)
    keep = parts[0] if len(parts) == 1 else torch.cat(parts, dim=-2)
    return keep.to(like.device)
