"""npu_ffn: ``y = activation(x @ W1 + b1) @ W2 + b2``, per expert when ``expert_tokens`` is given.

Documented (torch_npu docs): without ``expert_tokens`` one FFN over all ``M`` tokens (``x`` may
have 2-8 dims, the last is ``K1``); with ``expert_tokens`` (tokens per expert, summing to ``M``)
consecutive row blocks of ``x`` use ``weight1[e]``/``weight2[e]``/``bias1[e]``/``bias2[e]``. The
output has ``x``'s shape with ``N2`` last and ``x``'s dtype. Computed in float32 (the documented
high-precision mode; ``inner_precise=1`` is computed the same way here).

Emulated activations: ``relu``, ``silu``, ``fastgelu`` (``x / (1 + exp(-1.702|x|)) *
exp(0.851(x - |x|))``, as npu_fast_gelu). Not emulated (NotImplementedError): ``gelu`` (which
approximation the kernel uses is not documented), ``geglu``/``swiglu``/``reglu`` (which half
of ``x @ W1`` is the gate is not documented), ``expert_tokens_index``, and the quantised /
antiquant (int8 weight) scenarios.
"""
import torch

from torch_npu.op_plugin._common import acc, check, unsupported
from torch_npu.op_plugin._registry import impl

__all__ = []

_OP = "npu_ffn"


def _fastgelu(h):
    return h / (1 + torch.exp(-1.702 * h.abs())) * torch.exp(0.851 * (h - h.abs()))


_ACTIVATIONS = {"relu": torch.relu, "silu": torch.nn.functional.silu, "fastgelu": _fastgelu}
_UNDOCUMENTED = {"gelu": "the gelu approximation", "geglu": "the gate half", "swiglu": "the gate half",
                 "reglu": "the gate half"}


def _ffn(x2d, w1, w2, b1, b2, act):
    h = x2d @ acc(w1)
    if b1 is not None:
        h = h + acc(b1)
    h = act(h) @ acc(w2)
    if b2 is not None:
        h = h + acc(b2)
    return h


@impl("npu_ffn")
def npu_ffn(x, weight1, weight2, activation, *, expert_tokens=None, expert_tokens_index=None, bias1=None,
            bias2=None, scale=None, offset=None, deq_scale1=None, deq_scale2=None, antiquant_scale1=None,
            antiquant_scale2=None, antiquant_offset1=None, antiquant_offset2=None, inner_precise=None,
            output_dtype=None):
    """See the module doc."""
    name = activation.lower()
    if name in _UNDOCUMENTED:
        unsupported(_OP, "activation %r (%s is not documented)" % (activation, _UNDOCUMENTED[name]))
    check(name in _ACTIVATIONS, _OP, "activation must be one of fastgelu, gelu, relu, silu, geglu, swiglu, "
          "reglu, got %r", (activation,))
    quant = (scale, offset, deq_scale1, deq_scale2, antiquant_scale1, antiquant_scale2, antiquant_offset1,
             antiquant_offset2)
    if any(t is not None for t in quant) or not x.is_floating_point() or not weight1.is_floating_point():
        unsupported(_OP, "the quantised / antiquant scenario")
    if expert_tokens_index is not None:
        unsupported(_OP, "expert_tokens_index (its meaning is not documented)")
    check(2 <= x.dim() <= 8, _OP, "x must have 2 to 8 dims, got %d", x.dim())
    check(x.dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64), _OP, "x must be float16/bfloat16")
    act = _ACTIVATIONS[name]
    k1 = x.shape[-1]
    rows = acc(x).reshape(-1, k1)
    if expert_tokens is None:
        check(weight1.dim() == 2 and weight2.dim() == 2, _OP, "weight1/weight2 must be [K1, N1]/[K2, N2] without experts")
        check(weight1.shape[0] == k1 and weight1.shape[1] == weight2.shape[0], _OP,
              "shapes x %s, weight1 %s, weight2 %s do not chain", (tuple(x.shape), tuple(weight1.shape),
                                                                    tuple(weight2.shape)))
        out = _ffn(rows, weight1, weight2, bias1, bias2, act)
    else:
        counts = [int(c) for c in expert_tokens]
        check(weight1.dim() == 3 and weight2.dim() == 3 and weight1.shape[0] == len(counts) == weight2.shape[0], _OP,
              "weight1/weight2 must be [E, K1, N1]/[E, K2, N2] with E = len(expert_tokens) = %d", len(counts))
        check(sum(counts) == rows.shape[0], _OP, "expert_tokens sum %d must equal M=%d", (sum(counts), rows.shape[0]))
        parts = torch.split(rows, counts)
        out = torch.cat([_ffn(part, weight1[e], weight2[e], None if bias1 is None else bias1[e],
                              None if bias2 is None else bias2[e], act) for e, part in enumerate(parts)])
    return out.to(x.dtype).reshape(tuple(x.shape[:-1]) + (out.shape[-1],))
