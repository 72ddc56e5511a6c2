"""npu_mrope: rotary position embedding read from a cos/sin cache, plain (1-D positions) or
multimodal (3-D positions, Qwen2-VL style ``mrope_section``).

From the op-plugin golden and the aclnnRopeWithSinCosCache formula:

    cos, sin = cos_sin_cache[positions].chunk(2, -1)         # halves of rotary_dim
    positions [3, T]: column c of cos/sin comes from section row src[c]:
        cache_mode "default":    src = 0 for c < s0, 1 for c < s0+s1, 2 after
        cache_mode "interleave": src = 1 for c in 1, 4, .., < 3*s1; 2 for c in 2, 5, .., < 3*s1;
                                 0 elsewhere (the golden uses s1 for both strides)
    x_rot = x[..., :rotary_dim] per head of size head_size, x_pass the rest
    rotary_mode "half":       x1, x2 = x_rot.chunk(2)  ->  cat(o1, o2)
    rotary_mode "interleave": x1, x2 = x_rot[0::2], x_rot[1::2]  ->  interleave(o1, o2)
    o1 = x1 cos - x2 sin,  o2 = x2 cos + x1 sin

query/key are [T, N*head_size] (any shape whose leading dim is T and whose size divides into
heads). Computed in float32 (float64 stays float64), returned in the input dtype.
"""
import torch

from torch_npu.op_plugin._common import check
from torch_npu.op_plugin._registry import impl

__all__ = []


def _section_rows(mrope_section, cache_mode, half):
    """For 3-row positions: which position row feeds each of the rotary_dim/2 columns."""
    src = [0] * half
    if cache_mode == "default":
        s0, s1 = mrope_section[0], mrope_section[1]
        for c in range(half):
            src[c] = 0 if c < s0 else (1 if c < s0 + s1 else 2)
    else:
        stop = min(3 * mrope_section[1], half)
        for c in range(1, stop, 3):
            src[c] = 1
        for c in range(2, stop, 3):
            src[c] = 2
    return src


def _rotate(x, num_tokens, head_size, rotary_dim, cos, sin, neox, cdt):
    heads = x.to(cdt).reshape(num_tokens, -1, head_size)
    rot, rest = heads[..., :rotary_dim], heads[..., rotary_dim:]
    if neox:
        x1, x2 = rot.chunk(2, dim=-1)
    else:
        x1, x2 = rot[..., 0::2], rot[..., 1::2]
    o1 = x1 * cos - x2 * sin
    o2 = x2 * cos + x1 * sin
    rot = torch.cat((o1, o2), -1) if neox else torch.stack((o1, o2), -1).flatten(-2)
    return torch.cat((rot, rest), -1).reshape(x.shape).to(x.dtype)


@impl("npu_mrope")
def npu_mrope(positions, query, key, cos_sin_cache, head_size, *, mrope_section=None, rotary_mode="half",
              cache_mode="default"):
    """Rotary embedding of ``query`` and ``key`` with cos/sin gathered from ``cos_sin_cache``
    [max_pos, rotary_dim] at ``positions`` ([T] or [3, T]). Returns (query_out, key_out)."""
    op = "npu_mrope"
    torch._check(rotary_mode in ("half", "interleave"), lambda: "rotary_mode only support half or interleave")
    torch._check(cache_mode in ("default", "interleave"), lambda: "cache_mode only support default or interleave")
    check(positions.dim() in (1, 2), op, "positions must be [T] or [3, T], got %d-D", positions.dim())
    check(cos_sin_cache.dim() == 2, op, "cos_sin_cache must be 2-D [max_pos, rotary_dim]")
    rotary_dim = cos_sin_cache.shape[-1]
    check(rotary_dim % 2 == 0 and rotary_dim <= head_size, op,
          "rotary_dim %d must be even and <= head_size %d", (rotary_dim, head_size))
    num_tokens = positions.shape[-1]
    for name, t in (("query", query), ("key", key)):
        check(t.shape[0] == num_tokens and t.numel() % (num_tokens * head_size) == 0, op,
              "%s must be [T=%d, N*head_size], got %s", (name, num_tokens, tuple(t.shape)))
    cdt = torch.float64 if query.dtype == torch.float64 else torch.float32
    half = rotary_dim // 2
    gathered = cos_sin_cache.to(cdt).index_select(0, positions.reshape(-1).long())
    cos, sin = gathered.reshape(tuple(positions.shape) + (rotary_dim,)).chunk(2, dim=-1)
    if positions.dim() == 2:
        check(positions.shape[0] == 3, op, "2-D positions must have 3 rows, got %d", positions.shape[0])
        check(mrope_section is not None and len(mrope_section) == 3, op, "positions [3, T] need a 3-entry mrope_section")
        if cache_mode == "default":
            check(sum(mrope_section) == half, op, "mrope_section %s must sum to rotary_dim/2 = %d",
                  (list(mrope_section), half))
        src = torch.tensor(_section_rows(mrope_section, cache_mode, half), device=positions.device)
        cos = torch.where(src == 0, cos[0], torch.where(src == 1, cos[1], cos[2]))
        sin = torch.where(src == 0, sin[0], torch.where(src == 1, sin[1], sin[2]))
    cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)  # [T, 1, rotary_dim/2]
    neox = rotary_mode == "half"
    return (_rotate(query, num_tokens, head_size, rotary_dim, cos, sin, neox, cdt),
            _rotate(key, num_tokens, head_size, rotary_dim, cos, sin, neox, cdt))
