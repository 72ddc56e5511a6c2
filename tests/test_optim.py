"""torch_npu.optim: the fused optimizers.

Every optimizer is checked against an independent reference that never calls
torch_npu.optim: the matching ``torch.optim`` class (SGD, Adam, AdamW, RMSprop,
Adadelta) or a plain per-parameter implementation, written below, of the
published algorithm (AdamP, BertAdam, LAMB, RMSpropTF).  Training runs 20 steps
on npu parameters (and on CPU for a few cases) and compares the parameters.
"""
import copy
import inspect
import io
import math

import pytest
import torch
import torch.nn as nn
from torch.optim.optimizer import Optimizer, required

import torch_npu  # noqa: F401
import torch_npu.optim as fused
from torch_npu.optim import (NpuFusedAdadelta, NpuFusedAdam, NpuFusedAdamP, NpuFusedAdamW,
                             NpuFusedBertAdam, NpuFusedLamb, NpuFusedOptimizerBase, NpuFusedRMSprop,
                             NpuFusedRMSpropTF, NpuFusedSGD)

from _subproc import run_json

DEV = "npu"
STEPS = 20
RTOL, ATOL = 1e-6, 1e-7


@pytest.fixture(autouse=True, scope="module")
def _one_intra_op_thread():
    """The tensors here are tiny: with several intra-op threads the run time is
    dominated by thread hand-offs (and explodes on a loaded machine)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


# --------------------------------------------------------------------- helpers
def _mlp(device=DEV, seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 10), nn.Tanh(), nn.Linear(10, 3)).to(device)


def _batches(steps=STEPS, n_in=6, n_out=3, batch=16, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(batch, n_in, generator=g), torch.randn(batch, n_out, generator=g))
            for _ in range(steps)]


def _train(model, opt, batches, device=DEV, loss_scale=1.0, lr_decay=1.0):
    for x, y in batches:
        opt.zero_grad()
        loss = ((model(x.to(device)) - y.to(device)) ** 2).mean() * loss_scale
        loss.backward()
        opt.step()
        for group in opt.param_groups:  # hyper-parameters are read at every step
            group["lr"] *= lr_decay


def _assert_params_close(m_test, m_ref, rtol=RTOL, atol=ATOL):
    moved = False
    for (name, a), (_, b) in zip(m_test.named_parameters(), m_ref.named_parameters()):
        assert a.device == b.device and a.dtype == b.dtype
        torch.testing.assert_close(a.detach().cpu(), b.detach().cpu(), rtol=rtol, atol=atol, msg=name)
    for a, b in zip(m_test.parameters(), _mlp_like(m_ref)):
        moved |= not torch.equal(a.detach().cpu(), b.cpu())
    assert moved, "the optimizer did not change any parameter"


_INITIAL = {}


def _mlp_like(model):
    """The initial parameters of ``model`` (recorded by ``_pair``)."""
    return _INITIAL[id(model)]


def _pair(factory, device=DEV):
    a, b = factory(device), factory(device)
    _INITIAL[id(b)] = [p.detach().cpu().clone() for p in b.parameters()]
    return a, b


# ------------------------------------------------------------ reference math
class RefAdamP(Optimizer):
    """AdamP (Heo et al. 2021, clovaai/AdamP), one parameter at a time."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0,
                 delta=0.1, wd_ratio=0.1, nesterov=False):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                                      delta=delta, wd_ratio=wd_ratio, nesterov=nesterov))
        self.branches = []

    @staticmethod
    def _cos(x, y, eps):
        return (x * y).sum(dim=1).abs() / x.norm(dim=1).add(eps) / y.norm(dim=1).add(eps)

    def _projection(self, p, grad, perturb, delta, wd_ratio, eps):
        expand = [-1] + [1] * (p.dim() - 1)
        for name, view in (("channel", lambda t: t.reshape(t.size(0), -1)),
                           ("layer", lambda t: t.reshape(1, -1))):
            if self._cos(view(grad), view(p), eps).max() < delta / math.sqrt(view(p).size(1)):
                p_n = p / view(p).norm(dim=1).view(expand).add(eps)
                perturb = perturb - p_n * view(p_n * perturb).sum(dim=1).view(expand)
                return perturb, wd_ratio, name
        return perturb, 1, "none"

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad, state = p.grad, self.state[p]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p)
                    state["exp_avg_sq"] = torch.zeros_like(p)
                state["step"] += 1
                m, v = state["exp_avg"], state["exp_avg_sq"]
                m.mul_(beta1).add_(grad, alpha=1 - beta1)
                v.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                denom = (v.sqrt() / math.sqrt(1 - beta2 ** state["step"])).add_(group["eps"])
                step_size = group["lr"] / (1 - beta1 ** state["step"])
                if group["nesterov"]:
                    perturb = (beta1 * m + (1 - beta1) * grad) / denom
                else:
                    perturb = m / denom
                wd_ratio = 1
                if p.dim() > 1:
                    perturb, wd_ratio, branch = self._projection(p, grad, perturb, group["delta"],
                                                                 group["wd_ratio"], group["eps"])
                    self.branches.append(branch)
                if group["weight_decay"] > 0:
                    p.mul_(1 - group["lr"] * group["weight_decay"] * wd_ratio)
                p.add_(perturb, alpha=-step_size)


def _sched(name, x, warmup):
    """NVIDIA BERT BertAdam learning-rate schedules."""
    if x < warmup:
        return x / warmup
    if name == "warmup_cosine":
        return 0.5 * (1.0 + math.cos(math.pi * x))
    if name == "warmup_constant":
        return 1.0
    if name == "warmup_linear":
        return max((x - 1.0) / (warmup - 1.0), 0.0)
    if name == "warmup_poly":
        return (1.0 - x) ** 0.5
    raise ValueError(name)


