"""Fused norm ops (add / deep / gemma / cast RMSNorm and LayerNorm variants, npu_layernorm_grad) and
RMSNorm fused with int8 quantisation, against float64 references and autograd."""
import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode

import torch_npu

from _op_helpers import (
    DEVICES, assert_int8_close as _assert_int8_close, close_as_expected as _close, int8_ref as _q8_ref,
    randn_dims as _rand)

LOW = [(torch.float16, 2e-3, 2e-3), (torch.bfloat16, 2e-2, 2e-2)]


def _ln_ref(x, gamma, beta, eps):
    """LayerNorm over gamma's dims, float64, with mean and rstd written out."""
    dims = list(range(x.dim() - gamma.dim(), x.dim()))
    mean = x.mean(dims, keepdim=True)
    var = ((x - mean) ** 2).mean(dims, keepdim=True)
    rstd = 1.0 / torch.sqrt(var + eps)
    return (x - mean) * rstd * gamma + beta, mean, rstd


def _rms_ref(x, gamma, eps):
    dims = list(range(x.dim() - gamma.dim(), x.dim()))
    rstd = 1.0 / torch.sqrt((x * x).mean(dims, keepdim=True) + eps)
    return x * rstd * gamma, rstd


def _layer_norm_grads(x, gamma, beta, dy, eps):
    """PyTorch autograd of F.layer_norm (float64): (dx, dgamma, dbeta)."""
    leaves = [t.detach().clone().requires_grad_(True) for t in (x, gamma, beta)]
    y = F.layer_norm(leaves[0], list(gamma.shape), leaves[1], leaves[2], eps)
    return torch.autograd.grad(y, leaves, dy)


@pytest.mark.parametrize("device", DEVICES)
def test_add_layer_norm_fp32_and_stats_layout(device):
    x1, x2 = _rand(2, 3, 4, 8, seed=1), _rand(2, 3, 4, 8, seed=2)
    gamma, beta = _rand(4, 8, seed=3), _rand(4, 8, seed=4)
    y_ref, mean_ref, rstd_ref = _ln_ref(x1 + x2, gamma, beta, 1e-5)
    args = [t.float().to(device) for t in (x1, x2, gamma, beta)]
    y, mean, rstd, x = torch_npu.npu_add_layer_norm(*args, 1e-5, True)
    assert y.device.type == device and y.dtype == torch.float32
    # one trailing 1 after the leading dims, whatever gamma.dim() (the adapter's layout)
    assert mean.shape == (2, 3, 1) and rstd.shape == (2, 3, 1) and mean.dtype == torch.float32
    _close(y, y_ref, 1e-5, 1e-5)
    _close(mean, mean_ref.reshape(2, 3, 1), 1e-5, 1e-5)
    _close(rstd, rstd_ref.reshape(2, 3, 1), 1e-4, 1e-5)
    _close(x, x1 + x2, 1e-6, 1e-6)


@pytest.mark.parametrize("dtype,atol,rtol", LOW)
def test_add_layer_norm_low_precision_and_mixed(dtype, atol, rtol):
    x1, x2 = _rand(5, 16, seed=5).to(dtype), _rand(5, 16, seed=6).to(dtype)
    gamma, beta = _rand(16, seed=7).to(dtype), _rand(16, seed=8).to(dtype)
    y, mean, rstd, x = torch_npu.npu_add_layer_norm(x1.npu(), x2.npu(), gamma.npu(), beta.npu())
    y_ref, _, _ = _ln_ref(x1.double() + x2.double(), gamma.double(), beta.double(), 1e-5)
    assert y.dtype == dtype and x.dtype == dtype and rstd.dtype == torch.float32
    _close(y, y_ref, atol * 10, rtol * 10)
    # x1 and x2 of different dtypes: y and x come out float32
    y32, _, _, x32 = torch_npu.npu_add_layer_norm(x1.float(), x2, gamma.float(), beta.float())
    assert y32.dtype == torch.float32 and x32.dtype == torch.float32
    _close(x32, x1.double() + x2.double(), 1e-6, 1e-6)


