"""npu_chunk_gated_delta_rule: the chunked (prefill) gated delta rule, computed token by token.

Documented formula, per sequence b (``actual_seq_lengths[b]`` tokens packed along T, per-batch
lengths as the op-plugin golden uses them) and value head h (key/query head h // (Nv / Nk)),
from S = initial_state[b, h] [Dv, Dk]:

    alpha_t = exp(g[t, h])                        (g absent: alpha = 1)
    S = alpha_t S + beta[t, h] (v[t, h] - alpha_t S k[t]) k[t]^T
    o[t, h] = S (scale q[t])

The chunked kernel is an algebraic re-arrangement of this recurrence (the op-plugin golden
checks it against the same sequential form), so the emulator runs the recurrence directly,
in float32. Returns (o [T, Nv, Dv] bfloat16, as op-plugin allocates it; final_state shaped
and typed like initial_state). beta, initial_state, actual_seq_lengths and scale are required
(op-plugin checks them). actual_seq_lengths is read on the host, so the op is registered opaque
(one torch.compile graph node with a fake kernel for the shapes); it has no backward (none in
torch_npu either).
"""
import torch

from torch_npu.op_plugin._common import check
from torch_npu.op_plugin._opaque_vjp import non_differentiable
from torch_npu.op_plugin._registry import opaque

__all__ = []


def _chunk_gated_delta_rule_fake(query, key, value, *, beta=None, initial_state=None, actual_seq_lengths=None,
                                 scale=None, g=None):
    op = "npu_chunk_gated_delta_rule"
    check(value.dim() == 3, op, "value dim should be 3, got %d", value.dim())
    check(beta is not None, op, "beta cannot be empty")
    check(initial_state is not None, op, "initial_state cannot be empty")
    check(actual_seq_lengths is not None, op, "actual_seq_lengths cannot be empty")
    check(scale is not None, op, "scale cannot be empty")
    return value.new_empty(tuple(value.shape), dtype=torch.bfloat16), torch.empty_like(initial_state)


@opaque("npu_chunk_gated_delta_rule", fake=_chunk_gated_delta_rule_fake)
def npu_chunk_gated_delta_rule(query, key, value, *, beta=None, initial_state=None, actual_seq_lengths=None,
                               scale=None, g=None):
    op = "npu_chunk_gated_delta_rule"
    check(value.dim() == 3, op, "value dim should be 3, got %d", value.dim())
    check(beta is not None, op, "beta cannot be empty")
    check(initial_state is not None, op, "initial_state cannot be empty")
    check(actual_seq_lengths is not None, op, "actual_seq_lengths cannot be empty")
    check(scale is not None, op, "scale cannot be empty")
    check(query.dim() == 3 and tuple(key.shape) == tuple(query.shape), op, "query and key must be [T, Nk, Dk]")
    for name, t in (("query", query), ("key", key), ("value", value), ("beta", beta)):
        check(t.dtype == torch.bfloat16, op, "%s dtype must be bfloat16, got %s", (name, t.dtype))
    check(initial_state.dtype in (torch.bfloat16, torch.float32), op,
          "initial_state dtype must be bfloat16 or float32, got %s", initial_state.dtype)
    t_total, nk, dk = query.shape
    nv, dv = value.shape[1], value.shape[2]
    check(value.shape[0] == t_total and nv % nk == 0, op, "value must be [T=%d, Nv, Dv] with Nv a multiple of Nk=%d", (t_total, nk))
    check(tuple(beta.shape) == (t_total, nv), op, "beta must be [T=%d, Nv=%d]", (t_total, nv))
    check(initial_state.dim() == 4 and tuple(initial_state.shape[1:]) == (nv, dv, dk), op,
          "initial_state must be [B, Nv=%d, Dv=%d, Dk=%d], got %s", (nv, dv, dk, tuple(initial_state.shape)))
    if g is not None:
        check(g.dtype == torch.float32 and tuple(g.shape) == (t_total, nv), op, "g must be float32 [T=%d, Nv=%d]", (t_total, nv))
    check(actual_seq_lengths.dim() == 1 and actual_seq_lengths.shape[0] == initial_state.shape[0], op,
          "actual_seq_lengths must be [B=%d]", initial_state.shape[0])
    lengths = [int(x) for x in actual_seq_lengths.tolist()]
    check(min(lengths) >= 0 and sum(lengths) == t_total, op, "actual_seq_lengths must be >= 0 and sum to T=%d, "
          "got %s", (t_total, lengths))
    cdt = torch.float32
    rep = nv // nk
    q = query.to(cdt).repeat_interleave(rep, dim=1) * scale        # [T, Nv, Dk]
    k = key.to(cdt).repeat_interleave(rep, dim=1)
    v = value.to(cdt)
    b_t = beta.to(cdt)
    alpha = torch.ones(t_total, nv, dtype=cdt, device=query.device) if g is None else torch.exp(g.to(cdt))
    outs, finals, start = [], [], 0
    for b, length in enumerate(lengths):
        s = initial_state[b].to(cdt)                              # [Nv, Dv, Dk]
        for t in range(start, start + length):
            s = alpha[t].view(nv, 1, 1) * s
            err = v[t] - torch.einsum("hvk,hk->hv", s, k[t])
            s = s + b_t[t].view(nv, 1, 1) * err.unsqueeze(-1) * k[t].unsqueeze(-2)
            outs.append(torch.einsum("hvk,hk->hv", s, q[t]))
        finals.append(s)
        start += length
    out = torch.stack(outs) if outs else value.new_empty((0, nv, dv), dtype=cdt)
    return out.to(torch.bfloat16), torch.stack(finals).to(initial_state.dtype)


non_differentiable("npu_chunk_gated_delta_rule")