class RefBertAdam(Optimizer):
    """BertAdam (Adam without bias correction, decoupled weight decay, warmup
    schedules).  Clipping as in the fused NPU version: the gradients of a param
    group are clipped together to ``max_grad_norm``."""

    def __init__(self, params, lr, warmup=-1, t_total=-1, schedule="warmup_linear", b1=0.9, b2=0.999,
                 e=1e-6, weight_decay=0.01, max_grad_norm=1.0):
        super().__init__(params, dict(lr=lr, warmup=warmup, t_total=t_total, schedule=schedule, b1=b1, b2=b2,
                                      e=e, weight_decay=weight_decay, max_grad_norm=max_grad_norm))
        self.clipped = 0
        self.lrs = []

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if group["max_grad_norm"] > 0:
                total_norm = torch.cat([p.grad.flatten() for p in params]).float().pow(2).sum().sqrt()
                clip_coef = group["max_grad_norm"] / (total_norm + 1e-6)
                if clip_coef < 1:
                    self.clipped += 1
                    for p in params:
                        p.grad.mul_(clip_coef)
            for p in params:
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["next_m"] = torch.zeros_like(p)
                    state["next_v"] = torch.zeros_like(p)
                m, v, grad = state["next_m"], state["next_v"], p.grad
                m.mul_(group["b1"]).add_(grad, alpha=1 - group["b1"])
                v.mul_(group["b2"]).addcmul_(grad, grad, value=1 - group["b2"])
                update = m / (v.sqrt() + group["e"])
                if group["weight_decay"] > 0.0:
                    update += group["weight_decay"] * p
                if group["t_total"] != -1:
                    lr = group["lr"] * _sched(group["schedule"], state["step"] / group["t_total"], group["warmup"])
                else:
                    lr = group["lr"]
                self.lrs.append(lr)
                p.add_(-(lr * update))
                state["step"] += 1


