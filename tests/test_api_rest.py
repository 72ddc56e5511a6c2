"""The rest of the public surface (issue 8): HiFloat8Tensor, NPUGraph task groups / update / handlers,
super-kernel scopes, torch_npu.npu.npugraph_ex, torch_npu.jit, torch_npu.multiprocessing, the opinfo sample
generators, torch_npu.utils.profiler. Each against an independent reference: formulas written here, the CPU
computation, the real error texts."""
import io
import math
import pickle
import subprocess
import sys
import textwrap
from multiprocessing.reduction import ForkingPickler

import pytest
import torch

import torch_npu
import torch_npu.jit
from torch_npu.npu import npugraph_ex
from torch_npu.npu._npugraph_handlers import npugraph_handler
from torch_npu.testing.testcase import TestCase
from torch_npu.utils import profiler as legacy_profiler

H8 = torch_npu.HiFloat8Tensor


# ---------------------------------------------------------------- HiFloat8
def _hif8_value_from_paper(code):
    """Value of a HiF8 code, from the white paper's field layout, computed independently of the codec:
    after the sign bit, the dot prefix gives the exponent width D (11:4, 10:3, 01:2, 001:1, 0001:0, 0000:
    denormal); exponent = sign-magnitude with an implicit leading 1; the rest is the mantissa."""
    if code == 0x80:
        return math.nan
    sign = -1.0 if code & 0x80 else 1.0
    bits = format(code & 0x7F, "07b")
    for prefix, width in (("11", 4), ("10", 3), ("01", 2), ("001", 1), ("0001", 0)):
        if bits.startswith(prefix):
            rest = bits[len(prefix):]
            exp_field, mant = rest[:width], rest[width:]
            if width == 0:
                exponent = 0
            else:
                magnitude = int("1" + exp_field[1:], 2)
                exponent = -magnitude if exp_field[0] == "1" else magnitude
            if width == 4 and exponent == 15 and mant == "1":
                return sign * math.inf
            return sign * 2.0 ** exponent * (1 + int(mant, 2) / 2 ** len(mant))
    m = int(bits[4:], 2)                           # "0000" + 3 bits: denormal 2**(m-23)
    return 0.0 if m == 0 else sign * 2.0 ** (m - 23)


ALL_CODES = torch.arange(256, dtype=torch.uint8)
PAPER_VALUES = torch.tensor([_hif8_value_from_paper(c) for c in range(256)], dtype=torch.float64)


def test_hif8_decode_matches_the_paper_layout_for_all_256_codes():
    h = H8(data=ALL_CODES.clone())
    got = h.float().cpu().double()
    assert torch.equal(torch.isnan(got), torch.isnan(PAPER_VALUES))
    finite = ~torch.isnan(PAPER_VALUES)
    assert torch.equal(got[finite], PAPER_VALUES[finite])
    # anchors quoted in the format's description
    assert got[0x00] == 0 and got[0x08] == 1.0 and got[0x6E] == 32768.0 and got[0x6F] == math.inf
    assert got[0xEF] == -math.inf and got[0x01] == 2.0 ** -22 and math.isnan(got[0x80])


def test_hif8_value_set_has_the_papers_tapered_precision():
    """7 binades with 3 mantissa bits (|E|<=3), 8 with 2 bits (4..7), 16 with 1 bit (8..15), 7 denormal
    binades: 38 binades from 2**-22 to 2**15."""
    pos = PAPER_VALUES[(PAPER_VALUES > 0) & torch.isfinite(PAPER_VALUES)]
    assert pos.numel() == 126 and pos.unique().numel() == 126
    per_binade = torch.bincount((torch.log2(pos).floor() + 22).long())
    assert per_binade.numel() == 38
    for e in range(-22, 16):
        n = int(per_binade[e + 22])
        if e < -15:
            assert n == 1
        elif abs(e) <= 3:
            assert n == 8
        elif abs(e) <= 7:
            assert n == 4
        else:
            assert n == (1 if e == 15 else 2), e   # the 1.5 * 2**15 slot is Inf


