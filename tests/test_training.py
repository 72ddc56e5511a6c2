"""Small training loops on npu match the same loops on CPU from identical init and data."""
import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torch_npu  # noqa: F401

TOL = 1e-6


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))


def _data(steps=20, batch=32):
    g = torch.Generator().manual_seed(1)
    w = torch.randn(16, 4, generator=g)
    xs = [torch.randn(batch, 16, generator=g) for _ in range(steps)]
    ys = [x @ w + 0.1 * torch.randn(batch, 4, generator=g) for x in xs]
    return xs, ys


def _train(model, opt, xs, ys, device, clip=None):
    losses = []
    for x, y in zip(xs, ys):
        x, y = x.to(device), y.to(device)
        opt.zero_grad(set_to_none=True)
        loss = F.mse_loss(model(x), y)
        loss.backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        assert loss.device.type == device.split(":")[0]
        losses.append(loss.item())
    return losses


def _close(a, b, tol=TOL):
    torch.testing.assert_close(a, b, rtol=tol, atol=tol)


OPTIMIZERS = {
    "sgd": lambda p: torch.optim.SGD(p, lr=0.05),
    "sgd_momentum_nesterov_wd": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, nesterov=True,
                                                          weight_decay=1e-3),
    "sgd_foreach": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, foreach=True),
    "adamw_default": lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.05),
    "adamw_foreach": lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.05, foreach=True),
    "adamw_single_tensor": lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.05, foreach=False),
    "adamw_amsgrad": lambda p: torch.optim.AdamW(p, lr=1e-2, amsgrad=True, foreach=True),
    "adam": lambda p: torch.optim.Adam(p, lr=1e-2),
}


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_mlp_training_matches_cpu(name):
    xs, ys = _data()
    m_cpu = _mlp()
    m_npu = copy.deepcopy(m_cpu).npu()
    for p in m_npu.parameters():
        assert p.device == torch.device("npu:0")
    make = OPTIMIZERS[name]
    l_cpu = _train(m_cpu, make(m_cpu.parameters()), xs, ys, "cpu")
    opt_npu = make(m_npu.parameters())
    l_npu = _train(m_npu, opt_npu, xs, ys, "npu")
    assert len(l_npu) == 20
    assert l_npu[-1] < 0.7 * l_npu[0], l_npu  # it learns
    _close(torch.tensor(l_npu), torch.tensor(l_cpu))
    for (n, pc), pn in zip(m_cpu.named_parameters(), m_npu.parameters()):
        assert pn.device.type == "npu", n
        _close(pn.detach().cpu(), pc.detach(), TOL)
    # optimizer state lives on the npu
    for st in opt_npu.state.values():
        for k, v in st.items():
            if isinstance(v, torch.Tensor) and k != "step":
                assert v.device.type == "npu", k


def test_mlp_training_on_npu1():
    xs, ys = _data(steps=10)
    m_cpu = _mlp()
    m_npu = copy.deepcopy(m_cpu).to("npu:1")
    l_cpu = _train(m_cpu, torch.optim.AdamW(m_cpu.parameters(), lr=1e-2), xs, ys, "cpu")
    l_npu = _train(m_npu, torch.optim.AdamW(m_npu.parameters(), lr=1e-2), xs, ys, "npu:1")
    _close(torch.tensor(l_npu), torch.tensor(l_cpu))
    for pc, pn in zip(m_cpu.parameters(), m_npu.parameters()):
        assert pn.device == torch.device("npu:1")
        assert pn.grad.device == torch.device("npu:1")
        _close(pn.detach().cpu(), pc.detach())


def test_training_is_bitwise_identical_with_matching_code_paths():
    # with the same optimizer implementation (single-tensor) on both devices, every op is the same CPU kernel
    xs, ys = _data(steps=10)
    m_cpu = _mlp()
    m_npu = copy.deepcopy(m_cpu).npu()
    l_cpu = _train(m_cpu, torch.optim.SGD(m_cpu.parameters(), lr=0.05, momentum=0.9, foreach=False), xs, ys, "cpu")
    l_npu = _train(m_npu, torch.optim.SGD(m_npu.parameters(), lr=0.05, momentum=0.9, foreach=False), xs, ys, "npu")
    assert l_npu == l_cpu
    for pc, pn in zip(m_cpu.parameters(), m_npu.parameters()):
        assert torch.equal(pn.detach().cpu(), pc.detach())


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 8, 3, stride=2, padding=1)
        self.pool = nn.MaxPool2d(2)
        self.drop = nn.Dropout(0.0)
        self.fc = nn.Linear(8 * 4 * 4, 5)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        x = self.pool(F.relu(self.conv2(x)))
        return self.fc(self.drop(torch.flatten(x, 1)))


@pytest.mark.parametrize("opt_name", ["sgd", "adamw"])
def test_cnn_step_matches_cpu(opt_name):
    torch.manual_seed(2)
    m_cpu = SmallCNN()
    m_npu = copy.deepcopy(m_cpu).npu()
    g = torch.Generator().manual_seed(3)
    x = torch.randn(4, 3, 16, 16, generator=g)
    y = torch.randint(0, 5, (4,), generator=g)
    mk = (lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9)) if opt_name == "sgd" else \
        (lambda p: torch.optim.AdamW(p, lr=1e-3))
    o_cpu, o_npu = mk(m_cpu.parameters()), mk(m_npu.parameters())
    losses = []
    for _ in range(3):
        lc = F.cross_entropy(m_cpu(x), y)
        ln = F.cross_entropy(m_npu(x.npu()), y.npu())
        _close(ln.detach().cpu(), lc.detach())
        o_cpu.zero_grad()
        o_npu.zero_grad()
        lc.backward()
        ln.backward()
        for (n, pc), pn in zip(m_cpu.named_parameters(), m_npu.parameters()):
            assert pn.grad is not None and pn.grad.device.type == "npu", n
            _close(pn.grad.cpu(), pc.grad, 1e-5)
        o_cpu.step()
        o_npu.step()
        losses.append(ln.item())
    assert losses[-1] < losses[0]
    for pc, pn in zip(m_cpu.parameters(), m_npu.parameters()):
        _close(pn.detach().cpu(), pc.detach(), 1e-5)
    for (n, bc), bn in zip(m_cpu.named_buffers(), m_npu.buffers()):
        assert bn.device.type == "npu", n
        _close(bn.cpu(), bc, 1e-5)


