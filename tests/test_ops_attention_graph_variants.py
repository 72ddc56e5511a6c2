"""Graph-mode attention variants: npu_fusion_attention_v3 (+ grad, .out),
npu_fused_infer_attention_score.out / _v2 and the infer_output allocators."""
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import torch_npu  # noqa: F401

from _op_helpers import DEVICES, close_tol as _close

ops = torch.ops.npu


def _sdpa_ref(q, k, v, scale, causal=False):
    s = torch.matmul(q, k.transpose(-1, -2)) * scale
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), float("-inf"))
    return torch.matmul(torch.softmax(s, -1), v)


@pytest.mark.parametrize("device", DEVICES)
def test_fusion_attention_v3_bnsd_forward_backward(device):
    torch.manual_seed(12)
    q, k, v = torch.randn(1, 2, 5, 8), torch.randn(1, 2, 6, 8), torch.randn(1, 2, 6, 8)
    leaves = [t.double().requires_grad_(True) for t in (q, k, v)]
    ref = _sdpa_ref(*leaves, 0.3)
    dy = torch.randn(1, 2, 5, 8)
    r_grads = torch.autograd.grad(ref, leaves, dy.double())
    x = [t.to(device).requires_grad_(True) for t in (q, k, v)]
    out, smax, ssum, sout, seed, offset = torch_npu.npu_fusion_attention_v3(x[0], x[1], x[2], 2, "BNSD", scale=0.3)
    _close(out, ref.detach(), 1e-5, 1e-5)
    assert smax.shape == (1, 2, 5, 8) and smax.dtype == torch.float32
    assert seed.shape == (1,) and seed.dtype == torch.int64 and offset.shape == (1,) and offset.dtype == torch.int64
    assert seed.device.type == device
    out.backward(dy.to(device))
    for got, r in zip((x[0].grad, x[1].grad, x[2].grad), r_grads):
        _close(got, r, 1e-5, 1e-5)
    dq, dk, dv, dpse, dsink = torch_npu.npu_fusion_attention_grad_v3(
        q.to(device), k.to(device), v.to(device), dy.to(device), 2, "BNSD", softmax_max=smax, softmax_sum=ssum,
        attention_in=out.detach(), scale_value=0.3, seed=seed, offset=offset)
    for got, r in zip((dq, dk, dv), r_grads):
        _close(got, r, 1e-5, 1e-5)


def test_fusion_attention_v3_tnd_with_tensor_lengths_and_out():
    torch.manual_seed(13)
    q, k, v = torch.randn(5, 2, 8), torch.randn(5, 2, 8), torch.randn(5, 2, 8)
    cq = torch.tensor([2, 5])
    res = torch_npu.npu_fusion_attention_v3(q, k, v, 2, "TND", scale=0.5, actual_seq_qlen=cq, actual_seq_kvlen=cq)
    ref = torch.cat([_sdpa_ref(q[a:b].transpose(0, 1).double(), k[a:b].transpose(0, 1).double(),
                               v[a:b].transpose(0, 1).double(), 0.5).transpose(0, 1) for a, b in ((0, 2), (2, 5))])
    _close(res[0], ref, 1e-5, 1e-5)
    assert res[1].shape == (5, 2, 8)
    outs = torch.ops.npu._npu_fusion_attention_v3_infer_output(q, k, v, 2, "TND")
    assert [o.shape for o in outs] == [(5, 2, 8), (5, 2, 8), (5, 2, 8)]
    extra = [torch.empty(0), torch.empty(1, dtype=torch.int64), torch.empty(1, dtype=torch.int64)]
    got = torch.ops.npu.npu_fusion_attention_v3.out(q, k, v, 2, "TND", scale=0.5, actual_seq_qlen=cq,
                                                    actual_seq_kvlen=cq, attention_score=outs[0],
                                                    softmax_max=outs[1], softmax_sum=outs[2], softmax_out=extra[0],
                                                    seed=extra[1], offset=extra[2])
    assert got[0] is outs[0] and got[4] is extra[1]
    _close(outs[0], ref, 1e-5, 1e-5)
    grads = torch.ops.npu._npu_fusion_attention_grad_v3_infer_output(q, k, v)
    assert [g.shape for g in grads] == [(5, 2, 8)] * 3 + [(0,), (0,)]
    dy = torch.randn(5, 2, 8)
    full = torch_npu.npu_fusion_attention_grad_v3(q, k, v, dy, 2, "TND", scale_value=0.5, actual_seq_qlen=cq,
                                                  actual_seq_kvlen=cq)
    got = torch.ops.npu.npu_fusion_attention_grad_v3.out(q, k, v, dy, 2, "TND", scale_value=0.5, actual_seq_qlen=cq,
                                                         actual_seq_kvlen=cq, dq=grads[0], dk=grads[1], dv=grads[2],
                                                         dpse=grads[3], dsink=grads[4])
    assert got[0] is grads[0]
    for a, b in zip(got[:3], full[:3]):
        torch.testing.assert_close(a, b)