def _nearest_ties_away(x):
    """Brute force: the finite HiF8 value nearest x; a tie goes to the larger magnitude; beyond the
    midpoint between 2**15 and the Inf slot (1.5 * 2**15) -> Inf."""
    finite_vals = PAPER_VALUES[torch.isfinite(PAPER_VALUES)]
    out = []
    for v in x.tolist():
        if math.isnan(v):
            out.append(math.nan)
            continue
        if abs(v) >= 40960.0:
            out.append(math.copysign(math.inf, v))
            continue
        dist = (finite_vals - v).abs()
        best = dist.min()
        candidates = finite_vals[dist == best]
        out.append(float(candidates[candidates.abs().argmax()]))
    return torch.tensor(out, dtype=torch.float64)


def test_hif8_encode_rounds_to_nearest_ties_away_from_zero():
    g = torch.Generator().manual_seed(0)
    scale = torch.exp2(torch.randint(-26, 18, (1500,), generator=g).double())
    x = (torch.randn(1500, generator=g, dtype=torch.float64) * scale).float()
    specials = torch.tensor([0.0, -0.0, math.nan, math.inf, -math.inf, 40960.0, 40959.996, 2.0 ** -23,
                             -(2.0 ** -23), 2.0 ** -24, 1.0625, 18.0, -18.0, 1e30, 32768.0, 3 * 2.0 ** -23])
    x = torch.cat([x, specials])
    got = H8.to_hifloat8(x.npu()).float().cpu().double()
    want = _nearest_ties_away(x.double())
    assert torch.equal(torch.isnan(got), torch.isnan(want))
    ok = ~torch.isnan(want)
    assert torch.equal(got[ok], want[ok])
    # ties: 1.0625 is between 1.0 and 1.125; 18 between 16 and 20; 2**-23 between 0 and 2**-22
    assert got[-6].item() == 1.125 and got[-5].item() == 20.0 and got[-9].item() == 2.0 ** -22


def test_hif8_encode_from_16_bit_inputs_keeps_the_nominal_dtype():
    x = torch.tensor([0.3, -7.1, 1000.0, 5e-5])
    for dtype in (torch.float16, torch.bfloat16):
        h = H8.to_hifloat8(x.to(dtype).npu())
        assert h.dtype == dtype and h._data.dtype == torch.uint8 and h.device.type == "npu"
        want = _nearest_ties_away(x.to(dtype).double())
        assert torch.equal(h.float().cpu().double(), want)
    assert H8.to_hifloat8(torch.tensor([3, 5], device="npu")).dtype == torch.float32  # ints: float32


def test_hif8_tensor_views_stay_hif8_and_share_codes():
    x = torch.arange(-6, 6, dtype=torch.float32, device="npu").reshape(3, 4) / 4
    h = H8.to_hifloat8(x)
    v = h.view(4, 3)
    assert isinstance(v, H8) and v.shape == (4, 3) and v._data.data_ptr() == h._data.data_ptr()
    assert torch.equal(v.float(), h.float().view(4, 3))
    t = h.transpose(0, 1)
    assert isinstance(t, H8) and torch.equal(t.float(), h.float().t())
    c = t.contiguous()
    assert c._data.is_contiguous() and torch.equal(c.float(), h.float().t())
    assert h.contiguous() is h
    r = h.reshape(-1)
    assert isinstance(r, H8) and torch.equal(r.float(), h.float().reshape(-1))
    s = h[1:, 2]
    assert isinstance(s, H8) and torch.equal(s.float(), h.float()[1:, 2])
    d = h.to_dtype(torch.bfloat16)
    assert d.dtype == torch.bfloat16 and d._data is h._data
    assert d.from_hifloat8().dtype == torch.bfloat16 and h.half().dtype == torch.float16
    k = h.clone()
    assert k._data.data_ptr() != h._data.data_ptr() and torch.equal(k._data, h._data)
    assert h.cpu().device.type == "cpu" and torch.equal(h.cpu(), h.float().cpu())
    assert repr(h).startswith("HiFloat8Tensor(data=tensor(")