class RefLamb(Optimizer):
    """LAMB as in cybertronai/pytorch-lamb: no bias correction, per-parameter
    trust ratio clamp(||w||, 0, 10) / ||adam_step||."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-6, weight_decay=0, adam=False,
                 use_global_grad_norm=False):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))
        self.adam, self.use_global_grad_norm = adam, use_global_grad_norm
        self.divided = 0
        self.clamped = 0
        self.ratios = []

    @torch.no_grad()
    def step(self):
        global_norm = None
        if self.use_global_grad_norm:
            global_norm = torch.cat([p.grad.flatten() for g in self.param_groups for p in g["params"]
                                     if p.grad is not None]).pow(2).sum().sqrt()
            if global_norm > 1:
                self.divided += 1
            else:
                global_norm = None
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = p.grad if global_norm is None else p.grad / global_norm
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p)
                    state["exp_avg_sq"] = torch.zeros_like(p)
                state["step"] += 1
                exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
                exp_avg.mul_(beta1).add_(grad, alpha=1 - beta1)
                exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                step_size = group["lr"]  # no bias correction (paper v3)
                weight_norm = p.pow(2).sum().sqrt().clamp(0, 10)
                self.clamped += int(p.pow(2).sum().sqrt() > 10)
                adam_step = exp_avg / exp_avg_sq.sqrt().add(group["eps"])
                if group["weight_decay"] != 0:
                    adam_step.add_(p, alpha=group["weight_decay"])
                adam_norm = adam_step.pow(2).sum().sqrt()
                if weight_norm == 0 or adam_norm == 0:
                    trust_ratio = 1
                else:
                    trust_ratio = weight_norm / adam_norm
                if self.adam:
                    trust_ratio = 1
                self.ratios.append(float(trust_ratio))
                p.add_(adam_step, alpha=-step_size * trust_ratio)


class RefRMSpropTF(Optimizer):
    """TensorFlow-style RMSprop (timm RMSpropTF): square_avg starts at 1, eps
    inside the sqrt, lr folded into the momentum buffer, decoupled decay
    ``p -= weight_decay * p``."""

    def __init__(self, params, lr=1e-2, alpha=0.9, eps=1e-10, weight_decay=0, momentum=0., centered=False,
                 decoupled_decay=False, lr_in_momentum=True):
        super().__init__(params, dict(lr=lr, alpha=alpha, eps=eps, weight_decay=weight_decay, momentum=momentum,
                                      centered=centered, decoupled_decay=decoupled_decay,
                                      lr_in_momentum=lr_in_momentum))

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad, state = p.grad, self.state[p]
                if not state:
                    state["square_avg"] = torch.ones_like(p)
                    state["momentum_buffer"] = torch.zeros_like(p)
                    state["grad_avg"] = torch.zeros_like(p)
                square_avg = state["square_avg"]
                one_minus_alpha = 1. - group["alpha"]
                if group["weight_decay"] != 0:
                    if group["decoupled_decay"]:
                        p.add_(p, alpha=-group["weight_decay"])
                    else:
                        grad = grad.add(p, alpha=group["weight_decay"])
                # Tensorflow order of ops for updating squared avg
                square_avg.add_(grad.pow(2) - square_avg, alpha=one_minus_alpha)
                if group["centered"]:
                    grad_avg = state["grad_avg"]
                    grad_avg.add_(grad - grad_avg, alpha=one_minus_alpha)
                    avg = square_avg.addcmul(grad_avg, grad_avg, value=-1).add(group["eps"]).sqrt_()
                else:
                    avg = square_avg.add(group["eps"]).sqrt_()  # eps moved in sqrt
                if group["momentum"] > 0:
                    buf = state["momentum_buffer"]
                    if group["lr_in_momentum"]:
                        # Tensorflow accumulates the LR scaling in the momentum buffer
                        buf.mul_(group["momentum"]).addcdiv_(grad, avg, value=group["lr"])
                        p.add_(-buf)
                    else:
                        buf.mul_(group["momentum"]).addcdiv_(grad, avg)
                        p.add_(buf, alpha=-group["lr"])
                else:
                    p.addcdiv_(grad, avg, value=-group["lr"])


# --------------------------------------------------------------- API surface
REAL_ALL = ["NpuFusedOptimizerBase", "NpuFusedSGD", "NpuFusedAdadelta", "NpuFusedLamb", "NpuFusedAdam",
            "NpuFusedAdamW", "NpuFusedAdamP", "NpuFusedBertAdam", "NpuFusedRMSprop", "NpuFusedRMSpropTF"]

SUBMODULES = {
    "npu_fused_optim_base": "NpuFusedOptimizerBase", "npu_fused_sgd": "NpuFusedSGD",
    "npu_fused_adadelta": "NpuFusedAdadelta", "npu_fused_lamb": "NpuFusedLamb",
    "npu_fused_adam": "NpuFusedAdam", "npu_fused_adamw": "NpuFusedAdamW", "npu_fused_adamp": "NpuFusedAdamP",
    "npu_fused_bert_adam": "NpuFusedBertAdam", "npu_fused_rmsprop": "NpuFusedRMSprop",
    "npu_fused_rmsprop_tf": "NpuFusedRMSpropTF",
}

SIGNATURES = {
    NpuFusedOptimizerBase: [("params", inspect.Parameter.empty), ("default", inspect.Parameter.empty)],
    NpuFusedSGD: [("params", inspect.Parameter.empty), ("lr", required), ("momentum", 0.0), ("dampening", 0.0),
                  ("weight_decay", 0.0), ("nesterov", False)],
    NpuFusedAdam: [("params", inspect.Parameter.empty), ("lr", 1e-3), ("betas", (0.9, 0.999)), ("eps", 1e-8),
                   ("weight_decay", 0), ("amsgrad", False)],
    NpuFusedAdamW: [("params", inspect.Parameter.empty), ("lr", 1e-3), ("betas", (0.9, 0.999)), ("eps", 1e-8),
                    ("weight_decay", 1e-2), ("amsgrad", False)],
    NpuFusedAdamP: [("params", inspect.Parameter.empty), ("lr", 1e-3), ("betas", (0.9, 0.999)), ("eps", 1e-8),
                    ("weight_decay", 0), ("delta", 0.1), ("wd_ratio", 0.1), ("nesterov", False)],
    NpuFusedBertAdam: [("params", inspect.Parameter.empty), ("lr", required), ("warmup", -1), ("t_total", -1),
                       ("schedule", "warmup_linear"), ("b1", 0.9), ("b2", 0.999), ("e", 1e-6),
                       ("weight_decay", 0.01), ("max_grad_norm", 1.0)],
    NpuFusedLamb: [("params", inspect.Parameter.empty), ("lr", 1e-3), ("betas", (0.9, 0.999)), ("eps", 1e-6),
                   ("weight_decay", 0), ("adam", False), ("use_global_grad_norm", False)],
    NpuFusedAdadelta: [("params", inspect.Parameter.empty), ("lr", 1.0), ("rho", 0.9), ("eps", 1e-6),
                       ("weight_decay", 0)],
    NpuFusedRMSprop: [("params", inspect.Parameter.empty), ("lr", 1e-2), ("alpha", 0.99), ("eps", 1e-8),
                      ("weight_decay", 0), ("momentum", 0), ("centered", False)],
    NpuFusedRMSpropTF: [("params", inspect.Parameter.empty), ("lr", 1e-2), ("alpha", 0.9), ("eps", 1e-10),
                        ("weight_decay", 0), ("momentum", 0.0), ("centered", False), ("decoupled_decay", False),
                        ("lr_in_momentum", True)],
}


def test_all_lists():
    assert fused.__all__ == REAL_ALL
    for mod, name in SUBMODULES.items():
        m = __import__("torch_npu.optim." + mod, fromlist=["_"])
        assert m.__all__ == [name]
        assert getattr(m, name) is getattr(fused, name)


@pytest.mark.parametrize("cls", list(SIGNATURES), ids=lambda c: c.__name__)
def test_signature(cls):
    params = list(inspect.signature(cls).parameters.values())
    got = [(p.name, p.default) for p in params]
    assert got == SIGNATURES[cls]
    for (_, d), (_, want) in zip(got, SIGNATURES[cls]):
        assert type(d) is type(want)
    assert issubclass(cls, Optimizer) and issubclass(cls, NpuFusedOptimizerBase)


def test_method_signatures():
    sig = lambda f: str(inspect.signature(f))  # noqa: E731
    assert sig(NpuFusedOptimizerBase.step) == "(self, closure=None)"
    assert sig(NpuFusedOptimizerBase.zero_grad) == "(self, set_to_none=False)"
    assert sig(NpuFusedOptimizerBase.clip_grad_norm_fused_) == "(self, max_norm, norm_type=2)"
    assert sig(NpuFusedOptimizerBase.get_combined_params) == "(self)"
    assert sig(NpuFusedOptimizerBase.get_combined_grads) == "(self)"


def test_import_standalone():
    out = run_json("""
        import torch_npu.optim as o
        emit([o.__name__, sorted(o.__all__), o.NpuFusedAdam.__mro__[1].__name__])
    """)
    assert out == ["torch_npu.optim", sorted(REAL_ALL), "NpuFusedOptimizerBase"]


def test_invalid_arguments():
    p = [nn.Parameter(torch.zeros(2, device=DEV))]
    with pytest.raises(ValueError):
        NpuFusedSGD(p)  # lr is required
    with pytest.raises(ValueError):
        NpuFusedBertAdam(p)
    with pytest.raises(ValueError):
        NpuFusedSGD(p, lr=0.1, nesterov=True)  # nesterov needs momentum
    with pytest.raises(ValueError):
        NpuFusedSGD(p, lr=0.1, momentum=0.9, dampening=0.5, nesterov=True)
    with pytest.raises(ValueError):
        NpuFusedAdam(p, lr=-1.0)
    with pytest.raises(ValueError):
        NpuFusedAdamW(p, betas=(1.0, 0.999))
    with pytest.raises(ValueError):
        NpuFusedLamb(p, eps=-1.0)
    with pytest.raises(ValueError):
        NpuFusedAdadelta(p, rho=1.5)
    with pytest.raises(ValueError):
        NpuFusedRMSprop(p, alpha=-0.1)
    with pytest.raises(ValueError):
        NpuFusedRMSpropTF(p, momentum=-0.1)
    with pytest.raises(ValueError):
        NpuFusedBertAdam(p, lr=0.1, schedule="nope")
    with pytest.raises(ValueError):
        NpuFusedBertAdam(p, lr=0.1, warmup=1.0)


# ------------------------------------------------- equality with torch.optim
TORCH_CASES = [
    ("sgd", NpuFusedSGD, torch.optim.SGD, dict(lr=0.1)),
    ("sgd_momentum_wd_dampening", NpuFusedSGD, torch.optim.SGD,
     dict(lr=0.05, momentum=0.9, dampening=0.2, weight_decay=0.01)),
    ("sgd_nesterov", NpuFusedSGD, torch.optim.SGD, dict(lr=0.05, momentum=0.8, nesterov=True, weight_decay=0.02)),
    ("adam", NpuFusedAdam, torch.optim.Adam, dict(lr=0.01)),
    ("adam_wd_amsgrad", NpuFusedAdam, torch.optim.Adam,
     dict(lr=0.02, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1, amsgrad=True)),
    ("adamw", NpuFusedAdamW, torch.optim.AdamW, dict(lr=0.01)),
    ("adamw_amsgrad", NpuFusedAdamW, torch.optim.AdamW, dict(lr=0.02, weight_decay=0.3, amsgrad=True)),
    ("rmsprop", NpuFusedRMSprop, torch.optim.RMSprop, dict(lr=0.01)),
    ("rmsprop_centered_momentum_wd", NpuFusedRMSprop, torch.optim.RMSprop,
     dict(lr=0.005, alpha=0.9, momentum=0.7, centered=True, weight_decay=0.05)),
    ("adadelta", NpuFusedAdadelta, torch.optim.Adadelta, dict()),
    ("adadelta_wd", NpuFusedAdadelta, torch.optim.Adadelta, dict(lr=0.5, rho=0.8, eps=1e-5, weight_decay=0.1)),
]


@pytest.mark.parametrize("name,cls,ref,kw", TORCH_CASES, ids=[c[0] for c in TORCH_CASES])
def test_matches_torch_optim(name, cls, ref, kw):
    m_test, m_ref = _pair(_mlp)
    batches = _batches()
    _train(m_test, cls(m_test.parameters(), **kw), batches)
    _train(m_ref, ref(m_ref.parameters(), **kw), batches)
    _assert_params_close(m_test, m_ref)


@pytest.mark.parametrize("name,cls,ref,kw", [TORCH_CASES[2], TORCH_CASES[4], TORCH_CASES[8]],
                         ids=["sgd_nesterov", "adam_wd_amsgrad", "rmsprop_centered"])
def test_matches_torch_optim_cpu(name, cls, ref, kw):
    m_test, m_ref = _pair(_mlp, "cpu")
    batches = _batches()
    opt = cls(m_test.parameters(), **kw)
    _train(m_test, opt, batches, "cpu")
    _train(m_ref, ref(m_ref.parameters(), **kw), batches, "cpu")
    _assert_params_close(m_test, m_ref)
    assert opt.get_combined_params()[0].device.type == "cpu"


# ------------------------------------------- equality with reference formulas
def _scale_invariant_net(device=DEV, seed=0):
    """Linear -> BatchNorm (invariant to scaling each weight row: AdamP's
    channel-wise projection), Linear -> LayerNorm (invariant to scaling the
    whole weight: layer-wise projection), and a plain Linear head."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 8, bias=False), nn.BatchNorm1d(8, affine=False), nn.Tanh(),
                         nn.Linear(8, 8, bias=False), nn.LayerNorm(8, elementwise_affine=False), nn.Tanh(),
                         nn.Linear(8, 3)).to(device)


