"""Quantisation ops: npu_group_quant, npu_gelu_quant, npu_anti_mx_quant, npu_quant_max
(torch_npu/op_plugin/quant/) and the meta-only quantisation ops (quant/meta_only.py).

Emulated ops are checked against references written here from the documented formulas
(plain torch in float64 on CPU);
Meta-only ops are checked for the documented output shapes/dtypes under FakeTensorMode and
for the NotImplementedError a real call still raises.
"""
import math

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import torch_npu
from torch_npu.op_plugin._registry import NOT_EMULATED, not_emulated_message

from _op_helpers import (
    DEVICES, assert_int8_close as _assert_int8_close, close_as_expected as _close, int8_ref as _q8_ref,
    randn_dims as _rand)


# ------------------------------------------------------------------ AddLayerNorm


# ------------------------------------------------------------------ DeepNorm


# ------------------------------------------------------------------ RmsNorm variants


# ------------------------------------------------------------------ npu_layernorm_grad


# ------------------------------------------------------------------ FakeTensor shapes


# ------------------------------------------------------------------ RmsNorm + int8 quant (emulated)


# ------------------------------------------------------------------ npu_group_quant / npu_gelu_quant


def test_group_quant_documented_example():
    """The example of torch_npu-npu_group_quant.md (inputs and printed int8 result)."""
    x = torch.tensor([[1.0029, -1.2373, 1.0107, -0.2681], [0.5791, 0.1101, 1.0059, -0.9658],
                      [-1.7637, 1.7588, -1.3193, 0.3989], [1.3262, 0.4854, 1.9551, 0.9697],
                      [-0.8770, -1.8828, 2.1777, -0.0050], [0.4722, 0.5605, 0.8267, -0.9810]]).half()
    scale = torch.tensor([[-0.2710, -0.9381, 0.2850, -1.1230], [0.5217, -0.7233, -0.1730, -0.1245],
                          [-1.5433, -0.9129, -2.2095, 1.7371], [-0.8253, 0.3973, 0.1430, 0.3885]])
    group_index = torch.tensor([1, 4, 6, 6], dtype=torch.int32)
    expected = torch.tensor([[-1, 0, -1, -1], [-1, -1, -1, -1], [-2, -2, -1, -1],
                             [0, -2, -2, -1], [0, 1, -6, -1], [-2, -2, -3, -3]], dtype=torch.int8)
    y = torch_npu.npu_group_quant(x.npu(), scale.npu(), group_index.npu(), offset=torch.tensor([-1.1658]).npu(),
                                  dst_dtype=torch.qint8)
    assert y.device.type == "npu" and torch.equal(y.cpu(), expected)


@pytest.mark.parametrize("device", DEVICES)
def test_group_quant_formula(device):
    x = _rand(9, 12, seed=110).to(torch.bfloat16)
    scale = _rand(4, 12, seed=111).float() * 60
    group_index = torch.tensor([2, 2, 7, 9], dtype=torch.int64)     # group 1 is empty
    y = torch_npu.npu_group_quant(x.to(device), scale.to(device), group_index.to(device))
    ref = torch.empty(9, 12, dtype=torch.float64)
    start = 0
    for g, end in enumerate(group_index.tolist()):                    # rows [start, end) use scale[g]
        for r in range(start, end):
            ref[r] = x[r].double() * scale[g].double()
        start = end
    _assert_int8_close(y, _q8_ref(ref))
    assert float(ref.abs().max()) > 128                               # saturation exercised
    with pytest.raises(NotImplementedError, match="dst_dtype"):
        torch_npu.npu_group_quant(x.to(device), scale.to(device), group_index.to(device), dst_dtype=torch.quint4x2)
    with pytest.raises(RuntimeError, match="group_index must be 1-D of length 4"):
        torch_npu.npu_group_quant(x.to(device), scale.to(device), group_index[:3].to(device))