def test_hif8_ops_compute_on_decoded_values_and_inplace_reencodes():
    x = torch.tensor([[1.3, -2.2], [0.07, 300.0]], device="npu")
    h = H8.to_hifloat8(x)
    dec = h.float()
    out = h * 3 + 1
    assert type(out) is torch.Tensor and torch.equal(out, dec * 3 + 1)
    assert torch.equal(torch.matmul(h, torch.eye(2, device="npu")), dec @ torch.eye(2, device="npu"))
    h.mul_(3)
    assert isinstance(h, H8) and torch.equal(h.float(), H8.to_hifloat8(dec * 3).float())
    y = torch.empty(2, 2, device="npu")
    y.copy_(h)
    assert torch.equal(y, h.float())
    z = H8(data=torch.zeros(2, 2, dtype=torch.uint8))
    z.copy_(x)
    assert torch.equal(z._data, H8.to_hifloat8(x)._data)


def test_hif8_autograd_is_straight_through():
    a = torch.randn(5, device="npu", requires_grad=True)
    H8.to_hifloat8(a).from_hifloat8().mul(torch.arange(5.0, device="npu")).sum().backward()
    assert torch.equal(a.grad, torch.arange(5.0, device="npu"))


def test_hif8_constructor_checks():
    with pytest.raises(ValueError, match=r"requires data buffer with 8-bit dtype \(got dtype=torch.float32\)"):
        H8(data=torch.zeros(3))
    with pytest.raises(ValueError, match="requires non-differentiable data buffer"):
        H8(data=torch.zeros(3, dtype=torch.float8_e4m3fn, requires_grad=True))
    h = H8(data=torch.tensor([8, 16], dtype=torch.uint8), dtype=torch.float16)
    assert h.device.type == "npu" and h.dtype == torch.float16 and h.float().tolist() == [1.0, 2.0]
    assert H8.make_like(h, data=torch.tensor([24], dtype=torch.uint8).npu()).dtype == torch.float16


def test_hif8_matches_en_dtypes_when_available():
    """Cross-check with an independent HiF8 implementation (en_dtypes, numpy) if it is installed."""
    en_dtypes = pytest.importorskip("en_dtypes")
    import numpy as np
    g = torch.Generator().manual_seed(1)
    x = torch.randn(20000, generator=g) * torch.exp2(torch.randint(-28, 18, (20000,), generator=g).float())
    ref = x.numpy().astype(en_dtypes.hifloat8).view(np.uint8)
    assert np.array_equal(H8.to_hifloat8(x.npu())._data.cpu().numpy(), ref)


# ---------------------------------------------------------------- NPUGraph task groups and update
def test_task_group_update_replaces_the_groups_ops_for_replay():
    x = torch.randn(6, device="npu")
    y = torch.randn(6, device="npu")
    g = torch.npu.NPUGraph()
    with torch.npu.graph(g):
        stream = torch.npu.current_stream()
        a = x * 2
        torch.npu.graph_task_group_begin(stream)
        b = torch.add(a, y, alpha=1.0)
        handle = torch.npu.graph_task_group_end(stream)
        c = b.relu()
    x.copy_(torch.randn(6))
    g.replay()
    assert torch.equal(c, torch.add(x * 2, y, alpha=1.0).relu())
    update_stream = torch.npu.Stream()
    with torch.npu.stream(update_stream):
        torch.npu.graph_task_update_begin(update_stream, handle)
        torch.add(a, y, alpha=3.0)
        torch.npu.graph_task_update_end(update_stream)
    x.copy_(torch.randn(6))
    g.replay()
    assert torch.equal(c, torch.add(x * 2, y, alpha=3.0).relu())
    assert g.replay_ops() == ["aten::mul.Tensor", "aten::add.Tensor", "aten::relu"]


