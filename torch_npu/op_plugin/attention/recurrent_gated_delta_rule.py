"""Gated delta rule recurrence (linear attention, Qwen3-Next style):
npu_recurrent_gated_delta_rule (state updated in place) and its _functional twin.

Per sequence i (``actual_seq_lengths[i]`` tokens packed along T) and value head h, with
key/query head ``h // (Nv / Nk)``, the state S [Dv, Dk] starts from
``state[ssm_state_indices[first token]]`` (with ``num_accepted_tokens``: from the slot of
token ``first + num_accepted_tokens[i] - 1``) and for every token t:

    S = S * exp(g[t, h])                                   (g: log decay, default 0)
    S = S + beta[t, h] * (v[t, h] - S @ k[t]) outer k[t]   (beta default 1)
    o[t, h] = S @ (scale * q[t])                           (scale default Dk ** -0.5)
    state[ssm_state_indices[t], h] = S

as in the op-plugin golden. Computed in float32 (float64 stays float64); ``o`` has the
value's dtype, the state keeps its dtype. ``gk`` (per-key-channel decay) is not emulated:
its formula is not in the docs.

The functional op is registered opaque (lengths, slots and accepted counts are read on the
host; gradients recompute the kernel, ``_opaque_vjp``); the in-place op calls it and copies
the new state, so both compile to one node (plus the traced copy).
"""
import torch

from torch_npu.op_plugin._common import check
from torch_npu.op_plugin._opaque_vjp import recompute_autograd
from torch_npu.op_plugin._registry import impl, opaque

__all__ = []


def _int_list(t, what, op):
    check(t.dim() == 1, op, "%s must be 1-D, got %d-D", (what, t.dim()))
    return [int(x) for x in t.tolist()]


def _check_shapes(op, query, key, value, state, gk):
    """The checks that need no tensor values."""
    if gk is not None:
        raise NotImplementedError("%s: argument gk is not emulated on the CPU-emulated NPU "
                                  "(per-key decay formula not documented)" % op)
    check(query.dim() == 3 and key.dim() == 3 and value.dim() == 3, op,
          "query, key and value must be 3-D (T, N, D)")
    t_total, nk, dk = query.shape
    check(tuple(key.shape) == (t_total, nk, dk), op, "key shape %s differs from query's %s", (tuple(key.shape), tuple(query.shape)))
    check(value.shape[0] == t_total, op, "value has %d tokens, query %d", (value.shape[0], t_total))
    nv, dv = value.shape[1], value.shape[2]
    check(nv % nk == 0, op, "value heads %d are not a multiple of key heads %d", (nv, nk))
    check(state.dim() == 4 and tuple(state.shape[1:]) == (nv, dv, dk), op,
          "state must be (slots, %d, %d, %d), got %s", (nv, dv, dk, tuple(state.shape)))


