"""npu_block_sparse_attention and npu_block_sparse_attention_backward.

The reference is written here from the documented formula (aclnnBlockSparseAttention and the
op-plugin golden): per batch, the block mask is expanded to an element mask
``keep[n, i, j] = mask[b, n, i // block_x, j // block_y] != 0`` over that batch's own rows,
then plain float64 softmax attention ``softmax(scale * q k^T)[keep] @ v`` with key/value head
``n // (N1 / N2)``; rows that keep nothing give 0 and softmax_lse -1e10 (the golden's value);
gradients come from autograd through that plain-torch reference. CPU and npu inputs, float32
plus float16/bfloat16, TND/BNSD/BSND, FakeTensor/meta shapes, gradcheck in float64, errors.
"""
import math

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import torch_npu

from _op_helpers import DEVICES

EMPTY_LSE = -1e10


def rand(shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)


def rand_mask(shape, seed=0, p_keep=0.6):
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(shape, generator=g) < p_keep).to(torch.int8)


def batch_rows(x, layout, b, start, rows):
    """[N, rows, D] view of batch b of a tensor in ``layout``."""
    if layout == "TND":
        return x[start:start + rows].transpose(0, 1)
    if layout == "BNSD":
        return x[b, :, :rows]
    return x[b, :rows].transpose(0, 1)


def reference(q, k, v, mask, block, scale, layout, q_lens=None, kv_lens=None):
    """float64 (out in q's layout, lse [..., 1]); differentiable in q, k, v."""
    bx, by = block
    if layout == "TND":
        batch = len(q_lens)
    else:
        batch = q.shape[0]
        seq = 2 if layout == "BNSD" else 1
        q_lens = q_lens or [q.shape[seq]] * batch
        kv_lens = kv_lens or [k.shape[seq]] * batch
    out = torch.zeros(q.shape, dtype=torch.float64)
    lse = torch.full(tuple(q.shape[:-1]) + (1,), EMPTY_LSE, dtype=torch.float64)
    qs = ks = 0
    for b in range(batch):
        lq, lk = q_lens[b], kv_lens[b]
        qb = batch_rows(q, layout, b, qs, lq).double()
        kb = batch_rows(k, layout, b, ks, lk).double()
        vb = batch_rows(v, layout, b, ks, lk).double()
        group = qb.shape[0] // kb.shape[0]
        kb, vb = kb.repeat_interleave(group, 0), vb.repeat_interleave(group, 0)
        i, j = torch.arange(lq) // bx, torch.arange(lk) // by
        keep = mask[b].cpu()[:, i][:, :, j] != 0  # [N, lq, lk]
        s = scale * qb @ kb.transpose(-1, -2)
        alive = keep.any(-1, keepdim=True)
        s = torch.where(keep, s, torch.tensor(float("-inf"), dtype=torch.float64))
        s = torch.where(alive, s, torch.zeros_like(s))  # keeps fully masked rows NaN-free
        p = torch.where(alive, torch.softmax(s, -1), torch.zeros_like(s))
        row_lse = torch.where(alive, torch.logsumexp(s, -1, keepdim=True),
                              torch.full_like(s[..., :1], EMPTY_LSE))
        # write batch b's rows in place (autograd records the copies into the views)
        batch_rows(out, layout, b, qs, lq).copy_(p @ vb)
        batch_rows(lse, layout, b, qs, lq).copy_(row_lse)
        qs, ks = qs + lq, ks + lk
    return out, lse


def call(q, k, v, mask, block, layout, heads_kv, scale, **kw):
    return torch_npu.npu_block_sparse_attention(q, k, v, mask, block, q_input_layout=layout, kv_input_layout=layout,
                                                num_key_value_heads=heads_kv, scale_value=scale, **kw)


def to(device, *ts):
    return [t.to(device) for t in ts]


# ------------------------------------------------------------------ forward

