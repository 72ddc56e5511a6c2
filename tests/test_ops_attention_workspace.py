"""Workspace allocators of the graph-capture flows (torch_npu/op_plugin/attention/workspace.py) and the capture flows
themselves: workspace -> ``.out`` inside ``torch.npu.graph``, replay, task-group update."""
import math

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import torch_npu

from _op_helpers import DEVICES


def _ref_attention(q, k, v, scale, kv_lens=None):
    """softmax(scale q k^T) v per (batch, head) in float64; q/k/v [B, N, S, D]; keys >= kv_lens[b] dropped."""
    q, k, v = q.double(), k.double(), v.double()
    out = torch.empty(q.shape[:3] + (v.shape[-1],), dtype=torch.float64)
    for b in range(q.shape[0]):
        n_kv = k.shape[2] if kv_lens is None else kv_lens[b]
        for h in range(q.shape[1]):
            s = scale * q[b, h] @ k[b, h, :n_kv].T
            p = torch.exp(s - s.max(-1, keepdim=True).values)
            out[b, h] = (p / p.sum(-1, keepdim=True)) @ v[b, h, :n_kv]
    return out


def _bsh_to_bnsd(x, n):
    b, s, h = x.shape
    return x.reshape(b, s, n, h // n).permute(0, 2, 1, 3)


# ---------------------------------------------------------------- the allocators


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_fia_workspaces_are_1d_in_query_dtype(device, dtype):
    q = torch.randn(2, 3, 64, dtype=dtype, device=device)
    kv = torch.randn(2, 5, 64, dtype=dtype, device=device)
    for fn, kw in ((torch_npu._npu_fused_infer_attention_score_get_max_workspace, dict(num_heads=4)),
                   (torch_npu._npu_fused_infer_attention_score_v2_get_max_workspace, dict(num_query_heads=4))):
        ws = fn(q, kv, kv, input_layout="BSH", **kw)
        assert ws.dim() == 1 and ws.dtype == dtype and ws.device.type == device
        assert ws.numel() == 0  # the emulated kernels use no scratch memory


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_fa_v3_workspaces_are_1d_in_query_dtype(device, dtype):
    q = torch.randn(2, 4, 8, 16, dtype=dtype, device=device)  # BNSD
    ws = torch_npu._npu_fusion_attention_v3_get_max_workspace(q, q, q, 4, "BNSD", scale=0.25)
    assert ws.shape == (0,) and ws.dtype == dtype and ws.device.type == device
    ws = torch_npu._npu_fusion_attention_grad_v3_get_max_workspace(q, q, q, q, 4, "BNSD", scale_value=0.25)
    assert ws.shape == (0,) and ws.dtype == dtype and ws.device.type == device


def test_workspaces_on_fake_tensors():
    with FakeTensorMode():
        q = torch.empty(2, 8, 4, 16, dtype=torch.float16)  # BSND
        ws = torch_npu._npu_fused_infer_attention_score_get_max_workspace(q, q, q, num_heads=4, input_layout="BSND")
        assert ws.shape == (0,) and ws.dtype == torch.float16
        ws = torch_npu._npu_fusion_attention_v3_get_max_workspace(q, q, q, 4, "BSND")
        assert ws.shape == (0,) and ws.dtype == torch.float16
    q = torch.empty(2, 8, 64, device="meta")
    ws = torch_npu._npu_fused_infer_attention_score_v2_get_max_workspace(q, q, q, num_query_heads=4)
    assert ws.shape == (0,) and ws.device.type == "meta"


def test_workspace_argument_errors():
    q = torch.randn(2, 8, 64)
    with pytest.raises(RuntimeError, match="input_layout 'XYZ' is not supported"):
        torch_npu._npu_fused_infer_attention_score_get_max_workspace(q, q, q, input_layout="XYZ")
    with pytest.raises(RuntimeError, match="query must be 4-D for layout BNSD"):
        torch_npu._npu_fused_infer_attention_score_v2_get_max_workspace(q, q, q, input_layout="BNSD")
    with pytest.raises(RuntimeError, match="head_num must > 0"):
        torch_npu._npu_fusion_attention_v3_get_max_workspace(q, q, q, 0, "BSH")
    with pytest.raises(RuntimeError, match=r"keep_prob value must be in range of \(0, 1\]"):
        torch_npu._npu_fusion_attention_v3_get_max_workspace(q, q, q, 4, "BSH", keep_prob=0.0)
    with pytest.raises(RuntimeError, match="input_layout must be BSH, SBH, BSND, BNSD or TND"):
        torch_npu._npu_fusion_attention_grad_v3_get_max_workspace(q, q, q, q, 4, "NSD")
    with pytest.raises(RuntimeError, match="should be 3 or 4 dimensional"):
        torch_npu._npu_fusion_attention_grad_v3_get_max_workspace(q[0], q, q, q, 4, "BSH")


# ---------------------------------------------------------------- the capture flows


def test_fia_out_with_workspace_captured_and_replayed():
    torch.manual_seed(0)
    n, scale = 4, 0.25
    q = torch.randn(2, 3, 64, device="npu")
    k = torch.randn(2, 7, 64, device="npu")
    v = torch.randn(2, 7, 64, device="npu")
    kw = dict(num_heads=n, input_layout="BSH", scale=scale)
    ws = torch_npu._npu_fused_infer_attention_score_get_max_workspace(q, k, v, **kw)
    out, lse = torch.empty_like(q), torch.empty(1, device="npu")
    g = torch.npu.NPUGraph()
    with torch.npu.graph(g):
        torch_npu.npu_fused_infer_attention_score.out(q, k, v, workspace=ws, attention_out=out, softmax_lse=lse, **kw)
    for _ in range(2):  # new data into the captured inputs, replay, compare with eager and the formula
        q.copy_(torch.randn_like(q))
        v.copy_(torch.randn_like(v))
        g.replay()
        eager, _ = torch_npu.npu_fused_infer_attention_score(q, k, v, **kw)
        assert torch.equal(out.cpu(), eager.cpu())
        ref = _ref_attention(_bsh_to_bnsd(q.cpu(), n), _bsh_to_bnsd(k.cpu(), n), _bsh_to_bnsd(v.cpu(), n), scale)
        torch.testing.assert_close(_bsh_to_bnsd(out.cpu(), n).double(), ref, rtol=1e-5, atol=1e-5)


def _capture_fia_decode_group(kv_lens):
    """The decode-graph flow of serving frameworks: workspace and outputs allocated up front, the
    .out call captured as its own task group (so its lengths can be updated later)."""
    torch.manual_seed(1)
    n, scale = 2, 1 / math.sqrt(16)
    q = torch.randn(2, 2, 1, 16, device="npu")     # BNSD decode query
    k = torch.randn(2, 2, 12, 16, device="npu")
    v = torch.randn(2, 2, 12, 16, device="npu")
    kw = dict(num_heads=n, input_layout="BNSD", scale=scale)
    ws = torch_npu._npu_fused_infer_attention_score_get_max_workspace(q, k, v, actual_seq_lengths_kv=kv_lens, **kw)
    out, lse = torch_npu._npu_fused_infer_attention_score_infer_output(q, v, input_layout="BNSD", num_heads=n)
    g = torch.npu.NPUGraph()
    with torch.npu.graph(g):
        stream = torch.npu.current_stream()
        torch.npu.graph_task_group_begin(stream)
        torch_npu.npu_fused_infer_attention_score.out(q, k, v, actual_seq_lengths_kv=kv_lens, workspace=ws,
                                                      attention_out=out, softmax_lse=lse, **kw)
        handle = torch.npu.graph_task_group_end(stream)
    q.copy_(torch.randn_like(q))
    g.replay()
    torch.testing.assert_close(out.cpu().double(), _ref_attention(q.cpu(), k.cpu(), v.cpu(), scale, kv_lens=kv_lens),
                               rtol=1e-5, atol=1e-5)
    return g, handle, (q, k, v, ws, out, lse, kw)


def test_fia_out_task_group_with_kv_lengths_captured():
    _capture_fia_decode_group([11, 10])


def test_fia_out_task_group_update_of_kv_lengths():
    # an emulated custom op is recorded as its ATen ops: the update's ops must read the captured
    # intermediates at replay, not the update run's own
    g, handle, (q, k, v, ws, out, lse, kw) = _capture_fia_decode_group([11, 10])
    update_stream = torch.npu.Stream()
    with torch.npu.stream(update_stream):
        torch.npu.graph_task_update_begin(update_stream, handle)
        torch_npu.npu_fused_infer_attention_score.out(q, k, v, actual_seq_lengths_kv=[5, 9], workspace=ws,
                                                      attention_out=out, softmax_lse=lse, **kw)
        torch.npu.graph_task_update_end(update_stream)
    q.copy_(torch.randn_like(q))
    g.replay()
    ref = _ref_attention(q.cpu(), k.cpu(), v.cpu(), kw["scale"], kv_lens=[5, 9])
    torch.testing.assert_close(out.cpu().double(), ref, rtol=1e-5, atol=1e-5)


def test_fia_v2_out_with_workspace_captured():
    torch.manual_seed(2)
    q = torch.randn(1, 4, 2, 8, device="npu")    # BSND
    kv = torch.randn(1, 6, 2, 8, device="npu")
    kw = dict(num_query_heads=2, input_layout="BSND", softmax_scale=0.5)
    ws = torch_npu._npu_fused_infer_attention_score_v2_get_max_workspace(q, kv, kv, **kw)
    out, lse = torch.empty_like(q), torch.empty(1, device="npu")
    g = torch.npu.NPUGraph()
    with torch.npu.graph(g):
        torch_npu.npu_fused_infer_attention_score_v2.out(q, kv, kv, workspace=ws, attention_out=out,
                                                         softmax_lse=lse, **kw)
    q.copy_(torch.randn_like(q))
    g.replay()
    perm = (0, 2, 1, 3)
    ref = _ref_attention(q.cpu().permute(perm), kv.cpu().permute(perm), kv.cpu().permute(perm), 0.5)
    torch.testing.assert_close(out.cpu().permute(perm).double(), ref, rtol=1e-5, atol=1e-5)


def test_fa_v3_forward_and_grad_out_with_workspace_captured():
    torch.manual_seed(3)
    n, scale = 2, 0.3
    q = torch.randn(2, 5, n, 8, device="npu")   # BSND
    k = torch.randn(2, 6, n, 8, device="npu")
    v = torch.randn(2, 6, n, 8, device="npu")
    ws = torch_npu._npu_fusion_attention_v3_get_max_workspace(q, k, v, n, "BSND", scale=scale)
    outs = list(torch_npu._npu_fusion_attention_v3_infer_output(q, k, v, n, "BSND"))
    outs += [torch.empty_like(outs[1]), torch.empty(1, dtype=torch.int64, device="npu"),
             torch.empty(1, dtype=torch.int64, device="npu")]
    names = ("attention_score", "softmax_max", "softmax_sum", "softmax_out", "seed", "offset")
    g = torch.npu.NPUGraph()
    with torch.npu.graph(g):
        torch_npu.npu_fusion_attention_v3.out(q, k, v, n, "BSND", scale=scale, workspace=ws,
                                              **dict(zip(names, outs)))
    q.copy_(torch.randn_like(q))
    g.replay()
    perm = (0, 2, 1, 3)
    ref = _ref_attention(q.cpu().permute(perm), k.cpu().permute(perm), v.cpu().permute(perm), scale)
    torch.testing.assert_close(outs[0].cpu().permute(perm).double(), ref, rtol=1e-5, atol=1e-5)

    # backward: workspace + infer_output + .out equals autograd of the formula
    dy = torch.randn_like(q)
    gws = torch_npu._npu_fusion_attention_grad_v3_get_max_workspace(q, k, v, dy, n, "BSND", scale_value=scale)
    dq, dk, dv, dpse, dsink = torch_npu._npu_fusion_attention_grad_v3_infer_output(q, k, v)
    torch_npu.npu_fusion_attention_grad_v3.out(q, k, v, dy, n, "BSND", softmax_max=outs[1], softmax_sum=outs[2],
                                               attention_in=outs[0], scale_value=scale, workspace=gws,
                                               dq=dq, dk=dk, dv=dv, dpse=dpse, dsink=dsink)
    qr, kr, vr = (t.cpu().double().permute(perm).requires_grad_() for t in (q, k, v))
    p = torch.softmax(scale * qr @ kr.transpose(-1, -2), -1)
    (p @ vr).backward(dy.cpu().double().permute(perm))
    for got, want in ((dq, qr.grad), (dk, kr.grad), (dv, vr.grad)):
        torch.testing.assert_close(got.cpu().permute(perm).double(), want, rtol=1e-4, atol=1e-5)


def test_workspace_and_out_inside_torch_compile():
    """torchair's static-workspace rewrite puts the allocator and the .out call in the traced graph:
    both must trace on FakeTensors (fullgraph) and the compiled result equal the formula."""
    def step(q, k, v):
        ws = torch.ops.npu._npu_fused_infer_attention_score_get_max_workspace(q, k, v, num_heads=2,
                                                                              input_layout="BSH", scale=0.5)
        out, lse = torch.ops.npu._npu_fused_infer_attention_score_infer_output(q, v, input_layout="BSH", num_heads=2)
        out, _ = torch.ops.npu.npu_fused_infer_attention_score.out(q, k, v, num_heads=2, input_layout="BSH",
                                                                   scale=0.5, workspace=ws, attention_out=out,
                                                                   softmax_lse=lse)
        return out, ws

    torch.manual_seed(4)
    q = torch.randn(1, 3, 16, device="npu")
    k, v = torch.randn(1, 5, 16, device="npu"), torch.randn(1, 5, 16, device="npu")
    out, ws = torch.compile(step, fullgraph=True, backend="aot_eager")(q, k, v)
    assert ws.shape == (0,) and ws.dtype == q.dtype
    ref = _ref_attention(_bsh_to_bnsd(q.cpu(), 2), _bsh_to_bnsd(k.cpu(), 2), _bsh_to_bnsd(v.cpu(), 2), 0.5)
    torch.testing.assert_close(_bsh_to_bnsd(out.cpu(), 2).double(), ref, rtol=1e-5, atol=1e-5)
