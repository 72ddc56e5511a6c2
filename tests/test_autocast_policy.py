"""Autocast on npu follows torch_npu 2.13.0's own op list, row for row.

The list is ``autocast_policy.tsv`` (op, overload, policy), read from the
reference directory when it exists and otherwise from the package's copy
(torch_npu/_data/autocast_policy.tsv, which csrc/amp/AutocastPolicy.inc is
generated from). Every row is checked by a real call under
``torch.autocast("npu")`` in fp16 and bf16: the output dtype must be the one the
row's policy gives, and the same call without autocast must not already give it
(so a missing registration would fail the row). Ops in CUDA's lists but not in
the NPU's must not be cast; the set of ops with an AutocastPrivateUse1 kernel
must equal the tsv's.
"""
import importlib.util
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import torch_npu  # noqa: F401

REPO = Path(__file__).resolve().parent.parent
PACKAGE_TSV = REPO / "torch_npu" / "_data" / "autocast_policy.tsv"
REFERENCE_TSV = REPO.parent / "shared" / "reference" / "torch_npu-2.13.0" / "autocast_policy.tsv"
POLICY_TSV = REFERENCE_TSV if REFERENCE_TSV.exists() else PACKAGE_TSV
DTYPES = [torch.float16, torch.bfloat16]


