"""Autocast on npu (C++ AutocastPrivateUse1 registration): every rule class
checked against explicit casts computed on CPU, plus loss scaling."""
import pytest
import torch
import torch.nn.functional as F

import torch_npu  # noqa: F401

DTYPES = [torch.float16, torch.bfloat16]


def _pair(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g)
    return x, x.npu()


@pytest.mark.parametrize("dtype", DTYPES)
def test_lower_precision_ops_run_in_the_autocast_dtype(dtype):
    a, an = _pair(8, 16, seed=1)
    b, bn = _pair(16, 4, seed=2)
    w, wn = _pair(4, 16, seed=3)
    img, imgn = _pair(2, 3, 8, 8, seed=4)
    k, kn = _pair(5, 3, 3, 3, seed=5)
    cases = [
        (lambda x, y, z, i, c: x @ y, lambda x, y, z, i, c: x.to(dtype) @ y.to(dtype)),
        (lambda x, y, z, i, c: torch.mm(x, y), lambda x, y, z, i, c: torch.mm(x.to(dtype), y.to(dtype))),
        (lambda x, y, z, i, c: F.linear(x, z), lambda x, y, z, i, c: F.linear(x.to(dtype), z.to(dtype))),
        (lambda x, y, z, i, c: F.conv2d(i, c), lambda x, y, z, i, c: F.conv2d(i.to(dtype), c.to(dtype))),
    ]
    for auto_fn, ref_fn in cases:
        with torch.autocast("npu", dtype=dtype):
            out = auto_fn(an, bn, wn, imgn, kn)
        ref = ref_fn(a, b, w, img, k)
        assert out.dtype == dtype and out.device.type == "npu"
        torch.testing.assert_close(out.cpu(), ref, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", DTYPES)
def test_fp32_ops_run_in_float32(dtype):
    x, xn = _pair(4, 8, seed=6)
    xh, xhn = x.to(dtype), xn.to(dtype)
    t, tn = _pair(4, 8, seed=7)
    cases = [
        (lambda v, u: torch.softmax(v, -1), lambda v, u: torch.softmax(v.float(), -1)),
        (lambda v, u: F.layer_norm(v, (8,)), lambda v, u: F.layer_norm(v.float(), (8,))),
        (lambda v, u: F.mse_loss(v, u), lambda v, u: F.mse_loss(v.float(), u.float())),
        (lambda v, u: torch.exp(v), lambda v, u: torch.exp(v.float())),
        (lambda v, u: v.pow(2), lambda v, u: v.float().pow(2)),
    ]
    for auto_fn, ref_fn in cases:
        with torch.autocast("npu", dtype=dtype):
            out = auto_fn(xhn, tn)
        assert out.dtype == torch.float32, auto_fn
        torch.testing.assert_close(out.cpu(), ref_fn(xh, t), rtol=0, atol=0)


def test_fp32_set_opt_dtype_and_promote_rules():
    x, xn = _pair(3, 5, seed=8)
    with torch.autocast("npu", dtype=torch.float16):
        s = torch.sum(xn.half(), 1)               # fp32_set_opt_dtype: reduces in float32
        c = torch.cat([xn.half(), xn])           # promote: widest input type
        st = torch.stack([xn.half(), xn])
        r = torch.relu(xn.half())                 # no rule: falls through, keeps its dtype
    assert s.dtype == torch.float32
    torch.testing.assert_close(s.cpu(), torch.sum(x.half().float(), 1), rtol=0, atol=0)
    assert c.dtype == torch.float32 and st.dtype == torch.float32
    torch.testing.assert_close(c.cpu(), torch.cat([x.half().float(), x]), rtol=0, atol=0)
    assert r.dtype == torch.float16


def test_disabled_and_nested_regions_and_state_queries():
    a, an = _pair(4, 4, seed=9)
    assert not torch.is_autocast_enabled("npu")
    with torch.autocast("npu", dtype=torch.bfloat16):
        assert torch.is_autocast_enabled("npu")
        assert torch.get_autocast_dtype("npu") == torch.bfloat16
        assert torch.npu.is_autocast_enabled() and torch.npu.get_autocast_dtype() == torch.bfloat16
        with torch.autocast("npu", enabled=False):
            assert (an @ an).dtype == torch.float32
        assert (an @ an).dtype == torch.bfloat16
    assert not torch.is_autocast_enabled("npu")
    # CPU tensors are not touched by the npu autocast region
    with torch.autocast("npu", dtype=torch.float16):
        assert (a @ a).dtype == torch.float32


def test_binary_cross_entropy_is_banned_as_on_cuda():
    p = torch.rand(6).npu()
    with torch.autocast("npu"):
        with pytest.raises(RuntimeError, match="unsafe to autocast"):
            F.binary_cross_entropy(p, p)
        out = F.binary_cross_entropy_with_logits(p, p)
    assert out.dtype == torch.float32


def test_autocast_training_matches_explicit_casts_on_cpu():
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 1))
    npu = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 1))
    npu.load_state_dict(ref.state_dict())
    npu = npu.npu()
    x, xn = _pair(64, 16, seed=10)
    y, yn = _pair(64, 1, seed=11)
    o_ref = torch.optim.SGD(ref.parameters(), lr=0.05)
    o_npu = torch.optim.SGD(npu.parameters(), lr=0.05)
    for _ in range(5):
        # reference: the casts bf16 autocast applies, written out by hand on CPU
        h = F.linear(x.bfloat16(), ref[0].weight.bfloat16(), ref[0].bias.bfloat16())
        h = F.gelu(h)
        out = F.linear(h, ref[2].weight.bfloat16(), ref[2].bias.bfloat16())
        loss_ref = F.mse_loss(out.float(), y)
        o_ref.zero_grad()
        loss_ref.backward()
        o_ref.step()
        with torch.autocast("npu", dtype=torch.bfloat16):
            loss = F.mse_loss(npu(xn), yn)
        o_npu.zero_grad()
        loss.backward()
        o_npu.step()
        assert loss.dtype == torch.float32
        torch.testing.assert_close(loss.cpu(), loss_ref, rtol=0, atol=0)
    for p_ref, p_npu in zip(ref.parameters(), npu.parameters()):
        torch.testing.assert_close(p_npu.cpu(), p_ref, rtol=0, atol=0)