def _lamb_net(device=DEV):
    """A zero bias: LAMB's trust ratio falls back to 1 for a zero weight norm."""
    net = _scale_invariant_net(device)
    with torch.no_grad():
        net[6].bias.zero_()
    return net


def _big_scale_invariant_net(device=DEV):
    """Weights with norms above LAMB's clamp of 10."""
    net = _scale_invariant_net(device)
    with torch.no_grad():
        for p in net.parameters():
            p.mul_(40.0)
    return net


REF_CASES = [
    ("adamp", NpuFusedAdamP, RefAdamP, dict(lr=0.01)),
    ("adamp_wd_nesterov", NpuFusedAdamP, RefAdamP,
     dict(lr=0.02, betas=(0.85, 0.99), weight_decay=0.1, delta=0.1, wd_ratio=0.3, nesterov=True)),
    ("bertadam_default", NpuFusedBertAdam, RefBertAdam, dict(lr=0.01)),
    ("bertadam_warmup_linear", NpuFusedBertAdam, RefBertAdam,
     dict(lr=0.02, warmup=0.2, t_total=STEPS, schedule="warmup_linear", max_grad_norm=0.05)),
    ("bertadam_warmup_cosine", NpuFusedBertAdam, RefBertAdam,
     dict(lr=0.02, warmup=0.2, t_total=STEPS, schedule="warmup_cosine", max_grad_norm=0.05)),
    ("bertadam_warmup_constant", NpuFusedBertAdam, RefBertAdam,
     dict(lr=0.02, warmup=0.1, t_total=STEPS, schedule="warmup_constant", b1=0.8, e=1e-5, weight_decay=0.0)),
    ("bertadam_warmup_poly", NpuFusedBertAdam, RefBertAdam,
     dict(lr=0.02, warmup=0.3, t_total=2 * STEPS, schedule="warmup_poly", max_grad_norm=-1)),
    ("lamb", NpuFusedLamb, RefLamb, dict(lr=0.01)),
    ("lamb_wd", NpuFusedLamb, RefLamb, dict(lr=0.02, betas=(0.8, 0.99), eps=1e-5, weight_decay=0.1)),
    ("lamb_adam", NpuFusedLamb, RefLamb, dict(lr=0.01, weight_decay=0.05, adam=True)),
    ("lamb_global_norm", NpuFusedLamb, RefLamb, dict(lr=0.01, use_global_grad_norm=True)),
    ("lamb_big_weights", NpuFusedLamb, RefLamb, dict(lr=0.01, weight_decay=0.01)),
    ("rmsproptf", NpuFusedRMSpropTF, RefRMSpropTF, dict(lr=0.01)),
    ("rmsproptf_momentum", NpuFusedRMSpropTF, RefRMSpropTF,
     dict(lr=0.01, momentum=0.9, weight_decay=0.05, eps=1e-3)),
    ("rmsproptf_momentum_no_lr", NpuFusedRMSpropTF, RefRMSpropTF,
     dict(lr=0.01, momentum=0.9, lr_in_momentum=False, centered=True, eps=1e-2)),
    ("rmsproptf_decoupled", NpuFusedRMSpropTF, RefRMSpropTF,
     dict(lr=0.01, alpha=0.8, eps=1e-8, weight_decay=0.01, decoupled_decay=True, momentum=0.5)),
]


