"""npu_fusion_attention runs ATen's CPU flash-attention kernel where it can express the call.

transformers' NPU flash path (``attn_implementation="flash_attention_2"``) calls
npu_fusion_attention in BSND with the 2048x2048 causal template and sparse_mode 3;
diffusers' AttnProcessorNPU in BNSD without a mask. Those calls (no pse, no dropout,
no mask or a top-left causal one) must cost what CPU SDPA costs, so they run
``aten._scaled_dot_product_flash_attention_for_cpu`` (and its backward); everything
else stays on the blocked composition. Checked here: which path each call takes, and
that the fast path's four results (out, softmax_max, softmax_sum, gradients) match
an independent float64 reference.
"""
import contextlib

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import torch_npu

FLASH = "aten._scaled_dot_product_flash_attention_for_cpu.default"
FLASH_BWD = "aten._scaled_dot_product_flash_attention_for_cpu_backward.default"
TEMPLATE = torch.triu(torch.ones(2048, 2048, dtype=torch.bool), diagonal=1)
BIG = 2147483647  # pre/next_tockens default


class _Ops(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.names = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.add(str(func))
        return func(*args, **(kwargs or {}))


def _to_layout(x, layout):
    """[B, N, S, D] -> layout."""
    b, n, s, d = x.shape
    if layout == "BNSD":
        return x.contiguous()
    if layout == "BSND":
        return x.transpose(1, 2).contiguous()
    if layout == "BSH":
        return x.transpose(1, 2).reshape(b, s, n * d)
    return x.permute(2, 0, 1, 3).reshape(s, b, n * d)  # SBH


def _reference(q, k, v, scale, causal):
    """float64 math on [B, N, S, D]: out, row max, row sum of exp(x - max)."""
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    x = scale * q @ k.transpose(-1, -2)
    if causal:
        s1, s2 = x.shape[-2:]
        x = x.masked_fill(torch.ones(s1, s2, dtype=torch.bool).triu(1), float("-inf"))
    m = x.amax(-1)
    return torch.softmax(x, -1) @ v, m, torch.exp(x - m.unsqueeze(-1)).sum(-1)


# (layout, key/value heads): BSH/SBH derive the key heads from the hidden size, so GQA
# (2 key heads for 4 query heads) is exercised in the 4-D layouts
@pytest.mark.parametrize("layout,n_kv", [("BSH", 4), ("SBH", 4), ("BSND", 4), ("BNSD", 4), ("BSND", 2), ("BNSD", 2)])
@pytest.mark.parametrize("mask", ["none", "causal2", "causal3"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fast_path_matches_reference(layout, mask, n_kv, dtype):
    torch.manual_seed(0)
    b, n, s, d, scale = 2, 4, 9, 8, 0.3
    q64 = torch.randn(b, n, s, d, dtype=torch.float64)
    k64 = torch.randn(b, n_kv, s, d, dtype=torch.float64)
    v64 = torch.randn(b, n_kv, s, d, dtype=torch.float64)
    # the reference sees the values the op sees (rounded to dtype)
    q64, k64, v64 = (t.to(dtype).double().requires_grad_() for t in (q64, k64, v64))
    qs, ks, vs = (_to_layout(t.detach(), layout).to(dtype).npu().requires_grad_() for t in (q64, k64, v64))
    kwargs = {} if mask == "none" else {"atten_mask": TEMPLATE.npu(), "sparse_mode": int(mask[-1])}
    ops = _Ops()
    with ops:
        out, smax, ssum = torch_npu.npu_fusion_attention(qs, ks, vs, n, layout, scale=scale, **kwargs)[:3]
        out.float().sum().backward()
    assert FLASH in ops.names and FLASH_BWD in ops.names
    ref_out, ref_max, ref_sum = _reference(q64, k64, v64, scale, mask != "none")
    ref_out.sum().backward()
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(out.cpu().double(), _to_layout(ref_out.detach(), layout), **tol)
    assert smax.shape == ssum.shape == (b, n, s, 8) and smax.dtype == ssum.dtype == torch.float32
    torch.testing.assert_close(smax.cpu().double(), ref_max.detach().unsqueeze(-1).expand(b, n, s, 8),
                               rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ssum.cpu().double(), ref_sum.detach().unsqueeze(-1).expand(b, n, s, 8),
                               rtol=1e-4, atol=1e-4)
    for got, ref in ((qs, q64), (ks, k64), (vs, v64)):
        torch.testing.assert_close(got.grad.cpu().double(), _to_layout(ref.grad, layout), **tol)


def _uses_flash(**kw):
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 6, 4).npu() for _ in range(3))
    ops = _Ops()
    with ops:
        torch_npu.npu_fusion_attention(q, k, v, 2, "BNSD", scale=0.5, **kw)
    return FLASH in ops.names


def test_what_sdpa_cannot_express_stays_on_the_composition():
    assert _uses_flash()
    assert _uses_flash(atten_mask=TEMPLATE.npu(), sparse_mode=2)
    assert not _uses_flash(keep_prob=0.9)                                    # dropout from the npu generator
    assert not _uses_flash(pse=torch.randn(1, 2, 6, 6).npu())                # bias
    assert not _uses_flash(atten_mask=torch.rand(6, 6).npu() > 0.5)          # arbitrary mask (sparse_mode 0)
    assert not _uses_flash(atten_mask=TEMPLATE.npu(), sparse_mode=4, pre_tockens=1, next_tockens=0)  # band


def test_bottom_right_causal_with_unequal_lengths_stays_on_the_composition():
    q = torch.randn(1, 2, 3, 4).npu()
    kv = torch.randn(1, 2, 6, 4).npu()
    ops = _Ops()
    with ops:
        torch_npu.npu_fusion_attention(q, kv, kv, 2, "BNSD", atten_mask=TEMPLATE.npu(), sparse_mode=3)
    assert FLASH not in ops.names


@pytest.mark.parametrize("causal", [False, True])
def test_small_dropout_call_is_one_autograd_block_equal_to_the_blocked_engine(monkeypatch, causal):
    # A small call with dropout runs in one block (one autograd node, the derivative of its
    # ATen ops); its forward is the blocked engine's formula with the same keep mask, so the
    # results are the same bits, and the gradients agree with the engine's backward.
    from torch_npu.op_plugin.attention import flash as attention_flash
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(2, 8, 4, 16, generator=g).npu().requires_grad_() for _ in range(3))
    kw = dict(scale=0.3, keep_prob=0.8)
    if causal:
        kw.update(atten_mask=TEMPLATE.npu(), sparse_mode=2)

    def run():
        torch.npu.manual_seed(9)
        res = torch_npu.npu_fusion_attention(q, k, v, 4, "BSND", **kw)
        res[0].backward(torch.ones_like(res[0]))
        grads = [t.grad.clone() for t in (q, k, v)]
        for t in (q, k, v):
            t.grad = None
        return res, grads

    (out, smax, ssum, _, seed, offset, _), grads = run()
    assert out.grad_fn.name() == "NpuFusionAttentionBackward0"   # the one-node path
    monkeypatch.setattr(attention_flash, "SMALL_ELEMENTS", 0)  # the blocked engine
    (ref, rmax, rsum, _, rseed, roffset, _), rgrads = run()
    assert "FusionAttention" in type(ref.grad_fn).__name__
    assert (seed, offset) == (rseed, roffset)
    for got, want in ((out, ref), (smax, rmax), (ssum, rsum)):
        assert torch.equal(got.cpu(), want.cpu())
    for got, want in zip(grads, rgrads):
        torch.testing.assert_close(got.cpu(), want.cpu(), rtol=1e-5, atol=1e-6)


