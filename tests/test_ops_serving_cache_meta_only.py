"""The meta-only KV-cache, sampling, serving-runtime, HANS codec, silent-check and barrier ops of
torch.ops.npu, and the one-node compile of the value-dependent cache ops.

Meta-only ops: under FakeTensorMode each returns the shapes/dtypes written here from the op's
documentation / op-plugin output-size code, and a real CPU call still raises NotImplementedError
naming the op.
"""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from torch_npu.op_plugin._registry import IMPLEMENTED, META, NOT_EMULATED, not_emulated_message

from _op_helpers import int_zeros as _ints, zeros as z

npu = torch.ops.npu
f16, f32, i8, i32, i64 = torch.float16, torch.float32, torch.int8, torch.int32, torch.int64


# (overload, call(), expected [(shape, dtype)] or None for "returns nothing")
META_CASES = [
    ("npu_rope_quant_kvcache",
     lambda: npu.npu_rope_quant_kvcache(z(2, 3, 128, dtype=f16), z(2, 3, 1, 32, dtype=f16), z(2, 3, 1, 32, dtype=f16),
                                        z(2, 16, 1, 32, dtype=i8), z(2, 16, 1, 32, dtype=i8), _ints(2), z(32), z(32),
                                        [64, 32, 32], kv_output=True),
     # q heads = 64 // 32 = 2, k/v heads = k_cache.size(2) = 1
     [((2, 3, 2, 32), f16), ((2, 3, 1, 32), f16), ((2, 3, 1, 32), f16), ((2, 16, 1, 32), i8), ((2, 16, 1, 32), i8)]),
    ("npu_dequant_rope_quant_kvcache",
     lambda: npu.npu_dequant_rope_quant_kvcache(z(4, 96, dtype=i32), z(4, 1, 32, dtype=torch.bfloat16),
                                                z(4, 1, 32, dtype=torch.bfloat16), z(2, 16, 1, 32, dtype=i8),
                                                z(2, 16, 1, 32, dtype=i8), _ints(4), z(32), z(32), [32, 32, 32]),
     # 2-D x: [T, heads, D]; without kv_output k/v are empty [0]
     [((4, 1, 32), torch.bfloat16), ((0,), torch.bfloat16), ((0,), torch.bfloat16), ((2, 16, 1, 32), i8),
      ((2, 16, 1, 32), i8)]),
    ("npu_top_k_top_p_sample",
     lambda: npu.npu_top_k_top_p_sample(z(3, 10, dtype=f16), _ints(3), z(3, dtype=f16), z(3, 10)),
     [((3,), i64), ((3, 10), f32)]),
    ("npu_hans_encode.out",
     lambda: npu.npu_hans_encode(z(64, dtype=f16), pdf=z(256, dtype=i32), mantissa=z(32, dtype=f16),
                                 fixed=z(40, dtype=f16), var=z(8, dtype=f16)),
     [((256,), i32), ((32,), f16), ((40,), f16), ((8,), f16)]),
    ("npu_hans_decode.out",
     lambda: npu.npu_hans_decode(z(32, dtype=f16), z(40, dtype=f16), z(8, dtype=f16), z(256, dtype=i32),
                                 out=z(64, dtype=f16)),
     [((64,), f16)]),
    ("obfuscation_calculate",
     lambda: npu.obfuscation_calculate(_ints(1), z(4, 16, dtype=torch.bfloat16), z(1)),
     [((4, 16), torch.bfloat16)]),
    ("obfuscation_finalize",
     lambda: npu.obfuscation_finalize(_ints(1)),
     [((1,), i32)]),
    ("attention_worker_scheduler", lambda: npu.attention_worker_scheduler(z(64, dtype=i8)), [((64,), i8)]),
    ("attention_worker_scheduler_", lambda: npu.attention_worker_scheduler_(z(64, dtype=i8)), [((64,), i8)]),
    ("ffn_worker_scheduler", lambda: npu.ffn_worker_scheduler(z(64, dtype=i8), sync_group_size=2), [((64,), i8)]),
    ("ffn_worker_scheduler_", lambda: npu.ffn_worker_scheduler_(z(64, dtype=i8)), [((64,), i8)]),
    ("npu_attention_to_ffn",
     lambda: npu.npu_attention_to_ffn(z(2, 16, dtype=f16), _ints(1), _ints(1), _ints(1), z(2, 2, dtype=i32),
                                      z(2, 2, dtype=i32), "group", 2, [1, 1, 10], [1, 1, 2, 2, 32], [1, 2, 2], 4),
     None),
    ("npu_ffn_to_attention",
     lambda: npu.npu_ffn_to_attention(z(6, 16, dtype=f16), _ints(6), _ints(6), _ints(6), _ints(6), z(1, dtype=i64),
                                      "group", 2, [1, 1, 10], [1, 1, 2, 2, 32]),
     None),
    ("npu_attention_worker_combine",
     lambda: npu.npu_attention_worker_combine(z(128, dtype=i8), z(5, 3), _ints(1), 16, token_dtype=1),
     [((5, 16), torch.bfloat16), ((1,), i32)]),
    ("npu_ffn_worker_batching",
     # max_out_shape [A, BS, K+1, H] = [1, 2, 3, 16]: Y = 6 rows
     lambda: npu.npu_ffn_worker_batching(z(128, dtype=i8), 4, [1, 2, 3, 16], token_dtype=2),
     [((6, 16), i8), ((4, 2), i64), ((6,), i32), ((6,), i32), ((6,), i32), ((6,), i32), ((6,), f32), ((1,), i64)]),
    ("_npu_distribute_barrier",
     lambda: npu._npu_distribute_barrier(z(2, 3, dtype=f16), "group", 2),
     [((2, 3), f16)]),
    ("_npu_silent_check",
     lambda: npu._npu_silent_check(z(4), z(), z(1), z(1), z(1), z(1, dtype=i64), 7, 1e6, 1e5, 1e3, 5.0),
     [((1,), i64)]),
    ("_npu_silent_check_v2",
     lambda: npu._npu_silent_check_v2(z(), z(4), z(3), z(1, dtype=i64), 7, 1e6, 1e5, 1e3, 5.0, 1),
     [((1,), i32)]),
    ("_npu_silent_check_v3",
     lambda: npu._npu_silent_check_v3(z(), z(4), z(1, dtype=i64), z(1), z(1), 1e6, 1e3, 0.99, 1),
     [((1,), i32)]),
]