def _generator():
    spec = importlib.util.spec_from_file_location("_gen_autocast_policy", REPO / "tools" / "gen_autocast_policy.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


ROWS = _generator().read_policy(str(POLICY_TSV))


def _key(op, overload):
    return f"{op}.{overload}" if overload else op


# ---------------------------------------------------------------------------
# Inputs. `t(shape, dt)` makes an npu tensor with values in (0.1, 0.9) so that
# log/acos/erfinv/... stay finite in every dtype.
# ---------------------------------------------------------------------------

def t(*shape, dt=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed + 17 * len(shape))
    return (torch.rand(shape, generator=g) * 0.8 + 0.1).to(dt).npu()


def idx(*shape, high=3):
    return torch.randint(0, high, shape, generator=torch.Generator().manual_seed(3)).npu()


def sign(*shape):
    return (torch.randint(0, 2, shape, generator=torch.Generator().manual_seed(4)) * 2 - 1).float().npu()


A = torch.ops.aten

# Lower-precision rows: every floating input fp32; expected output = the autocast dtype.
LOWER = {
    "_convolution.deprecated": lambda d: A._convolution.deprecated(
        t(1, 2, 5, 5, dt=d), t(3, 2, 3, 3, dt=d), t(3, dt=d), [1, 1], [0, 0], [1, 1], False, [0, 0], 1,
        False, False, False),
    "_convolution": lambda d: A._convolution(
        t(1, 2, 5, 5, dt=d), t(3, 2, 3, 3, dt=d), t(3, dt=d), [1, 1], [0, 0], [1, 1], False, [0, 0], 1,
        False, False, False, False),
    "conv1d": lambda d: A.conv1d(t(1, 2, 6, dt=d), t(3, 2, 3, dt=d)),
    "conv2d": lambda d: A.conv2d(t(1, 2, 5, 5, dt=d), t(3, 2, 3, 3, dt=d)),
    "conv3d": lambda d: A.conv3d(t(1, 2, 4, 4, 4, dt=d), t(3, 2, 2, 2, 2, dt=d)),
    "conv_tbc": lambda d: A.conv_tbc(t(6, 2, 3, dt=d), t(3, 3, 4, dt=d), t(4, dt=d)),
    "conv_transpose1d": lambda d: A.conv_transpose1d(t(1, 2, 5, dt=d), t(2, 3, 3, dt=d)),
    "conv_transpose2d.input": lambda d: A.conv_transpose2d.input(t(1, 2, 4, 4, dt=d), t(2, 3, 3, 3, dt=d)),
    "conv_transpose3d.input": lambda d: A.conv_transpose3d.input(t(1, 2, 3, 3, 3, dt=d), t(2, 3, 2, 2, 2, dt=d)),
    "convolution": lambda d: A.convolution(
        t(1, 2, 5, 5, dt=d), t(3, 2, 3, 3, dt=d), None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1),
    "prelu": lambda d: A.prelu(t(2, 3, 4, dt=d) - 0.5, t(3, dt=d)),
    "addmm": lambda d: A.addmm(t(3, 4, dt=d), t(3, 5, dt=d), t(5, 4, dt=d)),
    "addmv": lambda d: A.addmv(t(3, dt=d), t(3, 5, dt=d), t(5, dt=d)),
    "addr": lambda d: A.addr(t(3, 4, dt=d), t(3, dt=d), t(4, dt=d)),
    "matmul": lambda d: A.matmul(t(3, 5, dt=d), t(5, 4, dt=d)),
    "einsum": lambda d: A.einsum("ij,jk->ik", [t(3, 5, dt=d), t(5, 4, dt=d)]),
    "mm": lambda d: A.mm(t(3, 5, dt=d), t(5, 4, dt=d)),
    "mv": lambda d: A.mv(t(3, 5, dt=d), t(5, dt=d)),
    "linear": lambda d: A.linear(t(3, 5, dt=d), t(4, 5, dt=d), t(4, dt=d)),
    "addbmm": lambda d: A.addbmm(t(3, 4, dt=d), t(2, 3, 5, dt=d), t(2, 5, 4, dt=d)),
    "baddbmm": lambda d: A.baddbmm(t(2, 3, 4, dt=d), t(2, 3, 5, dt=d), t(2, 5, 4, dt=d)),
    "bmm": lambda d: A.bmm(t(2, 3, 5, dt=d), t(2, 5, 4, dt=d)),
    "chain_matmul": lambda d: A.chain_matmul([t(3, 5, dt=d), t(5, 4, dt=d), t(4, 2, dt=d)]),
    "linalg_multi_dot": lambda d: A.linalg_multi_dot([t(3, 5, dt=d), t(5, 4, dt=d), t(4, 2, dt=d)]),
    "lstm_cell": lambda d: A.lstm_cell(
        t(2, 3, dt=d), [t(2, 4, dt=d), t(2, 4, dt=d)], t(16, 3, dt=d), t(16, 4, dt=d), t(16, dt=d), t(16, dt=d)),
    "gru_cell": lambda d: A.gru_cell(
        t(2, 3, dt=d), t(2, 4, dt=d), t(12, 3, dt=d), t(12, 4, dt=d), t(12, dt=d), t(12, dt=d)),
    "rnn_tanh_cell": lambda d: A.rnn_tanh_cell(t(2, 3, dt=d), t(2, 4, dt=d), t(4, 3, dt=d), t(4, 4, dt=d)),
    "rnn_relu_cell": lambda d: A.rnn_relu_cell(t(2, 3, dt=d), t(2, 4, dt=d), t(4, 3, dt=d), t(4, 4, dt=d)),
    "scaled_dot_product_attention": lambda d: A.scaled_dot_product_attention(
        t(1, 2, 4, 8, dt=d), t(1, 2, 4, 8, dt=d), t(1, 2, 4, 8, dt=d)),
}

# Rows whose op has no kernel the emulated npu (or the CPU under it) can run:
# CUDA-only ops. Their autocast rule is checked through a stand-in npu kernel
# that records the dtypes it receives (the call still goes through the real
# AutocastPrivateUse1 kernel). value: (call(dtype), number of floating inputs).
SPIED = {
    "cudnn_convolution": lambda d: A.cudnn_convolution(
        t(1, 2, 5, 5, dt=d), t(3, 2, 3, 3, dt=d), [0, 0], [1, 1], [1, 1], 1, False, False, False),
    "cudnn_convolution_transpose": lambda d: A.cudnn_convolution_transpose(
        t(1, 2, 4, 4, dt=d), t(2, 3, 3, 3, dt=d), [0, 0], [0, 0], [1, 1], [1, 1], 1, False, False, False),
    "_thnn_fused_lstm_cell": lambda d: A._thnn_fused_lstm_cell(
        t(2, 16, dt=d), t(2, 16, dt=d), t(2, 4, dt=d), t(16, dt=d), t(16, dt=d)),
    "_thnn_fused_gru_cell": lambda d: A._thnn_fused_gru_cell(
        t(2, 12, dt=d), t(2, 12, dt=d), t(2, 4, dt=d), t(12, dt=d), t(12, dt=d)),
    "_scaled_dot_product_flash_attention": lambda d: A._scaled_dot_product_flash_attention(
        t(1, 2, 4, 8, dt=d), t(1, 2, 4, 8, dt=d), t(1, 2, 4, 8, dt=d)),
}

# fp32 rows: floating inputs in the autocast dtype; expected output float32.
FP32 = {
    **{name: (lambda op: lambda d: getattr(A, op)(t(2, 3, dt=d)))(name)
       for name in ("acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p",
                    "reciprocal", "rsqrt", "sinh", "tan")},
    "pow.Tensor_Scalar": lambda d: A.pow.Tensor_Scalar(t(2, 3, dt=d), 2.5),
    "pow.Tensor_Tensor": lambda d: A.pow.Tensor_Tensor(t(2, 3, dt=d), t(2, 3, dt=d)),
    "pow.Scalar": lambda d: A.pow.Scalar(2.5, t(2, 3, dt=d)),
    "softplus": lambda d: A.softplus(t(2, 3, dt=d)),
    "layer_norm": lambda d: A.layer_norm(t(2, 3, 4, dt=d), [4], t(4, dt=d), t(4, dt=d)),
    "native_layer_norm": lambda d: A.native_layer_norm(t(2, 3, 4, dt=d), [4], t(4, dt=d), t(4, dt=d), 1e-5),
    "group_norm": lambda d: A.group_norm(t(2, 4, 3, dt=d), 2, t(4, dt=d), t(4, dt=d)),
    "frobenius_norm.dim": lambda d: A.frobenius_norm.dim(t(3, 4, dt=d), [0, 1]),
    "nuclear_norm": lambda d: A.nuclear_norm(t(3, 4, dt=d)),
    "nuclear_norm.dim": lambda d: A.nuclear_norm.dim(t(3, 4, dt=d), [0, 1]),
    "cosine_similarity": lambda d: A.cosine_similarity(t(3, 4, dt=d), t(3, 4, dt=d, seed=1)),
    "poisson_nll_loss": lambda d: A.poisson_nll_loss(t(3, 4, dt=d), t(3, 4, dt=d, seed=1), True, False, 1e-8, 1),
    "cosine_embedding_loss": lambda d: A.cosine_embedding_loss(t(3, 4, dt=d), t(3, 4, dt=d, seed=1), sign(3).to(d)),
    "nll_loss": lambda d: A.nll_loss(t(3, 4, dt=d), idx(3, high=4)),
    "nll_loss2d": lambda d: A.nll_loss2d(t(2, 4, 3, 3, dt=d), idx(2, 3, 3, high=4)),
    "hinge_embedding_loss": lambda d: A.hinge_embedding_loss(t(3, 4, dt=d), sign(3, 4).to(d)),
    "kl_div": lambda d: A.kl_div(t(3, 4, dt=d), t(3, 4, dt=d, seed=1)),
    "l1_loss": lambda d: A.l1_loss(t(3, 4, dt=d), t(3, 4, dt=d, seed=1)),
    "smooth_l1_loss": lambda d: A.smooth_l1_loss(t(3, 4, dt=d), t(3, 4, dt=d, seed=1)),
    "huber_loss": lambda d: A.huber_loss(t(3, 4, dt=d), t(3, 4, dt=d, seed=1)),
    "mse_loss": lambda d: A.mse_loss(t(3, 4, dt=d), t(3, 4, dt=d, seed=1)),
    "margin_ranking_loss": lambda d: A.margin_ranking_loss(t(3, dt=d), t(3, dt=d, seed=1), sign(3).to(d)),
    "multilabel_margin_loss": lambda d: A.multilabel_margin_loss(t(2, 4, dt=d), idx(2, 4, high=4)),
    "soft_margin_loss": lambda d: A.soft_margin_loss(t(3, 4, dt=d), sign(3, 4).to(d)),
    "triplet_margin_loss": lambda d: A.triplet_margin_loss(t(3, 4, dt=d), t(3, 4, dt=d, seed=1),
                                                           t(3, 4, dt=d, seed=2)),
    "multi_margin_loss": lambda d: A.multi_margin_loss(t(3, 4, dt=d), idx(3, high=4)),
    "binary_cross_entropy_with_logits": lambda d: A.binary_cross_entropy_with_logits(t(3, 4, dt=d),
                                                                                     t(3, 4, dt=d, seed=1)),
    "dist": lambda d: A.dist(t(3, 4, dt=d), t(3, 4, dt=d, seed=1)),
    "pdist": lambda d: A.pdist(t(3, 4, dt=d)),
    "cdist": lambda d: A.cdist(t(3, 4, dt=d), t(2, 4, dt=d, seed=1)),
    "renorm": lambda d: A.renorm(t(3, 4, dt=d), 2, 0, 1.0),
    "logsumexp": lambda d: A.logsumexp(t(3, 4, dt=d), [1]),
}

# fp32_set_opt_dtype and fp32_append_dtype rows: input in the autocast dtype,
# no dtype given; expected output float32.
FP32_DTYPE_ARG = {
    "prod": lambda d: A.prod(t(3, 4, dt=d)),
    "prod.dim_int": lambda d: A.prod.dim_int(t(3, 4, dt=d), 1),
    "softmax.int": lambda d: A.softmax.int(t(3, 4, dt=d), 1),
    "log_softmax.int": lambda d: A.log_softmax.int(t(3, 4, dt=d), 1),
    "cumprod": lambda d: A.cumprod(t(3, 4, dt=d), 1),
    "cumsum": lambda d: A.cumsum(t(3, 4, dt=d), 1),
    "linalg_vector_norm": lambda d: A.linalg_vector_norm(t(3, 4, dt=d)),
    "linalg_matrix_norm": lambda d: A.linalg_matrix_norm(t(3, 4, dt=d), 1),
    "linalg_matrix_norm.str_ord": lambda d: A.linalg_matrix_norm.str_ord(t(3, 4, dt=d)),
    "sum": lambda d: A.sum(t(3, 4, dt=d)),
    "sum.dim_IntList": lambda d: A.sum.dim_IntList(t(3, 4, dt=d), [1]),
    "norm.Scalar": lambda d: A.norm.Scalar(t(3, 4, dt=d), 2),
    "norm.ScalarOpt_dim": lambda d: A.norm.ScalarOpt_dim(t(3, 4, dt=d), 2, [1]),
}

# promote rows: the first floating input in the autocast dtype, the others fp32.
# Where ordinary type promotion would already widen, the fp32 operands are 0-dim
# (which ordinary promotion ignores against a dimensioned tensor) so that only
# autocast's promote rule gives float32.
PROMOTE = {
    "addcdiv": lambda d: A.addcdiv(t(3, dt=d), t(dt=torch.float32), t(dt=torch.float32)),
    "addcmul": lambda d: A.addcmul(t(3, dt=d), t(dt=torch.float32), t(dt=torch.float32)),
    "atan2": lambda d: A.atan2(t(3, dt=d), t(dt=torch.float32)),
    "bilinear": lambda d: A.bilinear(t(2, 3, dt=d), t(2, 4), t(5, 3, 4), t(5)),
    "cross": lambda d: A.cross(t(2, 3, dt=d), t(2, 3)),
    "dot": lambda d: A.dot(t(4, dt=d), t(4)),
    "grid_sampler": lambda d: A.grid_sampler(t(1, 2, 4, 4, dt=d), t(1, 3, 3, 2) * 2 - 1, 0, 0, False),
    "index_put": lambda d: A.index_put(t(5, dt=d), [idx(2, high=5)], t(2)),
    "tensordot": lambda d: A.tensordot(t(3, 4, dt=d), t(4, 2), [1], [0]),
    "scatter_add": lambda d: A.scatter_add(t(3, 4, dt=d), 1, idx(3, 2, high=4), t(3, 2)),
}


def _first(out):
    return out[0] if isinstance(out, (tuple, list)) else out


def _expected(policy, dtype):
    return dtype if policy == "lower_precision_fp" else torch.float32


def _call_for(key, policy):
    """(call taking the dtype its floating inputs are made in, that dtype for this autocast dtype)."""
    table = {"lower_precision_fp": LOWER, "fp32": FP32, "fp32_set_opt_dtype": FP32_DTYPE_ARG,
             "fp32_append_dtype": FP32_DTYPE_ARG, "promote": PROMOTE}[policy]
    return table[key]


def _input_dtype(policy, dtype):
    # lower_precision_fp narrows fp32 inputs; every other policy widens
    # inputs given in the autocast dtype.
    return torch.float32 if policy == "lower_precision_fp" else dtype


def test_tsv_has_the_documented_row_counts_and_package_copy_is_the_reference():
    counts = {}
    for _op, _ov, policy in ROWS:
        counts[policy] = counts.get(policy, 0) + 1
    assert counts == {"lower_precision_fp": 34, "fp32": 46, "fp32_set_opt_dtype": 11, "fp32_append_dtype": 2,
                      "promote": 10, "banned": 1}
    if REFERENCE_TSV.exists():
        assert PACKAGE_TSV.read_bytes() == REFERENCE_TSV.read_bytes(), (
            "torch_npu/_data/autocast_policy.tsv differs from the reference list")


def test_generated_registration_is_up_to_date():
    assert _generator().main(["--check"]) == 0, "run python tools/gen_autocast_policy.py"


def test_every_row_has_a_test_call():
    tables = {**LOWER, **SPIED, **FP32, **FP32_DTYPE_ARG, **PROMOTE}
    missing = [_key(op, ov) for op, ov, p in ROWS if p != "banned" and _key(op, ov) not in tables]
    assert not missing
    extra = set(tables) - {_key(op, ov) for op, ov, _ in ROWS}
    assert not extra


def _autocast_kernels():
    """aten overloads with their own AutocastPrivateUse1 kernel (not the fallthrough fallback)."""
    found = set()
    for name in torch._C._dispatch_get_all_op_names():
        if name.startswith("aten::") and torch._C._dispatch_has_kernel_for_dispatch_key(name, "AutocastPrivateUse1"):
            found.add(name[len("aten::"):])
    return found


def test_registered_kernels_are_exactly_the_tsv_rows():
    assert _autocast_kernels() == {_key(op, ov) for op, ov, _ in ROWS}


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
@pytest.mark.parametrize("row", [r for r in ROWS if r[2] != "banned" and _key(r[0], r[1]) not in SPIED],
                         ids=lambda r: _key(r[0], r[1]))
def test_row_output_dtype_follows_its_policy(row, dtype):
    op, overload, policy = row
    call = _call_for(_key(op, overload), policy)
    in_dtype = _input_dtype(policy, dtype)
    want = _expected(policy, dtype)
    torch.manual_seed(0)
    with torch.autocast("npu", dtype=dtype):
        out = _first(call(in_dtype))
    assert out.device.type == "npu"
    assert out.dtype == want, f"{_key(op, overload)} ({policy}) under {dtype}: got {out.dtype}, want {want}"
    # The same call outside autocast must not give that dtype already (or must
    # fail), else this row would pass without its registration.
    try:
        plain = _first(call(in_dtype)).dtype
    except RuntimeError:
        plain = None
    assert plain != want, f"{_key(op, overload)}: the call gives {want} without autocast too"


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
@pytest.mark.parametrize("name", sorted(SPIED))
def test_cuda_only_rows_cast_their_inputs(name, dtype):
    schema = getattr(A, name.split(".")[0]).default._schema
    n_out = len(schema.returns)
    seen = []

    def kernel(*args):
        tensors = [a for a in args if isinstance(a, torch.Tensor) and a.is_floating_point()]
        seen.append([a.dtype for a in tensors])
        out = torch.empty(1, dtype=tensors[0].dtype, device=tensors[0].device)
        return out if n_out == 1 else tuple(out.clone() for _ in range(n_out))

    lib = torch.library.Library("aten", "IMPL")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "Overriding a previously registered kernel": undone by _destroy
            lib.impl(name, kernel, "PrivateUse1")
        with torch.autocast("npu", dtype=dtype):
            _first(SPIED[name](torch.float32))
        assert seen == [[dtype] * len(seen[0])], f"{name} kernel saw {seen}"
        seen.clear()
        _first(SPIED[name](torch.float32))  # without autocast: no cast
        assert seen == [[torch.float32] * len(seen[0])]
    finally:
        lib._destroy()


# Ops in PyTorch 2.13's CUDA autocast lists that torch_npu's list lacks: on npu
# they run in whatever dtype they are given.
def test_cuda_lower_precision_op_absent_from_npu_list_is_not_cast():
    a, b = t(3, 4), t(3, 4, seed=1)
    with torch.autocast("npu", dtype=torch.float16):
        out = torch.linalg.vecdot(a, b)
    assert out.dtype == torch.float32  # CUDA autocast would give float16
    torch.testing.assert_close(out.cpu(), torch.linalg.vecdot(a.cpu(), b.cpu()), rtol=0, atol=0)


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
@pytest.mark.parametrize("name, call", [
    ("upsample_nearest2d", lambda x: A.upsample_nearest2d(x, [8, 8])),
    ("_upsample_nearest_exact1d", lambda x: A._upsample_nearest_exact1d(x[0], [8])),
    ("upsample_bilinear2d", lambda x: A.upsample_bilinear2d(x, [8, 8], False)),
    ("upsample_bicubic2d", lambda x: A.upsample_bicubic2d(x, [8, 8], False)),
    ("upsample_nearest3d", lambda x: A.upsample_nearest3d(x.unsqueeze(2), [2, 8, 8])),
])
def test_cuda_fp32_ops_absent_from_npu_list_are_not_cast(name, call, dtype):
    x = t(1, 2, 4, 4, dt=dtype)
    with torch.autocast("npu", dtype=dtype):
        out = call(x)
    assert out.dtype == dtype, f"{name} was cast to {out.dtype} (CUDA autocast casts it to float32)"
    torch.testing.assert_close(out.cpu(), call(x).cpu(), rtol=0, atol=0)


def test_cuda_promote_op_absent_from_npu_list_is_not_promoted():
    # vdot is promoted on CUDA; on npu the mixed call reaches the kernel as is
    # and fails the kernel's own dtype check, exactly as outside autocast.
    a, b = t(4, dt=torch.float16), t(4)
    with pytest.raises(RuntimeError) as plain:
        torch.vdot(a, b)
    with torch.autocast("npu", dtype=torch.float16):
        with pytest.raises(RuntimeError) as auto:
            torch.vdot(a, b)
    assert str(auto.value) == str(plain.value)


def test_rms_norm_is_not_an_autocast_op_on_npu():
    # rms_norm is fp32 on CUDA; torch_npu registers no rule for it.
    assert not torch._C._dispatch_has_kernel_for_dispatch_key("aten::rms_norm", "AutocastPrivateUse1")
    assert torch._C._dispatch_has_kernel_for_dispatch_key("aten::rms_norm", "AutocastCUDA")


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
def test_binary_cross_entropy_is_banned(dtype):
    p = t(6)
    with torch.autocast("npu", dtype=dtype):
        with pytest.raises(RuntimeError, match=r"torch\.nn\.functional\.binary_cross_entropy and torch\.nn\.BCELoss "
                                                r"are unsafe to autocast"):
            F.binary_cross_entropy(p, p)
    # outside autocast it computes
    assert F.binary_cross_entropy(p, p).dtype == torch.float32