def _gelu_ref(x, approximate):
    if approximate == "tanh":
        return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
    return 0.5 * x * (1 + torch.erf(x / math.sqrt(2)))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_quant(device, approximate):
    x = (_rand(3, 4, 40, seed=120) * 2).half()
    s, o = (_rand(40, seed=121).abs() * 20 + 1).half(), _rand(40, seed=122).round().half()
    d = lambda t: None if t is None else t.to(device)
    g = _gelu_ref(x.double(), approximate)
    # dynamic: per-row scale = max|g * input_scale| / 127
    y, scale = torch_npu.npu_gelu_quant(d(x), input_scale=d(s), approximate=approximate)
    gs = g * s.double()
    ref_scale = gs.abs().amax(-1) / 127
    assert scale.shape == (3, 4) and scale.dtype == torch.float32
    _close(scale, ref_scale, 1e-5, 1e-4)
    _assert_int8_close(y, _q8_ref(gs / ref_scale.unsqueeze(-1)))
    y, scale = torch_npu.npu_gelu_quant(d(x), approximate=approximate)      # no input_scale
    _assert_int8_close(y, _q8_ref(g / (g.abs().amax(-1, keepdim=True) / 127)))
    # static: round(g * scale + offset), no scale output
    y, scale = torch_npu.npu_gelu_quant(d(x), input_scale=d(s), input_offset=d(o), approximate=approximate,
                                        quant_mode="static")
    assert scale is None
    _assert_int8_close(y, _q8_ref(g * s.double() + o.double()))
    with pytest.raises(NotImplementedError, match="dst_type"):
        torch_npu.npu_gelu_quant(d(x), dst_type=292)
    with pytest.raises(RuntimeError, match="quant_mode must be"):
        torch_npu.npu_gelu_quant(d(x), quant_mode="pertoken")