def _layout_tensor(layout, b, s, n, d, dtype, gen):
    shape = {"BSND": (b, s, n, d), "BNSD": (b, n, s, d), "BSH": (b, s, n * d), "SBH": (s, b, n * d)}[layout]
    return torch.randn(*shape, generator=gen).to(dtype).npu().requires_grad_()


def _check_cpp_path_against_python(monkeypatch, layout, n_kv, dtype, keep_prob, cases):
    """For each (S, mask, sparse_mode, scale): the call is taken by C++ and gives the Python
    path's bits (results, (seed, offset, numels), generator state, gradients)."""
    from torch_npu.op_plugin.attention import fusion
    engine = fusion._attention
    calls = []
    monkeypatch.setattr(fusion, "_attention", lambda *a: calls.append(a) or engine(*a))
    gen = torch.Generator().manual_seed(1)
    for s, mask, sparse_mode, scale in cases:
        q = _layout_tensor(layout, 2, s, 4, 8, dtype, gen)
        k, v = (_layout_tensor(layout, 2, s, n_kv, 8, dtype, gen) for _ in range(2))
        kw = dict(scale=scale, sparse_mode=sparse_mode, keep_prob=keep_prob,
                  atten_mask=None if mask is None else TEMPLATE.npu())
        torch.npu.manual_seed(5)
        got = torch_npu.npu_fusion_attention(q, k, v, 4, layout, **kw)
        assert calls == []  # taken by C++
        got_state = torch.npu.get_rng_state()
        dy = torch.randn(got[0].shape, generator=gen).to(dtype).npu()
        got_grads = torch.autograd.grad(got[0], (q, k, v), dy)
        torch.npu.manual_seed(5)
        want = engine("npu_fusion_attention", q, k, v, 4, layout, None, kw["atten_mask"], scale, keep_prob, BIG,
                      BIG, None, None, None, sparse_mode, 1)
        want_grads = torch.autograd.grad(want[0], (q, k, v), dy)
        seed_offset = (5, 0) if keep_prob < 1 else (0, 0)
        assert got[4:] == want[4:] == seed_offset + (2 * 4 * s * s,)
        assert torch.equal(got_state, torch.npu.get_rng_state())  # advanced alike (or not at all)
        for a, b in zip(got[:4] + got_grads, want[:4] + want_grads):
            assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.cpu(), b.cpu())


