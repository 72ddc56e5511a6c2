"""Training ops (torch_npu/op_plugin/training/: losses, adam, dropout): npu_cross_entropy_loss (+ backward),
npu_bert_apply_adam (+ .out), npu_apply_adam_w (+ .out), _npu_dropout,
npu_dropout_backward, npu_dropout_do_mask.

References are written here from the documented formulas in float64 (never by calling
the implementation); cross-entropy autograd is also checked against F.cross_entropy and
AdamW against torch.optim.AdamW.
"""
import math

import pytest
import torch
import torch.nn.functional as F

import torch_npu

from _op_helpers import DEVICES, close_to as close, uniform as rand

DTYPES = [torch.float32, torch.float16]
TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.float16: dict(rtol=2e-3, atol=2e-3)}
params = pytest.mark.parametrize("device,dtype", [(d, t) for d in DEVICES for t in DTYPES],
                                 ids=lambda v: str(v).replace("torch.", ""))


# ------------------------------------------------------------------ cross entropy


def ref_ce(x, t, w, reduction, ignore_index, eps, zscale):
    """float64 loop-free reference from the formula: per-row
    loss_i = (1-eps) * w[t_i] * -logp[i,t_i] + eps/C * sum_c w_c * -logp[i,c] (0 if ignored),
    mean divides by sum of w[t_i] over non-ignored rows."""
    x = x.double()
    n, c = x.shape
    m = x.max(-1, keepdim=True).values
    lse = (m.squeeze(-1) + torch.log(torch.exp(x - m).sum(-1)))
    logp = x - lse[:, None]
    w = torch.ones(c, dtype=torch.float64) if w is None else w.double()
    valid = (t != ignore_index)
    tc = torch.where(valid, t, 0)
    vf = valid.double()
    wt = w[tc] * vf
    nll = -logp[torch.arange(n), tc] * wt
    smooth = -(logp * w).sum(-1) * vf
    per_row = (1 - eps) * nll + eps / c * smooth
    z = zscale * lse ** 2 * vf
    if reduction == "none":
        return per_row, logp, z, lse
    if reduction == "sum":
        return per_row.sum(), logp, z.sum(), lse
    return per_row.sum() / wt.sum(), logp, z.sum() / vf.sum(), lse


def ce_inputs(device, dtype, n=6, c=5, seed=0):
    x = rand((n, c), dtype, device, seed=seed)
    t = torch.tensor([0, 4, -100, 2, 1, 4][:n], device=device)
    w = rand((c,), torch.float32, device, seed=seed + 1, low=0.5, high=1.5)
    return x, t, w


@params
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("use_weight,eps", [(False, 0.0), (True, 0.0), (True, 0.1), (False, 0.2)])
def test_cross_entropy_forward(device, dtype, reduction, use_weight, eps):
    x, t, w = ce_inputs(device, dtype)
    w = w if use_weight else None
    loss, logp, z, lse = torch_npu.npu_cross_entropy_loss(
        x, t, w, reduction, -100, eps, 0.25, True)
    r_loss, r_logp, r_z, r_lse = ref_ce(x.cpu(), t.cpu(), None if w is None else w.cpu(),
                                        reduction, -100, eps, 0.25)
    close(loss, r_loss, TOL[dtype], dtype, device)
    close(logp, r_logp, TOL[dtype], dtype, device)
    close(z, r_z, TOL[dtype], dtype, device)
    close(lse, r_lse, TOL[torch.float32], torch.float32, device)
    # loss equals F.cross_entropy with the same arguments
    f = F.cross_entropy(x.float(), t, w, ignore_index=-100, reduction=reduction, label_smoothing=eps)
    close(loss, f.double(), TOL[dtype])