@pytest.mark.parametrize("device", DEVICES)
def test_add_layer_norm_backward_matches_autograd(device):
    x1, x2 = _rand(3, 5, 12, seed=10), _rand(3, 5, 12, seed=11)
    gamma, beta, dy, dsum = _rand(12, seed=12), _rand(12, seed=13), _rand(3, 5, 12, seed=14), _rand(3, 5, 12, seed=15)
    _, mean, rstd = _ln_ref(x1 + x2, gamma, beta, 1e-5)
    dx_ref, dg_ref, db_ref = _layer_norm_grads(x1 + x2, gamma, beta, dy, 1e-5)
    d = lambda t: t.to(device)
    dx1, dx2, dg, db = torch_npu.npu_add_layer_norm_backward(d(dy), d(x1), d(x2), d(rstd), d(mean), d(gamma), d(dsum))
    _close(dx1, dx_ref + dsum)
    _close(dx2, dx_ref + dsum)
    _close(dg, dg_ref)
    _close(db, db_ref)
    # dy=None counts as zeros: only dsum flows; gamma/beta grads vanish
    dx1, _, dg, db = torch_npu.npu_add_layer_norm_backward(None, d(x1), d(x2), d(rstd), d(mean), d(gamma), d(dsum))
    _close(dx1, dsum)
    assert float(dg.abs().max()) == 0.0 and float(db.abs().max()) == 0.0
    # float32 inputs give float32 dgamma/dbeta and x1-dtype dx
    outs = torch_npu.npu_add_layer_norm_backward(*[d(t.float()) for t in (dy, x1, x2, rstd, mean, gamma)], None)
    assert [o.dtype for o in outs] == [torch.float32] * 4
    _close(outs[0], dx_ref, 1e-4, 1e-4)


def test_add_layer_norm_errors():
    with pytest.raises(RuntimeError, match="must have the same shape"):
        torch_npu.npu_add_layer_norm(torch.randn(2, 4), torch.randn(3, 4), torch.ones(4), torch.zeros(4))
    with pytest.raises(RuntimeError, match="gamma shape"):
        torch_npu.npu_add_layer_norm(torch.randn(2, 4), torch.randn(2, 4), torch.ones(5), torch.zeros(5))
    with pytest.raises(RuntimeError, match="float16, bfloat16 or float32"):
        torch_npu.npu_add_layer_norm(torch.ones(2, 4, dtype=torch.int32), torch.ones(2, 4, dtype=torch.int32),
                                     torch.ones(4), torch.zeros(4))


def test_norm_autograd_gradcheck():
    """Autograd flows through the compositions (float64 gradcheck of y w.r.t. every input)."""
    x1, x2 = _rand(2, 6, seed=150).requires_grad_(), _rand(2, 6, seed=151).requires_grad_()
    gamma, beta = _rand(6, seed=152).requires_grad_(), _rand(6, seed=153).requires_grad_()
    assert torch.autograd.gradcheck(lambda a, b, g, c: torch_npu.npu_add_layer_norm(a, b, g, c)[0],
                                    (x1, x2, gamma, beta))
    assert torch.autograd.gradcheck(lambda a, g: torch_npu.npu_gemma_rms_norm(a, g)[0], (x1, gamma))
    assert torch.autograd.gradcheck(lambda a, b, g: torch.ops.npu.npu_add_rms_norm_v2_functional(a, b, g)[1],
                                    (x1, x2, gamma))