def _flatten(out):
    if out is None:
        return None
    if isinstance(out, torch.Tensor):
        return [out]
    flat = []
    for item in out:
        flat.extend(_flatten(item) if not isinstance(item, torch.Tensor) else [item])
    return flat


@pytest.mark.parametrize("name,call,expected", META_CASES, ids=[c[0] for c in META_CASES])
def test_meta_shapes_and_cpu_still_raises(name, call, expected):
    assert name in META and name in NOT_EMULATED and name not in IMPLEMENTED
    with FakeTensorMode():
        out = call()
    got = _flatten(out)
    if expected is None:
        assert got is None
    else:
        assert [(tuple(t.shape), t.dtype) for t in got] == [(tuple(s), d) for s, d in expected]
    with pytest.raises(NotImplementedError) as info:
        call()
    assert str(info.value) == not_emulated_message(name)


def test_inplace_metas_return_their_argument():
    with FakeTensorMode():
        ctx = z(64, dtype=i8)
        assert npu.attention_worker_scheduler_(ctx) is ctx
        assert npu.ffn_worker_scheduler_(ctx) is ctx
        out = z(64, dtype=f16)
        mantissa, fixed, var, pdf = z(32, dtype=f16), z(40, dtype=f16), z(8, dtype=f16), z(256, dtype=i32)
        assert npu.npu_hans_decode(mantissa, fixed, var, pdf, out=out) is out


@pytest.mark.parametrize("call,message", [
    (lambda: npu.npu_dequant_rope_quant_kvcache(z(4, 96), z(4, 1, 32), z(4, 1, 32), z(2, 16, 1, 32, dtype=i8),
                                                z(2, 16, 1, 32, dtype=i8), _ints(4), z(32), z(32), [32, 32, 32]),
     "x must be int32"),
    (lambda: npu.npu_rope_quant_kvcache(z(4, 96), z(4, 1, 32), z(4, 1, 32), z(2, 16, 32, dtype=i8),
                                        z(2, 16, 32, dtype=i8), _ints(4), z(32), z(32), [32, 32, 32]),
     "k_cache must be 4-D"),
    (lambda: npu.npu_qkv_rms_norm_rope_cache(z(6, 64), z(8), z(8), z(6, 8), z(6, 8), z(6, dtype=i64), z(6, 32),
                                             z(4, 16, 2, 8), z(4, 16, 2, 8), [2, 3, 8], [4, 2, 2]),
     "qkv_size must be"),
    (lambda: npu.npu_top_k_top_p_sample(z(2, 3, 10), _ints(2), z(2)), "logits must be 2-D"),
    (lambda: npu.npu_rotated_box_encode(z(2, 4, 7), z(2, 4, 7), z(5)), "anchor_box must be (B, 5, N)"),
    (lambda: npu.npu_ffn_worker_batching(z(8, dtype=i8), 4, [1, 2, 16]), "max_out_shape must have 4 elements"),
    (lambda: npu.npu_ffn_worker_batching(z(8, dtype=i8), 0, [1, 2, 3, 16]), "expert_num should be a positive"),
])
def test_meta_validation_errors(call, message):
    with FakeTensorMode(), pytest.raises(RuntimeError, match=message.replace("(", r"\(").replace(")", r"\)")):
        call()


def test_side_effecting_communication_ops_are_kept_by_fx():
    from torch.fx.node import _side_effectful_functions  # the set has_side_effect() fills
    assert torch.ops.npu.npu_attention_to_ffn.default in _side_effectful_functions
    assert torch.ops.npu.npu_ffn_to_attention.default in _side_effectful_functions


# ----------------------------------------------------------------- emulated: DIoU / GIoU backward


# ----------------------------------------------------------------- emulated: RoIAlign backward


# ----------------------------------------------------------------- emulated: top-k / top-p filtering


# ----------------------------------------------------------------- emulated: paged KV-cache gather


# ----------------------------------------------------------------- emulated: K-cache scatter, list scatter


# ----------------------------------------------------------------- emulated: MLA kv RMSNorm + RoPE + cache


def test_value_dependent_ops_compile_as_one_node():
    """The opaque ops (host reads of lengths / block ids / RoI boxes) trace through their fake
    kernels and run eagerly inside the compiled graph."""
    def gather(kc, vc, tables, lens, k, v):
        key, value = npu.npu_gather_pa_kv_cache_functional(kc, vc, tables, lens, k, v)
        return key * 2, value
    kc, vc = torch.randn(4, 4, 2, 8), torch.randn(4, 4, 2, 4)
    args = (kc, vc, torch.tensor([[1, 2], [3, 0]], dtype=i32), torch.tensor([5, 3], dtype=i32), z(8, 2, 8), z(8, 2, 4))
    compiled = torch.compile(gather, backend="aot_eager", fullgraph=True)
    assert all(torch.equal(a, b) for a, b in zip(compiled(*args), gather(*args)))
