"""Flex attention under torch.compile on npu: the mask shapes transformers
builds (causal, padding, sliding window, document), block masks, inference
and training (transformers' own flex mask and attention paths, which need
transformers: tests/integration/test_transformers_flex_attention.py).

References: compiled CPU where PyTorch's CPU Inductor serves the case (block
masks, inference: bit-for-bit), and a float64 SDPA with the dense boolean
mask for what CPU cannot compile (gradients, logsumexp). Sizes are tiny:
every mask compiles anew on a 2-core machine.
"""
import math

import pytest
import torch
import torch.nn.functional as F

import torch_npu  # noqa: F401
import torch._dynamo
from torch.nn.attention.flex_attention import AuxRequest, create_block_mask, flex_attention

B, H, S, D = 2, 2, 24, 16
BLOCK = 8  # three blocks per side: full, partial and empty blocks all occur
LENGTHS = [24, 13]  # padding: valid keys per batch row
WINDOW = 5
DOCS = [[0] * 10 + [1] * 8 + [2] * 6, [0] * 4 + [1] * 20]

pytestmark = pytest.mark.filterwarnings("ignore:_compile flag on create_block_mask:DeprecationWarning")


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    # Every mask is a new function for the same compiled flex_attention:
    # start from an empty dynamo cache so no test meets the recompile limit.
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def mask_mod(name, device):
    """The mask as flex attention's mask_mod, reading its tensors on ``device``."""
    lengths = torch.tensor(LENGTHS, device=device)
    docs = torch.tensor(DOCS, device=device)

    def causal(b, h, q, kv):
        return q >= kv

    def padding(b, h, q, kv):
        return (kv < lengths[b]) & (q >= kv)

    def sliding_window(b, h, q, kv):
        return (q >= kv) & (q - kv < WINDOW)

    def document(b, h, q, kv):
        return (docs[b, q] == docs[b, kv]) & (q >= kv)

    return {"causal": causal, "padding": padding, "sliding_window": sliding_window,
            "document": document}[name]


def dense_mask(name):
    """The same mask written out with broadcasting on CPU: (B, 1, S, S) bool."""
    q = torch.arange(S).view(1, 1, S, 1)
    kv = torch.arange(S).view(1, 1, 1, S)
    causal = (q >= kv).expand(B, 1, S, S)
    if name == "causal":
        return causal
    if name == "padding":
        return causal & (kv < torch.tensor(LENGTHS).view(B, 1, 1, 1))
    if name == "sliding_window":
        return causal & (q - kv < WINDOW)
    docs = torch.tensor(DOCS)
    return causal & (docs.view(B, 1, S, 1) == docs.view(B, 1, 1, S))


MASKS = ["causal", "padding", "sliding_window", "document"]


def block_mask(name, device):
    return create_block_mask(mask_mod(name, device), B, 1, S, S, device=device,
                             BLOCK_SIZE=BLOCK, _compile=True)


def qkv(device, requires_grad=False):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(B, H, S, D, generator=g).to(device).requires_grad_(requires_grad)
            for _ in range(3)]


def sdpa_reference(name, q, k, v):
    """float64 SDPA with the dense mask: output, natural-log logsumexp, grads
    of ``out.sum() + lse.sum()``."""
    q, k, v = (t.detach().cpu().double().requires_grad_() for t in (q, k, v))
    mask = dense_mask(name)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(D)
    lse = scores.masked_fill(~mask, float("-inf")).logsumexp(-1)
    (out.sum() + lse.sum()).backward()
    return out, lse, q.grad, k.grad, v.grad


def assert_same_block_mask(npu_mask, cpu_mask):
    assert npu_mask.kv_num_blocks.device.type == "npu"
    for a, b in zip(npu_mask.as_tuple()[:-1], cpu_mask.as_tuple()[:-1]):
        if isinstance(a, torch.Tensor):
            assert torch.equal(a.cpu(), b)
        else:
            assert a == b


# One test per mask (block mask, inference, training): each mask costs
# compilations, and reusing them within a test keeps the file short to run.
@pytest.mark.parametrize("name", MASKS)
def test_compiled_flex_attention_on_npu(name):
    npu_mask, cpu_mask = block_mask(name, "npu"), block_mask(name, "cpu")
    # Compiled create_block_mask: same BlockMask as compiled CPU, and (an
    # independent check) a block is present where any of its elements is.
    assert_same_block_mask(npu_mask, cpu_mask)
    n = S // BLOCK
    expected = dense_mask(name).view(B, 1, n, BLOCK, n, BLOCK).any(5).any(3)
    assert torch.equal(npu_mask.to_dense().cpu().bool(), expected)

    ref = sdpa_reference(name, *qkv("cpu"))
    compiled = torch.compile(flex_attention, fullgraph=True)

    # Inference: the CPU template on npu data, bit for bit compiled CPU.
    with torch.no_grad():
        out_npu = compiled(*qkv("npu"), block_mask=npu_mask)
        out_cpu = compiled(*qkv("cpu"), block_mask=cpu_mask)
    assert out_npu.device.type == "npu"
    assert torch.equal(out_npu.cpu(), out_cpu)
    torch.testing.assert_close(out_npu.cpu(), ref[0].float())

    # Training with the logsumexp: compiled CPU refuses it ("CPU only
    # supports inference"); npu compiles it, checked against float64 SDPA.
    q, k, v = qkv("npu", requires_grad=True)
    out, aux = compiled(q, k, v, block_mask=npu_mask, return_aux=AuxRequest(lse=True))
    (out.sum() + aux.lse.sum()).backward()
    assert out.device.type == "npu" and q.grad.device.type == "npu"
    for got, want in zip((out, aux.lse, q.grad, k.grad, v.grad), ref):
        torch.testing.assert_close(got.detach().cpu(), want.float())


def test_eager_flex_attention_accepts_npu_and_matches_float64_sdpa():
    # Stock PyTorch rejects npu in flex attention's device check; the patch
    # lets npu through while CPU keeps its own check (no backward on CPU).
    q, k, v = qkv("npu", requires_grad=True)
    npu_mask = create_block_mask(mask_mod("document", "npu"), B, 1, S, S, device="npu", BLOCK_SIZE=BLOCK)
    out, aux = flex_attention(q, k, v, block_mask=npu_mask, return_aux=AuxRequest(lse=True))
    (out.sum() + aux.lse.sum()).backward()
    ref = sdpa_reference("document", *qkv("cpu"))
    for got, want in zip((out, aux.lse, q.grad, k.grad, v.grad), ref):
        torch.testing.assert_close(got.detach().cpu(), want.float())
    with pytest.raises(NotImplementedError, match="does not support backward on CPU"):
        flex_attention(*qkv("cpu", requires_grad=True))


def test_registry_inductor_backend_serves_npu_graphs():
    # lookup_backend("inductor") (torch._dynamo.optimize, CompileCounterWithBackend)
    # calls Inductor's compile_fx directly; it used to fail lowering the bool
    # sum below with the same AssertionError as compiled create_block_mask.
    from torch._dynamo.testing import CompileCounterWithBackend
    counter = CompileCounterWithBackend("inductor")
    x = torch.randn(3, 8)

    def count_positive(t):
        return (t > 0).sum(-1)

    out = torch.compile(count_positive, backend=counter, fullgraph=True)(x.to("npu"))
    assert counter.frame_count == 1 and out.device.type == "npu"
    assert torch.equal(out.cpu(), count_positive(x))
    # The registered backend still compiles CPU graphs as CPU graphs.
    assert torch.equal(torch.compile(count_positive, backend=counter)(x), count_positive(x))