@pytest.mark.parametrize("device", DEVICES)
def test_bnsd_gqa_sparse_float32(device):
    b, n1, n2, s1, s2, d, block = 2, 4, 2, 40, 300, 64, [16, 128]
    q, k, v = rand((b, n1, s1, d), seed=1), rand((b, n2, s2, d), seed=2), rand((b, n2, s2, d), seed=3)
    mask = rand_mask((b, n1, 3, 3), seed=4)
    mask[0, 1, 1] = 0  # a query block that keeps nothing
    mask[1, 3, 0] = 0
    mask[1, 3, 0, 2] = 1  # only the short tail block (keys 256..299)
    scale = 1 / math.sqrt(d)
    out, lse = call(*to(device, q, k, v, mask), block, "BNSD", n2, scale, softmax_lse_flag=1)
    assert out.device.type == device and out.dtype == torch.float32 and lse.dtype == torch.float32
    assert out.shape == q.shape and lse.shape == (b, n1, s1, 1)
    ro, rl = reference(q, k, v, mask, block, scale, "BNSD")
    torch.testing.assert_close(out.cpu().double(), ro, atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(lse.cpu().double(), rl, atol=2e-5, rtol=1e-5)
    assert (out[0, 1, 16:32] == 0).all() and (lse[0, 1, 16:32] == EMPTY_LSE).all()


@pytest.mark.parametrize("dtype,inner,atol", [(torch.float16, 1, 3e-3), (torch.float16, 0, 3e-3),
                                              (torch.bfloat16, 0, 2e-2)])
@pytest.mark.parametrize("device", DEVICES)
def test_low_precision(device, dtype, inner, atol):
    b, n, s1, s2, d, block = 1, 2, 64, 256, 128, [32, 128]
    q, k, v = rand((b, n, s1, d), dtype, 5), rand((b, n, s2, d), dtype, 6), rand((b, n, s2, d), dtype, 7)
    mask = rand_mask((b, n, 2, 2), seed=8, p_keep=0.7)
    mask[0, 0, 0] = 1
    scale = 1 / math.sqrt(d)
    out, lse = call(*to(device, q, k, v, mask), block, "BNSD", n, scale, inner_precise=inner, softmax_lse_flag=1)
    assert out.dtype == dtype
    ro, rl = reference(q, k, v, mask, block, scale, "BNSD")  # float64 on the rounded inputs
    torch.testing.assert_close(out.cpu().double(), ro, atol=atol, rtol=atol)
    torch.testing.assert_close(lse.cpu().double(), rl, atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_tnd_varlen_gqa(device):
    n1, n2, d, block = 4, 1, 128, [8, 128]
    q_lens, kv_lens = [20, 33, 0], [130, 260, 5]
    q, k, v = rand((53, n1, d), seed=9), rand((395, n2, d), seed=10), rand((395, n2, d), seed=11)
    mask = rand_mask((3, n1, math.ceil(33 / 8), math.ceil(260 / 128)), seed=12)
    out, lse = call(*to(device, q, k, v, mask), block, "TND", n2, 0.09, actual_seq_lengths=q_lens,
                    actual_seq_lengths_kv=kv_lens, softmax_lse_flag=1)
    assert out.shape == q.shape and lse.shape == (53, n1, 1)
    ro, rl = reference(q, k, v, mask, block, 0.09, "TND", q_lens, kv_lens)
    torch.testing.assert_close(out.cpu().double(), ro, atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(lse.cpu().double(), rl, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_actual_lengths_bsnd_padding_ignored(device):
    b, n, s1, s2, d, block = 2, 2, 24, 300, 64, [8, 128]
    q, k, v = rand((b, s1, n, d), seed=13), rand((b, s2, n, d), seed=14), rand((b, s2, n, d), seed=15)
    q_lens, kv_lens = [24, 10], [300, 140]
    k[1, 140:] = 1e3  # padding keys/values: would dominate if they were read
    v[1, 140:] = 1e3
    mask = torch.ones((b, n, 3, 3), dtype=torch.int8)
    out, lse = call(*to(device, q, k, v, mask), block, "BSND", n, 0.125, actual_seq_lengths=q_lens,
                    actual_seq_lengths_kv=kv_lens, softmax_lse_flag=1)
    assert lse.shape == (b, s1, n, 1)
    ro, rl = reference(q, k, v, mask, block, 0.125, "BSND", q_lens, kv_lens)
    torch.testing.assert_close(out.cpu().double(), ro, atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(lse.cpu().double(), rl, atol=2e-5, rtol=1e-5)
    assert (out[1, 10:] == 0).all() and (lse[1, 10:] == EMPTY_LSE).all()


@pytest.mark.parametrize("device", DEVICES)
def test_mask_sized_by_longest_actual_lengths(device):
    """BNSD with lengths: qBlockNum/kvBlockNum may come from max(actual lengths) instead of S."""
    b, n, s1, s2, d, block = 2, 2, 40, 300, 64, [8, 128]
    q, k, v = rand((b, n, s1, d), seed=50), rand((b, n, s2, d), seed=51), rand((b, n, s2, d), seed=52)
    q_lens, kv_lens = [20, 12], [130, 140]
    mask = rand_mask((b, n, 3, 2), seed=53)  # ceil(20/8) x ceil(140/128), not ceil(40/8) x ceil(300/128)
    out, lse = call(*to(device, q, k, v, mask), block, "BNSD", n, 0.125, actual_seq_lengths=q_lens,
                    actual_seq_lengths_kv=kv_lens, softmax_lse_flag=1)
    ro, rl = reference(q, k, v, mask, block, 0.125, "BNSD", q_lens, kv_lens)
    torch.testing.assert_close(out.cpu().double(), ro, atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(lse.cpu().double(), rl, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_default_scale_zero_and_lse_flag_off(device):
    """The schema default scale_value=0.0 is used as given: every kept logit is 0, so each row is the
    plain mean of its kept values; softmax_lse_flag=0 leaves softmax_lse unwritten (zeros here)."""
    b, n, s1, s2, d = 1, 1, 4, 256, 64
    q, k, v = rand((b, n, s1, d), seed=16), rand((b, n, s2, d), seed=17), rand((b, n, s2, d), seed=18)
    mask = torch.tensor([[[[1, 0], [0, 1], [1, 1], [0, 0]]]], dtype=torch.int8)
    out, lse = torch_npu.npu_block_sparse_attention(*to(device, q, k, v, mask), [1, 128],
                                                    q_input_layout="BNSD", kv_input_layout="BNSD")
    expect = torch.stack([v[0, 0, :128].mean(0), v[0, 0, 128:].mean(0), v[0, 0].mean(0), torch.zeros(d)])
    torch.testing.assert_close(out[0, 0].cpu(), expect, atol=1e-5, rtol=1e-5)
    assert lse.shape == (b, n, s1, 1) and lse.dtype == torch.float32 and (lse == 0).all()


def test_fake_and_meta_shapes():
    q = torch.empty(30, 4, 64, dtype=torch.float16, device="meta")
    k = torch.empty(300, 2, 64, dtype=torch.float16, device="meta")
    mask = torch.ones(2, 4, 2, 2, dtype=torch.int8, device="meta")
    out, lse = call(q, k, k, mask, [16, 128], "TND", 2, 0.1, actual_seq_lengths=[10, 20],
                    actual_seq_lengths_kv=[150, 150], softmax_lse_flag=1)
    assert out.shape == (30, 4, 64) and out.dtype == torch.float16 and out.device.type == "meta"
    assert lse.shape == (30, 4, 1) and lse.dtype == torch.float32
    with FakeTensorMode():
        q = torch.empty(2, 4, 40, 128, dtype=torch.bfloat16)
        k = torch.empty(2, 1, 256, 128, dtype=torch.bfloat16)
        mask = torch.ones(2, 4, 1, 2, dtype=torch.int8)
        out, lse = call(q, k, k, mask, [64, 128], "BNSD", 1, 0.1, inner_precise=0)
        assert out.shape == (2, 4, 40, 128) and out.dtype == torch.bfloat16
        assert lse.shape == (2, 4, 40, 1) and lse.dtype == torch.float32
        dq, dk, dv = torch_npu.npu_block_sparse_attention_backward(
            torch.empty(2, 4, 40, 128, dtype=torch.bfloat16), q, torch.empty(2, 4, 256, 128, dtype=torch.bfloat16),
            torch.empty(2, 4, 256, 128, dtype=torch.bfloat16), torch.empty(2, 4, 40, 128, dtype=torch.bfloat16),
            torch.empty(2, 4, 40, 1), mask, [64, 128], None, None, q_input_layout="BNSD", kv_input_layout="BNSD",
            num_key_value_heads=4, scale_value=0.1)
        assert dq.shape == (2, 4, 40, 128) and dk.shape == dv.shape == (2, 4, 256, 128)


# ------------------------------------------------------------------ backward

def _grad_case(dtype, seed=20):
    b, n, s1, s2, d, block = 2, 2, 24, 256, 64, [8, 128]
    q, k, v = rand((b, n, s1, d), dtype, seed), rand((b, n, s2, d), dtype, seed + 1), rand((b, n, s2, d), dtype,
                                                                                         seed + 2)
    mask = rand_mask((b, n, 3, 2), seed=seed + 3)
    mask[1, 0, 2] = 0  # rows with no key: zero gradients
    dout = rand((b, n, s1, d), dtype, seed + 4)
    return q, k, v, mask, dout, block


@pytest.mark.parametrize("dtype,atol", [(torch.float32, 2e-5), (torch.float16, 1e-2), (torch.bfloat16, 6e-2)])
@pytest.mark.parametrize("device", DEVICES)
def test_autograd_and_explicit_backward(device, dtype, atol):
    q, k, v, mask, dout, block = _grad_case(dtype)
    scale = 0.125
    inner = 0 if dtype == torch.bfloat16 else 1
    leaves = [t.to(device).requires_grad_() for t in (q, k, v)]
    out, lse = call(*leaves, mask.to(device), block, "BNSD", 2, scale, inner_precise=inner, softmax_lse_flag=1)
    grads = torch.autograd.grad(out, leaves, dout.to(device))
    ref_leaves = [t.double().requires_grad_() for t in (q, k, v)]
    ro, _ = reference(*ref_leaves, mask, block, scale, "BNSD")
    ref_grads = torch.autograd.grad(ro, ref_leaves, dout.double())
    for g, r, like in zip(grads, ref_grads, (q, k, v)):
        assert g.dtype == like.dtype and g.shape == like.shape and g.device.type == device
        torch.testing.assert_close(g.cpu().double(), r, atol=atol, rtol=atol)
    assert (grads[0][1, 0, 16:] == 0).all()
    explicit = torch_npu.npu_block_sparse_attention_backward(
        dout.to(device), *to(device, q, k, v), out.detach(), lse, mask.to(device), block,
        actual_seq_lengths=[24, 24], actual_seq_lengths_kv=[256, 256], q_input_layout="BNSD",
        kv_input_layout="BNSD", num_key_value_heads=2, scale_value=scale)
    for e, r in zip(explicit, ref_grads):
        torch.testing.assert_close(e.cpu().double(), r, atol=atol, rtol=atol)


def test_explicit_backward_with_reference_lse():
    """The backward op reads the given softmax_lse (and attention_out): feed the reference's."""
    q, k, v, mask, dout, block = _grad_case(torch.float32, seed=30)
    leaves = [t.double().requires_grad_() for t in (q, k, v)]
    ro, rl = reference(*leaves, mask, block, 0.2, "BNSD")
    ref_grads = torch.autograd.grad(ro, leaves, dout.double())
    got = torch_npu.npu_block_sparse_attention_backward(
        dout.npu(), q.npu(), k.npu(), v.npu(), ro.detach().float().npu(), rl.detach().float().squeeze(-1).npu(),
        mask.npu(), block, None, None, q_input_layout="BNSD", kv_input_layout="BNSD", num_key_value_heads=2,
        scale_value=0.2)
    for g, r in zip(got, ref_grads):
        torch.testing.assert_close(g.cpu().double(), r, atol=3e-5, rtol=1e-5)
    # block_shape None is the adapter's default [128, 128]
    mask = rand_mask((2, 2, 1, 2), seed=31)
    ro, rl = reference(*leaves, mask, [128, 128], 0.2, "BNSD")
    ref_grads = torch.autograd.grad(ro, leaves, dout.double())
    got = torch_npu.npu_block_sparse_attention_backward(
        dout, q, k, v, ro.detach().float(), rl.detach().float(), mask, None, None, None,
        q_input_layout="BNSD", kv_input_layout="BNSD", num_key_value_heads=2, scale_value=0.2)
    for g, r in zip(got, ref_grads):
        torch.testing.assert_close(g.double(), r, atol=3e-5, rtol=1e-5)


def test_gradcheck_float64():
    b, n, s1, s2, d, block = 1, 2, 12, 256, 64, [4, 128]
    q, k, v = (rand(s, torch.float64, i).requires_grad_() for i, s in
               enumerate([(b, n, s1, d), (b, n, s2, d), (b, n, s2, d)]))
    mask = rand_mask((b, n, 3, 2), seed=40)
    mask[0, 1, 0] = 0

    def fn(q_, k_, v_):
        return call(q_, k_, v_, mask, block, "BNSD", n, 0.3, actual_seq_lengths=[10], actual_seq_lengths_kv=[200])[0]

    assert torch.autograd.gradcheck(fn, (q, k, v), fast_mode=True)
    mask = mask.npu()
    assert torch.autograd.gradcheck(fn, (q.detach().npu().requires_grad_(), k.detach().npu().requires_grad_(),
                                         v.detach().npu().requires_grad_()), fast_mode=True)


def test_backward_supports_only_bnsd_mha():
    q, k, v, mask = rand((1, 4, 8, 64)), rand((1, 2, 128, 64)), rand((1, 2, 128, 64)), torch.ones(1, 4, 1, 1,
                                                                                                   dtype=torch.int8)
    q.requires_grad_()
    out, _ = call(q, k, v, mask, [8, 128], "BNSD", 2, 0.1)
    with pytest.raises(RuntimeError, match="only the BNSD layout with num_heads == num_key_value_heads"):
        out.sum().backward()
    qt, kt = rand((8, 2, 64)), rand((128, 2, 64))
    with pytest.raises(RuntimeError, match="only the BNSD layout"):
        torch_npu.npu_block_sparse_attention_backward(qt, qt, kt, kt, qt, torch.zeros(8, 2, 1), mask[:, :2],
                                                      [8, 128], actual_seq_lengths=[8], actual_seq_lengths_kv=[128],
                                                      q_input_layout="TND", kv_input_layout="TND",
                                                      num_key_value_heads=2, scale_value=0.1)
    with pytest.raises(RuntimeError, match="actual_seq_lengths must be specified when q_input_layout is TND"):
        torch_npu.npu_block_sparse_attention_backward(qt, qt, kt, kt, qt, torch.zeros(8, 2, 1), mask[:, :2],
                                                      [8, 128], None, None, q_input_layout="TND",
                                                      kv_input_layout="TND",
                                                      num_key_value_heads=2, scale_value=0.1)


# ------------------------------------------------------------------ errors

def _good():
    q, k = rand((1, 2, 16, 64), torch.float16), rand((1, 2, 128, 64), torch.float16)
    return dict(query=q, key=k, value=k.clone(), block_sparse_mask=torch.ones(1, 2, 2, 1, dtype=torch.int8),
                block_shape=[8, 128], q_input_layout="BNSD", kv_input_layout="BNSD", num_key_value_heads=2,
                scale_value=0.1)


@pytest.mark.parametrize("change,message", [
    (dict(value=rand((1, 2, 128, 64), torch.bfloat16)), "query, key, value must have the same dtype"),
    (dict(inner_precise=4), "inner_precise 4 is only supported on Ascend 950"),
    (dict(inner_precise=2), "inner_precise must be 0, 1 or 4"),
    (dict(block_shape=[8, 64]), "block_y must be a multiple of 128"),
    (dict(block_shape=[0, 128]), "block_shape values must be > 0"),
    (dict(block_shape=[8]), "block_shape must hold two elements"),
    (dict(kv_input_layout="TND"), "must be the same"),
    (dict(q_input_layout="BSH", kv_input_layout="BSH"), "input layout must be one of TND, BNSD, BSND"),
    (dict(num_key_value_heads=1), "key/value have 2 heads but num_key_value_heads is 1"),
    (dict(block_sparse_mask=torch.ones(1, 2, 3, 1, dtype=torch.int8)), "block_sparse_mask shape"),
    (dict(block_sparse_mask=torch.ones(1, 2, 2, 1)), "block_sparse_mask must be int8"),
    (dict(softmax_lse_flag=2), "softmax_lse_flag must be 0 or 1"),
    (dict(actual_seq_lengths=[16]), "must be given together"),
    (dict(actual_seq_lengths=[17], actual_seq_lengths_kv=[128]), "exceeds the query S 16"),
])
def test_errors(change, message):
    kw = _good()
    kw.update(change)
    with pytest.raises(RuntimeError, match=message):
        torch_npu.npu_block_sparse_attention(**kw)


def test_errors_shapes_and_dtypes():
    kw = _good()
    kw.update(query=rand((1, 2, 16, 32), torch.float16), key=rand((1, 2, 128, 32), torch.float16))
    kw["value"] = kw["key"]
    with pytest.raises(RuntimeError, match="head_dim D must be 64 or 128"):
        torch_npu.npu_block_sparse_attention(**kw)
    kw = _good()
    kw.update({k: v.bfloat16() for k, v in kw.items() if k in ("query", "key", "value")})
    with pytest.raises(RuntimeError, match="when query/key/value are bfloat16, inner_precise must be 0, got 1"):
        torch_npu.npu_block_sparse_attention(**kw)
    q, k = rand((10, 2, 64)), rand((130, 1, 64))
    mask = torch.ones(1, 2, 2, 2, dtype=torch.int8)
    with pytest.raises(RuntimeError, match="actual_seq_lengths must be specified when q_input_layout is TND"):
        torch_npu.npu_block_sparse_attention(q, k, k, mask, [8, 128])
    with pytest.raises(RuntimeError, match=r"sum of actual_seq_lengths \(9\) != query T \(10\)"):
        torch_npu.npu_block_sparse_attention(q, k, k, mask, [8, 128], actual_seq_lengths=[9],
                                             actual_seq_lengths_kv=[130])
