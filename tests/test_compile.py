"""torch.compile on npu: compiled vs eager (on npu and on CPU), gradients,
optimizer steps, graph breaks, recompilation, caches, random ops, backends.

Models are tiny: Inductor compiles on a 2-core machine. Each compiled
function is built once per module (fixtures) and reused across asserts.
"""
import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torch_npu  # noqa: F401
import torch._dynamo
import torch._dynamo.testing
from torch._dynamo.utils import counters

NPU = torch.device("npu")


class Block(nn.Module):
    """A pre-LN GPT block with attention and residual dropout."""

    def __init__(self, d=32, heads=2, p=0.1):
        super().__init__()
        self.heads, self.p = heads, p
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.drop = nn.Dropout(p)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
        # Attention written out (compiled F.scaled_dot_product_attention has its own test).
        scores = (q @ k.transpose(-2, -1)) / (C // self.heads) ** 0.5
        causal = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
        att = self.drop(scores.masked_fill(~causal, float("-inf")).softmax(-1))
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + self.drop(self.proj(y))
        return x + self.drop(self.fc2(F.gelu(self.fc1(self.ln2(x)))))


def mlp():
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))


def convnet():
    # AvgPool: stock CPU Inductor of torch 2.13 returns zero gradients upstream
    # of MaxPool2d in this net (on CPU tensors too), see docs/graph_mode.md.
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AvgPool2d(2),
                         nn.Flatten(), nn.Linear(8 * 4 * 4, 5))


def _pair(model_fn, seed=0):
    torch.manual_seed(seed)
    ref = model_fn()
    return ref, copy.deepcopy(ref).to(NPU)


def _train_steps(model, x, y, loss_fn, steps=2):
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    return losses


@pytest.mark.parametrize("model_fn,x_shape,loss", [
    (mlp, (8, 16), "ce"),
    (convnet, (4, 3, 8, 8), "ce"),
    (lambda: Block(p=0.0), (2, 8, 32), "mse"),
], ids=["mlp", "convnet", "gpt_block"])
def test_compiled_training_matches_cpu(model_fn, x_shape, loss):
    cpu_model, npu_model = _pair(model_fn)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(x_shape, generator=g)
    y = torch.randint(0, 4, (x_shape[0],), generator=g) if loss == "ce" else torch.randn(x_shape, generator=g)
    loss_fn = F.cross_entropy if loss == "ce" else F.mse_loss
    # no graph breaks in the model
    explanation = torch._dynamo.explain(npu_model)(x.to(NPU))
    assert explanation.graph_break_count == 0, explanation.break_reasons
    compiled = torch.compile(npu_model)
    npu_losses = _train_steps(compiled, x.to(NPU), y.to(NPU), loss_fn)
    cpu_losses = _train_steps(cpu_model, x, y, loss_fn)
    for ln, lc in zip(npu_losses, cpu_losses):
        assert ln.device.type == "npu"
        torch.testing.assert_close(ln.cpu(), lc, rtol=1e-4, atol=1e-5)
    for pn, pc in zip(npu_model.parameters(), cpu_model.parameters()):
        assert pn.device.type == "npu" and pn.grad.device.type == "npu"
        torch.testing.assert_close(pn.grad.cpu(), pc.grad, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(pn.detach().cpu(), pc.detach(), rtol=1e-4, atol=1e-5)


def _pointwise_chain(x, w, b):
    return torch.tanh(F.gelu(x @ w + b) * 2.0 - 1.0)


def test_fused_kernel_generated_and_outputs_on_npu():
    from torch._inductor.utils import run_and_get_code
    g = torch.Generator().manual_seed(2)
    x, w, b = torch.randn(8, 16, generator=g), torch.randn(16, 16, generator=g), torch.randn(16, generator=g)
    torch._dynamo.reset()
    compiled = torch.compile(_pointwise_chain)
    out, codes = run_and_get_code(compiled, x.to(NPU), w.to(NPU), b.to(NPU))
    assert out.device == torch.device("npu", 0)
    torch.testing.assert_close(out.cpu(), _pointwise_chain(x, w, b), rtol=1e-5, atol=1e-6)
    code = "\n".join(codes)
    # bias add, gelu, scale, shift and tanh in one generated C++ kernel
    assert "cpp_fused" in code and "tanh" in code


def _sdpa(q, k, v, mask, causal):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)


@pytest.mark.parametrize("case", ["plain", "causal", "mask", "transposed_mask"])
def test_compiled_sdpa_with_grads_matches_compiled_cpu(case):
    # SDPA's composite asks the npu backend-choice stub on fake npu tensors while
    # tracing; the answer (and so the kernel) must be the CPU's, grads included
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 3, 7, 8, generator=g) for _ in range(3))
    mask = torch.randn(2, 1, 7, 7, generator=g) if "mask" in case else None
    if case == "transposed_mask":
        mask = mask.transpose(-1, -2)  # last dimension's stride is 7
    results = {}
    for dev in ("cpu", "npu"):
        torch._dynamo.reset()
        leaves = [t.detach().to(dev).requires_grad_() for t in (q, k, v)]
        m = None if mask is None else mask.to(dev)
        if case == "transposed_mask":
            m = mask.transpose(-1, -2).contiguous().to(dev).transpose(-1, -2)
        out = torch.compile(_sdpa)(*leaves, m, case == "causal")
        out.backward(torch.ones_like(out))
        results[dev] = [out.detach().cpu()] + [t.grad.cpu() for t in leaves]
    for got, want in zip(results["npu"], results["cpu"]):
        assert torch.equal(got, want)