def test_grad_scaler_skips_inf_steps_backs_off_and_grows():
    m = torch.nn.Linear(4, 1).npu()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("npu", init_scale=8.0, growth_interval=2)
    x = torch.ones(2, 4).npu()
    # clean step: applied
    before = m.weight.detach().clone()
    scaler.scale(m(x).sum()).backward()
    scaler.step(opt)
    scaler.update()
    assert not torch.equal(m.weight.cpu(), before.cpu())
    assert scaler.get_scale() == 8.0
    # injected inf: step skipped, scale halved
    opt.zero_grad()
    before = m.weight.detach().clone()
    scaler.scale(m(x).sum() * float("inf")).backward()
    scaler.step(opt)
    scaler.update()
    assert torch.equal(m.weight.cpu(), before.cpu())
    assert scaler.get_scale() == 4.0
    # two clean steps in a row: growth by 2
    for _ in range(2):
        opt.zero_grad()
        scaler.scale(m(x).sum()).backward()
        scaler.step(opt)
        scaler.update()
    assert scaler.get_scale() == 8.0


class _TinyGPT(torch.nn.Module):
    def __init__(self, vocab=64, d=32, heads=2, seq=16):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, d)
        self.pos = torch.nn.Parameter(torch.randn(seq, d) * 0.02)
        self.ln1 = torch.nn.LayerNorm(d)
        self.qkv = torch.nn.Linear(d, 3 * d)
        self.proj = torch.nn.Linear(d, d)
        self.ln2 = torch.nn.LayerNorm(d)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(d, 4 * d), torch.nn.GELU(), torch.nn.Linear(4 * d, d))
        self.head = torch.nn.Linear(d, vocab)
        self.heads = heads

    def forward(self, idx):
        b, t = idx.shape
        x = self.emb(idx) + self.pos[:t]
        q, k, v = self.qkv(self.ln1(x)).chunk(3, -1)
        split = lambda z: z.view(b, t, self.heads, -1).transpose(1, 2)  # noqa: E731
        a = F.scaled_dot_product_attention(split(q), split(k), split(v), is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, -1))
        x = x + self.mlp(self.ln2(x))
        return self.head(x)


@pytest.mark.parametrize("dtype", DTYPES)
def test_tiny_gpt_amp_training_tracks_cpu_autocast(dtype):
    # Reference: the same code under CPU autocast (PyTorch's own, independent
    # cast lists) with a CPU GradScaler for fp16. Trajectories must agree
    # closely, and the loss must fall.
    torch.manual_seed(0)
    base = _TinyGPT()
    g = torch.Generator().manual_seed(1)
    data = torch.randint(0, 64, (8, 17), generator=g)
    losses = {}
    for dev in ("cpu", "npu"):
        model = _TinyGPT()
        model.load_state_dict(base.state_dict())
        model = model.to(dev)
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3, foreach=False)
        scaler = torch.amp.GradScaler(dev, enabled=(dtype == torch.float16))
        x, y = data[:, :-1].to(dev), data[:, 1:].to(dev)
        traj = []
        for _ in range(12):
            opt.zero_grad()
            with torch.autocast(dev, dtype=dtype):
                logits = model(x)
                loss = F.cross_entropy(logits.float().view(-1, 64), y.reshape(-1))
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            traj.append(loss.item())
        losses[dev] = traj
    cpu, npu = torch.tensor(losses["cpu"]), torch.tensor(losses["npu"])
    assert npu[-1] < npu[0] * 0.9
    tol = 1e-3  # measured: identical trajectories today; CPU autocast uses its own cast lists
    torch.testing.assert_close(npu, cpu, rtol=tol, atol=tol)


def _count_casts(cache_enabled):
    w = torch.randn(8, 8, device="npu", requires_grad=True)
    x = torch.randn(4, 8, device="npu")
    with torch.profiler.profile() as prof:
        with torch.autocast("npu", dtype=torch.float16, cache_enabled=cache_enabled):
            for _ in range(3):
                F.linear(x, w)
    return sum(e.count for e in prof.key_averages() if e.key == "aten::_to_copy")


def test_weight_casts_are_cached_as_on_cuda():
    # x is cast on every call; the leaf weight only once while the cache is on
    assert _count_casts(True) == 3 + 1
    assert _count_casts(False) == 3 + 3