def _recurrence(op, query, key, value, state, beta, scale, actual_seq_lengths, ssm_state_indices,
                num_accepted_tokens, g, gk):
    """Returns (o, new_state); ``state`` itself is not written."""
    _check_shapes(op, query, key, value, state, gk)
    t_total, nk, dk = query.shape
    nv, dv = value.shape[1], value.shape[2]
    o_dtype = value.dtype
    lengths = [t_total] if actual_seq_lengths is None else _int_list(actual_seq_lengths, "actual_seq_lengths", op)
    check(sum(lengths) == t_total and min(lengths) >= 0, op,
          "actual_seq_lengths must be >= 0 and sum to T=%d, got %s", (t_total, lengths))
    slots = list(range(t_total)) if ssm_state_indices is None else _int_list(ssm_state_indices, "ssm_state_indices", op)
    check(len(slots) == t_total, op, "ssm_state_indices needs T=%d entries, got %d", (t_total, len(slots)))
    accepted = None if num_accepted_tokens is None else _int_list(num_accepted_tokens, "num_accepted_tokens", op)
    check(accepted is None or len(accepted) == len(lengths), op, "num_accepted_tokens needs one entry per sequence")

    cdt = torch.float64 if torch.float64 in (state.dtype, query.dtype) else torch.float32
    q = query.to(cdt) * (dk ** -0.5 if scale is None else scale)
    k, v = key.to(cdt), value.to(cdt)
    decay = None if g is None else torch.exp(g.to(cdt))
    b_ = None if beta is None else beta.to(cdt)
    group = nv // nk
    q = q.repeat_interleave(group, dim=1)  # [T, Nv, Dk]
    k = k.repeat_interleave(group, dim=1)
    new_state = state.to(cdt).clone()
    outs = []
    start = 0
    for i, n in enumerate(lengths):
        if n == 0:
            continue
        first = start if accepted is None else start + accepted[i] - 1
        check(start <= first < start + max(n, 1), op, "num_accepted_tokens[%d] out of range", i)
        s = new_state[slots[first]]  # [Nv, Dv, Dk]; earlier sequences' writes are visible
        for t in range(start, start + n):
            if decay is not None:
                s = s * decay[t].view(nv, 1, 1)
            pred = torch.matmul(s, k[t].unsqueeze(-1)).squeeze(-1)  # [Nv, Dv]
            delta = v[t] - pred
            if b_ is not None:
                delta = delta * b_[t].view(nv, 1)
            s = s + delta.unsqueeze(-1) * k[t].unsqueeze(-2)
            new_state = new_state.index_put((torch.tensor([slots[t]], device=state.device),), s.unsqueeze(0))
            outs.append(torch.matmul(s, q[t].unsqueeze(-1)).squeeze(-1))
        start += n
    o = torch.stack(outs) if outs else v.new_zeros((0, nv, dv))
    return o.to(o_dtype), new_state.to(state.dtype)


@impl("npu_recurrent_gated_delta_rule")
def npu_recurrent_gated_delta_rule(query, key, value, state, *, beta=None, scale=None, actual_seq_lengths=None,
                                   ssm_state_indices=None, num_accepted_tokens=None, g=None, gk=None):
    """Gated delta rule recurrence over packed sequences (see the module docstring):
    query/key (T, Nk, Dk), value (T, Nv, Dv), state (slots, Nv, Dv, Dk) updated in place at
    ``ssm_state_indices``; returns o (T, Nv, Dv). ``gk`` raises NotImplementedError.
    Runs the opaque functional op and copies its new state into ``state``, so under
    torch.compile the recurrence stays one graph node and the write is a traced copy."""
    _check_shapes("npu_recurrent_gated_delta_rule", query, key, value, state, gk)
    o, new_state = torch.ops.npu.npu_recurrent_gated_delta_rule_functional(
        query, key, value, state, beta=beta, scale=scale, actual_seq_lengths=actual_seq_lengths,
        ssm_state_indices=ssm_state_indices, num_accepted_tokens=num_accepted_tokens, g=g, gk=gk)
    with torch.no_grad():
        state.copy_(new_state)
    return o


def _functional_fake(query, key, value, state, *, beta=None, scale=None, actual_seq_lengths=None,
                     ssm_state_indices=None, num_accepted_tokens=None, g=None, gk=None):
    _check_shapes("npu_recurrent_gated_delta_rule_functional", query, key, value, state, gk)
    return value.new_empty(value.shape), state.new_empty(state.shape)


# opaque: lengths, state slots and accepted-token counts are read on the host; autograd
# recomputes this kernel (its ATen math) in the backward
@opaque("npu_recurrent_gated_delta_rule_functional", fake=_functional_fake)
def npu_recurrent_gated_delta_rule_functional(query, key, value, state, *, beta=None, scale=None,
                                              actual_seq_lengths=None, ssm_state_indices=None,
                                              num_accepted_tokens=None, g=None, gk=None):
    """npu_recurrent_gated_delta_rule without mutation: returns (o, new state)."""
    return _recurrence("npu_recurrent_gated_delta_rule_functional", query, key, value, state, beta, scale,
                       actual_seq_lengths, ssm_state_indices, num_accepted_tokens, g, gk)


recompute_autograd("npu_recurrent_gated_delta_rule_functional", npu_recurrent_gated_delta_rule_functional)