def test_task_group_errors():
    s = torch.npu.Stream()
    with pytest.raises(RuntimeError, match="not capturing"):
        torch.npu.graph_task_group_begin(s)
    g = torch.npu.NPUGraph()
    x = torch.ones(3, device="npu")
    with torch.npu.graph(g):
        st = torch.npu.current_stream()
        torch.npu.graph_task_group_begin(st)
        y = x + 1
        h = torch.npu.graph_task_group_end(st)
    with pytest.raises(TypeError, match="graph_task_group_end"):
        torch.npu.graph_task_update_begin(s, object())
    torch.npu.graph_task_update_begin(s, h)
    x * 5 + 1                                    # two ops where the group had one
    with pytest.raises(RuntimeError, match="issued 2 ops, the task group captured 1"):
        torch.npu.graph_task_update_end(s)
    g.replay()
    assert torch.equal(y, x + 1)                 # the failed update left the graph as captured
    with pytest.raises(RuntimeError, match="no task update was begun"):
        torch.npu.graph_task_update_end(s)


class _AlphaOtherHandler(torch.npu.NpuGraphOpHandler):
    _OP_ARG_SPECS = {"add.Tensor": {"other": 1}}

    @classmethod
    def update_args(cls, dispatch_record, update_input):
        if "other" in update_input:
            dispatch_record.args[cls.get_update_specs("add.Tensor")["other"]] = update_input["other"]


@pytest.fixture
def add_handler():
    torch.npu.register_npu_graph_handler(["add.Tensor"])(_AlphaOtherHandler)
    yield _AlphaOtherHandler
    npugraph_handler._NPU_GRAPH_OP_HANDLERS.pop("add.Tensor", None)


def test_auto_dispatch_capture_update_changes_kwargs_and_args(add_handler):
    x, y, z = (torch.randn(5, device="npu") for _ in range(3))
    g = torch.npu.NPUGraph()
    with torch.npu.graph(g, auto_dispatch_capture=True):
        out = torch.add(x, y, alpha=2.0).mul(3)
        out2 = torch.add(out, x)
    assert len(g._dispatch_records) == 2
    g.update([{"alpha": 5.0}])                   # one dict: applies to both records
    g.replay()
    first = torch.add(x, y, alpha=5.0).mul(3)
    assert torch.equal(out, first) and torch.equal(out2, torch.add(first, x, alpha=5.0))
    g.update([{"other": z}, {}])                 # per record: positional arg through the handler
    g.replay()
    first = torch.add(x, z, alpha=5.0).mul(3)
    assert torch.equal(out, first) and torch.equal(out2, torch.add(first, x, alpha=5.0))
    with pytest.raises(RuntimeError, match="there are 2 operators that need to be updated by capture, and there "
                                           "are only 3 elements"):
        g.update([{}, {}, {}])


def test_update_requires_auto_dispatch_capture():
    g = torch.npu.NPUGraph()
    with torch.npu.graph(g):
        torch.ones(2, device="npu") + 1
    with pytest.raises(RuntimeError, match="The current graph configuration does not support update,Try to capture "
                                           "by setting auto_dispatch_capture=True during capture"):
        g.update([{}])


def test_handler_hooks_prepare_and_postprocess():
    calls = []

    @torch.npu.register_npu_graph_handler("sub.Tensor")
    class SubToMul(torch.npu.NpuGraphOpHandler):
        @classmethod
        def prepare_capture(cls, func, args, kwargs):
            calls.append("prepare")
            return torch.ops.aten.mul.Tensor, args, {}

        @classmethod
        def postprocess_result(cls, result, kwargs):
            calls.append("post")
            return result + 100

    try:
        a, b = torch.full((3,), 2.0, device="npu"), torch.full((3,), 5.0, device="npu")
        g = torch.npu.NPUGraph()
        with torch.npu.graph(g, auto_dispatch_capture=True):
            r = a - b
        assert calls == ["prepare", "post"] and torch.equal(r, torch.full((3,), 110.0, device="npu"))
        assert g.replay_ops() == ["aten::mul.Tensor"]
    finally:
        npugraph_handler._NPU_GRAPH_OP_HANDLERS.pop("sub.Tensor", None)
    kept = torch.npu.NpuGraphOpHandler.record_wrap_kwarg("out", [a, b], ["out"])
    assert kept == [a, b] and torch.npu.NpuGraphOpHandler.get_update_specs("x") is None


