"""Workloads for the torch_npu benchmark suite.

Every workload is built ONCE on the CPU (fixed seed), then deep-copied and the
copy moved to ``npu``, so both sides start from bit-identical weights and
inputs.  A workload exposes one zero-argument callable per device that does
one unit of work (one op call / one full training step).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

NPU = "npu"


def npu_sync() -> None:
    torch.npu.synchronize()


# --------------------------------------------------------------------------
# Micro ops
# --------------------------------------------------------------------------


@dataclass
class MicroOp:
    name: str
    fns: Dict[str, Callable[[], object]]            # device -> one call
    setups: Dict[str, Optional[Callable[[], object]]] = field(default_factory=dict)
    small: bool = True                              # subject to the 1.5 us target
    # keep tensors alive
    keep: List[object] = field(default_factory=list)


def _pair(*shapes, seed=0):
    g = torch.Generator().manual_seed(seed)
    cpu = [torch.randn(tuple(s), generator=g) for s in shapes]
    npu = [t.to(NPU) for t in cpu]
    return cpu, npu


def micro_ops() -> List[MicroOp]:
    ops: List[MicroOp] = []

    # 16-element a + b (out-of-place: dispatch + output allocation)
    (a, b), (an, bn) = _pair((16,), (16,))
    ops.append(MicroOp("add 16 elem (a + b)",
                       {"cpu": lambda: a + b, NPU: lambda: an + bn},
                       keep=[a, b, an, bn]))

    # 16-element in-place mul_ (dispatch only, no allocation).  The tensor is
    # reset to ones before each timed rep so values stay finite/normal.
    (m,), (mn,) = _pair((16,))
    ops.append(MicroOp("mul_ 16 elem (a.mul_(1.0001))",
                       {"cpu": lambda: m.mul_(1.0001), NPU: lambda: mn.mul_(1.0001)},
                       setups={"cpu": lambda: m.fill_(1.0), NPU: lambda: mn.fill_(1.0)},
                       keep=[m, mn]))

    # view (metadata only: TensorImpl/storage alias creation)
    (v,), (vn,) = _pair((16,))
    ops.append(MicroOp("view (a.view(4, 4))",
                       {"cpu": lambda: v.view(4, 4), NPU: lambda: vn.view(4, 4)},
                       keep=[v, vn]))

    # 1M-element a + b (memory bound, 4 MB output allocated per call)
    (c, d), (cn, dn) = _pair((1 << 20,), (1 << 20,))
    ops.append(MicroOp("add 1M elem (a + b)",
                       {"cpu": lambda: c + d, NPU: lambda: cn + dn},
                       small=False, keep=[c, d, cn, dn]))

    # 256x256 matmul (compute bound)
    (x, y), (xn, yn) = _pair((256, 256), (256, 256))
    ops.append(MicroOp("matmul 256x256 (a @ b)",
                       {"cpu": lambda: x @ y, NPU: lambda: xn @ yn},
                       small=False, keep=[x, y, xn, yn]))
    return ops


def extra_micro_ops() -> List[MicroOp]:
    """Informational rows (no target): per-call costs that training steps
    pay and that can take a different path on npu."""
    ops: List[MicroOp] = []
    # .item(): device->host scalar read (aten::_local_scalar_dense).  The
    # foreach optimizers on npu call it 2x per param per step.
    (s,), (sn,) = _pair(())
    ops.append(MicroOp("extra: scalar .item()",
                       {"cpu": lambda: s.item(), NPU: lambda: sn.item()},
                       small=False, keep=[s, sn]))
    # tiny autograd round trip.  On npu, backward runs on the autograd
    # engine's per-device worker thread (like CUDA), on cpu in the caller's
    # thread, so this row shows the thread hand-off cost per backward() call.
    g = torch.Generator().manual_seed(5)
    xc = torch.randn(16, generator=g).requires_grad_()
    xn = xc.detach().to(NPU).requires_grad_()

    def bw(x):
        (x * 2).sum().backward()
        x.grad = None
    ops.append(MicroOp("extra: tiny backward ((x*2).sum().backward(), 16 elem)",
                       {"cpu": lambda: bw(xc), NPU: lambda: bw(xn)},
                       small=False, keep=[xc, xn]))
    return ops


# --------------------------------------------------------------------------
# Training steps
# --------------------------------------------------------------------------


class MLP(nn.Module):
    def __init__(self, sizes=(256, 512, 512, 10)):
        super().__init__()
        layers: List[nn.Module] = []
        for i in range(len(sizes) - 1):
            layers.append(nn.Linear(sizes[i], sizes[i + 1]))
            if i < len(sizes) - 2:
                layers.append(nn.ReLU())
        self.net = nn.Sequential(*layers)

    def forward(self, x):
        return self.net(x)


class CausalSelfAttention(nn.Module):
    def __init__(self, d_model: int, n_heads: int):
        super().__init__()
        self.n_heads = n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        hd = C // self.n_heads
        q = q.view(B, T, self.n_heads, hd).transpose(1, 2)
        k = k.view(B, T, self.n_heads, hd).transpose(1, 2)
        v = v.view(B, T, self.n_heads, hd).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.proj(y)


class GPTBlock(nn.Module):
    """Pre-LN GPT-2 style decoder block (no dropout => deterministic)."""

    def __init__(self, d_model=512, n_heads=8):
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, n_heads)
        self.ln2 = nn.LayerNorm(d_model)
        self.fc1 = nn.Linear(d_model, 4 * d_model)
        self.fc2 = nn.Linear(4 * d_model, d_model)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        x = x + self.fc2(F.gelu(self.fc1(self.ln2(x))))
        return x


class ConvNet(nn.Module):
    def __init__(self, n_classes=10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),    # 16x16
            nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),   # 8x8
            nn.Conv2d(64, 128, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),  # 4x4
        )
        self.head = nn.Linear(128 * 4 * 4, n_classes)

    def forward(self, x):
        return self.head(torch.flatten(self.features(x), 1))


@dataclass
class TrainStep:
    name: str
    target_ratio: Optional[float]
    steps: Dict[str, Callable[[], torch.Tensor]]    # device -> one train step
    models: Dict[str, nn.Module]
    optimizers: Dict[str, torch.optim.Optimizer]
    description: str = ""


def _make_train_step(model, opt, loss_fn, x, y, autograd_mt=None, amp_dtype=None):
    """autograd_mt: None keeps torch_npu's setting (backward in the calling
    thread); True/False force torch.autograd.set_multithreading_enabled.
    amp_dtype: run forward and loss under torch.autocast(<device>, amp_dtype)."""
    def step():
        opt.zero_grad(set_to_none=True)
        if amp_dtype is None:
            loss = loss_fn(model(x), y)
        else:
            with torch.autocast(x.device.type, dtype=amp_dtype):
                loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        return loss

    if autograd_mt is None:
        return step

    def step_forced():
        with torch.autograd.set_multithreading_enabled(autograd_mt):
            return step()
    return step_forced


# Build options shared by all workloads (set by run.py / _isolated.py).
BUILD_OPTS = {"autograd_mt": None}


def _build(name, target, description, model_fn, opt_fn, loss_fn, x, y, seed=0,
           devices=("cpu", NPU), amp_dtype=None):
    """Build the model once on CPU (fixed seed); the npu copy is a deepcopy
    moved to npu.  `devices` may be ("cpu",) for a process that must not
    touch the npu at all (process-isolated baseline)."""
    torch.manual_seed(seed)
    cpu_model = model_fn()
    models = {"cpu": cpu_model}
    inputs = {"cpu": (x, y)}
    if NPU in devices:
        models[NPU] = copy.deepcopy(cpu_model).to(NPU)
        inputs[NPU] = (x.to(NPU), y.to(NPU))
    if "cpu" not in devices:
        del models["cpu"], inputs["cpu"]
    opts = {d: opt_fn(m.parameters()) for d, m in models.items()}
    amt = BUILD_OPTS["autograd_mt"]
    return TrainStep(
        name=name, target_ratio=target, description=description,
        steps={d: _make_train_step(models[d], opts[d], loss_fn, *inputs[d], autograd_mt=amt,
                                   amp_dtype=amp_dtype)
               for d in models},
        models=models,
        optimizers=opts,
    )


def _foreach_kw(foreach: Optional[bool]) -> dict:
    return {} if foreach is None else {"foreach": foreach}


def mlp_step(foreach: Optional[bool] = None, devices=("cpu", NPU)) -> TrainStep:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(64, 256, generator=g)
    y = torch.randint(0, 10, (64,), generator=g)
    return _build(
        "MLP 256-512-512-10, bs64, Adam", 1.15,
        "fwd+bwd+Adam step, cross-entropy",
        lambda: MLP(), lambda p: torch.optim.Adam(p, lr=1e-3, **_foreach_kw(foreach)),
        F.cross_entropy, x, y, devices=devices)


def gpt_block_step(foreach: Optional[bool] = None, devices=("cpu", NPU), batch=8, seq=256,
                   d_model=512, n_heads=8) -> TrainStep:
    g = torch.Generator().manual_seed(2)
    x = torch.randn(batch, seq, d_model, generator=g)
    y = torch.randn(batch, seq, d_model, generator=g)
    return _build(
        f"GPT block d{d_model} h{n_heads} T{seq} bs{batch}, AdamW", 1.05,
        "pre-LN block, causal SDPA, GELU MLP 4x; fwd+bwd+AdamW step, MSE",
        lambda: GPTBlock(d_model, n_heads),
        lambda p: torch.optim.AdamW(p, lr=1e-4, **_foreach_kw(foreach)),
        F.mse_loss, x, y, devices=devices)


def gpt_block_amp_step(foreach: Optional[bool] = None, devices=("cpu", NPU)) -> TrainStep:
    """The GPT block step under bf16 autocast (CPU autocast vs npu autocast)."""
    g = torch.Generator().manual_seed(2)
    x = torch.randn(8, 256, 512, generator=g)
    y = torch.randn(8, 256, 512, generator=g)
    return _build(
        "GPT block d512 h8 T256 bs8, AdamW, autocast bf16", 1.05,
        "as the GPT block, forward+loss under torch.autocast(device, bfloat16)",
        lambda: GPTBlock(512, 8),
        lambda p: torch.optim.AdamW(p, lr=1e-4, **_foreach_kw(foreach)),
        F.mse_loss, x, y, devices=devices, amp_dtype=torch.bfloat16)


def convnet_step(foreach: Optional[bool] = None, devices=("cpu", NPU)) -> TrainStep:
    g = torch.Generator().manual_seed(3)
    x = torch.randn(32, 3, 32, 32, generator=g)
    y = torch.randint(0, 10, (32,), generator=g)
    return _build(
        "ConvNet 3x(conv+relu+pool)+linear, bs32 32x32, SGD", None,
        "fwd+bwd+SGD(momentum 0.9) step, cross-entropy",
        lambda: ConvNet(),
        lambda p: torch.optim.SGD(p, lr=1e-2, momentum=0.9, **_foreach_kw(foreach)),
        F.cross_entropy, x, y, devices=devices)


TRAIN_STEPS = {
    "mlp": mlp_step,
    "gpt": gpt_block_step,
    "gpt_amp": gpt_block_amp_step,
    "conv": convnet_step,
}


def check_equivalence(ts: TrainStep, n_steps: int = 2) -> dict:
    """Run a few steps on both devices and compare losses and parameters.
    (Also serves as warm-up.)  Returns max abs differences."""
    max_loss_diff = 0.0
    for _ in range(n_steps):
        lc = ts.steps["cpu"]().detach()
        ln = ts.steps[NPU]().detach().cpu()
        max_loss_diff = max(max_loss_diff, (lc - ln).abs().item())
    max_param_diff = 0.0
    for pc, pn in zip(ts.models["cpu"].parameters(), ts.models[NPU].parameters()):
        max_param_diff = max(max_param_diff, (pc.detach() - pn.detach().cpu()).abs().max().item())
    return {"max_loss_abs_diff": max_loss_diff, "max_param_abs_diff": max_param_diff,
            "npu_param_device": str(next(ts.models[NPU].parameters()).device)}


def optimizer_path(ts: TrainStep) -> dict:
    """Which optimizer implementation torch will actually use per device
    ('fused', 'foreach' or 'for-loop'), resolving foreach=None the way
    torch.optim does (torch defaults to foreach only on devices listed in
    torch.utils._foreach_utils._get_foreach_kernels_supported_devices())."""
    from torch.optim.optimizer import _default_to_fused_or_foreach
    out = {}
    for dev, opt in ts.optimizers.items():
        d = opt.defaults
        params = [p for g in opt.param_groups for p in g["params"]]
        if d.get("fused"):
            out[dev] = "fused"
        elif d.get("foreach") is None:
            fused, foreach = _default_to_fused_or_foreach(params, bool(d.get("differentiable")), False)
            out[dev] = "foreach (auto)" if foreach else "for-loop (auto)"
        else:
            out[dev] = "foreach" if d["foreach"] else "for-loop"
    return out
