"""npu_ffn against ``activation(x @ W1 + b1) @ W2 + b2`` written here as float64 Python loops
(per expert block when expert_tokens is given); the undocumented modes must raise."""
import math

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import torch_npu

from _op_helpers import DEVICES

ACTS = {
    "relu": lambda v: max(v, 0.0),
    "silu": lambda v: v / (1 + math.exp(-v)),
    "fastgelu": lambda v: v / (1 + math.exp(-1.702 * abs(v))) * math.exp(0.851 * (v - abs(v))),
}


def dense_ref(rows, w1, w2, b1, b2, act):
    out = []
    for r in rows:
        h = [sum(r[i] * w1[i][j] for i in range(len(r))) + (b1[j] if b1 else 0.0) for j in range(len(w1[0]))]
        h = [ACTS[act](v) for v in h]
        out.append([sum(h[i] * w2[i][j] for i in range(len(h))) + (b2[j] if b2 else 0.0) for j in range(len(w2[0]))])
    return out


def ffn_ref(x, w1, w2, b1, b2, act, expert_tokens=None):
    rows = x.double().reshape(-1, x.shape[-1]).tolist()
    if expert_tokens is None:
        out = dense_ref(rows, w1.double().tolist(), w2.double().tolist(), None if b1 is None else b1.double().tolist(),
                        None if b2 is None else b2.double().tolist(), act)
    else:
        out, start = [], 0
        for e, c in enumerate(expert_tokens):
            out += dense_ref(rows[start:start + c], w1[e].double().tolist(), w2[e].double().tolist(),
                             None if b1 is None else b1[e].double().tolist(),
                             None if b2 is None else b2[e].double().tolist(), act)
            start += c
    return torch.tensor(out, dtype=torch.float64).reshape(tuple(x.shape[:-1]) + (w2.shape[-1],))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.float16, 2e-3), (torch.bfloat16, 1e-2)])
@pytest.mark.parametrize("act", sorted(ACTS))
def test_ffn_dense(device, dtype, tol, act):
    gen = torch.Generator().manual_seed(7)
    x = (torch.randn(2, 3, 8, generator=gen) * 0.5).to(dtype)
    w1 = (torch.randn(8, 12, generator=gen) * 0.3).to(dtype)
    w2 = (torch.randn(12, 8, generator=gen) * 0.3).to(dtype)
    b1 = (torch.randn(12, generator=gen) * 0.1).to(dtype)
    b2 = (torch.randn(8, generator=gen) * 0.1).to(dtype)
    y = torch_npu.npu_ffn(x.to(device), w1.to(device), w2.to(device), act, bias1=b1.to(device), bias2=b2.to(device))
    ref = ffn_ref(x, w1, w2, b1, b2, act)
    assert y.dtype == dtype and y.shape == (2, 3, 8) and y.device.type == device
    torch.testing.assert_close(y.cpu().double(), ref, rtol=tol, atol=tol)


@pytest.mark.parametrize("device", DEVICES)
def test_ffn_experts(device):
    gen = torch.Generator().manual_seed(8)
    tokens = [3, 0, 4]
    x = (torch.randn(7, 6, generator=gen) * 0.5).half()
    w1 = (torch.randn(3, 6, 10, generator=gen) * 0.3).half()
    w2 = (torch.randn(3, 10, 6, generator=gen) * 0.3).half()
    b1 = (torch.randn(3, 10, generator=gen) * 0.1).half()
    y = torch_npu.npu_ffn(x.to(device), w1.to(device), w2.to(device), "silu", expert_tokens=tokens,
                          bias1=b1.to(device), inner_precise=1)
    ref = ffn_ref(x, w1, w2, b1, None, "silu", tokens)
    torch.testing.assert_close(y.cpu().double(), ref, rtol=2e-3, atol=2e-3)
    with pytest.raises(RuntimeError, match="must equal M"):
        torch_npu.npu_ffn(x, w1, w2, "silu", expert_tokens=[3, 3, 3])


def test_ffn_undocumented_modes_raise_and_meta():
    x, w1, w2 = torch.randn(4, 8).half(), torch.randn(8, 16).half(), torch.randn(8, 8).half()
    for act in ("gelu", "geglu", "swiglu", "reglu"):
        with pytest.raises(NotImplementedError, match=act):
            torch_npu.npu_ffn(x, w1, w2, act)
    with pytest.raises(NotImplementedError, match="quantised"):
        torch_npu.npu_ffn(x, w1, w2.t().contiguous()[:16], "relu", scale=torch.ones(1))
    with pytest.raises(NotImplementedError, match="expert_tokens_index"):
        torch_npu.npu_ffn(x, w1, w2, "relu", expert_tokens_index=[4])
    with FakeTensorMode():
        y = torch_npu.npu_ffn(torch.empty(5, 2, 8, dtype=torch.bfloat16), torch.empty(2, 8, 16, dtype=torch.bfloat16),
                              torch.empty(2, 16, 4, dtype=torch.bfloat16), "fastgelu", expert_tokens=[6, 4])
    assert y.shape == (5, 2, 4) and y.dtype == torch.bfloat16
