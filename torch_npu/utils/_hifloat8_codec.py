"""HiFloat8 (HiF8) <-> float conversion, computed with tensor ops on the tensor's device.

HiF8 is Ascend's 8-bit tapered-precision float ("Ascend HiFloat8 Format for
Deep Learning", arXiv 2409.16626). A code is ``sign | dot | exponent | mantissa``;
the prefix-coded dot field gives the stored exponent width D:

    dot  11 -> D=4, 1 mantissa bit      dot 001  -> D=1, 3 mantissa bits
    dot  10 -> D=3, 2 mantissa bits     dot 0001 -> D=0 (E=0), 3 mantissa bits
    dot  01 -> D=2, 3 mantissa bits     dot 0000 -> denormal: 2**(m-23), m = 3-bit field

For D >= 1 the exponent is sign-magnitude with an implicit leading magnitude
bit: first stored bit = exponent sign, |E| = 2**(D-1) + remaining bits, so
E ranges over [-15, 15]. Normal value: ``2**E * (1 + m / 2**mbits)``.
Specials: 0x00 zero (no negative zero), 0x80 NaN, 0x6F/0xEF +-Inf (the slot of
1.5 * 2**15), so the largest finite value is 2**15 = 32768 and the smallest is
2**-22.

Encoding rounds to nearest with ties away from zero (the paper's "TA"
rounding); magnitudes from the midpoint between 32768 and the Inf slot
(40960) up become Inf, those below 2**-23 become zero.
"""
import math

import torch

__all__ = []

NAN_CODE = 0x80
_INF_BODY = 0x6F


def _decode_body(body: int) -> float:
    """Magnitude encoded by the low 7 bits of a HiF8 code (body != Inf slot)."""
    if body >> 5:                       # dot 11 / 10 / 01: D = 4 / 3 / 2
        dot = body >> 5
        width = {0b11: 4, 0b10: 3, 0b01: 2}[dot]
        rest = body & 0x1F
        mbits = 5 - width
    elif body >> 4:                     # dot 001: D = 1
        width, rest, mbits = 1, body & 0x0F, 3
    elif body >> 3:                     # dot 0001: D = 0
        return 1.0 + (body & 7) / 8.0
    else:                               # dot 0000: denormal
        m = body & 7
        return 0.0 if m == 0 else math.ldexp(1.0, m - 23)
    exp_bits, mant = rest >> mbits, rest & ((1 << mbits) - 1)
    negative = exp_bits >> (width - 1)
    magnitude = (1 << (width - 1)) | (exp_bits & ((1 << (width - 1)) - 1))
    exponent = -magnitude if negative else magnitude
    return math.ldexp(1.0 + mant / (1 << mbits), exponent)


def _decode_table():
    values = []
    for code in range(256):
        body, negative = code & 0x7F, code >> 7
        if code == NAN_CODE:
            values.append(math.nan)
        elif body == _INF_BODY:
            values.append(-math.inf if negative else math.inf)
        else:
            v = _decode_body(body)
            values.append(-v if negative else v)
    return values


DECODE_TABLE = _decode_table()          # code -> value (Python floats, exact)

# Non-negative codes sorted by value, and the rounding boundaries between neighbours.
_POSITIVE = sorted((DECODE_TABLE[c], c) for c in range(0x80) if c != _INF_BODY)
_SORTED_CODES = [c for _, c in _POSITIVE] + [_INF_BODY]
_INF_SLOT_VALUE = 1.5 * 2.0 ** 15       # where Inf sits in the encoding, for the last boundary
_BOUNDS = [(a + b) / 2 for (a, _), (b, _) in zip(_POSITIVE, _POSITIVE[1:] + [(_INF_SLOT_VALUE, None)])]

_cache = {}


def _constants(device):
    key = str(device)
    if key not in _cache:
        _cache[key] = (torch.tensor(DECODE_TABLE, dtype=torch.float32, device=device),
                       torch.tensor(_BOUNDS, dtype=torch.float64, device=device),
                       torch.tensor(_SORTED_CODES, dtype=torch.uint8, device=device))
    return _cache[key]


def encode(values: torch.Tensor) -> torch.Tensor:
    """Round float values to HiF8 codes (uint8, same shape and device)."""
    if not values.dtype.is_floating_point:
        values = values.float()
    _, bounds, codes = _constants(values.device)
    wide = values.detach().to(torch.float64)
    magnitude = wide.abs().contiguous()
    index = torch.searchsorted(bounds, magnitude, right=True)   # a tie goes up: away from zero
    out = codes.index_select(0, index.reshape(-1)).reshape(values.shape)
    negative = torch.signbit(wide) & (out != 0)
    out = torch.where(negative, out | 0x80, out)
    return torch.where(torch.isnan(wide), torch.full_like(out, NAN_CODE), out)


def decode(codes: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
    """Values of HiF8 codes (any 8-bit tensor) in ``dtype`` (exact for float32; rounded for 16-bit)."""
    table, _, _ = _constants(codes.device)
    index = codes.detach().contiguous().view(torch.uint8).reshape(-1).to(torch.int64)
    return table.index_select(0, index).reshape(codes.shape).to(dtype)