@pytest.mark.parametrize("name,cls,ref,kw", REF_CASES, ids=[c[0] for c in REF_CASES])
def test_matches_reference(name, cls, ref, kw):
    factory = _scale_invariant_net
    if cls is NpuFusedLamb:
        factory = _big_scale_invariant_net if name == "lamb_big_weights" else _lamb_net
    m_test, m_ref = _pair(factory)
    batches = _batches()
    scale = 50.0 if name == "lamb_global_norm" else 1.0  # make the global grad norm exceed 1
    # a decaying lr tells apart formulations that only agree for a constant lr
    _train(m_test, cls(m_test.parameters(), **kw), batches, loss_scale=scale, lr_decay=0.9)
    ref_opt = ref(m_ref.parameters(), **kw)
    _train(m_ref, ref_opt, batches, loss_scale=scale, lr_decay=0.9)
    _assert_params_close(m_test, m_ref)
    # the interesting branches of the algorithm were really taken
    if cls is NpuFusedAdamP:
        assert {"channel", "layer", "none"} <= set(ref_opt.branches)
    if cls is NpuFusedBertAdam:
        if kw.get("max_grad_norm") == 0.05:
            assert ref_opt.clipped == STEPS
        if "t_total" in kw:
            assert len(set(ref_opt.lrs)) > 2  # the schedule is really followed
    if cls is NpuFusedLamb:
        assert (ref_opt.divided > 0) == kw.get("use_global_grad_norm", False)
        assert (len(set(ref_opt.ratios)) > 1) != kw.get("adam", False)
        assert (ref_opt.clamped > 0) == (name == "lamb_big_weights")
        assert (1.0 in ref_opt.ratios) or kw.get("adam", False) or name == "lamb_big_weights"


# ------------------------------------------------------- combined buffers
def test_params_and_grads_are_views_of_combined_buffers():
    model = _mlp()
    opt = NpuFusedAdam(model.parameters(), lr=0.01)
    assert opt.get_combined_params() == [None, None]
    _train(model, opt, _batches(1))
    flat_p, flat_g = opt.get_combined_params()[0], opt.get_combined_grads()[0]
    assert opt.get_combined_params()[1] is None
    params = list(model.parameters())
    assert flat_p.dim() == 1 and flat_p.numel() == sum(p.numel() for p in params)
    assert flat_p.device.type == DEV
    for p in params:
        assert p.untyped_storage().data_ptr() == flat_p.untyped_storage().data_ptr()
        assert p.grad.untyped_storage().data_ptr() == flat_g.untyped_storage().data_ptr()
        for key in ("exp_avg", "exp_avg_sq"):
            assert opt.state[p][key].shape == p.shape
        assert opt.state[p]["step"] == 1
    before = [p.detach().clone() for p in params]
    with torch.no_grad():
        flat_p.add_(1.0)  # a write to the flat buffer is visible in every param
    for b, p in zip(before, params):
        torch.testing.assert_close(p.detach(), b + 1.0)
    with torch.no_grad():
        params[0].grad.fill_(3.0)
    assert flat_g[:params[0].numel()].eq(3.0).all()
    # the per-group view of the real implementation's bookkeeping
    assert opt.combined_params_indexed_by_group[0][0].numel() == flat_p.numel()


