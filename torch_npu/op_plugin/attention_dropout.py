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
graph: while only shapes are inferred (Meta / FakeTensor, Dynamo's fake propagation) a
placeholder pair and an all-kept mask stand in, but while a graph is being recorded for
execution (AOTAutograd under torch.compile, make_fx, torch.export: a proxy mode is active)
dropout raises NotImplementedError rather than compile attention without dropout.
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


def _refuse_graph_recording():
    from torch.fx.experimental.proxy_tensor import get_proxy_mode
    if get_proxy_mode() is not None:
        raise NotImplementedError(
            "attention dropout (keep_prob < 1) draws its mask on the host from the npu generator; the "
            "CPU-emulated NPU cannot record it in a graph (torch.compile / make_fx / torch.export). "
            "Run the attention call eagerly (torch.compiler.disable) or use keep_prob=1 in compiled code")


def draw_seed_offset(like):
    """(seed, offset) for one dropout call from the npu default generator of ``like``'s
    device (the current npu device for CPU tensors), advancing its offset; (0, 0) while
    only shapes are inferred (meta / FakeTensor); NotImplementedError while a graph is
    recorded (see the module docstring)."""
    if _is_symbolic(like):
        _refuse_graph_recording()
        return 0, 0
    import torch_npu
    idx = like.device.index if like.device.type == "npu" and like.device.index is not None \
        else torch_npu.npu.current_device()
    state = torch_npu.npu.get_rng_state(idx)
    raw = bytes(state.tolist())
    seed = int.from_bytes(raw[:8], "little")
    offset = int.from_bytes(raw[8:16], "little", signed=True)
    new_state = raw[:8] + (offset + _OFFSET_STEP).to_bytes(8, "little", signed=True)
    torch_npu.npu.set_rng_state(torch.tensor(list(new_state), dtype=torch.uint8), idx)
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
    if _is_symbolic(like):
        _refuse_graph_recording()
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
