"""npu_fused_matmul and npu_batch_gather_matmul against float64 references."""
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import torch_npu  # noqa: F401

from _op_helpers import DEVICES

npu = torch.ops.npu


I8, I32, I64, F32, BF16, U8 = torch.int8, torch.int32, torch.int64, torch.float32, torch.bfloat16, torch.uint8


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("with_a", [True, False])
def test_batch_gather_matmul(device, with_a):
    b, h1, r, h2, h3, w, layers = 5, 16, 16, 32, 48, 3, 2
    g = torch.Generator().manual_seed(7)
    y = torch.randn(b, h3, generator=g).half()
    x = torch.randn(b, h1, generator=g).half()
    wa = (torch.randn(w, layers, r, h1, generator=g) * 0.2).half() if with_a else None
    wb = (torch.randn(w, layers, h2, r if with_a else h1, generator=g) * 0.2).half()
    indices = torch.tensor([2, 0, 1, 2, 0], dtype=torch.int32)
    layer, scale, offset = 1, 0.5, 8
    expected = y.double().clone()
    for i in range(b):
        z = x[i].double()
        if with_a:
            z = wa[indices[i], layer].double() @ z
        expected[i, offset:offset + h2] += scale * (wb[indices[i], layer].double() @ z)
    dev = (lambda t: None if t is None else t.to(device))
    out = torch_npu.npu_batch_gather_matmul(dev(y), dev(x), dev(wb), dev(indices), dev(wa), layer_idx=layer,
                                            scale=scale, y_offset=offset, y_slice_size=h2)
    assert out.dtype == torch.float16 and out.shape == y.shape and out.device.type == device
    torch.testing.assert_close(out.cpu().double(), expected, atol=4e-3, rtol=2e-3)
    target = dev(y.clone())
    assert torch_npu.npu_batch_gather_matmul_(target, dev(x), dev(wb), dev(indices), dev(wa), layer_idx=layer,
                                              scale=scale, y_offset=offset, y_slice_size=h2) is target
    torch.testing.assert_close(target.cpu(), out.cpu())


def test_batch_gather_matmul_fake_and_errors():
    y, x = torch.zeros(2, 32).half(), torch.zeros(2, 16).half()
    wa, wb = torch.zeros(2, 1, 16, 16).half(), torch.zeros(2, 1, 32, 16).half()
    idx = torch.tensor([0, 1], dtype=torch.int32)
    with FakeTensorMode():
        out = torch_npu.npu_batch_gather_matmul(torch.empty(2, 32).half(), torch.empty(2, 16).half(),
                                                torch.empty(2, 1, 32, 16).half(), torch.empty(2, dtype=I32),
                                                torch.empty(2, 1, 16, 16).half())
        assert out.shape == (2, 32) and out.dtype == torch.float16
    with pytest.raises(NotImplementedError, match="indices outside"):
        torch_npu.npu_batch_gather_matmul(y, x, wb, torch.tensor([-1, 0], dtype=torch.int32), wa)
    with pytest.raises(NotImplementedError, match="y_slice_size=16"):
        torch_npu.npu_batch_gather_matmul(y, x, wb, idx, wa, y_slice_size=16)
    with pytest.raises(RuntimeError, match="x must be float16"):
        torch_npu.npu_batch_gather_matmul(y, x.float(), wb, idx, wa)
    with pytest.raises(RuntimeError, match="layer_idx must be in"):
        torch_npu.npu_batch_gather_matmul(y, x, wb, idx, wa, layer_idx=1)


def _fused_matmul_ref(x1, x2, bias, x3, kind):
    y = torch.matmul(x1.double(), x2.double())
    if bias is not None:
        y = y + bias.double().reshape(-1)
    if kind == "add":
        y = y + x3.double()
    elif kind == "mul":
        y = y * x3.double()
    elif kind == "relu":
        y = y.clamp_min(0)
    elif kind == "gelu_erf":
        y = 0.5 * y * (1 + torch.erf(y / 2 ** 0.5))
    elif kind == "gelu_tanh":
        y = 0.5 * y * (1 + torch.tanh((2 / torch.pi) ** 0.5 * (y + 0.044715 * y ** 3)))
    return y


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype,tol,kind", [
    (dtype, tol, kind)
    for dtype, tol in [(torch.float32, 1e-5), (torch.float16, 2e-3), (torch.bfloat16, 1.6e-2)]
    for kind in ["", "16cast32", "add", "mul", "relu", "gelu_erf", "gelu_tanh"]
    # gelu fusions are documented for float16/bfloat16 only (float32 is an error case below)
    if not (dtype == torch.float32 and kind.startswith("gelu"))])
def test_fused_matmul(device, dtype, tol, kind):
    batched = kind in ("", "relu", "add", "mul")
    x1 = torch.randn(*((2, 3, 8) if batched else (3, 8))).to(dtype)
    x2 = torch.randn(8, 5).to(dtype)
    bias = torch.randn(5).to(dtype) if kind in ("", "relu", "add", "mul") else None
    x3 = torch.randn(3, 5).to(dtype) if kind in ("add", "mul") else None     # broadcast over the batch
    out = npu.npu_fused_matmul(x1.to(device), x2.to(device), bias=None if bias is None else bias.to(device),
                               x3=None if x3 is None else x3.to(device), fused_op_type=kind)
    expected = _fused_matmul_ref(x1, x2, bias, x3, kind)
    assert out.device.type == device and out.shape == expected.shape
    assert out.dtype == (torch.float32 if kind == "16cast32" else dtype)
    torch.testing.assert_close(out.cpu().double(), expected, atol=tol * 10, rtol=tol)


def test_fused_matmul_fake_and_errors():
    with FakeTensorMode():
        out = npu.npu_fused_matmul(torch.empty(4, 2, 3, 8, dtype=torch.bfloat16),
                                   torch.empty(2, 8, 6, dtype=torch.bfloat16), fused_op_type="relu")
        assert out.shape == (4, 2, 3, 6) and out.dtype == torch.bfloat16
        out = npu.npu_fused_matmul(torch.empty(3, 8, dtype=torch.float16), torch.empty(8, 6, dtype=torch.float16),
                                   fused_op_type="16cast32")
        assert out.shape == (3, 6) and out.dtype == torch.float32
    a, b = torch.randn(3, 8, dtype=torch.float16), torch.randn(8, 4, dtype=torch.float16)
    for kwargs, msg in [({"fused_op_type": "silu"}, "fused_op_type must be one of"),
                        ({"fused_op_type": "add"}, "x3 is required"),
                        ({"fused_op_type": "relu", "x3": torch.randn(3, 4).half()}, "x3 must be None"),
                        ({"fused_op_type": "gelu_erf", "bias": torch.randn(4).half()}, "bias must be None")]:
        with pytest.raises(RuntimeError, match=msg):
            npu.npu_fused_matmul(a, b, **kwargs)
    with pytest.raises(RuntimeError, match="not supported for fused_op_type 'gelu_tanh'"):
        npu.npu_fused_matmul(a.float(), b.float(), fused_op_type="gelu_tanh")
    with pytest.raises(RuntimeError, match="must have 2 to 3 dims"):
        npu.npu_fused_matmul(torch.randn(2, 2, 3, 8).half(), b, x3=torch.randn(3, 4).half(), fused_op_type="add")
