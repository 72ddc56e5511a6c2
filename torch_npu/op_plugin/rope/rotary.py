"""Rotary position embedding ops."""
import torch

from torch_npu.op_plugin._common import acc, check
from torch_npu.op_plugin._registry import impl

__all__ = []

_MODES = ("half", "interleave")


def _check_mode(op, rotary_mode):
    if rotary_mode == "quarter":
        raise NotImplementedError(
            "torch_npu.%s: rotary_mode='quarter' is not emulated yet on the CPU-emulated NPU." % op)
    check(rotary_mode in _MODES, op, "rotary_mode must be 'half' or 'interleave', got %r", (rotary_mode,))


def _rot(x, rotary_mode):
    """``half``: ``x1, x2 = chunk(x, 2, -1)``, ``cat(-x2, x1)``.
    ``interleave``: pairs ``(x[2i], x[2i+1]) -> (-x[2i+1], x[2i])``."""
    if rotary_mode == "half":
        x1, x2 = x.chunk(2, -1)
        return torch.cat((-x2, x1), -1)
    return torch.stack((-x[..., 1::2], x[..., ::2]), -1).flatten(-2)


def _rot_t(g, rotary_mode):
    """Adjoint of :func:`_rot` (also its inverse): ``<g, _rot(x)> = <_rot_t(g), x>``."""
    if rotary_mode == "half":
        g1, g2 = g.chunk(2, -1)
        return torch.cat((g2, -g1), -1)
    return torch.stack((g[..., 1::2], -g[..., ::2]), -1).flatten(-2)


def _check_d(op, x):
    check(x.dim() >= 1 and x.shape[-1] % 2 == 0, op,
          "the last dim of the input must be even, got %s", (tuple(x.shape),))


@impl("npu_rotary_mul")
def npu_rotary_mul(self, r1, r2, rotary_mode="half", rotate=None):
    """RoPE: ``out = x * r1 + rotate(x) * r2`` (r1 = cos, r2 = sin, broadcast to x).

    ``rotary_mode='half'``: ``rotate(x) = cat(-x2, x1)`` with ``x1, x2 = chunk(x, 2, -1)``;
    ``'interleave'``: ``rotate(x)[..., 2i] = -x[..., 2i+1]``, ``rotate(x)[..., 2i+1] = x[..., 2i]``.
    Computed in float32 for float16/bfloat16; the output has ``x``'s shape and dtype.
    The optional ``rotate`` matrix argument is not emulated (NotImplementedError).
    """
    op = "npu_rotary_mul"
    if rotate is not None:
        raise NotImplementedError(
            "torch_npu.npu_rotary_mul: the 'rotate' matrix argument is not emulated yet on the CPU-emulated NPU.")
    _check_mode(op, rotary_mode)
    _check_d(op, self)
    xf = acc(self)
    out = xf * acc(r1) + _rot(xf, rotary_mode) * acc(r2)
    return out.to(self.dtype)


@impl("npu_rotary_mul_backward")
def npu_rotary_mul_backward(grad, self, r1, r2, rotary_mode="half"):
    """Gradients of :func:`npu_rotary_mul`:
    ``dx = grad * r1 + rotate^T(grad * r2)`` (``rotate^T`` the adjoint rotation:
    ``cat(g2, -g1)`` for 'half', pairs ``(g[2i+1], -g[2i])`` for 'interleave'),
    ``dr1 = sum_to(r1.shape, grad * x)``, ``dr2 = sum_to(r2.shape, grad * rotate(x))``.
    Returns ``(dx, dr1, dr2)`` in the dtypes of ``x``, ``r1``, ``r2``."""
    op = "npu_rotary_mul_backward"
    _check_mode(op, rotary_mode)
    _check_d(op, self)
    xf, g = acc(self), acc(grad)
    dx = g * acc(r1) + _rot_t(g * acc(r2), rotary_mode)
    dr1 = (g * xf).sum_to_size(r1.shape)
    dr2 = (g * _rot(xf, rotary_mode)).sum_to_size(r2.shape)
    return dx.to(self.dtype), dr1.to(r1.dtype), dr2.to(r2.dtype)


@impl("npu_apply_rotary_pos_emb")
def npu_apply_rotary_pos_emb(query, key, cos, sin, layout="BSND", rotary_mode="half"):
    """RoPE applied to query and key **in place** (as the NPU kernel does):
    ``query = query * cos + rotate(query) * sin`` and the same for ``key``, with
    ``rotate`` as in :func:`npu_rotary_mul` ('half' or 'interleave'). ``cos``/``sin``
    broadcast to each input (e.g. BSND: q ``[B, S, N, D]``, cos ``[B, S, 1, D]``), so
    ``layout`` (BSND, SBND, BNSD, TND; other strings are read as BSND) only names
    the arrangement. Returns ``(query, key)``, the updated inputs themselves."""
    op = "npu_apply_rotary_pos_emb"
    _check_mode(op, rotary_mode)
    results = []
    for name, t in (("query", query), ("key", key)):
        _check_d(op, t)
        for cname, c in (("cos", cos), ("sin", sin)):
            check(c.dim() <= t.dim() and tuple(torch.broadcast_shapes(t.shape, c.shape)) == tuple(t.shape), op,
                  "%s %s must broadcast to %s %s", (cname, tuple(c.shape), name, tuple(t.shape)))
        tf = acc(t)
        results.append((tf * acc(cos) + _rot(tf, rotary_mode) * acc(sin)).to(t.dtype))
    query.copy_(results[0])
    key.copy_(results[1])
    return query, key