def test_fusion_attention_v3_fake_bsh():
    with FakeTensorMode():
        q = torch.randn(2, 4, 32).half()
        res = ops.npu_fusion_attention_v3(q, q, q, 4, "BSH")
        outs = ops._npu_fusion_attention_v3_infer_output(q, q, q, 4, "SBH")
    assert res[0].shape == (2, 4, 32) and res[1].shape == (2, 4, 4, 8) and res[4].shape == (1,)
    assert outs[1].shape == (4, 4, 2, 8)


@pytest.mark.parametrize("device", DEVICES)
def test_fused_infer_attention_score_out(device):
    torch.manual_seed(14)
    q, k, v = torch.randn(1, 2, 3, 8), torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8)
    ref = _sdpa_ref(q.double(), k.double(), v.double(), 0.4)
    s = torch.matmul(q.double(), k.double().transpose(-1, -2)) * 0.4
    ref_lse = torch.logsumexp(s, -1, keepdim=True)
    out, lse = torch.ops.npu._npu_fused_infer_attention_score_infer_output(
        q.to(device), v.to(device), input_layout="BNSD", num_heads=2, softmax_lse_flag=True)
    assert out.shape == (1, 2, 3, 8) and lse.shape == (1, 2, 3, 1) and lse.dtype == torch.float32
    got = torch.ops.npu.npu_fused_infer_attention_score.out(
        q.to(device), k.to(device), v.to(device), num_heads=2, scale=0.4, input_layout="BNSD",
        softmax_lse_flag=True, attention_out=out, softmax_lse=lse)
    assert got[0] is out and got[1] is lse
    _close(out, ref, 1e-5, 1e-5)
    _close(lse, ref_lse, 1e-5, 1e-5)


def test_fused_infer_attention_infer_output_shapes():
    q_bsh, v_bsh = torch.empty(2, 3, 32), torch.empty(2, 7, 16)  # N = 4, N_kv = 2 -> D_v = 8
    out, lse = torch.ops.npu._npu_fused_infer_attention_score_infer_output(q_bsh, v_bsh, num_heads=4,
                                                                           num_key_value_heads=2)
    assert out.shape == (2, 3, 32) and lse.shape == (0,)
    out, lse = torch.ops.npu._npu_fused_infer_attention_score_infer_output(
        torch.empty(2, 4, 3, 16), torch.empty(2, 4, 9, 16), input_layout="BNSD_BSND", num_heads=4,
        softmax_lse_flag=True)
    assert out.shape == (2, 3, 4, 16) and lse.shape == (2, 4, 3, 1)
    out, lse = torch.ops.npu._npu_fused_infer_attention_score_infer_output(
        torch.empty(6, 4, 16, dtype=torch.int8), torch.empty(6, 4, 8), input_layout="TND", num_heads=4,
        softmax_lse_flag=True)
    assert out.shape == (6, 4, 8) and out.dtype == torch.float16 and lse.shape == (6, 4, 1)
    out, _ = torch.ops.npu._npu_fused_infer_attention_score_v2_infer_output(
        torch.empty(2, 3, 32).bfloat16(), torch.empty(2, 7, 32), num_query_heads=4, quant_scale_out=torch.empty(1))
    assert out.dtype == torch.int8
    with pytest.raises(NotImplementedError, match="out_dtype"):
        torch.ops.npu._npu_fused_infer_attention_score_v2_infer_output(torch.empty(2, 3, 32), torch.empty(2, 7, 32),
                                                                       num_query_heads=4, out_dtype=1)
    with pytest.raises(RuntimeError, match="not supported"):
        torch.ops.npu._npu_fused_infer_attention_score_infer_output(q_bsh, v_bsh, input_layout="XYZ")