def test_zero_grad():
    model = _mlp()
    x, y = _batches(1)[0]
    ((model(x.to(DEV)) - y.to(DEV)) ** 2).mean().backward()
    opt = NpuFusedSGD(model.parameters(), lr=0.1, momentum=0.9)
    opt.zero_grad()  # before the first step: plain gradients
    assert all(torch.count_nonzero(p.grad) == 0 for p in model.parameters())

    opt = NpuFusedSGD(model.parameters(), lr=0.1, momentum=0.9)
    _train(model, opt, _batches(2))
    grads = [p.grad for p in model.parameters()]
    assert all(g.abs().sum() > 0 for g in grads)
    opt.zero_grad()
    for p, g in zip(model.parameters(), grads):
        assert p.grad is g and torch.count_nonzero(g) == 0
    assert torch.count_nonzero(opt.get_combined_grads()[0]) == 0
    with pytest.raises(ValueError, match="set_to_none"):
        opt.zero_grad(set_to_none=True)


def test_step_with_closure():
    model, ref = _pair(_mlp)
    x, y = _batches(1)[0]
    opt = NpuFusedAdam(model.parameters(), lr=0.01)
    ref_opt = torch.optim.Adam(ref.parameters(), lr=0.01)
    for m, o in ((model, opt), (ref, ref_opt)):
        def closure(m=m, o=o):
            o.zero_grad()
            loss = ((m(x.to(DEV)) - y.to(DEV)) ** 2).mean()
            loss.backward()
            return loss
        for _ in range(3):
            loss = o.step(closure)
        assert loss.requires_grad
    _assert_params_close(model, ref)


def test_mixed_dtypes():
    torch.manual_seed(0)
    init = [torch.randn(7), torch.randn(3, 4).half(), torch.randn(5).half(), torch.randn(2, 2)]
    grads_g = torch.Generator().manual_seed(3)
    grads = [[torch.randn(t.shape, generator=grads_g).to(t.dtype) for t in init] for _ in range(10)]
    for cls, ref, kw in ((NpuFusedSGD, torch.optim.SGD, dict(lr=0.1, momentum=0.9, weight_decay=0.01)),
                         (NpuFusedAdam, torch.optim.Adam, dict(lr=0.01, weight_decay=0.01))):
        a = [nn.Parameter(t.clone().to(DEV)) for t in init]
        b = [nn.Parameter(t.clone().to(DEV)) for t in init]
        # torch's foreach and single-tensor paths round fp16 differently from
        # each other; the fused buffers follow the single-tensor op sequence
        oa, ob = cls(a, **kw), ref(b, foreach=False, **kw)
        for step_grads in grads:
            for pa, pb, g in zip(a, b, step_grads):
                pa.grad, pb.grad = g.to(DEV), g.to(DEV)
            oa.step()
            ob.step()
        for pa, pb, t in zip(a, b, init):
            assert pa.dtype == t.dtype
            torch.testing.assert_close(pa.detach(), pb.detach(), rtol=RTOL, atol=ATOL)
            assert not torch.equal(pa.detach().cpu(), t)
        combined = oa.get_combined_params()
        assert [c.dtype for c in combined] == [torch.float32, torch.float16]
        assert [c.numel() for c in combined] == [7 + 4, 12 + 5]


def test_channels_last_param_keeps_layout():
    torch.manual_seed(0)
    conv_a = nn.Conv2d(3, 4, 3).to(DEV).to(memory_format=torch.channels_last)
    conv_b = nn.Conv2d(3, 4, 3).to(DEV).to(memory_format=torch.channels_last)
    conv_b.load_state_dict(conv_a.state_dict())
    stride = conv_a.weight.stride()
    assert not conv_a.weight.is_contiguous()
    oa, ob = NpuFusedAdamW(conv_a.parameters(), lr=0.01), torch.optim.AdamW(conv_b.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(0)
    for _ in range(5):
        x = torch.randn(2, 3, 6, 6, generator=g).to(DEV).to(memory_format=torch.channels_last)
        for conv, opt in ((conv_a, oa), (conv_b, ob)):
            opt.zero_grad()
            conv(x).square().mean().backward()
            opt.step()
    assert conv_a.weight.stride() == stride
    torch.testing.assert_close(conv_a.weight.detach(), conv_b.weight.detach(), rtol=RTOL, atol=ATOL)
    torch.testing.assert_close(conv_a.bias.detach(), conv_b.bias.detach(), rtol=RTOL, atol=ATOL)


# ------------------------------------------------------------ state_dict
ALL_CASES = [
    (NpuFusedSGD, dict(lr=0.05, momentum=0.9, nesterov=True)),
    (NpuFusedAdam, dict(lr=0.01, amsgrad=True, weight_decay=0.01)),
    (NpuFusedAdamW, dict(lr=0.01)),
    (NpuFusedAdamP, dict(lr=0.01, weight_decay=0.1)),
    (NpuFusedBertAdam, dict(lr=0.01, warmup=0.1, t_total=STEPS, max_grad_norm=0.05)),
    (NpuFusedLamb, dict(lr=0.01, weight_decay=0.01)),
    (NpuFusedAdadelta, dict(weight_decay=0.01)),
    (NpuFusedRMSprop, dict(lr=0.01, momentum=0.5, centered=True)),
    (NpuFusedRMSpropTF, dict(lr=0.01, momentum=0.9, centered=True)),
]


@pytest.mark.parametrize("cls,kw", ALL_CASES, ids=[c[0].__name__ for c in ALL_CASES])
def test_state_dict_round_trip(cls, kw):
    batches = _batches()
    model = _scale_invariant_net()
    opt = cls(model.parameters(), **kw)
    _train(model, opt, batches[:10])

    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, buf)
    buf.seek(0)
    saved = torch.load(buf)
    if cls is not NpuFusedSGD:
        assert saved["opt"]["state"][0]["step"] == 10
    assert saved["opt"]["param_groups"][0]["lr"] == kw.get("lr", 1.0)

    resumed = _scale_invariant_net(seed=123)
    resumed.load_state_dict(saved["model"])
    opt2 = cls(resumed.parameters(), **kw)
    opt2.load_state_dict(saved["opt"])

    _train(model, opt, batches[10:])  # uninterrupted run
    _train(resumed, opt2, batches[10:])
    for a, b in zip(model.parameters(), resumed.parameters()):
        assert torch.equal(a.detach(), b.detach())
    sd1, sd2 = opt.state_dict(), opt2.state_dict()
    for i, st in sd1["state"].items():
        for k, v in st.items():
            if isinstance(v, torch.Tensor):
                assert torch.equal(v, sd2["state"][i][k])
            else:
                assert v == sd2["state"][i][k]