# ------------------------------------------------------------------ npu_anti_mx_quant / npu_quant_max


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("src,code", [(torch.float8_e4m3fn, 292), (torch.float8_e5m2, 291)])
def test_anti_mx_quant(device, src, code):
    x = (_rand(3, 100, seed=130) * 4).float().to(src)                # 100 = 3 full blocks + 4
    raw = torch.randint(110, 140, (3, 2, 2), generator=torch.Generator().manual_seed(131), dtype=torch.uint8)
    ref = torch.empty(3, 100, dtype=torch.float64)
    for r in range(3):
        for i in range(100):
            k = i // 32                                               # block k -> scale [k // 2, k % 2]
            ref[r, i] = float(x[r, i].float()) * 2.0 ** (int(raw[r, k // 2, k % 2]) - 127)
    y = torch_npu.npu_anti_mx_quant(x.to(device), raw.to(device), src_type=code)
    assert y.dtype == torch.bfloat16 and y.shape == (3, 100)
    _close(y, ref, 0, 8e-3)                                           # bf16 rounding of the exact product
    y32 = torch_npu.npu_anti_mx_quant(x.to(device), raw.view(torch.float8_e8m0fnu).to(device), dst_type=torch.float32,
                                      src_type=code)
    _close(y32, ref, 0, 0)                                            # float8 x power of two: exact in float32
    nan_scale = raw.clone()
    nan_scale[0, 0, 0] = 255                                          # e8m0 NaN
    assert torch.isnan(torch_npu.npu_anti_mx_quant(x, nan_scale, src_type=code)[0, :32].float()).all()
    with pytest.raises(NotImplementedError, match="src_type"):
        torch_npu.npu_anti_mx_quant(torch.zeros(3, 50, dtype=torch.uint8), raw, src_type=296)
    with pytest.raises(RuntimeError, match="mxscale must have shape"):
        torch_npu.npu_anti_mx_quant(x, raw[:, :1], src_type=code)


@pytest.mark.parametrize("device", DEVICES)
def test_quant_max(device):
    x = (_rand(6, 40, seed=140) * 3).half()
    y, amax = torch.ops.npu.npu_quant_max(x.to(device), torch.tensor([0.5]).to(device))
    assert y.dtype == torch.float8_e5m2 and amax.dtype == torch.float16 and amax.shape == (1,)
    # reference: float64 quotient rounded by PyTorch's float8 cast (the golden's cast)
    assert torch.equal(y.cpu().float(), (x.double() / 0.5).to(torch.float8_e5m2).float())
    assert float(amax) == float(x.abs().max())
    # grouped rows (cumulative ends), group 1 empty
    scales = torch.tensor([0.25, 8.0, 2.0])
    group_list = torch.tensor([2, 2, 6])
    y, amax = torch.ops.npu.npu_quant_max(x.to(device), scales.to(device), dst_dtype=torch.float8_e4m3fn,
                                          group_list=group_list.to(device))
    ref = torch.cat([x[:2].double() / 0.25, x[2:6].double() / 2.0]).to(torch.float8_e4m3fn)
    assert y.dtype == torch.float8_e4m3fn and torch.equal(y.cpu().float(), ref.float())
    assert amax.tolist() == [float(x[:2].abs().max()), 0.0, float(x[2:].abs().max())]
    with pytest.raises(NotImplementedError, match="hifloat8"):
        torch.ops.npu.npu_quant_max(x, torch.ones(1), dst_dtype=290)
    with pytest.raises(NotImplementedError, match="round_mode"):
        torch.ops.npu.npu_quant_max(x, torch.ones(1), round_mode="floor")


# ------------------------------------------------------------------ Meta-only ops

FP4 = 296          # torch_npu.float4_e2m1fn_x2
E5M2_NPU = 291     # torch_npu.float8_e5m2
HIF8 = 290         # torch_npu.hifloat8
E8M0 = 293         # torch_npu.float8_e8m0fnu


def _fake(*shape, dtype=torch.float16, requires_grad=False):
    t = torch.empty(*shape, dtype=dtype)
    return t.requires_grad_(True) if requires_grad else t


def _sig(outs):
    outs = outs if isinstance(outs, (tuple, list)) else (outs,)
    return [None if o is None else (tuple(o.shape), o.dtype) for o in outs]


U8, I8, I32, F32, F16, BF16 = torch.uint8, torch.int8, torch.int32, torch.float32, torch.float16, torch.bfloat16
E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2

# (name, call building its inputs inside FakeTensorMode, expected [(shape, dtype) or None])
META_CASES = [
    ("npu_add_rms_norm_quant",
     lambda: torch.ops.npu.npu_add_rms_norm_quant(_fake(2, 3, 64), _fake(2, 3, 64), _fake(64), _fake(64), None),
     [((2, 3, 64), I8), ((2, 3, 64), I8), ((2, 3, 64), F16)]),
    ("npu_add_rms_norm_dynamic_quant",
     lambda: torch.ops.npu.npu_add_rms_norm_dynamic_quant(_fake(4, 64), _fake(4, 64), _fake(64)),
     [((4, 64), I8), ((), I8), ((4, 64), F16), ((4,), F32), ((), F32)]),
    ("npu_add_rms_norm_dynamic_quant",   # both outputs
     lambda: torch.ops.npu.npu_add_rms_norm_dynamic_quant(_fake(4, 64), _fake(4, 64), _fake(64),
                                                          output_mask=[True, True]),
     [((4, 64), I8), ((4, 64), I8), ((4, 64), F16), ((4,), F32), ((4,), F32)]),
    ("npu_rms_norm_quant",
     lambda: torch.ops.npu.npu_rms_norm_quant(_fake(2, 16), _fake(16), _fake(16), _fake(1), _fake(1, dtype=I8)),
     [((2, 16), I8)]),
    ("npu_anti_mx_quant",
     lambda: torch.ops.npu.npu_anti_mx_quant(_fake(4, 64, dtype=E4M3), _fake(4, 1, 2, dtype=U8), dst_type=5),
     [((4, 64), F16)]),
    ("npu_dynamic_dual_level_mx_quant",
     lambda: torch.ops.npu.npu_dynamic_dual_level_mx_quant(_fake(3, 1100)),
     [((3, 550), U8), ((3, 3), F32), ((3, 18, 2), U8)]),
    ("npu_grouped_dynamic_block_quant",
     lambda: torch.ops.npu.npu_grouped_dynamic_block_quant(_fake(2, 10, 300), _fake(4, dtype=torch.int64),
                                                           dst_type=torch.float8_e4m3fn),
     [((2, 10, 300), E4M3), ((2, 14, 3), F32)]),
    ("npu_quant_max",
     lambda: torch.ops.npu.npu_quant_max(_fake(5, 7, dtype=BF16), _fake(1, dtype=F32)),
     [((5, 7), E5M2), ((1,), BF16)]),
    ("npu_quant_max",
     lambda: torch.ops.npu.npu_quant_max(_fake(4, 3, 8), _fake(2, dtype=F32), dst_dtype=292,
                                         group_list=_fake(2, dtype=torch.int64)),
     [((4, 3, 8), E4M3), ((2,), F16)]),
    ("npu_gelu_quant",
     lambda: torch.ops.npu.npu_gelu_quant(_fake(2, 3, 9)),
     [((2, 3, 9), I8), ((2, 3), F32)]),
    ("npu_gelu_quant",
     lambda: torch.ops.npu.npu_gelu_quant(_fake(2, 9), input_scale=_fake(9), quant_mode="static"),
     [((2, 9), I8), None]),
    ("npu_kronecker_quant",
     lambda: torch.ops.npu.npu_kronecker_quant(_fake(6, 4, 16), _fake(4, 4), _fake(16, 16)),
     [((6, 4, 2), I32), ((6,), F32)]),
    ("npu_kronecker_quant",
     lambda: torch.ops.npu.npu_kronecker_quant(_fake(6, 4, 40), _fake(4, 4), _fake(40, 40), dst_dtype=FP4),
     [((6, 80), U8), ((6, 3, 2), U8)]),
    ("npu_group_quant",
     lambda: torch.ops.npu.npu_group_quant(_fake(6, 16), _fake(2, 16), _fake(2, dtype=I32), dst_dtype=torch.qint8),
     [((6, 16), I8)]),
    ("npu_swiglu_group_quant",
     lambda: torch.ops.npu.npu_swiglu_group_quant(_fake(6, 32), group_index=_fake(3, dtype=torch.int64),
                                                  quant_mode=3, output_origin=True),
     [((6, 16), U8), ((3,), F32), ((6, 16), F16)]),
    ("npu_swiglu_group_quant",
     lambda: torch.ops.npu.npu_swiglu_group_quant(_fake(6, 32), quant_mode=2),
     [((6, 16), U8), ((0,), F32), ((0,), F16)]),
    ("npu_ifmr",
     lambda: torch.ops.npu.npu_ifmr(_fake(2, 3, dtype=F32), _fake(1, dtype=F32), _fake(1, dtype=F32),
                                    _fake(64, dtype=torch.int32), 0.999, 0.999, 0.7, 1.3, 0.01, True),
     [((1,), F32), ((1,), F32)]),
    ("npu_weight_quant_preprocess",
     lambda: torch.ops.npu.npu_weight_quant_preprocess(_fake(64, 32, dtype=U8), _fake(2, 32, 2, dtype=U8),
                                                       292, FP4, E8M0, x_scale_dtype=E8M0),
     [((64, 32), U8), ((2, 32, 2), U8), None, None]),
]


@pytest.mark.parametrize("name,call,expected", META_CASES, ids=[c[0] for c in META_CASES])
def test_meta_shapes(name, call, expected):
    with FakeTensorMode():
        got = call()
    assert _sig(got) == expected


# every meta-only case called on real tensors: the computation is still not emulated
META_ONLY_CASES = [c for c in META_CASES if c[0] in NOT_EMULATED]


@pytest.mark.parametrize("name,call", [c[:2] for c in META_ONLY_CASES], ids=[c[0] for c in META_ONLY_CASES])
@pytest.mark.parametrize("device", DEVICES)
def test_meta_only_ops_still_raise(name, call, device):
    with pytest.raises(NotImplementedError) as info:
        with torch.device(device):
            call()
    assert str(info.value) == not_emulated_message(name)


def test_meta_only_cases_cover_every_meta_kernel():
    from torch_npu.op_plugin import _registry
    from torch_npu.op_plugin.quant import meta_only as quant_meta_only
    mine = {n for n, f in _registry.META.items() if f.__module__ == quant_meta_only.__name__}
    assert mine == {c[0] for c in META_ONLY_CASES}


def test_every_meta_kernel_has_the_schema_signature():
    """Positional/keyword names, kwarg-only flags and defaults equal the registered schema's
    (the dispatcher passes arguments by schema position)."""
    import inspect
    from torch_npu.op_plugin import _registry
    from torch_npu.op_plugin.quant import meta_only as quant_meta_only
    fns = {n: f for n, f in _registry.META.items() if f.__module__ == quant_meta_only.__name__}
    assert len(fns) == len({c[0] for c in META_ONLY_CASES})
    for name, fn in fns.items():
        schema = getattr(torch.ops.npu, _registry.base_name(name)).default._schema
        params = list(inspect.signature(fn).parameters.values())
        assert [p.name for p in params] == [a.name for a in schema.arguments], name
        for p, a in zip(params, schema.arguments):
            assert (p.kind == inspect.Parameter.KEYWORD_ONLY) == a.kwarg_only, (name, p.name)
            assert (p.default is not inspect.Parameter.empty) == a.has_default_value(), (name, p.name)
            if a.has_default_value():
                assert p.default == a.default_value, (name, p.name)


def test_meta_errors():
    with FakeTensorMode():
        with pytest.raises(RuntimeError, match="dtype must be torch.int8"):
            torch.ops.npu.npu_swiglu_quant(_fake(4, 64), dst_type=torch.float16)
    # arguments whose outputs are not documented raise NotImplementedError naming them (on Meta
    # tensors directly; FakeTensorMode reports such an op as unsupported for those arguments)
    meta = lambda *shape, dtype=torch.float16: torch.empty(*shape, dtype=dtype, device="meta")
    with pytest.raises(NotImplementedError, match="quant_mode=0"):
        torch.ops.npu.npu_swiglu_group_quant(meta(4, 64))
    with pytest.raises(NotImplementedError, match="dst_type=12345"):
        torch.ops.npu.npu_dynamic_mx_quant(meta(4, 64), dst_type=12345)
    with pytest.raises(NotImplementedError, match="data flow"):
        torch.ops.npu.npu_weight_quant_preprocess(meta(64, 32, dtype=U8), meta(2, 32, 2, dtype=U8), 1, 1, 1)
