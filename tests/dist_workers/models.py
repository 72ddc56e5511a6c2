"""The small model and data the training workers and their reference share.

Weights are created on the CPU from a fixed seed, so a worker (which moves
them to npu) and the test's single-process reference start identical.
"""
import torch
from torch import nn

IN, HIDDEN, OUT = 8, 16, 4
BATCH = 8  # full batch; each of W ranks trains on BATCH // W rows


def make_model(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(IN, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, HIDDEN), nn.Tanh(),
                         nn.Linear(HIDDEN, OUT))


def batch(step, rows=BATCH):
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(rows, IN, generator=g)
    y = torch.randn(rows, OUT, generator=g)
    return x, y


def shard(t, rank, world):
    n = t.size(0) // world
    return t[rank * n:(rank + 1) * n]


def loss_fn(out, y):
    return torch.nn.functional.mse_loss(out, y)


def reference_steps(steps, lr=0.1, seed=0, grad_transform=None):
    """Single-process full-batch SGD on the CPU: (losses, final state_dict)."""
    model = make_model(seed)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for step in range(steps):
        x, y = batch(step)
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        if grad_transform is not None:
            for p in model.parameters():
                p.grad = grad_transform(p.grad)
        opt.step()
        losses.append(loss.item())
    return losses, {k: v.detach().clone() for k, v in model.state_dict().items()}


def full_params(model):
    """name -> full CPU tensor (gathers DTensor shards)."""
    out = {}
    for name, p in model.named_parameters():
        t = p.full_tensor() if hasattr(p, "full_tensor") else p
        out[name.replace("module.", "")] = t.detach().float().cpu()
    return out
