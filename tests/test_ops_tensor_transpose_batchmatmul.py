"""npu_transpose_batchmatmul against permuted float64 matmuls."""
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import torch_npu

from _op_helpers import DEVICES, generator as gen

dev = pytest.mark.parametrize("device", DEVICES)


@dev
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.float16, 2e-3), (torch.bfloat16, 1.6e-2)])
@pytest.mark.parametrize("perm_x1", [(0, 1, 2), (1, 0, 2)])
def test_transpose_batchmatmul(device, dtype, tol, perm_x1):
    g = gen(5)
    b, m, k, n = 3, 4, 16, 8
    shape = (b, m, k) if perm_x1 == (0, 1, 2) else (m, b, k)
    x1 = torch.randn(shape, generator=g).to(dtype)
    x2 = torch.randn(b, k, n, generator=g).to(dtype)
    a = x1.double() if perm_x1 == (0, 1, 2) else x1.double().transpose(0, 1)
    ref = torch.einsum("bmk,bkn->mbn", a, x2.double())
    y = torch_npu.npu_transpose_batchmatmul(x1.to(device), x2.to(device), perm_x1=perm_x1, perm_x2=(0, 1, 2),
                                            perm_y=(1, 0, 2))
    assert y.dtype == dtype and y.device.type == device and y.shape == (m, b, n)
    torch.testing.assert_close(y.cpu().double(), ref, rtol=tol, atol=tol * 4)
    if dtype == torch.float32:
        x1g = x1.double().requires_grad_()
        x2g = x2.double().requires_grad_()
        torch.autograd.gradcheck(lambda p, q: torch_npu.npu_transpose_batchmatmul(p, q, perm_x1=perm_x1),
                                 (x1g, x2g))


@dev
def test_transpose_batchmatmul_int8_scale(device):
    g = gen(6)
    b, m, k, n = 2, 3, 16, 4
    x1 = torch.randint(-4, 5, (m, b, k), generator=g).half()
    x2 = torch.randint(-4, 5, (b, k, n), generator=g).half()
    scale = 2.0 ** torch.randint(-4, -1, (b * n,), generator=g).float()
    packed = torch_npu.npu_trans_quant_param(scale)
    y = torch_npu.npu_transpose_batchmatmul(x1.to(device), x2.to(device), scale=packed.to(device), perm_x1=[1, 0, 2])
    acc = torch.einsum("bmk,bkn->mbn", x1.double().transpose(0, 1), x2.double()).reshape(m, 1, b * n)
    # power-of-two scales times integers: products are exact; ties go to even (rint)
    ref = torch.round(acc * scale.double()).clamp(-128, 127)
    assert y.dtype == torch.int8 and y.shape == (m, 1, b * n)
    assert torch.equal(y.cpu().double(), ref)


def test_transpose_batchmatmul_unsupported_and_meta():
    x1 = torch.zeros(2, 3, 4)
    x2 = torch.zeros(2, 4, 5)
    with pytest.raises(NotImplementedError, match="batch_split_factor"):
        torch_npu.npu_transpose_batchmatmul(x1, x2, batch_split_factor=5)
    with pytest.raises(NotImplementedError, match="bias"):
        torch_npu.npu_transpose_batchmatmul(x1, x2, bias=torch.zeros(5))
    with pytest.raises(NotImplementedError, match="perm"):
        torch_npu.npu_transpose_batchmatmul(x1, x2, perm_y=[0, 1, 2])
    with FakeTensorMode():
        y = torch_npu.npu_transpose_batchmatmul(torch.empty(6, 2, 4, dtype=torch.float16),
                                                torch.empty(2, 4, 5, dtype=torch.float16), perm_x1=[1, 0, 2])
        assert y.shape == (6, 2, 5) and y.dtype == torch.float16