def test_super_kernel_optimize_and_scopes():
    g = torch.npu.NPUGraph()
    with pytest.raises(RuntimeError, match="without a preceding successful capture"):
        g.super_kernel_optimize()
    x = torch.randn(4, device="npu")
    with torch.npu.graph(g):
        torch.npu.super_kernel_scope_begin("blk")
        y = x.sin() * 2
        torch.npu.super_kernel_scope_end("blk")
    g.super_kernel_optimize({"opt": 1})
    assert g.super_kernel_options == ({"opt": 1}, {})
    with pytest.raises(TypeError, match="optimize_options must be a dict"):
        g.super_kernel_optimize("x")
    x.copy_(torch.randn(4))
    g.replay()
    assert torch.equal(y, x.sin() * 2)
    with pytest.raises(TypeError, match="scope_name must be a str"):
        torch.npu.super_kernel_scope_begin(3)


# ---------------------------------------------------------------- npugraph_ex
def test_npugraph_ex_compile_fx_and_replacement():
    import torch._dynamo
    from torch_npu.npu.npugraph_ex import _replacements

    def fn(x):
        return torch.sin(x) * 2 + 1

    x = torch.randn(16, device="npu")
    compiled = torch.compile(fn, backend=lambda gm, inputs: npugraph_ex.compile_fx(gm, inputs, {"a": 1}))
    out = compiled(x)
    assert out.device.type == "npu" and torch.allclose(out, fn(x), atol=1e-6)
    torch._dynamo.reset()
    # A deliberately non-equivalent pattern proves the rewrite runs: sin(x) * 2 -> cos(x) * 2.
    saved = dict(_replacements._state)
    try:
        npugraph_ex.register_replacement(lambda a: torch.sin(a) * 2, lambda a: torch.cos(a) * 2, [torch.randn(4)])
        compiled = torch.compile(fn, backend=lambda gm, inputs: npugraph_ex.compile_fx(gm, inputs))
        assert torch.allclose(compiled(x), torch.cos(x) * 2 + 1, atol=1e-6)
    finally:
        _replacements._state.update(saved)
        torch._dynamo.reset()
    with pytest.raises(TypeError, match="options must be a dict"):
        npugraph_ex.compile_fx(torch.fx.symbolic_trace(torch.nn.ReLU()), [x], options=3)


def test_npugraph_ex_cache_compile_and_readable_cache(tmp_path, capsys):
    import torch._dynamo

    def scale(x):
        return x * 3 - 1

    compiled = npugraph_ex.inference.cache_compile(scale, cache_dir=str(tmp_path), global_rank=0)
    x = torch.randn(5, device="npu")
    assert torch.equal(compiled(x), scale(x))
    text = npugraph_ex.inference.readable_cache(compiled.cache_bin, file=str(tmp_path / "copy.txt"))
    assert "def forward" in text and "* 3" in text and text in capsys.readouterr().out
    assert (tmp_path / "copy.txt").read_text() == text
    assert compiled.cache_bin.startswith(str(tmp_path))
    with pytest.raises(FileNotFoundError):
        npugraph_ex.inference.readable_cache(str(tmp_path / "missing.bin"))
    torch._dynamo.reset()