@pytest.mark.parametrize("device", DEVICES)
def test_deep_norm_forward_backward_and_autograd(device):
    alpha = 0.7
    x, gx = _rand(4, 10, seed=20), _rand(4, 10, seed=21)
    gamma, beta, dy = _rand(10, seed=22), _rand(10, seed=23), _rand(4, 10, seed=24)
    y_ref, mean_ref, rstd_ref = _ln_ref(alpha * x + gx, gamma, beta, 1e-6)
    d = lambda t: t.to(device)
    mean, rstd, y = torch_npu.npu_deep_norm(d(x), d(gx), d(beta), d(gamma), alpha, 1e-6)
    _close(y, y_ref)
    _close(mean, mean_ref)
    _close(rstd, rstd_ref)
    dz_ref, dg_ref, db_ref = _layer_norm_grads(alpha * x + gx, gamma, beta, dy, 1e-6)
    dx, dgx, dbeta, dgamma = torch_npu.npu_deep_norm_backward(d(dy), d(x), d(gx), d(gamma), mean, rstd, alpha)
    _close(dgx, dz_ref)
    _close(dx, alpha * dz_ref)
    _close(dbeta, db_ref)
    _close(dgamma, dg_ref)
    # the real op has autograd (NpuDeepNormBackward0): gradcheck through the composition
    leaves = [t.clone().requires_grad_(True) for t in (x[:2, :5], gx[:2, :5], beta[:5], gamma[:5])]
    assert torch.autograd.gradcheck(lambda a, b, c, g: torch_npu.npu_deep_norm(a, b, c, g, alpha, 1e-6)[2], leaves)


@pytest.mark.parametrize("dtype,atol,rtol", LOW)
def test_deep_norm_low_precision(dtype, atol, rtol):
    x, gx, gamma, beta = (_rand(*s, seed=30 + i).to(dtype) for i, s in enumerate([(3, 32), (3, 32), (32,), (32,)]))
    mean, rstd, y = torch_npu.npu_deep_norm(x.npu(), gx.npu(), beta.npu(), gamma.npu())
    y_ref, _, rstd_ref = _ln_ref(0.3 * x.double() + gx.double(), gamma.double(), beta.double(), 1e-6)
    assert y.dtype == dtype and mean.dtype == torch.float32 and rstd.shape == (3, 1)
    _close(y, y_ref, atol * 10, rtol * 10)
    _close(rstd, rstd_ref, 1e-3, 1e-3)


@pytest.mark.parametrize("device", DEVICES)
def test_gemma_rms_norm(device):
    x, gamma = _rand(2, 3, 16, seed=40), _rand(16, seed=41)
    y_ref, rstd_ref = _rms_ref(x, 1 + gamma, 1e-6)
    y, rstd = torch_npu.npu_gemma_rms_norm(x.float().to(device), gamma.float().to(device))
    assert rstd.shape == (2, 3, 1) and rstd.dtype == torch.float32
    _close(y, y_ref, 1e-5, 1e-5)
    _close(rstd, rstd_ref, 1e-5, 1e-5)
    for dtype, atol, rtol in LOW:
        y, _ = torch_npu.npu_gemma_rms_norm(x.to(dtype).to(device), gamma.to(dtype).to(device), 1e-5)
        ref, _ = _rms_ref(x.to(dtype).double(), 1 + gamma.to(dtype).double(), 1e-5)
        assert y.dtype == dtype
        _close(y, ref, atol * 10, rtol * 10)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_add_rms_norm_cast(device, dtype):
    x1, x2, gamma = _rand(4, 32, seed=50).to(dtype), _rand(4, 32, seed=51).to(dtype), _rand(32, seed=52).to(dtype)
    y1, y2, rstd, x = torch_npu.npu_add_rms_norm_cast(x1.to(device), x2.to(device), gamma.to(device))
    s = x1.double() + x2.double()
    y_ref, rstd_ref = _rms_ref(s, gamma.double(), 1e-6)
    assert (y1.dtype, y2.dtype, rstd.dtype, x.dtype) == (torch.float32, dtype, torch.float32, dtype)
    tol = 2e-2 if dtype == torch.bfloat16 else 2e-3
    _close(y2, y_ref, tol * 5, tol * 5)
    assert torch.equal(y1.cpu(), y2.cpu().float())      # y1 = float(y2)
    _close(rstd, rstd_ref, 1e-4, 1e-4)
    _close(x, s, tol, tol)
    with pytest.raises(RuntimeError, match="float16 or bfloat16"):
        torch_npu.npu_add_rms_norm_cast(x1.float(), x2.float(), gamma.float())