def test_loaded_state_is_not_shared_with_source():
    model = _mlp()
    opt = NpuFusedAdam(model.parameters(), lr=0.01)
    _train(model, opt, _batches(3))
    other = _mlp()
    other.load_state_dict(model.state_dict())
    opt2 = NpuFusedAdam(other.parameters(), lr=0.01)
    opt2.load_state_dict(opt.state_dict())  # same device and dtype: no cast
    exp_avg = [opt2.state[p]["exp_avg"].clone() for p in other.parameters()]
    _train(model, opt, _batches(2, seed=7))  # the source keeps training
    for p, e in zip(other.parameters(), exp_avg):
        assert torch.equal(opt2.state[p]["exp_avg"], e)


def test_deepcopy_keeps_options_and_state():
    model = _mlp()
    opt = NpuFusedLamb(model.parameters(), lr=0.01, adam=True, use_global_grad_norm=True)
    _train(model, opt, _batches(3))
    clone = copy.deepcopy(opt)
    assert clone.adam is True and clone.use_global_grad_norm is True and clone.is_fused_optimizer
    cloned_params = clone.param_groups[0]["params"]
    assert all(c is not p for c, p in zip(cloned_params, model.parameters()))
    before = [p.detach().clone() for p in model.parameters()]
    for c in cloned_params:
        c.grad = torch.ones_like(c)
    clone.step()  # steps its own copies only
    assert all(torch.equal(b, p.detach()) for b, p in zip(before, model.parameters()))
    assert all(not torch.equal(b, c.detach()) for b, c in zip(before, cloned_params))
    assert clone.state[cloned_params[0]]["step"] == 4 and opt.state[model[0].weight]["step"] == 3


# ------------------------------------------------------------ param groups
@pytest.mark.parametrize("cls,ref,g0,g1", [
    (NpuFusedSGD, torch.optim.SGD, dict(lr=0.1, momentum=0.9), dict(lr=0.01, momentum=0.5, weight_decay=0.1)),
    (NpuFusedAdam, torch.optim.Adam, dict(lr=0.01), dict(lr=0.03, betas=(0.5, 0.9), weight_decay=0.2)),
    (NpuFusedRMSprop, torch.optim.RMSprop, dict(lr=0.01, centered=True), dict(lr=0.002, momentum=0.9)),
], ids=["sgd", "adam", "rmsprop"])
def test_param_groups_and_params_without_grad(cls, ref, g0, g1):
    def build(device=DEV):
        torch.manual_seed(0)
        m = nn.Sequential(nn.Linear(6, 10), nn.Tanh(), nn.Linear(10, 3)).to(device)
        m.unused = nn.Parameter(torch.randn(4, device=device))   # never gets a gradient
        m[0].bias.requires_grad_(False)                            # frozen
        return m

    m_test, m_ref = _pair(build)
    frozen = m_test[0].bias.detach().clone()
    unused = m_test.unused.detach().clone()

    def groups(m):
        return [dict(params=[m[0].weight, m[0].bias, m.unused], **g0),
                dict(params=[m[2].weight, m[2].bias], **g1)]

    opt = cls(groups(m_test))
    _train(m_test, opt, _batches())
    _train(m_ref, ref(groups(m_ref)), _batches())
    _assert_params_close(m_test, m_ref)
    assert torch.equal(m_test[0].bias.detach(), frozen) and torch.equal(m_test.unused.detach(), unused)
    assert m_test[0].bias not in opt.state and m_test.unused not in opt.state
    assert m_test[0].bias.grad is None and m_test.unused.grad is None


@pytest.mark.parametrize("cls,ref,kw", [
    (NpuFusedAdam, torch.optim.Adam, dict(lr=0.01, weight_decay=0.01)),
    (NpuFusedSGD, torch.optim.SGD, dict(lr=0.05, momentum=0.9, dampening=0.1)),
], ids=["adam", "sgd_momentum"])
def test_params_gaining_and_losing_grads(cls, ref, kw):
    """Params whose gradient appears late, disappears, or is replaced by the
    user (``model.zero_grad()`` sets grads to None) are handled per param,
    exactly like torch.optim (Adam's bias correction and SGD's momentum
    buffer start are per param)."""
    def build(device=DEV):
        torch.manual_seed(0)
        return nn.ModuleList([nn.Linear(5, 5) for _ in range(3)]).to(device)

    m_test, m_ref = _pair(build)
    o_test, o_ref = cls(m_test.parameters(), **kw), ref(m_ref.parameters(), **kw)
    g = torch.Generator().manual_seed(0)
    for step in range(STEPS):
        x = torch.randn(4, 5, generator=g).to(DEV)
        active = [0] + ([1] if step >= 5 else []) + ([2] if step % 7 < 3 else [])
        for m, o in ((m_test, o_test), (m_ref, o_ref)):
            m.zero_grad(set_to_none=True)
            sum(m[i](x).square().mean() for i in active).backward()
            o.step()
        if step == 12:
            with torch.no_grad():  # storage replaced behind the optimizer's back
                m_test[0].weight.data = m_test[0].weight.data.clone()
                m_ref[0].weight.data = m_ref[0].weight.data.clone()
    _assert_params_close(m_test, m_ref)
    if cls is NpuFusedAdam:
        assert o_test.state[m_test[1].weight]["step"] == STEPS - 5