def test_compiled_dropout_draws_from_npu_generator():
    torch.manual_seed(0)
    block = Block(p=0.5).to(NPU).train()
    compiled = torch.compile(block)
    x = torch.randn(2, 8, 32).to(NPU)
    cpu_state = torch.get_rng_state()
    torch.npu.manual_seed(123)
    a = compiled(x)
    torch.npu.manual_seed(123)
    b = compiled(x)
    c = compiled(x)
    assert a.device.type == "npu"
    assert torch.equal(a.cpu(), b.cpu())            # reseeding the npu generator reproduces
    assert not torch.equal(b.cpu(), c.cpu())        # and the stream advances
    assert torch.equal(torch.get_rng_state(), cpu_state)   # the CPU generator is untouched
    torch.manual_seed(999)                           # nor does the CPU seed matter
    torch.npu.manual_seed(123)
    assert torch.equal(compiled(x).cpu(), a.cpu())
    # eval mode: no dropout, equal to eager
    block.eval()
    torch.testing.assert_close(torch.compile(block)(x).cpu(), block(x).cpu(), rtol=1e-5, atol=1e-5)


class _CountingBackend:
    def __init__(self):
        self.frames = 0

    def __call__(self, gm, example_inputs):
        self.frames += 1
        return torch._dynamo.lookup_backend("npu")(gm, example_inputs)


def _fn(x):
    return F.silu(x) * x.sum(-1, keepdim=True)


def test_dynamic_shapes_and_recompilation_counts():
    torch._dynamo.reset()
    counter = _CountingBackend()
    dyn = torch.compile(_fn, backend=counter, dynamic=True)
    for n in (3, 5, 9):
        x = torch.randn(n, 4)
        out = dyn(x.to(NPU))
        assert out.device.type == "npu"
        torch.testing.assert_close(out.cpu(), _fn(x))
    assert counter.frames == 1
    torch._dynamo.reset()
    auto = _CountingBackend()
    compiled = torch.compile(_fn, backend=auto)   # automatic dynamic: static, then one dynamic recompile
    for n in (3, 5, 9, 17):
        x = torch.randn(n, 4)
        torch.testing.assert_close(compiled(x.to(NPU)).cpu(), _fn(x))
    assert auto.frames == 2


def test_warm_cache_start_returns_npu_tensors():
    x = torch.randn(6, 4)
    torch._dynamo.reset()
    torch.compile(_fn)(x.to(NPU))                 # fills the FX graph cache
    hits = counters["inductor"]["fxgraph_cache_hit"]
    torch._dynamo.reset()                          # a fresh start: dynamo and AOT state gone
    out = torch.compile(_fn)(x.to(NPU))
    assert counters["inductor"]["fxgraph_cache_hit"] > hits
    assert out.device.type == "npu"
    torch.testing.assert_close(out.cpu(), _fn(x))


def _device_calls(x):
    torch.npu.synchronize()
    stream = torch.npu.current_stream()  # noqa: F841
    scale = torch.npu.current_device() + 2
    y, _ = torch_npu.npu_rms_norm(x, torch.ones(x.shape[-1], device=x.device))
    return y * scale


def test_custom_ops_and_device_calls_do_not_break_graphs():
    x = torch.randn(4, 8)
    explanation = torch._dynamo.explain(_device_calls)(x.to(NPU))
    assert explanation.graph_break_count == 0, explanation.break_reasons
    out = torch.compile(_device_calls)(x.to(NPU))
    expected = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * 2
    torch.testing.assert_close(out.cpu(), expected, rtol=1e-5, atol=1e-5)


def test_views_mutations_and_cpu_outputs():
    def f(x, buf):
        buf.add_(1)                  # input mutation lands in npu memory
        return x.view(-1), (x * 2).cpu(), x + buf
    x, buf = torch.randn(2, 3).to(NPU), torch.zeros(2, 3).to(NPU)
    view, on_cpu, s = torch.compile(f)(x, buf)
    assert view.device.type == "npu" and view.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
    assert on_cpu.device.type == "cpu"
    torch.testing.assert_close(on_cpu, x.cpu() * 2)
    assert torch.equal(buf.cpu(), torch.ones(2, 3))
    torch.testing.assert_close(s.cpu(), x.cpu() + 1)


def test_named_backends_and_torchair():
    import torchair
    from torch_npu.dynamo import torchair as bundled
    assert torchair is bundled
    x = torch.randn(5, 4)
    for backend in ("npu", "npugraph_ex", "npugraphs",
                    torchair.get_npu_backend(compiler_config=torchair.CompilerConfig())):
        torch._dynamo.reset()
        out = torch.compile(_fn, backend=backend)(x.to(NPU))
        assert out.device.type == "npu"
        torch.testing.assert_close(out.cpu(), _fn(x))
    config = torchair.CompilerConfig()
    config.mode = "reduce-overhead"
    config.experimental_config.frozen_parameter = True
    with pytest.raises(ValueError):
        config.mode = "fastest"
    with pytest.raises(AttributeError):
        config.no_such_option = 1
    with pytest.raises(TypeError):
        torchair.get_npu_backend(compiler_config={"mode": "max-autotune"})
