"""npu_rms_norm_quant_v2 and _npu_rms_norm_backward_quant against the op-plugin goldens."""
import math

import pytest
import torch

from _op_helpers import DEVICES, assert_int8_close_97 as _assert_int8_close

FLOATS = [torch.float32, torch.float16, torch.bfloat16]


def _rms_norm_quant_v2_ref(x, gamma, scale, offset, beta, eps, div_mode):
    """The op-plugin golden, float64 loops over rows."""
    n = x.shape[-1]
    rows = x.double().reshape(-1, n).tolist()
    g = gamma.double().tolist()
    bt = None if beta is None else beta.double().tolist()
    sc = scale.double().reshape(-1).tolist()
    of = None if offset is None else offset.double().reshape(-1).tolist()
    ys, rstds = [], []
    for row in rows:
        rstd = 1.0 / math.sqrt(sum(v * v for v in row) / n + eps)
        out = []
        for j in range(n):
            v = row[j] * rstd * g[j] + (bt[j] if bt is not None else 0.0)
            s = sc[j] if len(sc) > 1 else sc[0]
            v = v / s if div_mode else v * s
            if of is not None:
                v += of[j] if len(of) > 1 else of[0]
            out.append(min(127.0, max(-128.0, float(round(v)))))
        ys.append(out)
        rstds.append(rstd)
    return (torch.tensor(ys, dtype=torch.float64).reshape(x.shape),
            torch.tensor(rstds, dtype=torch.float64).reshape(list(x.shape[:-1]) + [1]))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("div_mode", [True, False])
def test_rms_norm_quant_v2(device, dtype, div_mode):
    torch.manual_seed(4)
    x = torch.randn(3, 4, 32).to(dtype)
    gamma = torch.randn(32).to(dtype)
    beta = torch.randn(32).to(dtype)
    scale = (torch.rand(1) * 0.8 + 0.2).to(dtype)           # the golden's per-tensor scale
    offset = torch.randint(-5, 6, (1,)).to(dtype)
    y, rstd = torch.ops.npu.npu_rms_norm_quant_v2(x.to(device), gamma.to(device), scale.to(device),
                                                  offset=offset.to(device), beta=beta.to(device), div_mode=div_mode)
    ref_y, ref_rstd = _rms_norm_quant_v2_ref(x, gamma, scale, offset, beta, 1e-6, div_mode)
    assert y.device.type == device and y.shape == x.shape
    _assert_int8_close(y, ref_y)
    assert rstd.shape == (0,) and rstd.dtype == torch.float32    # x does not require grad
    # per-channel scale/offset, no beta; x requiring grad also returns rstd
    xg = x.float().to(device).requires_grad_(True)
    sc = torch.rand(32) + 0.5
    of = torch.randn(32)
    y, rstd = torch.ops.npu.npu_rms_norm_quant_v2(xg, gamma.float().to(device), sc.to(device), offset=of.to(device),
                                                  div_mode=div_mode, dst_dtype=torch.int8)
    ref_y, ref_rstd = _rms_norm_quant_v2_ref(x.float(), gamma.float(), sc, of, None, 1e-6, div_mode)
    _assert_int8_close(y, ref_y)
    assert rstd.shape == (3, 4, 1) and rstd.dtype == torch.float32
    torch.testing.assert_close(rstd.detach().cpu().double(), ref_rstd, rtol=1e-5, atol=0)


def test_rms_norm_quant_v2_errors():
    x, g, s = torch.randn(2, 16), torch.randn(16), torch.ones(1)
    op = torch.ops.npu.npu_rms_norm_quant_v2
    with pytest.raises(NotImplementedError, match="dst_dtype=16"):
        op(x, g, s, dst_dtype=torch.quint4x2)
    with pytest.raises(NotImplementedError, match="dst_dtype=291"):
        op(x, g, s, dst_dtype=291)
    with pytest.raises(NotImplementedError, match="gamma with 2 dims"):
        op(x, g.reshape(1, 16), s)
    with pytest.raises(RuntimeError, match="gamma must be \\[16\\]"):
        op(x, torch.randn(8), s)
    with pytest.raises(RuntimeError, match="scale must hold 1 or 16"):
        op(x, g, torch.ones(3))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("div_mode", [True, False])
def test_rms_norm_backward_quant(device, dtype, div_mode):
    """The golden: RMSNorm backward (formula written here in float64), dx rounded to x's dtype,
    then ``round(dx / scale + offset)`` (div_mode) or ``round(dx * scale + offset)``, int8."""
    torch.manual_seed(7)
    dy = torch.randn(2, 3, 16).to(dtype)
    x = torch.randn(2, 3, 16).to(dtype)
    gamma = torch.randn(16).to(dtype)
    rstd = (torch.rand(2, 3) + 0.5)
    scale = torch.tensor([0.05 if div_mode else 20.0])
    offset = torch.tensor([3], dtype=torch.int32)
    dq, dgamma = torch.ops.npu._npu_rms_norm_backward_quant(dy.to(device), x.to(device), rstd.to(device),
                                                            gamma.to(device), scale.to(device),
                                                            offset_x=offset.to(device), div_mode=div_mode)
    xd, dyd, gd, rd = x.double(), dy.double(), gamma.double(), rstd.double().unsqueeze(-1)
    xhat = xd * rd
    gdy = dyd * gd
    dx = rd * (gdy - xhat * (gdy * xhat).mean(-1, keepdim=True))
    dx = dx.to(dtype).double()                     # the golden quantises the x-dtype dx
    v = dx / 0.05 if div_mode else dx * 20.0
    ref_q = torch.round(v + 3).clamp(-128, 127)
    ref_dgamma = (dyd * xhat).sum((0, 1))
    assert dq.dtype == torch.int8 and dq.shape == x.shape and dq.device.type == device
    if dtype == torch.float32:
        _assert_int8_close(dq, ref_q)
    else:
        # dx is rounded to float16/bfloat16 here and in the emulation from slightly different
        # float64 / float32 values: one step of that grid, times the quantisation factor
        # (1 / 0.05 or 20, both 20), may separate the int8 results
        step = dx.abs() * (2 ** -10 if dtype == torch.float16 else 2 ** -7) * 20.0
        assert bool(((dq.cpu().double() - ref_q).abs() <= step + 1).all())
    assert dgamma.dtype == torch.float32 and dgamma.shape == (16,)
    torch.testing.assert_close(dgamma.cpu().double(), ref_dgamma, rtol=2e-3 if dtype != torch.float32 else 1e-5,
                               atol=2e-3 if dtype != torch.float32 else 1e-5)


def test_rms_norm_backward_quant_errors():
    dy = x = torch.randn(2, 8)
    op = torch.ops.npu._npu_rms_norm_backward_quant
    with pytest.raises(NotImplementedError, match="quant_mode='dynamic'"):
        op(dy, x, torch.ones(2), torch.ones(8), torch.ones(1), quant_mode="dynamic")
    with pytest.raises(NotImplementedError, match="per-channel scale_x"):
        op(dy, x, torch.ones(2), torch.ones(8), torch.ones(8))
    with pytest.raises(RuntimeError, match="rstd must hold one value"):
        op(dy, x, torch.ones(3), torch.ones(8), torch.ones(1))