def test_npugraph_ex_scopes():
    from torch_npu.npu.npugraph_ex import scope
    x = torch.randn(3, device="npu")
    with scope.limit_core_num(8, 16):
        with scope.deterministic(1):
            assert scope.current() == [("limit_core_num", (8, 16, None)), ("deterministic", (1,))]
            y = x * 2
    assert scope.current() == [] and torch.equal(y, x * 2)
    with pytest.raises(ValueError, match="op_aicore_num"):
        scope.limit_core_num(-1, 2)
    with pytest.raises(ValueError, match="level must be 0, 1 or 2"):
        scope.deterministic(5)


# ---------------------------------------------------------------- torch_npu.jit
class _GeluNet(torch.nn.Module):
    def forward(self, x):
        return torch.nn.functional.gelu(x) * 2 + torch.nn.functional.gelu(x, approximate="tanh")


def test_jit_optimize_rewrites_exact_gelu_to_fast_gelu():
    x = torch.randn(64, device="npu")
    # The rewrite must come before the module's first run (the executor keeps its first plan): trace without
    # the check run.
    for mod in (torch.jit.script(_GeluNet()), torch.jit.trace(_GeluNet(), torch.randn(4), check_trace=False)):
        torch_npu.jit.optimize(mod)
        graph = str(mod.graph)
        assert graph.count("npu::fast_gelu") == 1 and graph.count("aten::gelu") == 1  # tanh gelu kept
        want = torch_npu.fast_gelu(x) * 2 + torch.nn.functional.gelu(x, approximate="tanh")
        assert torch.allclose(mod(x), want, atol=1e-6)


def test_jit_fusion_pass_module_path():
    from torch_npu.jit.fusion_pass.fast_gelu import fast_gelu_pass
    from torch_npu.jit.register_fusion_pattern import optimize
    assert optimize is torch_npu.jit.optimize
    mod = torch.jit.script(_GeluNet())
    fast_gelu_pass(mod)
    assert "npu::fast_gelu" in str(mod.graph)


# ---------------------------------------------------------------- multiprocessing
def _roundtrip(obj):
    buf = io.BytesIO()
    ForkingPickler(buf).dump(obj)
    return pickle.loads(buf.getvalue())


def test_npu_tensor_pickles_through_forking_pickler():
    base = torch.arange(24, dtype=torch.float16, device="npu").view(4, 6)
    view = base.t()[2:]
    got = _roundtrip(view)
    assert got.device == view.device and got.dtype == torch.float16
    assert got.stride() == view.stride() and got.storage_offset() == view.storage_offset()
    assert torch.equal(got.cpu(), view.cpu())
    got.fill_(0)                                  # shared memory: the write lands in the sender's tensor
    assert base.t()[2:].abs().sum() == 0 and base[:, :2].abs().sum() > 0
    p = torch.nn.Parameter(torch.randn(3, device="npu"))
    q = _roundtrip(p)
    assert isinstance(q, torch.nn.Parameter) and q.requires_grad and torch.equal(q, p)
    with pytest.raises(RuntimeError, match="Cowardly refusing to serialize non-leaf tensor"):
        _roundtrip(p * 2)
    ev = _roundtrip(torch.npu.Event())
    assert isinstance(ev, torch.npu.Event) and ev.query()
    cpu = torch.arange(3.0)
    assert torch.equal(_roundtrip(cpu), cpu)     # CPU tensors still go through torch's reductions


def test_npu_tensor_crosses_a_spawned_process(tmp_path):
    script = tmp_path / "spawn_child.py"
    script.write_text(textwrap.dedent("""
        import torch, torch_npu
        import torch.multiprocessing as mp

        def child(q_in, q_out):
            t = q_in.get()
            q_out.put((str(t.device), (t * 2).cpu()))
            # a tensor put on a queue travels as a file descriptor that its sender serves:
            # stay alive until the parent has it (torch.multiprocessing's rule)
            q_in.get(timeout=120)

        if __name__ == "__main__":
            ctx = mp.get_context("spawn")
            q_in, q_out = ctx.Queue(), ctx.Queue()
            proc = ctx.Process(target=child, args=(q_in, q_out))
            proc.start()
            q_in.put(torch.arange(5.0, device="npu"))
            device, doubled = q_out.get(timeout=120)
            q_in.put("received")
            proc.join(60)
            print(device, doubled.tolist(), proc.exitcode)
    """))
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=180)
    assert result.stdout.strip().splitlines()[-1:] == ["npu:0 [0.0, 2.0, 4.0, 6.0, 8.0] 0"], result.stderr[-2000:]