def test_lr_scheduler():
    m_test, m_ref = _pair(_mlp)
    o_test, o_ref = NpuFusedAdamW(m_test.parameters(), lr=0.02), torch.optim.AdamW(m_ref.parameters(), lr=0.02)
    s_test = torch.optim.lr_scheduler.StepLR(o_test, step_size=3, gamma=0.5)
    s_ref = torch.optim.lr_scheduler.StepLR(o_ref, step_size=3, gamma=0.5)
    for x, y in _batches():
        for m, o, s in ((m_test, o_test, s_test), (m_ref, o_ref, s_ref)):
            o.zero_grad()
            ((m(x.to(DEV)) - y.to(DEV)) ** 2).mean().backward()
            o.step()
            s.step()
    assert o_test.param_groups[0]["lr"] == 0.02 * 0.5 ** (STEPS // 3)
    _assert_params_close(m_test, m_ref)


# ------------------------------------------------------------- clipping, AMP
@pytest.mark.parametrize("norm_type", [2.0, float("inf")])
def test_clip_grad_norm_fused(norm_type):
    m_test, m_ref = _pair(_mlp)
    opt = NpuFusedSGD(m_test.parameters(), lr=0.1)
    for m in (m_test, m_ref):
        x, y = _batches(1)[0]
        (((m(x.to(DEV)) - y.to(DEV)) ** 2).mean() * 10).backward()
    total = opt.clip_grad_norm_fused_(0.5, norm_type)
    ref_total = torch.nn.utils.clip_grad_norm_(m_ref.parameters(), 0.5, norm_type)
    assert ref_total > 0.5
    torch.testing.assert_close(total.cpu(), ref_total.cpu(), rtol=1e-6, atol=0)
    for a, b in zip(m_test.parameters(), m_ref.parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-6, atol=1e-7)
    # the gradients now live in the combined buffer
    assert m_test[0].weight.grad.untyped_storage().data_ptr() == \
        opt.get_combined_grads()[0].untyped_storage().data_ptr()


@pytest.mark.parametrize("norm_type", [2.0, float("inf")])
def test_clip_grad_norm_fused_mixed_dtypes(norm_type):
    """fp32 and fp16 gradients live in two combined buffers; the total norm
    covers both (reference: the norm of all gradients, computed in float64)."""
    torch.manual_seed(0)
    shapes = [((3, 4), torch.float32), ((5,), torch.float16), ((6,), torch.float32), ((2, 2), torch.float16)]
    grads = [torch.randn(s).to(d) * (i + 1) for i, (s, d) in enumerate(shapes)]
    params = [nn.Parameter(torch.zeros(s, dtype=d, device=DEV)) for s, d in shapes]
    for p, g in zip(params, grads):
        p.grad = g.to(DEV)
    opt = NpuFusedAdam(params)
    total = opt.clip_grad_norm_fused_(1.0, norm_type)
    flat = torch.cat([g.double().flatten() for g in grads])
    ref_total = flat.abs().max() if norm_type == float("inf") else flat.norm()
    torch.testing.assert_close(total.double().cpu(), ref_total, rtol=1e-6, atol=0)
    coef = 1.0 / (float(ref_total) + 1e-6)
    for p, g in zip(params, grads):
        assert p.grad.dtype == g.dtype
        torch.testing.assert_close(p.grad.cpu(), (g.double() * coef).to(g.dtype), rtol=2e-3, atol=1e-4)
    assert [g.dtype for g in opt.get_combined_grads()] == [torch.float32, torch.float16]


def test_grad_scaler():
    m_test, m_ref = _pair(_mlp)
    o_test, o_ref = NpuFusedAdam(m_test.parameters(), lr=0.01), torch.optim.Adam(m_ref.parameters(), lr=0.01)
    calls = []
    o_test.register_step_post_hook(lambda *_: calls.append(1))
    s_test = torch.amp.GradScaler("npu", init_scale=2.0 ** 10, growth_interval=4)
    s_ref = torch.amp.GradScaler("npu", init_scale=2.0 ** 10, growth_interval=4)
    skipped_step = 6
    for i, (x, y) in enumerate(_batches(12)):
        for m, o, s in ((m_test, o_test, s_test), (m_ref, o_ref, s_ref)):
            o.zero_grad()
            loss = ((m(x.to(DEV)) - y.to(DEV)) ** 2).mean()
            if i == skipped_step:
                loss = loss * float("inf")  # non-finite gradients: the step is skipped
            s.scale(loss).backward()
            before = [p.detach().clone() for p in m.parameters()]
            s.step(o)
            s.update()
            if i == skipped_step:
                assert all(torch.equal(b, p.detach()) for b, p in zip(before, m.parameters()))
    assert len(calls) == 11  # GradScaler.step called the fused step, except on the inf step
    assert s_test.get_scale() == s_ref.get_scale() != 2.0 ** 10
    _assert_params_close(m_test, m_ref)