@pytest.mark.parametrize("layout,n_kv", [("BSH", 4), ("SBH", 4), ("BSND", 4), ("BNSD", 4), ("BSND", 2), ("BNSD", 1)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cpp_fast_path_is_bitwise_the_python_fast_path(monkeypatch, layout, n_kv, dtype):
    # The common case runs in C++ (aten/FusionAttentionSdpa.cpp) with the Python fast
    # path's ops, order and row blocks (S = 300: three causal row blocks).
    _check_cpp_path_against_python(monkeypatch, layout, n_kv, dtype, 1.0,
                                   ((9, None, 0, 0.3), (300, None, 0, -0.2), (9, "causal", 2, 0.3),
                                    (300, "causal", 3, 0.125)))


@pytest.mark.parametrize("layout,n_kv", [("BSH", 4), ("SBH", 4), ("BSND", 2), ("BNSD", 1)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cpp_small_dropout_path_is_bitwise_the_python_path(monkeypatch, layout, n_kv, dtype):
    # A small call with dropout also runs in C++, with the Python small-dropout path's ops and
    # keep mask (the same (seed, offset) from the npu generator, the same mask row blocks;
    # S = 40: three of them).
    _check_cpp_path_against_python(monkeypatch, layout, n_kv, dtype, 0.8,
                                   ((7, None, 0, 0.3), (40, None, 0, -0.2), (40, "causal", 2, 0.125),
                                    (7, "causal", 3, 0.5)))


@pytest.mark.parametrize("scale", [-0.5, 0.0])
def test_causal_with_a_nonpositive_scale_is_right(scale):
    # ATen's CPU flash kernel returns NaN for a causal call with scale <= 0 (its masked
    # logits become -inf * scale), so such calls must take the blocked composition.
    torch.manual_seed(0)
    q64, k64, v64 = (torch.randn(2, 4, 7, 8, dtype=torch.float64).requires_grad_() for _ in range(3))
    qs, ks, vs = (t.detach().float().npu().requires_grad_() for t in (q64, k64, v64))
    ops = _Ops()
    with ops:
        out, smax, ssum = torch_npu.npu_fusion_attention(qs, ks, vs, 4, "BNSD", scale=scale,
                                                         atten_mask=TEMPLATE.npu(), sparse_mode=2)[:3]
        out.sum().backward()
    assert FLASH not in ops.names
    ref_out, ref_max, ref_sum = _reference(q64, k64, v64, scale, True)
    ref_out.sum().backward()
    assert not out.isnan().any()
    torch.testing.assert_close(out.cpu().double(), ref_out.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(smax[..., 0].cpu().double(), ref_max.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ssum[..., 0].cpu().double(), ref_sum.detach(), rtol=1e-4, atol=1e-4)
    for got, ref in ((qs, q64), (ks, k64), (vs, v64)):
        torch.testing.assert_close(got.grad.cpu().double(), ref.grad, rtol=1e-4, atol=1e-4)


def _python_kernel_entries(monkeypatch):
    """A list that grows each time npu_fusion_attention's Python kernel runs: every path
    through it calls fusion._plain (the fast-path check) or fusion.reject_given (before
    the engine), and nothing else calls them."""
    from torch_npu.op_plugin.attention import fusion
    entries, plain, reject = [], fusion._plain, fusion.reject_given
    monkeypatch.setattr(fusion, "_plain", lambda *t: entries.append("plain") or plain(*t))
    monkeypatch.setattr(fusion, "reject_given", lambda *a, **kw: entries.append("reject") or reject(*a, **kw))
    return entries


@pytest.mark.parametrize("device", ["cpu", "npu"])
def test_the_common_call_without_dropout_skips_the_python_kernel(monkeypatch, device):
    # The op's C++ kernel at AutogradCPU / AutogradPrivateUse1 takes it (no per-call Python);
    # under inference mode (no Autograd keys) the Python kernel runs the same C++ path.
    # Both give the same bits.
    entries = _python_kernel_entries(monkeypatch)
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 9, n, 8, generator=gen).to(device).requires_grad_() for n in (4, 2, 2))
    mask = TEMPLATE.to(device)
    got = torch_npu.npu_fusion_attention(q, k, v, 4, "BSND", atten_mask=mask, scale=0.3, sparse_mode=3)
    assert entries == [] and got[0].grad_fn is not None
    with torch.inference_mode():
        inf = torch_npu.npu_fusion_attention(q, k, v, 4, "BSND", atten_mask=mask, scale=0.3, sparse_mode=3)
    assert entries == ["plain"]
    assert got[4:] == inf[4:] == (0, 0, 2 * 4 * 9 * 9)
    for a, b in zip(got[:4], inf[:4]):
        assert a.device.type == device and torch.equal(a.detach().cpu(), b.cpu())


def test_every_other_call_reaches_the_python_kernel(monkeypatch):
    from torch_npu.op_plugin.attention import flash
    entries = _python_kernel_entries(monkeypatch)
    q, k, v = (torch.randn(1, 2, 6, 4).npu() for _ in range(3))

    def entered(*args, **kw):
        entries.clear()
        torch_npu.npu_fusion_attention(*args, **kw)
        return bool(entries)

    assert not entered(q, k, v, 2, "BNSD", scale=0.5)
    assert not entered(q, k, v, 2, "BNSD", keep_prob=0.9)      # small, on npu: C++ draws the seed
    assert entered(q.cpu(), k.cpu(), v.cpu(), 2, "BNSD", keep_prob=0.9)           # dropout on CPU tensors
    with _Counts():                                 # a dispatch mode (make_fx refuses the draw)
        assert entered(q, k, v, 2, "BNSD", keep_prob=0.9)
    monkeypatch.setattr(flash, "SMALL_ELEMENTS", 0)
    assert entered(q, k, v, 2, "BNSD", keep_prob=0.9)          # dropout over more than one block
    assert entered(q, k, v, 2, "BNSD", pse=torch.randn(1, 2, 6, 6).npu())
    assert entered(q, k, v, 2, "BNSD", atten_mask=torch.rand(6, 6).npu() > 0.5)    # a mask SDPA cannot express
    assert entered(q, k, v, 2, "BNSD", prefix=[1])
    # argument errors are the Python engine's, with its text
    entries.clear()
    with pytest.raises(RuntimeError, match="npu_fusion_attention"):
        torch_npu.npu_fusion_attention(q, k, v, 3, "BNSD")
    assert entries
    # FakeTensors (torch.compile's tracing) carry the Python key: the Python kernel
    from torch._subclasses.fake_tensor import FakeTensorMode
    mask = TEMPLATE.npu()
    entries.clear()
    with FakeTensorMode() as mode:
        fq, fk, fv, fm = (mode.from_tensor(t) for t in (q, k, v, mask))
        out, smax = torch_npu.npu_fusion_attention(fq, fk, fv, 2, "BNSD", atten_mask=fm, sparse_mode=2)[:2]
    assert entries
    assert out.shape == q.shape and smax.shape == (1, 2, 6, 8) and out.device.type == "npu"


def test_the_cpp_kernel_reads_the_patched_chunk_size(monkeypatch):
    # flash.CHUNK_ELEMENTS sets the row max's row blocks (one amax each); Python owns it and
    # the C++ kernel reads it at each call
    from torch_npu.op_plugin.attention import flash
    entries = _python_kernel_entries(monkeypatch)
    q, k, v = (torch.randn(1, 2, 40, 8).npu().requires_grad_() for _ in range(3))

    def row_blocks():
        ops = _Counts()
        with ops:
            out = torch_npu.npu_fusion_attention(q, k, v, 2, "BNSD", scale=0.3)[1]
        return ops.counts.get("aten.amax.default", 0), out

    whole, smax_whole = row_blocks()
    monkeypatch.setattr(flash, "CHUNK_ELEMENTS", 16 * 2 * 40)  # 16 rows of logits at a time
    blocks, smax_blocks = row_blocks()
    assert entries == [] and (whole, blocks) == (1, 3)
    torch.testing.assert_close(smax_blocks, smax_whole, rtol=0, atol=0)


class _Counts(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.counts = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.counts[str(func)] = self.counts.get(str(func), 0) + 1
        return func(*args, **(kwargs or {}))


def _bsnd(seed, n_kv=2, s=9):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(2, s, n, 8, generator=gen).npu().requires_grad_() for n in (4, n_kv, n_kv)]


def _attend(q, k, v, layout="BSND"):
    return torch_npu.npu_fusion_attention(q, k, v, 4, layout, atten_mask=TEMPLATE.npu(), scale=0.3, sparse_mode=3)


@pytest.mark.parametrize("device", ["cpu", "npu"])
@pytest.mark.parametrize("layout,n_kv", [("BSH", 4), ("SBH", 4), ("BSND", 2), ("BNSD", 1)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_one_node_path_is_bitwise_the_aten_op_path(device, layout, n_kv, dtype):
    # Plain calls run their forward without recording it (on npu: on CPU aliases, as one npu
    # kernel) and get one autograd node, NpuFusionAttentionBackward0 (the real op's name);
    # under a TorchDispatchMode (the stream sanitizer, tracing) the same ATen ops run with
    # autograd recording them, each seen by the mode. Same bits, forward and backward, also
    # when only some inputs require grad.
    gen = torch.Generator().manual_seed(0)
    q = _layout_tensor(layout, 2, 9, 4, 8, dtype, gen).detach().to(device)
    k, v = (_layout_tensor(layout, 2, 9, n_kv, 8, dtype, gen).detach().to(device) for _ in range(2))
    dy = torch.randn(q.shape, generator=gen).to(dtype).to(device)
    kw = dict(scale=0.3, atten_mask=TEMPLATE.to(device), sparse_mode=3)
    for wants_grad in ((q, k, v), (k,)):
        for t in (q, k, v):
            t.requires_grad_(any(t is w for w in wants_grad))
        got = torch_npu.npu_fusion_attention(q, k, v, 4, layout, **kw)
        assert got[0].grad_fn.name() == "NpuFusionAttentionBackward0"
        assert not got[1].requires_grad and not got[2].requires_grad
        got_grads = torch.autograd.grad(got[0], wants_grad, dy)
        ops = _Ops()
        with ops:
            want = torch_npu.npu_fusion_attention(q, k, v, 4, layout, **kw)
            want_grads = torch.autograd.grad(want[0], wants_grad, dy)
        assert FLASH in ops.names and FLASH_BWD in ops.names
        assert got[4:] == want[4:]
        for a, b in zip(got[:4] + got_grads, want[:4] + want_grads):
            assert a.device.type == device and a.dtype == b.dtype and a.shape == b.shape
            assert torch.equal(a.detach().cpu(), b.detach().cpu())


def _check_shared_kv_and_retain_graph(attend, q, k, v, dy, ref):
    """The same tensor as key and value (self-attention on one projection): gradients summed,
    bitwise as on the ATen-op path. retain_graph: a second backward gives the same gradients
    (``ref``); without it, the usual error."""
    kv = k.detach().clone().requires_grad_()
    with _Ops():
        want = torch.autograd.grad(attend(q, kv, kv)[0], (q, kv), dy)
    got = torch.autograd.grad(attend(q, kv, kv)[0], (q, kv), dy)
    assert all(torch.equal(a.cpu(), b.cpu()) for a, b in zip(got, want))
    out = attend(q, k, v)[0]
    first = torch.autograd.grad(out, (q, k, v), dy, retain_graph=True)
    second = torch.autograd.grad(out, (q, k, v), dy)
    assert all(torch.equal(a.cpu(), b.cpu()) and torch.equal(a.cpu(), r.cpu())
               for a, b, r in zip(first, second, ref))
    with pytest.raises(RuntimeError, match="Trying to backward through the graph a second time"):
        torch.autograd.grad(out, (q, k, v), dy)


def _dropout_call(q, k, v, layout, causal, seed=11):
    """npu_fusion_attention with dropout (keep_prob 0.8) after torch.npu.manual_seed(seed)."""
    torch.npu.manual_seed(seed)
    kw = dict(scale=0.3, keep_prob=0.8)
    if causal:
        kw.update(atten_mask=TEMPLATE.to(q.device), sparse_mode=2)
    return torch_npu.npu_fusion_attention(q, k, v, 4, layout, **kw)


@pytest.mark.parametrize("layout,n_kv", [("BSH", 4), ("SBH", 4), ("BSND", 2), ("BNSD", 1), ("BNSD", 4)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("causal", [False, True])
def test_one_node_dropout_path_is_bitwise_the_aten_op_path(layout, n_kv, dtype, causal):
    # A small call with dropout on npu tensors draws (seed, offset) in C++ and gets one node
    # whose backward is autograd's derivative of the forward's ATen ops, formula for formula;
    # under a TorchDispatchMode the Python kernel runs those ATen ops with autograd recording
    # them. Same keep mask, same bits forward and backward, also for partial requires_grad.
    gen = torch.Generator().manual_seed(3)
    q = _layout_tensor(layout, 2, 9, 4, 8, dtype, gen).detach()
    k, v = (_layout_tensor(layout, 2, 9, n_kv, 8, dtype, gen).detach() for _ in range(2))
    dy = torch.randn(q.shape, generator=gen).to(dtype).npu()
    for wants_grad in ((q, k, v), (v,), (q, k)):
        for t in (q, k, v):
            t.requires_grad_(any(t is w for w in wants_grad))
        got = _dropout_call(q, k, v, layout, causal)
        assert got[0].grad_fn.name() == "NpuFusionAttentionBackward0"
        got_grads = torch.autograd.grad(got[0], wants_grad, dy)
        got_state = torch.npu.get_rng_state()
        ops = _Ops()
        with ops:
            want = _dropout_call(q, k, v, layout, causal)
            want_grads = torch.autograd.grad(want[0], wants_grad, dy)
        assert "aten.bmm.default" in ops.names and "aten.exp.default" in ops.names
        assert got[4:] == want[4:] and got[4:6] == (11, 0)
        assert torch.equal(got_state, torch.npu.get_rng_state())
        for a, b in zip(got[:4] + got_grads, want[:4] + want_grads):
            assert a.device.type == "npu" and a.dtype == b.dtype and a.shape == b.shape
            assert torch.equal(a.detach().cpu(), b.detach().cpu())


def test_one_node_dropout_path_autograd_edges():
    q, k, v = _bsnd(6)
    dy = torch.randn(2, 9, 4, 8).npu()
    ref = torch.autograd.grad(_dropout_call(q, k, v, "BSND", True)[0], (q, k, v), dy)
    _check_shared_kv_and_retain_graph(lambda a, b, c: _dropout_call(a, b, c, "BSND", True), q, k, v, dy, ref)
    # create_graph: first-order gradients as usual; differentiating them raises (the real
    # op's backward, npu_fusion_attention_grad, has no derivative)
    dq = torch.autograd.grad(_dropout_call(q, k, v, "BSND", True)[0], q, dy, create_graph=True)[0]
    assert torch.equal(dq.detach().cpu(), ref[0].cpu()) and dq.requires_grad
    with pytest.raises(RuntimeError, match="derivative for npu::npu_fusion_attention_grad is not implemented"):
        dq.sum().backward()


def test_dropout_path_memory_is_npu_memory_freed_with_the_graph():
    # the forward's saved tensors (the logits' exp, the keep mask, the bmm operands) count as
    # npu memory while the graph lives, and are freed with it
    q, k, v = _bsnd(9)
    dy = torch.randn(2, 9, 4, 8).npu()
    torch.npu.synchronize()
    before = torch.npu.memory_allocated()
    for _ in range(2):
        out = _dropout_call(q, k, v, "BSND", True)[0]
        held = torch.npu.memory_allocated()
        grads = torch.autograd.grad(out, (q, k, v), dy)
        del out, grads
        assert held > before + 2 * 4 * 9 * 9 * 4 and torch.npu.memory_allocated() == before


@pytest.mark.parametrize("mode", [contextlib.nullcontext, _Ops])
def test_dropout_path_sees_in_place_changes_before_backward(mode):
    # BNSD float32: the first bmm reads q and k as views, and autograd keeps those views
    q, k, v = (t.detach().transpose(1, 2).contiguous().requires_grad_() for t in _bsnd(7, n_kv=4))
    with mode():
        out = _dropout_call(q, k, v, "BNSD", False)[0]
    with torch.no_grad():
        q.mul_(2)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.sum().backward()


def test_dropout_path_under_checkpoint():
    # checkpoint restores the npu generator before recomputing, so the recomputed forward
    # draws the same (seed, offset) and keep mask
    from torch.utils.checkpoint import checkpoint
    q, k, v = _bsnd(8)
    dy = torch.randn(2, 9, 4, 8).npu()
    want = torch.autograd.grad(_dropout_call(q, k, v, "BSND", True)[0], (q, k, v), dy)
    for reentrant in (False, True):
        for t in (q, k, v):
            t.grad = None
        torch.npu.manual_seed(11)
        out = checkpoint(lambda a, b, c: torch_npu.npu_fusion_attention(
            a, b, c, 4, "BSND", atten_mask=TEMPLATE.npu(), sparse_mode=2, scale=0.3, keep_prob=0.8)[0],
            q, k, v, use_reentrant=reentrant)
        out.backward(dy)
        assert all(torch.equal(t.grad.cpu(), b.cpu()) for t, b in zip((q, k, v), want))


def test_npu_fast_path_autograd_edges():
    q, k, v = _bsnd(2)
    dy = torch.randn(2, 9, 4, 8).npu()
    ref = torch.autograd.grad(_attend(q, k, v)[0], (q, k, v), dy)
    _check_shared_kv_and_retain_graph(_attend, q, k, v, dy, ref)
    # create_graph: first-order gradients as usual; differentiating them raises, as on the
    # ATen-op path (the CPU flash kernel's backward has no derivative)
    for mode in (contextlib.nullcontext, _Ops):
        with mode():
            dq = torch.autograd.grad(_attend(q, k, v)[0], q, dy, create_graph=True)[0]
        assert torch.equal(dq.detach().cpu(), ref[0].cpu()) and dq.requires_grad
        with pytest.raises(RuntimeError, match="derivative for aten::_scaled_dot_product_flash_attention_for_cpu_"
                                               "backward is not implemented"):
            dq.sum().backward()


@pytest.mark.parametrize("device", ["cpu", "npu"])
@pytest.mark.parametrize("mode", [contextlib.nullcontext, _Ops])
def test_fast_path_sees_in_place_changes_before_backward(device, mode):
    # BNSD: the result is the flash kernel's own output, which its backward reads; so are q,
    # k and v (float32: as views)
    for changed in ("out", "q"):
        q, k, v = (t.detach().to(device).transpose(1, 2).contiguous().requires_grad_() for t in _bsnd(3))
        with mode():
            out = torch_npu.npu_fusion_attention(q, k, v, 4, "BNSD", scale=0.3)[0]
        with torch.no_grad():
            (out if changed == "out" else q).mul_(2)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            out.sum().backward()


def test_npu_fast_path_under_checkpoint():
    from torch.utils.checkpoint import checkpoint
    q, k, v = _bsnd(4)
    dy = torch.randn(2, 9, 4, 8).npu()
    want = torch.autograd.grad(_attend(q, k, v)[0], (q, k, v), dy)
    for reentrant in (False, True):
        for t in (q, k, v):
            t.grad = None
        out = checkpoint(lambda a, b, c: _attend(a, b, c)[0], q, k, v, use_reentrant=reentrant)
        out.backward(dy)
        assert all(torch.equal(t.grad.cpu(), b.cpu()) for t, b in zip((q, k, v), want))


@pytest.mark.parametrize("device", ["cpu", "npu"])
def test_statistics_loops_give_the_aten_ops_bits(monkeypatch, device):
    # Without a TorchDispatchMode, softmax_max / softmax_sum are written by direct loops over
    # the logits (aten/FusionAttentionSdpa.cpp); under one, by ATen ops (every op seen). Same
    # bits: several row blocks, a nonpositive scale, a zero-logit row (its max is +0), a NaN.
    from torch_npu.op_plugin.attention import flash
    monkeypatch.setattr(flash, "CHUNK_ELEMENTS", 16 * 2 * 4 * 40)  # 16-row blocks
    gen = torch.Generator().manual_seed(7)
    q = torch.randn(2, 40, 4, 8, generator=gen)
    k, v = (torch.randn(2, 40, 2, 8, generator=gen) for _ in range(2))
    q[0, 3] = 0.0         # every logit of these rows is 0
    k[1, :, 1] = -k[1, :, 1].abs()
    q[1, 5, 2] = 0.0
    k[1, 30, 0, 1] = float("nan")   # rows >= 30 of key head 0 (causal), all rows otherwise
    q, k, v = (t.to(device) for t in (q, k, v))
    for kw in (dict(scale=0.3, atten_mask=TEMPLATE.to(device), sparse_mode=2), dict(scale=-0.4), dict(scale=0.0)):
        got = torch_npu.npu_fusion_attention(q, k, v, 4, "BSND", **kw)[1:3]
        with _Ops():
            want = torch_npu.npu_fusion_attention(q, k, v, 4, "BSND", **kw)[1:3]
        for a, b in zip(got, want):
            a, b = a.cpu(), b.cpu()
            assert a.isnan().any() and torch.equal(a.isnan(), b.isnan())
            torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)
            assert torch.equal(a.signbit(), b.signbit())
        smax = got[0].cpu()
        assert smax[0, :, 3].eq(0).all() and not smax[0, :, 3].signbit().any()
        if "atten_mask" in kw:  # the NaN key is masked for rows before it
            assert not smax[1, :2, :30].isnan().any() and smax[1, :2, 30:].isnan().all()
    # the loops run (no amax, no expand copies) when nothing observes the ops
    from torch.profiler import profile
    with profile() as prof:
        torch_npu.npu_fusion_attention(q, k, v, 4, "BSND", scale=0.3)
    names = {e.key for e in prof.key_averages()}
    assert "aten::_scaled_dot_product_flash_attention_for_cpu" in names and "aten::amax" not in names


@pytest.mark.parametrize("device", ["cpu", "npu"])
def test_forward_mode_ad_takes_the_aten_op_path(device):
    # A dual input (forward-mode AD) is not taken by the one-node path, which would drop the
    # tangent: the ATen-op path runs and raises the flash kernel's own error, as it did before.
    import torch.autograd.forward_ad as fwAD
    q, k, v = (t.detach().to(device) for t in _bsnd(5))
    with fwAD.dual_level():
        dual = fwAD.make_dual(q, torch.ones_like(q))
        with pytest.raises(RuntimeError, match="_scaled_dot_product_flash_attention_for_cpu"):
            torch_npu.npu_fusion_attention(dual, k, v, 4, "BSND", scale=0.3)