@pytest.mark.parametrize("device", DEVICES)
def test_add_rms_norm_v2_inplace_and_functional(device):
    x1, x2, gamma = _rand(3, 2, 8, seed=60).float(), _rand(3, 2, 8, seed=61).float(), _rand(2, 8, seed=62).float()
    y_ref, rstd_ref = _rms_ref(x1.double() + x2.double(), gamma.double(), 1e-6)
    a, b = x1.clone().to(device), x2.clone().to(device)
    rstd_f, y_f, x_f = torch.ops.npu.npu_add_rms_norm_v2_functional(a, b, gamma.to(device))
    assert torch.equal(a.cpu(), x1) and torch.equal(b.cpu(), x2)     # functional: inputs untouched
    rstd = torch.ops.npu.npu_add_rms_norm_v2(a, b, gamma.to(device))
    assert rstd.shape == (3, 1, 1) and rstd.dtype == torch.float32
    _close(a, y_ref, 1e-5, 1e-5)                 # x1 now holds the normalised output
    _close(b, x1.double() + x2.double(), 1e-6, 1e-6)   # x2 holds the sum
    _close(rstd, rstd_ref, 1e-5, 1e-5)
    _close(y_f, y_ref, 1e-5, 1e-5)
    _close(x_f, x1.double() + x2.double(), 1e-6, 1e-6)
    _close(rstd_f, rstd_ref, 1e-5, 1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_layernorm_grad_matches_autograd(device):
    x, w, b, dy = _rand(3, 4, 6, seed=70), _rand(4, 6, seed=71), _rand(4, 6, seed=72), _rand(3, 4, 6, seed=73)
    _, mean, rstd = torch.native_layer_norm(x, [4, 6], w, b, 1e-5)
    dx_ref, dw_ref, db_ref = _layer_norm_grads(x, w, b, dy, 1e-5)
    d = lambda t: t.to(device)
    dx, dw, db = torch_npu.npu_layernorm_grad(d(dy), d(x), [4, 6], d(mean), d(rstd), d(w), d(b))
    _close(dx, dx_ref)
    _close(dw, dw_ref)
    _close(db, db_ref)
    # no weight: the input gradient of the plain normalisation
    leaf = x.clone().requires_grad_(True)
    dx_plain, = torch.autograd.grad(F.layer_norm(leaf, [4, 6], None, None, 1e-5), leaf, dy)
    dx, _, _ = torch_npu.npu_layernorm_grad(d(dy), d(x), [4, 6], d(mean), d(rstd), None, None)
    _close(dx, dx_plain)
    with pytest.raises(RuntimeError, match="expected input with shape"):
        torch_npu.npu_layernorm_grad(dy, x, [5], mean, rstd, None, None)


def test_emulated_norms_fake_shapes():
    with FakeTensorMode():
        x = torch.empty(2, 3, 8, dtype=torch.float16)
        g = torch.empty(8, dtype=torch.float16)
        g2 = torch.empty(3, 8, dtype=torch.float16)
        out = torch.ops.npu.npu_add_layer_norm(x, x, g2, g2)
        assert [tuple(o.shape) for o in out] == [(2, 3, 8), (2, 1), (2, 1), (2, 3, 8)]
        assert [o.dtype for o in out] == [torch.float16, torch.float32, torch.float32, torch.float16]
        out = torch.ops.npu.npu_add_layer_norm_backward(x, x, x, out[2], out[1], g2, None)
        assert [tuple(o.shape) for o in out] == [(2, 3, 8), (2, 3, 8), (3, 8), (3, 8)]
        assert [o.dtype for o in out][2:] == [torch.float32, torch.float32]
        mean, rstd, y = torch.ops.npu.npu_deep_norm(x, x, g, g)
        assert tuple(mean.shape) == (2, 3, 1) and y.dtype == torch.float16
        out = torch.ops.npu.npu_deep_norm_backward(x, x, x, g, mean, rstd)
        assert [tuple(o.shape) for o in out] == [(2, 3, 8), (2, 3, 8), (8,), (8,)]
        y, rstd = torch.ops.npu.npu_gemma_rms_norm(x, g)
        assert tuple(rstd.shape) == (2, 3, 1) and rstd.dtype == torch.float32
        out = torch.ops.npu.npu_add_rms_norm_cast(x, x, g)
        assert [o.dtype for o in out] == [torch.float32, torch.float16, torch.float32, torch.float16]
        assert tuple(torch.ops.npu.npu_add_rms_norm_v2(x.clone(), x.clone(), g2).shape) == (2, 1, 1)
        out = torch.ops.npu.npu_add_rms_norm_v2_functional(x, x, g)
        assert [tuple(o.shape) for o in out] == [(2, 3, 1), (2, 3, 8), (2, 3, 8)]
        out = torch.ops.npu.npu_layernorm_grad(x, x, [8], rstd, rstd, g, g)
        assert [tuple(o.shape) for o in out] == [(2, 3, 8), (8,), (8,)]


def _rms_ref_beta(x, gamma, beta, eps):
    """float64 ``x * rstd * gamma + beta`` over gamma's trailing dims."""
    y, _ = _rms_ref(x, gamma, eps)
    return y if beta is None else y + beta


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_rms_norm_quant(device, dtype):
    x, gamma, beta = _rand(6, 64, seed=80).to(dtype), _rand(64, seed=81).to(dtype), _rand(64, seed=82).to(dtype)
    scale, offset = torch.tensor([40.0], dtype=dtype), torch.tensor([3], dtype=torch.int8)
    d = lambda t: t.to(device)
    y = torch_npu.npu_rms_norm_quant(d(x), d(gamma), d(beta), d(scale), d(offset), 1e-6)
    unclamped = _rms_ref_beta(x.double(), gamma.double(), beta.double(), 1e-6) * scale.double() + 3
    assert float(unclamped.abs().max()) > 128          # the data exercises saturation
    assert y.device.type == device and y.shape == (6, 64)
    _assert_int8_close(y, _q8_ref(unclamped))
    # gamma/beta given as (1, N) are accepted
    y2 = torch_npu.npu_rms_norm_quant(d(x), d(gamma.reshape(1, 64)), d(beta.reshape(1, 64)), d(scale), d(offset))
    assert torch.equal(y2.cpu(), y.cpu())
    with pytest.raises(NotImplementedError, match="dst_dtype"):
        torch_npu.npu_rms_norm_quant(d(x), d(gamma), d(beta), d(scale), d(offset), dst_dtype=torch.quint4x2)
    with pytest.raises(RuntimeError, match="must have shape"):
        torch_npu.npu_rms_norm_quant(d(x), d(gamma), d(beta), d(scale.repeat(2)), d(offset))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("div_mode", [True, False])
def test_add_rms_norm_quant(device, div_mode):
    dtype = torch.float16
    x1, x2 = _rand(3, 4, 32, seed=90).to(dtype), _rand(3, 4, 32, seed=91).to(dtype)
    gamma, beta = _rand(4, 32, seed=92).to(dtype), _rand(4, 32, seed=93).to(dtype)
    s1 = (_rand(4, 32, seed=94).abs() * 0.05 + 0.01).float()
    s2 = (_rand(4, 32, seed=95).abs() * 0.05 + 0.01).float()
    z1 = torch.randint(-5, 5, (4, 32), generator=torch.Generator().manual_seed(96), dtype=torch.int32)
    d = lambda t: None if t is None else t.to(device)
    y = _rms_ref_beta(x1.double() + x2.double(), gamma.double(), beta.double(), 1e-6)
    q = (lambda s, z: y / s.double() + z) if div_mode else (lambda s, z: y * s.double() + z)
    y1, y2, x = torch_npu.npu_add_rms_norm_quant(d(x1), d(x2), d(gamma), d(s1), d(z1), d(beta), d(s2), None,
                                                 div_mode=div_mode)
    _assert_int8_close(y1, _q8_ref(q(s1, z1.double())))
    _assert_int8_close(y2, _q8_ref(q(s2, 0.0)))
    assert x.dtype == dtype
    _close(x, x1.double() + x2.double(), 2e-3, 2e-3)
    # no beta, no scales2: y2 is defined as zeros here (the kernel leaves it unwritten)
    y1, y2, _ = torch_npu.npu_add_rms_norm_quant(d(x1), d(x2), d(gamma), d(s1), None, div_mode=div_mode)
    y_nb = _rms_ref_beta(x1.double() + x2.double(), gamma.double(), None, 1e-6)
    _assert_int8_close(y1, _q8_ref(y_nb / s1.double() if div_mode else y_nb * s1.double()))
    assert not y2.cpu().any()
    with pytest.raises(RuntimeError, match="axis only support -1"):
        torch_npu.npu_add_rms_norm_quant(d(x1), d(x2), d(gamma), d(s1), None, axis=0)


@pytest.mark.parametrize("device", DEVICES)
def test_add_rms_norm_dynamic_quant(device):
    dtype = torch.bfloat16
    x1, x2 = _rand(2, 5, 48, seed=100).to(dtype), _rand(2, 5, 48, seed=101).to(dtype)
    gamma, beta = _rand(48, seed=102).to(dtype), _rand(48, seed=103).to(dtype)
    sm1, sm2 = (_rand(48, seed=104).abs() + 0.5).to(dtype), (_rand(48, seed=105).abs() + 0.5).to(dtype)
    d = lambda t: None if t is None else t.to(device)
    y = _rms_ref_beta(x1.double() + x2.double(), gamma.double(), beta.double(), 1e-6)

    def dyn(v):
        scale = v.abs().amax(-1) / 127
        return _q8_ref(v / scale.unsqueeze(-1)), scale

    y1, y2, x, sc1, sc2 = torch_npu.npu_add_rms_norm_dynamic_quant(d(x1), d(x2), d(gamma), smooth_scale1=d(sm1),
                                                                   smooth_scale2=d(sm2), beta=d(beta))
    for got_y, got_s, smooth in ((y1, sc1, sm1), (y2, sc2, sm2)):
        ref_y, ref_s = dyn(y * smooth.double())
        assert got_s.dtype == torch.float32 and got_s.shape == (2, 5)
        _close(got_s, ref_s, 1e-5, 1e-5)
        _assert_int8_close(got_y, ref_y)
    _close(x, x1.double() + x2.double(), 2e-2, 2e-2)
    # default: only y1 (no smooth scales); y2/scale2 are 0-d
    y1, y2, _, sc1, sc2 = torch_npu.npu_add_rms_norm_dynamic_quant(d(x1), d(x2), d(gamma))
    ref_y, ref_s = dyn(_rms_ref_beta(x1.double() + x2.double(), gamma.double(), None, 1e-6))
    _assert_int8_close(y1, ref_y)
    _close(sc1, ref_s, 1e-5, 1e-5)
    assert y2.shape == () and sc2.shape == ()
    # output_mask picks y2 only
    y1, y2, _, sc1, sc2 = torch_npu.npu_add_rms_norm_dynamic_quant(d(x1), d(x2), d(gamma), output_mask=[False, True])
    assert y1.shape == () and y2.shape == (2, 5, 48)
    _assert_int8_close(y2, ref_y)
    with pytest.raises(RuntimeError, match="at least one of y1 and y2"):
        torch_npu.npu_add_rms_norm_dynamic_quant(d(x1), d(x2), d(gamma), output_mask=[False, False])
    with pytest.raises(NotImplementedError, match="y_dtype"):
        torch_npu.npu_add_rms_norm_dynamic_quant(d(x1), d(x2), d(gamma), y_dtype=torch.quint4x2)
