"""npu_convert_weight_to_int4pack, and the int4 unpacking that consumes its output.

Packing (torch_npu docs, ``torch_npu-npu_convert_weight_to_int4pack.md``; op-plugin's
ConvertWeightToInt4Pack adapter and its test golden): ``weight`` is int32 ``(d0, d1)``
holding int4 values in ``[-8, 7]``; each group of 8 consecutive elements along the last
dim becomes one int32 of the ``(d0, d1 / 8)`` result. Element ``j`` of a group occupies
bits ``4j .. 4j+3`` (element 0 in the lowest nibble), stored as its 4-bit two's
complement (``value & 0xF``): the "interleaved" placement the doc speaks of.

The real adapter masks each value to its low 4 bits without a range check, so values
outside ``[-8, 7]`` wrap (e.g. 9 packs as -7); the emulation does the same, and so needs
no host read of the values. ``inner_k_tiles`` is documented as reserved and unused and is
ignored, as on hardware. An input tagged FRACTAL_NZ gives a result tagged FRACTAL_NZ
(the real op re-lays the packed data out as NZ; here formats are a storage tag and the
data stays ND), with the same ``(d0, d1 / 8)`` shape.

Consumers (``npu_weight_quant_batchmatmul`` int32 weights): a packed ``(k, n / 8)``
tensor is read along its last dim; a packed ``(n, k / 8)`` tensor passed transposed (a
``(k / 8, n)`` view whose last two dims are swapped strides of a contiguous tensor) is
read along dim -2, as op-plugin's ``is_transpose_last_two_dims`` rule decides.
"""
import torch

from torch_npu.op_plugin._common import check
from torch_npu.op_plugin._registry import impl
from torch_npu.op_plugin.tensor import formats

__all__ = []

NIBBLES_PER_INT32 = 8
_FRACTAL_NZ = 29


def _nibble_shifts(device):
    return torch.arange(0, 4 * NIBBLES_PER_INT32, 4, dtype=torch.int64, device=device)


def pack_int4(values):
    """int32 ``[..., d]`` (``d % 8 == 0``) -> int32 ``[..., d / 8]``, element 0 of each group of
    8 in the lowest nibble; each value contributes its low 4 bits."""
    groups = values.reshape(*values.shape[:-1], values.shape[-1] // NIBBLES_PER_INT32, NIBBLES_PER_INT32)
    nibbles = groups.to(torch.int64).bitwise_and(0xF)
    # The 8 nibbles occupy disjoint bits, so their sum is their bitwise OR (0 .. 2^32 - 1).
    word = nibbles.bitwise_left_shift(_nibble_shifts(values.device)).sum(-1)
    # Reinterpret the unsigned 32-bit word as int32 (two's complement).
    word = torch.where(word >= 2 ** 31, word - 2 ** 32, word)
    return word.to(torch.int32)


def unpack_int4(packed, dim=-1):
    """Inverse of ``pack_int4`` along ``dim``: int32 with ``size(dim) = s`` -> int32 with
    ``size(dim) = 8 * s``, values sign-extended to ``[-8, 7]``."""
    moved = packed.movedim(dim, -1).to(torch.int64)
    nibbles = moved.unsqueeze(-1).bitwise_right_shift(_nibble_shifts(packed.device)).bitwise_and(0xF)
    signed = torch.where(nibbles >= 8, nibbles - 16, nibbles).to(torch.int32)
    return signed.reshape(*moved.shape[:-1], moved.shape[-1] * NIBBLES_PER_INT32).movedim(-1, dim)


def is_transposed_last_two(t):
    """op-plugin's ``is_transpose_last_two_dims``: the last two dims are the swapped
    dims of a contiguous tensor that covers its whole storage (2-d or 3-d)."""
    if t.dim() not in (2, 3):
        return False
    rows, cols = t.shape[-2], t.shape[-1]
    if t.stride(-2) != 1 or t.stride(-1) != rows:
        return False
    if t.dim() == 3 and t.stride(0) != rows * cols:
        return False
    storage_elements = t.untyped_storage().nbytes() // t.element_size()
    return t.storage_offset() == 0 and t.numel() == storage_elements


def unpack_int4_weight(weight, op):
    """int32-packed int4 matmul weight -> int32 ``(k, n)`` values in ``[-8, 7]``.

    ``(k, n / 8)`` packed along n, or the transposed view ``(k / 8, n)`` of a contiguous
    ``(n, k / 8)`` tensor packed along k (see the module doc)."""
    check(weight.dtype == torch.int32, op, "int4 weight must be int32-packed, got %s", weight.dtype)
    check(weight.dim() == 2, op, "weight must be 2-d, got %d dims", weight.dim())
    return unpack_int4(weight, dim=-2 if is_transposed_last_two(weight) else -1)


@impl("npu_convert_weight_to_int4pack")
def npu_convert_weight_to_int4pack(weight, inner_k_tiles=0):
    """Pack int32 int4 values ``(d0, d1)`` into int32 ``(d0, d1 / 8)``, 8 per int32, element
    ``j`` of each group of 8 in bits ``4j .. 4j+3`` (see the module doc)."""
    op = "npu_convert_weight_to_int4pack"
    check(weight.is_contiguous(), op, "weight should be contiguous")
    check(weight.dim() == 2, op, "weight shape only support dim num 2, but it is %d", weight.dim())
    check(weight.dtype == torch.int32, op, "weight dtype only support int32, but it is %s", weight.dtype)
    check(weight.shape[0] > 0 and weight.shape[1] > 0, op, "weight dim should be greater than 0")
    check(weight.shape[1] % NIBBLES_PER_INT32 == 0, op,
          "weight last dim should be the multiple of 8, but it is %d", weight.shape[1])
    packed = pack_int4(weight)
    if formats._format_of(weight) == _FRACTAL_NZ:
        formats._tag(packed, _FRACTAL_NZ, op)
    return packed
