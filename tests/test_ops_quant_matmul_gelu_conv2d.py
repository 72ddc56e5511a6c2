"""npu_quant_matmul_gelu and npu_quant_conv2d against float64 dequantised references."""
import math

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import torch_npu

from _op_helpers import DEVICES


def gelu_ref(v, approximate):
    if approximate == "gelu_tanh":
        return 0.5 * v * (1 + math.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v ** 3)))
    return 0.5 * v * (1 + math.erf(v / math.sqrt(2)))


def ref_quant_matmul_gelu(x1, x2, s1, s2, bias, approximate):
    m, k = x1.shape
    n = x2.shape[1]
    out = torch.zeros(m, n, dtype=torch.float64)
    for i in range(m):
        for j in range(n):
            acc = sum(int(x1[i, t]) * int(x2[t, j]) for t in range(k))
            sc = float(s2[j if s2.numel() > 1 else 0]) * float(s1[i])
            if bias is not None and bias.dtype == torch.int32:
                v = (acc + int(bias[j])) * sc
            else:
                v = acc * sc + (float(bias[j]) if bias is not None else 0.0)
            out[i, j] = gelu_ref(v, approximate)
    return out


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("approximate", ["gelu_erf", "gelu_tanh"])
@pytest.mark.parametrize("bias_dtype,s2_dtype,out_dtype", [
    (None, torch.float32, torch.float16), (torch.int32, torch.float32, torch.float16),
    (torch.float32, torch.bfloat16, torch.bfloat16), (torch.bfloat16, torch.float32, torch.bfloat16),
    (torch.float16, torch.float32, torch.float16)])
def test_quant_matmul_gelu(device, approximate, bias_dtype, s2_dtype, out_dtype):
    g = torch.Generator().manual_seed(3)
    m, k, n = 5, 16, 6
    x1 = torch.randint(-8, 8, (m, k), generator=g, dtype=torch.int8)
    x2 = torch.randint(-8, 8, (k, n), generator=g, dtype=torch.int8)
    s1 = torch.rand(m, generator=g) * 0.02 + 0.005
    s2 = (torch.rand(n, generator=g) * 0.05 + 0.01).to(s2_dtype)
    bias = None
    if bias_dtype == torch.int32:
        bias = torch.randint(-50, 50, (n,), generator=g, dtype=torch.int32)
    elif bias_dtype is not None:
        bias = (torch.randn(n, generator=g) * 0.3).to(bias_dtype)
    expected = ref_quant_matmul_gelu(x1, x2, s1, s2, bias, approximate)
    kw = {} if approximate == "gelu_erf" else {"approximate": approximate}
    out = torch_npu.npu_quant_matmul_gelu(x1.to(device), x2.to(device), s1.to(device), s2.to(device),
                                          bias=None if bias is None else bias.to(device), **kw)
    assert out.dtype == out_dtype and out.device.type == device and out.shape == (m, n)
    tol = 1e-2 if out_dtype == torch.bfloat16 else 2e-3
    torch.testing.assert_close(out.cpu().double(), expected, rtol=tol, atol=tol)


def test_quant_matmul_gelu_batch_pertensor_and_fake():
    g = torch.Generator().manual_seed(4)
    x1 = torch.randint(-4, 4, (2, 3, 8), generator=g, dtype=torch.int8)
    x2 = torch.randint(-4, 4, (8, 5), generator=g, dtype=torch.int8)
    s1, s2 = torch.rand(3, generator=g) * 0.1, torch.tensor([0.05])
    out = torch_npu.npu_quant_matmul_gelu(x1.npu(), x2.npu(), s1.npu(), s2.npu())
    assert out.shape == (2, 3, 5)
    for b in range(2):
        torch.testing.assert_close(out[b].cpu().double(), ref_quant_matmul_gelu(x1[b], x2, s1, s2, None, "gelu_erf"),
                                   rtol=2e-3, atol=2e-3)
    with FakeTensorMode():
        f = torch_npu.npu_quant_matmul_gelu(torch.empty(4, 7, 16, dtype=torch.int8), torch.empty(16, 9, dtype=torch.int8),
                                            torch.empty(7), torch.empty(9, dtype=torch.bfloat16))
        assert f.shape == (4, 7, 9) and f.dtype == torch.bfloat16
    with pytest.raises(NotImplementedError, match="only int8"):
        torch_npu.npu_quant_matmul_gelu(torch.zeros(2, 1, dtype=torch.int32), torch.zeros(8, 1, dtype=torch.int32),
                                        torch.ones(2), torch.ones(8))