# ---------------------------------------------------------------- opinfo samples
def test_opinfo_sample_generators():
    from torch.testing._internal.common_methods_invocations import op_db
    from torch_npu.testing import common_methods_invocations as cmi
    normal = next(o for o in op_db if o.name == "normal")
    samples = list(cmi.sample_inputs_normal_tensor_second(normal, "npu", torch.float32, False))
    assert [tuple(s.input.shape) for s in samples] == [(3, 4), (3, 55), (5, 6, 7, 8)]
    assert samples[0].args[0] == 0.3 and samples[1].args[0] == 0 and tuple(samples[2].args[0].shape) == (5, 6, 7, 8)
    assert all(s.input.device.type == "npu" and (s.input >= 0).all() for s in samples)
    median = next(o for o in op_db if o.name == "median")
    custom = list(cmi.sample_inputs_median_custom(median, "npu", torch.float32, False))
    assert [tuple(s.input.shape) for s in custom[:2]] == [(2, 0), (0, 2)]
    from torch.testing._internal.common_methods_invocations import sample_inputs_reduction
    assert len(custom) == 2 + len(list(sample_inputs_reduction(median, "npu", torch.float32, False)))
    ran = 0
    for s in custom[2:]:                          # the samples median takes run on npu as on CPU
        dim = s.kwargs.get("dim")
        if isinstance(dim, (tuple, list)) or "dtype" in s.kwargs:
            continue
        got = torch.median(s.input, *s.args, **s.kwargs)
        want = torch.median(s.input.cpu(), *s.args, **s.kwargs)
        got, want = (got, want) if isinstance(got, torch.Tensor) else (got[0], want[0])
        assert torch.equal(got.cpu(), want)
        ran += 1
    assert ran >= 5


# ---------------------------------------------------------------- utils.profiler (legacy)
def test_legacy_profile_singleton_and_torch_trace(tmp_path):
    assert legacy_profiler.Profile() is legacy_profiler.Profile(start_step=3)   # one per process
    make = legacy_profiler.Singleton(legacy_profiler._Profile)                  # a fresh singleton
    prof = make(start_step=2, save_path=str(tmp_path), profile_type="TORCH", record_shapes=True)
    assert make() is prof
    with pytest.raises(ValueError, match="start interface must be called after end"):
        prof.end()
    x = torch.randn(8, 8, device="npu")
    prof.start()
    with pytest.raises(ValueError, match="start interface can only be called once"):
        prof.start()
    prof.end()
    prof.start()                                                                # step 2: profiled
    x @ x
    with pytest.raises(SystemExit):
        prof.end()
    traces = list(tmp_path.glob("torch_prof_*.json"))
    assert len(traces) == 1 and "aten::mm" in traces[0].read_text()
    with pytest.raises(ValueError, match="invaild, expect args"):
        legacy_profiler._Profile(profile_type="CANN", save_path=str(tmp_path), record_shapes=True)
    off = legacy_profiler._Profile(profile_type=None)
    off.start()
    off.end()
    assert off.enable is False


# ---------------------------------------------------------------- torch_npu.testing harness use
class TestHarnessOnRest(TestCase):
    def test_hif8_roundtrip_rtol(self):
        x = torch.rand(64, device="npu") + 0.5          # [0.5, 1.5): 3 mantissa bits, step <= 1/8
        self.assertRtolEqual(H8.to_hifloat8(x).float().cpu(), x.cpu(), prec=1.0 / 16)
