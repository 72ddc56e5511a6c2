"""npu_moe_gating_top_k_softmax_v2 against the documented formulas written here per row in
float64 with Python sorting (descending, lower expert index first on ties)."""
import math

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import torch_npu

from _op_helpers import DEVICES


def softmax_row(vals):
    m = max(vals)
    ex = [math.exp(v - m) for v in vals]
    s = sum(ex)
    return [v / s for v in ex]


def ref(x, k, renorm, finished=None):
    rows = x.double().reshape(-1, x.shape[-1]).tolist()
    fin = finished.reshape(-1).tolist() if finished is not None else [False] * len(rows)
    ys, idxs, sms = [], [], []
    for row, f in zip(rows, fin):
        base = softmax_row(row) if renorm == 0 else row
        order = sorted(range(len(row)), key=lambda j: (-base[j], j))[:k]
        top = [base[j] for j in order]
        ys.append(top if renorm == 0 else softmax_row(top) if k else [])
        idxs.append([len(row)] * k if f else order)
        sms.append(softmax_row(row))
    shape = tuple(x.shape[:-1]) + (k,)
    return (torch.tensor(ys, dtype=torch.float64).reshape(shape), torch.tensor(idxs).reshape(shape),
            torch.tensor(sms, dtype=torch.float64).reshape(x.shape))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-6), (torch.float16, 1e-3), (torch.bfloat16, 8e-3)])
@pytest.mark.parametrize("renorm", [0, 1])
@pytest.mark.parametrize("shape,k", [((5, 8), 2), ((2, 3, 6), 3)])
def test_gating_v2(device, dtype, tol, renorm, shape, k):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=g).to(dtype)
    finished = torch.rand(shape[:-1], generator=g) < 0.3
    y, idx, sm = torch_npu.npu_moe_gating_top_k_softmax_v2(x.to(device), k=k, finished=finished.to(device),
                                                           renorm=renorm, output_softmax=True)
    ry, ridx, rsm = ref(x, k, renorm, finished)
    assert y.dtype == dtype and idx.dtype == torch.int32 and y.device.type == device
    torch.testing.assert_close(y.cpu().double(), ry, rtol=tol, atol=tol)
    assert torch.equal(idx.cpu().long(), ridx)
    if renorm == 0:
        assert sm.dtype == torch.float32 and sm.shape == x.shape
        torch.testing.assert_close(sm.cpu().double(), rsm, rtol=1e-5, atol=1e-6)
    else:
        assert sm.shape == (0,)


def test_ties_default_and_meta():
    x = torch.tensor([[1.0, 3.0, 3.0, 0.0]])
    y, idx, sm = torch_npu.npu_moe_gating_top_k_softmax_v2(x, k=2)
    assert idx.tolist() == [[1, 2]] and sm.shape == (0,)
    with pytest.raises(RuntimeError, match="renorm"):
        torch_npu.npu_moe_gating_top_k_softmax_v2(x, k=2, renorm=2)
    with FakeTensorMode():
        y, idx, sm = torch_npu.npu_moe_gating_top_k_softmax_v2(torch.empty(4, 16, dtype=torch.bfloat16), k=4,
                                                               output_softmax=True)
        assert y.shape == (4, 4) and y.dtype == torch.bfloat16 and idx.dtype == torch.int32 and sm.shape == (4, 16)
