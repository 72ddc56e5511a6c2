"""The gated delta rule ops (npu_recurrent_gated_delta_rule, npu_chunk_gated_delta_rule) against
float64 recurrences."""
import math

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import torch_npu

from _op_helpers import DEVICES, close_tol as _close, randn_scaled as rand, zeros as _r


def ref_delta_rule(q, k, v, state, beta, scale, lengths, slots, g, accepted):
    q, k, v = q.double(), k.double(), v.double()
    st = state.double().clone()
    t_, nk, dk = q.shape
    nv = v.shape[1]
    o = torch.zeros(v.shape, dtype=torch.float64)
    start = 0
    for i, n in enumerate(lengths):
        first = start if accepted is None else start + accepted[i] - 1
        for h in range(nv):
            hk = h // (nv // nk)
            s = st[slots[first], h].clone()
            for t in range(start, start + n):
                s = s * (math.exp(float(g[t, h])) if g is not None else 1.0)
                pred = s @ k[t, hk]
                bt = float(beta[t, h]) if beta is not None else 1.0
                s = s + torch.outer((v[t, h] - pred) * bt, k[t, hk])
                st[slots[t], h] = s
                o[t, h] = s @ (q[t, hk] * scale)
        start += n
    return o, st


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 3e-2)])
def test_recurrent_gated_delta_rule(device, dtype, tol):
    lengths, nk, nv, dk, dv = [2, 3, 1], 2, 4, 8, 6
    t = sum(lengths)
    q = torch.nn.functional.normalize(rand((t, nk, dk), seed=20), dim=-1).to(dtype)
    k = torch.nn.functional.normalize(rand((t, nk, dk), seed=21), dim=-1).to(dtype)
    v = rand((t, nv, dv), dtype, 22)
    state = rand((t + 2, nv, dv, dk), dtype, 23, 0.5)
    g = -rand((t, nv), seed=24).abs() * 0.3
    beta = rand((t, nv), seed=25).sigmoid().to(dtype)
    slots = [3, 0, 7, 1, 2, 5]
    accepted = [2, 1, 1]
    args = dict(beta=beta.to(device), scale=0.5, actual_seq_lengths=torch.tensor(lengths, dtype=torch.int32).to(device),
                ssm_state_indices=torch.tensor(slots, dtype=torch.int32).to(device), g=g.to(device),
                num_accepted_tokens=torch.tensor(accepted, dtype=torch.int32).to(device))
    eo, es = ref_delta_rule(q, k, v, state, beta, 0.5, lengths, slots, g, accepted)
    st = state.to(device).clone()
    o = torch_npu.npu_recurrent_gated_delta_rule(q.to(device), k.to(device), v.to(device), st, **args)
    assert o.dtype == dtype and o.device.type == device
    torch.testing.assert_close(o.cpu().double(), eo, rtol=tol, atol=tol)
    torch.testing.assert_close(st.cpu().double(), es, rtol=tol, atol=tol)
    st2 = state.to(device).clone()
    o2, s2 = torch_npu.npu_recurrent_gated_delta_rule_functional(q.to(device), k.to(device), v.to(device), st2, **args)
    assert torch.equal(st2.cpu(), state)  # functional leaves its input alone
    torch.testing.assert_close(o2.cpu().double(), eo, rtol=tol, atol=tol)
    torch.testing.assert_close(s2.cpu().double(), es, rtol=tol, atol=tol)


def test_recurrent_gated_delta_rule_defaults_grad_fake():
    t, nk, nv, dk, dv = 3, 1, 2, 4, 3
    q = rand((t, nk, dk), torch.float64, 30).requires_grad_()
    k = torch.nn.functional.normalize(rand((t, nk, dk), torch.float64, 31), dim=-1).requires_grad_()
    v = rand((t, nv, dv), torch.float64, 32).requires_grad_()
    state = rand((t, nv, dv, dk), torch.float64, 33)
    o, _ = torch_npu.npu_recurrent_gated_delta_rule_functional(q, k, v, state)
    eo, _ = ref_delta_rule(q.detach(), k.detach(), v.detach(), state, None, dk ** -0.5, [t], list(range(t)), None, None)
    torch.testing.assert_close(o.detach(), eo)
    torch.autograd.gradcheck(lambda a, b, c: torch_npu.npu_recurrent_gated_delta_rule_functional(a, b, c, state)[0],
                             (q, k, v))
    with FakeTensorMode():
        o, s = torch_npu.npu_recurrent_gated_delta_rule_functional(
            torch.empty(5, 2, 8), torch.empty(5, 2, 8), torch.empty(5, 4, 6), torch.empty(9, 4, 6, 8))
        assert o.shape == (5, 4, 6) and s.shape == (9, 4, 6, 8)
    with pytest.raises(NotImplementedError, match="gk"):
        torch_npu.npu_recurrent_gated_delta_rule_functional(q.detach(), k.detach(), v.detach(), state,
                                                            gk=torch.zeros(t, nv, dk, dtype=torch.float64))


ops = torch.ops.npu


f16, bf16, f32, i32 = torch.float16, torch.bfloat16, torch.float32, torch.int32


