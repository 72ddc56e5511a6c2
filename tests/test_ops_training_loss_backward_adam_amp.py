"""Training ops: loss-gradient ops against autograd of PyTorch's losses, dropout with a byte mask,
the AMP non-finite check and the ApplyAdam step."""
import math

import pytest
import torch
import torch.nn.functional as F

import torch_npu

from _op_helpers import DEVICES, randn_dims as _rand


def _grad_of(fn, x, g):
    x = x.detach().clone().requires_grad_(True)
    return torch.autograd.grad(fn(x), x, g)[0]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("reduction", [0, 1, 2])
def test_loss_backward_ops(device, reduction):
    names = {0: "none", 1: "mean", 2: "sum"}
    red = names[reduction]
    x, t = _rand(3, 4, seed=1), _rand(3, 4, seed=2)
    g = _rand(3, 4, seed=3) if reduction == 0 else torch.tensor(0.7, dtype=torch.float64)
    ref = _grad_of(lambda x: F.l1_loss(x, t, reduction=red), x, g)
    torch.testing.assert_close(torch.ops.npu.l1_loss_backward(g.to(device), x.to(device), t.to(device),
                                                              reduction).cpu(), ref)

    logp = torch.log_softmax(_rand(3, 4, seed=4), -1)
    p = torch.softmax(_rand(3, 4, seed=5), -1)
    p[0, 1] = 0.0
    for log_target, target in ((False, p), (True, torch.log(p.clamp_min(1e-3)))):
        ref = _grad_of(lambda x: F.kl_div(x, target, reduction=red, log_target=log_target), logp, g)
        got = torch.ops.npu.kl_div_backward(g.to(device), logp.to(device), target.to(device), reduction,
                                            log_target=log_target)
        torch.testing.assert_close(got.cpu(), ref)
        ref = _grad_of(lambda t: F.kl_div(logp, t, reduction=red, log_target=log_target), target, g)
        got = torch.ops.npu.kl_div_target_backward(g.to(device), logp.to(device), target.to(device), reduction,
                                                   log_target=log_target)
        if not log_target:
            # d/dt of t*log(t) at t = 0: autograd gives NaN; the op masks it to 0, as PyTorch's own
            # kl_div_target_backward formula did (masked_fill(target == 0, 0))
            assert torch.isnan(ref[0, 1]) and got.cpu()[0, 1] == 0
            ref[0, 1] = 0.0
        torch.testing.assert_close(got.cpu(), ref)

    tgt = torch.rand(3, 4, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    w, pw = torch.rand(4, dtype=torch.float64) + 0.5, torch.rand(4, dtype=torch.float64) + 0.5
    for weight, pos in ((None, None), (w, None), (None, pw), (w, pw)):
        ref = _grad_of(lambda x: F.binary_cross_entropy_with_logits(x, tgt, weight, reduction=red, pos_weight=pos),
                       x, g)
        got = torch_npu.npu_binary_cross_entropy_with_logits_backward(
            g.to(device), x.to(device), tgt.to(device), None if weight is None else weight.to(device),
            None if pos is None else pos.to(device), reduction)
        torch.testing.assert_close(got.cpu(), ref)


@pytest.mark.parametrize("device", DEVICES)
def test_softmax_cross_entropy_backward(device):
    x = _rand(3, 5, seed=1)
    labels = torch.softmax(_rand(3, 5, seed=2), -1) * torch.tensor([[1.0], [2.0], [0.5]], dtype=torch.float64)
    g = _rand(3, seed=3)
    ref = _grad_of(lambda x: -(labels * torch.log_softmax(x, -1)).sum(-1), x, g)
    got = torch_npu.npu_softmax_cross_entropy_with_logits_backward(g.to(device), x.to(device), labels.to(device))
    torch.testing.assert_close(got.cpu(), ref)


def test_dropout_with_byte_mask():
    torch.npu.manual_seed(5)
    x = torch.ones(4000, device="npu")
    out, mask = torch.ops.npu._dropout_with_byte_mask(x, 0.25)
    assert mask.dtype == torch.uint8 and mask.shape == x.shape
    kept = mask.cpu().bool()
    assert torch.equal(out.cpu()[kept], torch.full((int(kept.sum()),), 1 / 0.75))
    assert torch.equal(out.cpu()[~kept], torch.zeros(int((~kept).sum())))
    assert abs(kept.float().mean().item() - 0.75) < 0.03
    g = _rand(4000, dtype=torch.float32).npu()
    back = torch.ops.npu._dropout_with_byte_mask_backward(g, mask, 0.25)
    torch.testing.assert_close(back.cpu(), g.cpu() * kept.float() / 0.75)
    with pytest.raises(RuntimeError, match="uint8"):
        torch.ops.npu._dropout_with_byte_mask_backward(g, mask.bool(), 0.25)
    assert torch.equal(torch.ops.npu._dropout_with_byte_mask(x, 1.0)[0].cpu(), torch.zeros(4000))


def test_amp_non_finite_check():
    grads = [torch.ones(3, device="npu"), torch.zeros(2, 2, device="npu")]
    assert torch.ops.npu._amp_foreach_non_finite_check(grads) is False
    grads[1][1, 0] = float("inf")
    assert torch.ops.npu._amp_foreach_non_finite_check(grads) is True
    assert torch.ops.npu._amp_foreach_non_finite_check([torch.tensor([float("nan")], device="npu")]) is True


def _apply_adam_ref(var, m, v, g, lr, b1, b2, eps, t, nesterov):
    out = []
    for var_i, m_i, v_i, g_i in zip(var.tolist(), m.tolist(), v.tolist(), g.tolist()):
        lr_t = lr * math.sqrt(1 - b2 ** t) / (1 - b1 ** t)
        m_i = m_i + (g_i - m_i) * (1 - b1)
        v_i = v_i + (g_i * g_i - v_i) * (1 - b2)
        step = m_i * b1 + (1 - b1) * g_i if nesterov else m_i
        out.append((var_i - lr_t * step / (math.sqrt(v_i) + eps), m_i, v_i))
    return [torch.tensor(c, dtype=torch.float64) for c in zip(*out)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("nesterov", [False, True])
def test_apply_adam(device, nesterov):
    var, m, v = _rand(6, seed=1), _rand(6, seed=2) * 0.1, _rand(6, seed=3).abs() * 0.1
    g = _rand(6, seed=4)
    t = 3
    ref = _apply_adam_ref(var, m, v, g, 0.01, 0.9, 0.999, 1e-8, t, nesterov)
    dv, dm, dvv = var.clone().to(device), m.clone().to(device), v.clone().to(device)
    res = torch_npu.npu_apply_adam(0.9 ** t, 0.999 ** t, 0.01, 0.9, 0.999, 1e-8, g.to(device), False, nesterov,
                                   var=dv, m=dm, v=dvv)
    assert res[0] is dv and res[1] is dm and res[2] is dvv
    for a, e in zip((dv, dm, dvv), ref):
        torch.testing.assert_close(a.cpu(), e)
    fresh = torch.ops.npu.npu_apply_adam(0.9 ** t, 0.999 ** t, 0.01, 0.9, 0.999, 1e-8, g.to(device), False,
                                         nesterov)
    zeros = torch.zeros(6, dtype=torch.float64)
    for a, e in zip(fresh, _apply_adam_ref(zeros, zeros, zeros, g, 0.01, 0.9, 0.999, 1e-8, t, nesterov)):
        torch.testing.assert_close(a.cpu(), e)