def ref_quant_conv2d(x, w, scale, bias, stride, pad, dil, pad_value):
    b, c, h, wd = x.shape
    co, _, kh, kw = w.shape
    oh = (h + 2 * pad[0] - dil[0] * (kh - 1) - 1) // stride[0] + 1
    ow = (wd + 2 * pad[1] - dil[1] * (kw - 1) - 1) // stride[1] + 1
    out = torch.zeros(b, co, oh, ow, dtype=torch.float64)

    def px(bi, ci, i, j):
        i, j = i - pad[0], j - pad[1]
        return int(x[bi, ci, i, j]) if 0 <= i < h and 0 <= j < wd else pad_value
    for bi in range(b):
        for o in range(co):
            for i in range(oh):
                for j in range(ow):
                    acc = sum(px(bi, ci, i * stride[0] + u * dil[0], j * stride[1] + v * dil[1]) * int(w[o, ci, u, v])
                              for ci in range(c) for u in range(kh) for v in range(kw))
                    if bias is not None:
                        acc += int(bias[o])
                    out[bi, o, i, j] = acc * float(scale[o])
    return out


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("with_bias,pad_value,stride,pad,dil", [
    (False, 0, (1, 1), (0, 0), (1, 1)), (True, 0, (2, 1), (1, 2), (1, 1)), (True, 3, (1, 1), (1, 1), (2, 1))])
def test_quant_conv2d(device, with_bias, pad_value, stride, pad, dil):
    g = torch.Generator().manual_seed(9)
    x = torch.randint(-4, 4, (2, 3, 6, 7), generator=g, dtype=torch.int8)
    w = torch.randint(-4, 4, (4, 3, 3, 2), generator=g, dtype=torch.int8)
    scale = torch.rand(4, generator=g) + 0.5
    bias = torch.randint(-20, 20, (4,), generator=g, dtype=torch.int32) if with_bias else None
    expected = ref_quant_conv2d(x, w, scale, bias, stride, pad, dil, pad_value)
    out = torch.ops.npu.npu_quant_conv2d(x.to(device), w.to(device), scale.to(device), list(stride), list(pad),
                                         list(dil), 1, pad_value, "rint", torch.float16,
                                         None if bias is None else bias.to(device))
    assert out.dtype == torch.float16 and out.device.type == device
    torch.testing.assert_close(out.cpu().double(), expected, rtol=1e-3, atol=1e-3)


def test_quant_conv2d_packed_scale_and_contrib_module():
    from torch_npu.contrib.module import QuantConv2d
    g = torch.Generator().manual_seed(10)
    x = torch.randint(-3, 3, (1, 2, 5, 5), generator=g, dtype=torch.int8)
    w = torch.randint(-3, 3, (3, 2, 3, 3), generator=g, dtype=torch.int8)
    scale = torch.rand(3, generator=g) + 1
    scale_fp19 = (scale.view(torch.int32) & -8192).view(torch.float32)   # the fp19 bits kept by the packing
    bias = torch.randint(-5, 5, (3,), generator=g, dtype=torch.int32)
    mod = QuantConv2d(2, 3, 3, output_dtype=torch.float16, padding=1).npu()
    mod.weight.data = w.npu()
    mod.scale.data = scale.npu()                                 # float32: forward packs it (npu_trans_quant_param)
    mod.bias.data = bias.npu()
    out = mod(x.npu())
    expected = ref_quant_conv2d(x, w, scale_fp19, bias, (1, 1), (1, 1), (1, 1), 0)
    torch.testing.assert_close(out.cpu().double(), expected, rtol=1e-3, atol=1e-3)
    with pytest.raises(NotImplementedError, match="input_dtype"):
        torch.ops.npu.npu_quant_conv2d(x, w, scale, output_dtype=torch.float16, input_dtype=1)