def _gdr_ref(q, k, v, beta, state, lengths, scale, g):
    """Documented recurrence in float64, token by token."""
    t_total, nk, dk = q.shape
    nv, dv = v.shape[1], v.shape[2]
    out = torch.zeros(t_total, nv, dv, dtype=torch.float64)
    finals, start = [], 0
    for b, length in enumerate(lengths):
        s = state[b].double().clone()
        for t in range(start, start + length):
            for h in range(nv):
                kh, qh = k[t, h // (nv // nk)].double(), q[t, h // (nv // nk)].double()
                a = math.exp(float(g[t, h])) if g is not None else 1.0
                s[h] = a * s[h] + float(beta[t, h]) * torch.outer(v[t, h].double() - a * s[h] @ kh, kh)
                out[t, h] = s[h] @ (qh * scale)
        finals.append(s)
        start += length
    return out, torch.stack(finals)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("with_g,state_dtype", [(True, torch.float32), (False, torch.bfloat16)])
def test_chunk_gated_delta_rule(device, with_g, state_dtype):
    gen = torch.Generator().manual_seed(24)
    lengths, nk, nv, dk, dv = [3, 0, 4], 1, 2, 8, 4
    t_total = sum(lengths)
    q = torch.nn.functional.normalize(torch.randn(t_total, nk, dk, generator=gen), dim=-1).bfloat16()
    k = torch.nn.functional.normalize(torch.randn(t_total, nk, dk, generator=gen), dim=-1).bfloat16()
    v = torch.randn(t_total, nv, dv, generator=gen).bfloat16()
    beta = torch.rand(t_total, nv, generator=gen).bfloat16()
    g = -torch.rand(t_total, nv, generator=gen) if with_g else None
    state = torch.randn(3, nv, dv, dk, generator=gen).to(state_dtype)
    o, final = torch_npu.npu_chunk_gated_delta_rule(
        q.to(device), k.to(device), v.to(device), beta=beta.to(device), initial_state=state.to(device),
        actual_seq_lengths=torch.tensor(lengths, dtype=torch.int32).to(device), scale=dk ** -0.5,
        g=None if g is None else g.to(device))
    r_o, r_final = _gdr_ref(q, k, v, beta, state, lengths, dk ** -0.5, g)
    assert o.shape == (t_total, nv, dv) and o.dtype == torch.bfloat16
    assert final.shape == state.shape and final.dtype == state_dtype
    _close(o, r_o, 3e-2, 2e-2)
    _close(final, r_final, 3e-2 if state_dtype == torch.bfloat16 else 1e-4, 2e-2)


def test_chunk_gated_delta_rule_fake_and_compile():
    with FakeTensorMode():
        o, final = ops.npu_chunk_gated_delta_rule(
            _r(10, 2, 16, dtype=bf16), _r(10, 2, 16, dtype=bf16), _r(10, 4, 32, dtype=bf16),
            beta=_r(10, 4, dtype=bf16), initial_state=_r(3, 4, 32, 16), actual_seq_lengths=_r(3, dtype=i32),
            scale=0.25)
    assert (tuple(o.shape), o.dtype, tuple(final.shape), final.dtype) == ((10, 4, 32), bf16, (3, 4, 32, 16), f32)
    gen = torch.Generator().manual_seed(26)
    q = torch.nn.functional.normalize(torch.randn(4, 1, 8, generator=gen), dim=-1).bfloat16()
    v, beta = torch.randn(4, 1, 4, generator=gen).bfloat16(), torch.rand(4, 1, generator=gen).bfloat16()
    st, lens = torch.randn(2, 1, 4, 8, generator=gen), torch.tensor([1, 3], dtype=torch.int32)

    def f(q, v, beta, st, lens):
        return torch_npu.npu_chunk_gated_delta_rule(q, q, v, beta=beta, initial_state=st, actual_seq_lengths=lens,
                                                    scale=0.5)
    eager = f(q, v, beta, st, lens)
    compiled = torch.compile(f, backend="aot_eager", fullgraph=True)(q, v, beta, st, lens)
    assert torch.equal(eager[0], compiled[0]) and torch.equal(eager[1], compiled[1])


def test_chunk_gated_delta_rule_errors():
    x = torch.zeros(4, 1, 8, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="sum to T=4"):
        torch_npu.npu_chunk_gated_delta_rule(x, x, torch.zeros(4, 1, 4, dtype=torch.bfloat16),
                                             beta=torch.zeros(4, 1, dtype=torch.bfloat16),
                                             initial_state=torch.zeros(1, 1, 4, 8),
                                             actual_seq_lengths=torch.tensor([3], dtype=torch.int32), scale=1.0)
    with pytest.raises(RuntimeError, match="query dtype must be bfloat16"):
        torch_npu.npu_chunk_gated_delta_rule(x.float(), x.float(), torch.zeros(4, 1, 4, dtype=torch.bfloat16),
                                             beta=torch.zeros(4, 1, dtype=torch.bfloat16),
                                             initial_state=torch.zeros(1, 1, 4, 8),
                                             actual_seq_lengths=torch.tensor([4], dtype=torch.int32), scale=1.0)