@pytest.mark.parametrize("norm_type", [2.0, 1.0, float("inf")])
@pytest.mark.parametrize("foreach", [None, False, True])
def test_clip_grad_norm(norm_type, foreach):
    xs, ys = _data(steps=1)
    m_cpu = _mlp()
    m_npu = copy.deepcopy(m_cpu).npu()
    F.mse_loss(m_cpu(xs[0]), ys[0] * 50).backward()
    F.mse_loss(m_npu(xs[0].npu()), ys[0].npu() * 50).backward()
    kw = {} if foreach is None else {"foreach": foreach}
    tn_cpu = torch.nn.utils.clip_grad_norm_(m_cpu.parameters(), 0.5, norm_type=norm_type, **kw)
    tn_npu = torch.nn.utils.clip_grad_norm_(m_npu.parameters(), 0.5, norm_type=norm_type, **kw)
    assert tn_npu.device.type == "npu"
    assert tn_npu.item() > 0.5  # the clip actually did something
    _close(tn_npu.cpu(), tn_cpu)
    total = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad, norm_type)
                                                  for p in m_npu.parameters()]), norm_type)
    assert abs(total.item() - 0.5) < 1e-4
    for pc, pn in zip(m_cpu.parameters(), m_npu.parameters()):
        _close(pn.grad.cpu(), pc.grad)
    # clip_grad_value_ too
    torch.nn.utils.clip_grad_value_(m_npu.parameters(), 0.01)
    torch.nn.utils.clip_grad_value_(m_cpu.parameters(), 0.01)
    for pc, pn in zip(m_cpu.parameters(), m_npu.parameters()):
        assert float(pn.grad.abs().max()) <= 0.01
        _close(pn.grad.cpu(), pc.grad)


def test_model_npu_moves_params_and_buffers_and_bn_updates_identically():
    torch.manual_seed(4)
    m_cpu = nn.Sequential(nn.Linear(5, 6), nn.BatchNorm1d(6), nn.ReLU(), nn.Linear(6, 2))
    m_npu = copy.deepcopy(m_cpu)
    ret = m_npu.npu()
    assert ret is m_npu
    for n, p in m_npu.named_parameters():
        assert p.device == torch.device("npu:0"), n
        assert isinstance(p, nn.Parameter)
    names = []
    for n, b in m_npu.named_buffers():
        names.append(n)
        assert b.device == torch.device("npu:0"), n
    assert "1.running_mean" in names and "1.running_var" in names and "1.num_batches_tracked" in names
    bn_c, bn_n = m_cpu[1], m_npu[1]
    assert bn_n.num_batches_tracked.dtype == torch.int64
    g = torch.Generator().manual_seed(5)
    m_cpu.train()
    m_npu.train()
    for _ in range(4):
        x = torch.randn(10, 5, generator=g) * 3 + 1
        _close(m_npu(x.npu()).detach().cpu(), m_cpu(x).detach())
    assert bn_n.num_batches_tracked.item() == bn_c.num_batches_tracked.item() == 4
    assert not torch.equal(bn_n.running_mean.cpu(), torch.zeros(6))
    _close(bn_n.running_mean.cpu(), bn_c.running_mean)
    _close(bn_n.running_var.cpu(), bn_c.running_var)
    m_cpu.eval()
    m_npu.eval()
    x = torch.randn(3, 5, generator=g)
    _close(m_npu(x.npu()).detach().cpu(), m_cpu(x).detach())
    # move to another npu and back to cpu
    m_npu.npu(2)
    assert all(p.device == torch.device("npu:2") for p in m_npu.parameters())
    assert all(b.device == torch.device("npu:2") for b in m_npu.buffers())
    m_back = m_npu.cpu()
    assert all(p.device.type == "cpu" for p in m_back.parameters())
    _close(m_back(x).detach(), m_cpu(x).detach())
    # Module.to("npu", dtype)
    m_half = copy.deepcopy(m_cpu).to("npu:1", torch.float64)
    assert all(p.device == torch.device("npu:1") and p.dtype == torch.float64 for p in m_half.parameters())
    assert m_half[1].num_batches_tracked.dtype == torch.int64


def test_grad_accumulation_and_no_grad_on_npu():
    m_cpu = _mlp()
    m_npu = copy.deepcopy(m_cpu).npu()
    xs, ys = _data(steps=3)
    for x, y in zip(xs, ys):
        F.mse_loss(m_cpu(x), y).backward()
        F.mse_loss(m_npu(x.npu()), y.npu()).backward()
    for pc, pn in zip(m_cpu.parameters(), m_npu.parameters()):
        _close(pn.grad.cpu(), pc.grad)
    with torch.no_grad():
        out = m_npu(xs[0].npu())
    assert not out.requires_grad and out.device.type == "npu"