@pytest.mark.parametrize("device", DEVICES)
def test_fused_infer_attention_score_v2_gqa_bnsd_and_bsh(device):
    torch.manual_seed(22)
    q, k, v = torch.randn(2, 4, 3, 8), torch.randn(2, 2, 6, 8), torch.randn(2, 2, 6, 8)
    kr, vr = k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)
    s = torch.matmul(q.double(), kr.double().transpose(-1, -2)) * 0.35
    ref = torch.matmul(torch.softmax(s, -1), vr.double())
    out, lse = torch_npu.npu_fused_infer_attention_score_v2(
        q.to(device), k.to(device), v.to(device), num_query_heads=4, num_key_value_heads=2, softmax_scale=0.35,
        input_layout="BNSD", return_softmax_lse=True)
    _close(out, ref, 1e-5, 1e-5)
    _close(lse, torch.logsumexp(s, -1, keepdim=True), 1e-5, 1e-5)
    bsh = lambda t: t.transpose(1, 2).reshape(t.shape[0], t.shape[2], -1)  # noqa: E731
    out_bsh, lse_empty = torch_npu.npu_fused_infer_attention_score_v2(
        bsh(q).to(device), bsh(k).to(device), bsh(v).to(device), num_query_heads=4, num_key_value_heads=2,
        softmax_scale=0.35)
    _close(out_bsh, bsh(ref), 1e-5, 1e-5)
    assert lse_empty.shape == (0,)
    buf_out, buf_lse = torch.empty(0, device=device), torch.empty(0, device=device)
    got = torch.ops.npu.npu_fused_infer_attention_score_v2.out(
        q.to(device), k.to(device), v.to(device), num_query_heads=4, num_key_value_heads=2, softmax_scale=0.35,
        input_layout="BNSD", return_softmax_lse=True, attention_out=buf_out, softmax_lse=buf_lse)
    assert got[0] is buf_out and buf_out.shape == (2, 4, 3, 8)
    _close(buf_out, ref, 1e-5, 1e-5)


@pytest.mark.parametrize("dtype,atol", [(torch.float16, 3e-3), (torch.bfloat16, 3e-2)])
def test_fused_infer_attention_score_v2_low_precision_and_fake(dtype, atol):
    torch.manual_seed(23)
    q, k = torch.randn(1, 2, 2, 16).to(dtype), torch.randn(1, 2, 5, 16).to(dtype)
    ref = torch.matmul(torch.softmax(torch.matmul(q.double(), k.double().transpose(-1, -2)) * 0.25, -1), k.double())
    out, _ = torch_npu.npu_fused_infer_attention_score_v2(q, k, k, num_query_heads=2, softmax_scale=0.25,
                                                          input_layout="BNSD")
    assert out.dtype == dtype
    _close(out, ref, atol, 1e-2)
    with FakeTensorMode():
        fq = torch.randn(2, 4, 3, 16).to(dtype)
        fout, flse = ops.npu_fused_infer_attention_score_v2(fq, torch.randn(2, 1, 9, 16).to(dtype),
                                                            torch.randn(2, 1, 9, 16).to(dtype), num_query_heads=4,
                                                            num_key_value_heads=1, input_layout="BNSD",
                                                            return_softmax_lse=True)
    assert fout.shape == (2, 4, 3, 16) and fout.dtype == dtype and flse.shape == (2, 4, 3, 1)


def test_fused_infer_attention_score_v2_not_emulated_arguments():
    q = torch.randn(1, 2, 2, 16)
    with pytest.raises(NotImplementedError, match="quant_scale_out"):
        torch_npu.npu_fused_infer_attention_score_v2(q, q, q, num_query_heads=2, input_layout="BNSD",
                                                     quant_scale_out=torch.ones(1))
    with pytest.raises(NotImplementedError, match="learnable_sink"):
        torch_npu.npu_fused_infer_attention_score_v2(q, q, q, num_query_heads=2, input_layout="BNSD",
                                                     learnable_sink=torch.ones(2))
    with pytest.raises(NotImplementedError, match="key_quant_mode"):
        torch_npu.npu_fused_infer_attention_score_v2(q, q, q, num_query_heads=2, input_layout="BNSD",
                                                     key_quant_mode=1)