def test_cross_entropy_no_zloss_and_custom_ignore():
    x, t, _ = ce_inputs("npu", torch.float32)
    t = t.clone()
    t[1] = 3
    t[2] = 0
    loss, logp, z, lse = torch_npu.npu_cross_entropy_loss(x, t, ignore_index=3)
    assert z.numel() == 0 and z.device.type == "npu"
    r_loss, _, _, r_lse = ref_ce(x.cpu(), t.cpu(), None, "mean", 3, 0.0, 0.0)
    close(loss, r_loss, TOL[torch.float32])
    close(lse, r_lse, TOL[torch.float32])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_autograd_matches_torch(device, reduction):
    x, t, w = ce_inputs(device, torch.float32)
    x1 = x.clone().requires_grad_(True)
    x2 = x.clone().requires_grad_(True)
    loss = torch_npu.npu_cross_entropy_loss(x1, t, w, reduction, -100, 0.1)[0]
    ref = F.cross_entropy(x2, t, w, ignore_index=-100, reduction=reduction, label_smoothing=0.1)
    cot = rand(loss.shape, device=device, seed=7)
    (g1,) = torch.autograd.grad(loss, x1, cot)
    (g2,) = torch.autograd.grad(ref, x2, cot)
    assert g1.device.type == device
    torch.testing.assert_close(g1, g2, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("use_weight,eps", [(False, 0.0), (True, 0.15)])
def test_cross_entropy_backward_op(device, reduction, use_weight, eps):
    x, t, w = ce_inputs(device, torch.float32)
    w = w if use_weight else None
    zs = 0.3
    loss, logp, z, lse = torch_npu.npu_cross_entropy_loss(x, t, w, reduction, -100, eps, zs, True)
    gl = rand(loss.shape, device=device, seed=3)
    gz = rand(z.shape, device=device, seed=4)
    grad = torch_npu.npu_cross_entropy_loss_backward(gl, logp, t, w, gz, lse, reduction, -100, eps, zs)
    xr = x.cpu().double().requires_grad_(True)
    r_loss, _, r_z, _ = ref_ce(xr, t.cpu(), None if w is None else w.cpu(), reduction, -100, eps, zs)
    (rg,) = torch.autograd.grad([r_loss, r_z], xr, [gl.cpu().double(), gz.cpu().double()])
    close(grad, rg, dict(rtol=1e-5, atol=1e-5), torch.float32, device)


def test_cross_entropy_meta_and_errors():
    x = torch.empty(4, 7, device="meta")
    t = torch.empty(4, dtype=torch.long, device="meta")
    loss, logp, z, lse = torch_npu.npu_cross_entropy_loss(x, t, reduction="none", return_zloss=True)
    assert loss.shape == (4,) and logp.shape == (4, 7) and z.shape == (4,) and lse.shape == (4,)
    x, t, _ = ce_inputs("cpu", torch.float32)
    with pytest.raises(NotImplementedError, match="reduction='avg'"):
        torch_npu.npu_cross_entropy_loss(x, t, reduction="avg")
    with pytest.raises(NotImplementedError, match="target dtype"):
        torch_npu.npu_cross_entropy_loss(x, t.float())
    with pytest.raises(RuntimeError, match="2-D"):
        torch_npu.npu_cross_entropy_loss(x[0], t[:1])


# ------------------------------------------------------------------ BertAdam


def ref_bert_adam(var, m, v, grad, lr, b1, b2, eps, max_norm, gnorm, wd):
    var, m, v, g = (a.cpu().double() for a in (var, m, v, grad))
    if max_norm > 0:
        coef = max_norm / (gnorm + 1e-6)
        if coef < 1:
            g = g * coef
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    upd = m / (v.sqrt() + eps)
    if wd > 0:
        upd = upd + wd * var
    return var - lr * upd, m, v


@params
@pytest.mark.parametrize("max_norm,gnorm,wd", [(1.0, 3.0, 0.01), (1.0, 0.5, 0.0), (0.0, 9.0, 0.1)])
def test_bert_apply_adam_out(device, dtype, max_norm, gnorm, wd):
    shape = (3, 17)
    var = rand(shape, dtype, device, seed=1)
    m = rand(shape, dtype, device, seed=2, low=-0.1, high=0.1)
    v = rand(shape, dtype, device, seed=3, low=0.0, high=0.1)
    grad = rand(shape, dtype, device, seed=4)
    ref = ref_bert_adam(var, m, v, grad, 0.01, 0.9, 0.999, 1e-6, max_norm, gnorm, wd)
    outs = torch_npu.npu_bert_apply_adam(0.01, 0.9, 0.999, 1e-6, grad, max_norm, gnorm, wd,
                                         var=var, m=m, v=v)
    assert outs[0] is var and outs[1] is m and outs[2] is v
    for o, r in zip((var, m, v), ref):
        close(o, r, TOL[dtype], dtype, device)


@pytest.mark.parametrize("device", DEVICES)
def test_bert_apply_adam_functional_starts_from_zero(device):
    grad = rand((5, 4), device=device, seed=9)
    z = torch.zeros(5, 4)
    ref = ref_bert_adam(z, z, z, grad, 0.1, 0.8, 0.99, 1e-6, 1.0, 2.0, 0.01)
    outs = torch_npu.npu_bert_apply_adam(0.1, 0.8, 0.99, 1e-6, grad, 1.0, 2.0, 0.01)
    for o, r in zip(outs, ref):
        close(o, r, TOL[torch.float32], torch.float32, device)


def test_bert_apply_adam_unsupported():
    g = torch.ones(3)
    with pytest.raises(NotImplementedError, match="adam_mode=1"):
        torch_npu.npu_bert_apply_adam(0.1, 0.9, 0.999, 1e-6, g, 1.0, 1.0, 0.0, adam_mode=1)
    with pytest.raises(NotImplementedError, match="step_size"):
        torch_npu.npu_bert_apply_adam(0.1, 0.9, 0.999, 1e-6, g, 1.0, 1.0, 0.0, step_size=0.5)


# ------------------------------------------------------------------ AdamW


def ref_adam_w(var, m, v, grad, step, lr, wd, b1, b2, eps, vmax, amsgrad, maximize):
    var, m, v, g = (a.cpu().double() for a in (var, m, v, grad))
    if maximize:
        g = -g
    var = var * (1 - lr * wd)
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    vv = torch.maximum(vmax.cpu().double(), v) if amsgrad else v
    bc1, bc2 = 1 - b1 ** step, 1 - b2 ** step
    var = var - lr / bc1 * m / (vv.sqrt() / math.sqrt(bc2) + eps)
    return var, m, v


@params
@pytest.mark.parametrize("amsgrad,maximize", [(False, False), (True, False), (False, True), (True, True)])
def test_apply_adam_w_out(device, dtype, amsgrad, maximize):
    shape = (4, 9)
    var = rand(shape, dtype, device, seed=1)
    m = rand(shape, dtype, device, seed=2, low=-0.1, high=0.1)
    v = rand(shape, dtype, device, seed=3, low=0.0, high=0.1)
    vmax = rand(shape, dtype, device, seed=5, low=0.0, high=0.2)
    grad = rand(shape, dtype, device, seed=4)
    step, b1, b2 = 3, 0.9, 0.99
    ref = ref_adam_w(var, m, v, grad, step, 0.01, 0.05, b1, b2, 1e-8, vmax, amsgrad, maximize)
    outs = torch_npu.npu_apply_adam_w(b1 ** step, b2 ** step, 0.01, 0.05, b1, b2, 1e-8, grad,
                                      vmax if amsgrad else None, amsgrad, maximize, var=var, m=m, v=v)
    assert outs[0] is var and outs[1] is m and outs[2] is v
    for o, r in zip((var, m, v), ref):
        close(o, r, TOL[dtype], dtype, device)


@pytest.mark.parametrize("amsgrad,maximize", [(False, False), (True, True)])
def test_apply_adam_w_matches_torch_optim(amsgrad, maximize):
    """Two steps of torch.optim.AdamW vs two npu_apply_adam_w.out calls on npu tensors."""
    p = torch.nn.Parameter(rand((6,), torch.float64, seed=1))
    opt = torch.optim.AdamW([p], lr=0.02, betas=(0.8, 0.95), eps=1e-8, weight_decay=0.1,
                            amsgrad=amsgrad, maximize=maximize)
    var = p.detach().clone().float().to("npu")
    m = torch.zeros(6, device="npu")
    v = torch.zeros(6, device="npu")
    vmax = torch.zeros(6, device="npu")
    for step in (1, 2):
        g = rand((6,), torch.float64, seed=10 + step)
        p.grad = g.clone()
        opt.step()
        torch_npu.npu_apply_adam_w(0.8 ** step, 0.95 ** step, 0.02, 0.1, 0.8, 0.95, 1e-8,
                                   g.float().to("npu"), vmax if amsgrad else None, amsgrad, maximize,
                                   var=var, m=m, v=v)
        vmax = torch.maximum(vmax, v)
    torch.testing.assert_close(var.cpu().double(), p.detach(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
def test_apply_adam_w_functional_and_errors(device):
    grad = rand((7,), device=device, seed=2)
    z = torch.zeros(7)
    ref = ref_adam_w(z, z, z, grad, 1, 0.1, 0.01, 0.9, 0.999, 1e-8, z, False, False)
    outs = torch_npu.npu_apply_adam_w(0.9, 0.999, 0.1, 0.01, 0.9, 0.999, 1e-8, grad, None, None, None)
    for o, r in zip(outs, ref):
        close(o, r, TOL[torch.float32], torch.float32, device)
    with pytest.raises(NotImplementedError, match="amsgrad=True"):
        torch_npu.npu_apply_adam_w(0.9, 0.999, 0.1, 0.01, 0.9, 0.999, 1e-8, grad, None, True, False)


# ------------------------------------------------------------------ dropout


def unpack_mask(mask, n):
    """Documented format: bit i % 8 (LSB first) of byte i // 8, bit 1 = keep."""
    bytes_ = mask.cpu().tolist()
    return torch.tensor([(bytes_[i // 8] >> (i % 8)) & 1 for i in range(n)], dtype=torch.bool)


@params
def test_dropout_scaling_and_mask(device, dtype):
    shape = (13, 21)
    x = rand(shape, dtype, device, seed=1, low=0.5, high=1.5)
    p = 0.3
    torch.npu.manual_seed(123)
    out, mask = torch_npu._npu_dropout(x, p)
    n = x.numel()
    assert mask.dtype == torch.uint8 and mask.dim() == 1 and mask.device.type == device
    assert mask.numel() == (n + 127) // 128 * 16
    keep = unpack_mask(mask, n).reshape(shape)
    # padding bits are zero
    tail = mask.cpu().tolist()
    assert all(((tail[i // 8] >> (i % 8)) & 1) == 0 for i in range(n, mask.numel() * 8))
    ref = x.cpu().double() * keep.double() / (1 - p)
    close(out, ref, TOL[dtype], dtype, device)
    # backward op and do_mask agree with the same mask
    gy = rand(shape, dtype, device, seed=2)
    close(torch_npu.npu_dropout_backward(gy, mask, p), gy.cpu().double() * keep.double() / (1 - p),
          TOL[dtype], dtype, device)
    o2, m2 = torch_npu.npu_dropout_do_mask(x, mask, p)
    close(o2, ref, TOL[dtype], dtype, device)
    assert torch.equal(m2, mask)


def test_dropout_statistics_reproducibility_autograd():
    x = torch.ones(200_000, device="npu")
    for p in (0.1, 0.5, 0.8):
        torch.npu.manual_seed(7)
        out, mask = torch_npu._npu_dropout(x, p)
        kept = (out != 0).double().mean().item()
        sd = math.sqrt(p * (1 - p) / x.numel())
        assert abs(kept - (1 - p)) < 5 * sd, (p, kept)
        assert abs(out.double().mean().item() - 1.0) < 5 * sd / (1 - p)
        torch.npu.manual_seed(7)
        out2, mask2 = torch_npu._npu_dropout(x, p)
        assert torch.equal(out, out2) and torch.equal(mask, mask2)
    torch.npu.manual_seed(8)
    out3, _ = torch_npu._npu_dropout(x, 0.8)
    assert not torch.equal(out, out3)
    # p = 0 keeps everything, p = 1 drops everything
    out0, mask0 = torch_npu._npu_dropout(x[:300], 0.0)
    assert torch.equal(out0, x[:300]) and unpack_mask(mask0, 300).all()
    out1, _ = torch_npu._npu_dropout(x[:300], 1.0)
    assert (out1 == 0).all()
    # autograd of out w.r.t. self equals npu_dropout_backward
    xs = rand((5, 40), device="npu", seed=3).requires_grad_(True)
    out, mask = torch_npu._npu_dropout(xs, 0.4)
    gy = rand((5, 40), device="npu", seed=4)
    (gx,) = torch.autograd.grad(out, xs, gy)
    torch.testing.assert_close(gx, torch_npu.npu_dropout_backward(gy, mask, 0.4))
    with pytest.raises(NotImplementedError, match="p=1.5"):
        torch_npu._npu_dropout(xs, 1.5)
    with pytest.raises(RuntimeError, match="bytes"):
        torch_npu.npu_dropout_backward(gy, mask[:-16], 0.4)


# ------------------------------------------------------------------ npu_dropout_gen_mask


def _unpack_bits(mask, numel):
    """Reference unpacking written from the format: element i is bit i % 8 (LSB first) of byte i // 8."""
    bytes_ = mask.cpu().tolist()
    return [(bytes_[i // 8] >> (i % 8)) & 1 for i in range(numel)]


@pytest.mark.parametrize("size", [[300], [3, 5, 7], [128], [0]])
def test_dropout_gen_mask_format_and_same_draws_as_dropout(size):
    numel = math.prod(size)
    torch.npu.manual_seed(11)
    mask = torch_npu.npu_dropout_gen_mask(size, 0.3, dtype=torch.float16)
    assert mask.dtype == torch.uint8 and mask.device.type == "npu"
    assert mask.shape == ((numel + 127) // 128 * 16,)
    bits = _unpack_bits(mask, mask.numel() * 8)
    assert all(b == 0 for b in bits[numel:])  # padding bits are zero
    # Same seed, same tensor size: _npu_dropout draws the same mask from the npu generator.
    torch.npu.manual_seed(11)
    x = torch.ones(size, device="npu")
    out, mask2 = torch_npu._npu_dropout(x, 0.3)
    assert torch.equal(mask.cpu(), mask2.cpu())
    kept = bits[:numel]
    assert out.cpu().reshape(-1).tolist() == pytest.approx([k / 0.7 for k in kept])


def test_dropout_gen_mask_statistics_and_edges():
    torch.npu.manual_seed(5)
    n = 128 * 200
    bits = _unpack_bits(torch_npu.npu_dropout_gen_mask([n], 0.25), n)
    rate = sum(bits) / n
    assert abs(rate - 0.75) < 4 * math.sqrt(0.75 * 0.25 / n)
    assert set(_unpack_bits(torch_npu.npu_dropout_gen_mask([100], 0.0), 100)) == {1}
    assert set(_unpack_bits(torch_npu.npu_dropout_gen_mask([100], 1.0), 100)) == {0}
    cpu_mask = torch_npu.npu_dropout_gen_mask([10], 0.5, device="cpu")
    assert cpu_mask.device.type == "cpu" and cpu_mask.shape == (16,)
    with pytest.raises(NotImplementedError, match="p=1.5"):
        torch_npu.npu_dropout_gen_mask([4], 1.5)
