"""npu_ring_attention_update on the CPU-emulated NPU.

Checked two ways: against the documented merge formula written here in float64, and end to
end: attention over all keys equals the ring update of attention over two key halves
(npu_fusion_attention's output and softmax_max / softmax_sum, SBH and TND).
"""
import pytest
import torch

import torch_npu

from _op_helpers import DEVICES, randn as rand


def stats(shape, seed):
    """positive softmax sums and arbitrary maxes, repeated over the last dim of 8."""
    base = rand(shape[:-1], seed=seed)
    return base.unsqueeze(-1).expand(*shape).contiguous()


def ref_merge(po, pm, ps, co, cm, cs):
    m = torch.maximum(pm, cm)
    sp, sc = ps * torch.exp(pm - m), cs * torch.exp(cm - m)
    total = sp + sc
    return sp / total, sc / total, m, total


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_formula_sbh(device, dtype):
    s, b, n, d = 5, 2, 3, 4
    po, co = rand((s, b, n * d), dtype, device, 1), rand((s, b, n * d), dtype, device, 2)
    pm, cm = stats((b, n, s, 8), 3).to(device), stats((b, n, s, 8), 4).to(device)
    ps, cs = stats((b, n, s, 8), 5).abs().add(0.5).to(device), stats((b, n, s, 8), 6).abs().add(0.5).to(device)
    out, m, total = torch_npu.npu_ring_attention_update(po, pm, ps, co, cm, cs)
    wp, wc, rm, rt = ref_merge(*(t.cpu().double() for t in (po, pm, ps, co, cm, cs)))
    # weights per (b, n, s) applied to each head's d values of row s, batch b
    ref = torch.empty(s, b, n, d, dtype=torch.float64)
    for si in range(s):
        for bi in range(b):
            for ni in range(n):
                p = po[si, bi, ni * d:(ni + 1) * d].cpu().double()
                c = co[si, bi, ni * d:(ni + 1) * d].cpu().double()
                ref[si, bi, ni] = p * wp[bi, ni, si, 0] + c * wc[bi, ni, si, 0]
    assert out.dtype == dtype and out.shape == po.shape and out.device.type == device
    tol = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}[dtype]
    torch.testing.assert_close(out.cpu().double(), ref.reshape(s, b, n * d), rtol=tol, atol=tol)
    torch.testing.assert_close(m.cpu().double(), rm, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(total.cpu().double(), rt, rtol=1e-5, atol=1e-6)
    assert m.dtype == total.dtype == torch.float32 and m.shape == (b, n, s, 8)


@pytest.mark.parametrize("device", DEVICES)
def test_two_key_halves_equal_full_attention_sbh(device):
    s1, s2, b, n, d = 6, 10, 2, 2, 8
    q = rand((s1, b, n * d), device=device, seed=1)
    k = rand((s2, b, n * d), device=device, seed=2)
    v = rand((s2, b, n * d), device=device, seed=3)
    full = torch_npu.npu_fusion_attention(q, k, v, n, "SBH", scale=0.3)[0]
    a = torch_npu.npu_fusion_attention(q, k[:4], v[:4], n, "SBH", scale=0.3)
    c = torch_npu.npu_fusion_attention(q, k[4:], v[4:], n, "SBH", scale=0.3)
    out, m, total = torch_npu.npu_ring_attention_update(a[0], a[1], a[2], c[0], c[1], c[2])
    torch.testing.assert_close(out, full, rtol=1e-5, atol=1e-5)
    whole = torch_npu.npu_fusion_attention(q, k, v, n, "SBH", scale=0.3)
    torch.testing.assert_close(m, whole[1], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(total, whole[2], rtol=1e-5, atol=1e-5)


def test_two_key_halves_equal_full_attention_tnd():
    n, d = 2, 8
    q, k, v = rand((7, n, d), seed=1), rand((9, n, d), seed=2), rand((9, n, d), seed=3)
    # one batch of 7 queries over 9 keys, split into 5 + 4 keys
    full = torch_npu.npu_fusion_attention(q, k, v, n, "TND", actual_seq_qlen=[7], actual_seq_kvlen=[9])
    a = torch_npu.npu_fusion_attention(q, k[:5], v[:5], n, "TND", actual_seq_qlen=[7], actual_seq_kvlen=[5])
    c = torch_npu.npu_fusion_attention(q, k[5:], v[5:], n, "TND", actual_seq_qlen=[7], actual_seq_kvlen=[4])
    out, m, total = torch_npu.npu_ring_attention_update(a[0], a[1], a[2], c[0], c[1], c[2],
                                                        actual_seq_qlen=torch.tensor([7]), input_layout="TND")
    torch.testing.assert_close(out, full[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(m, full[1], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(total, full[2], rtol=1e-5, atol=1e-5)


def test_gradcheck_and_meta():
    t, n, d = 3, 2, 4
    po = rand((t, n, d), torch.float64, seed=1).requires_grad_()
    co = rand((t, n, d), torch.float64, seed=2).requires_grad_()
    pm, cm = stats((t, n, 8), 3).double(), stats((t, n, 8), 4).double()
    ps, cs = stats((t, n, 8), 5).abs().add(0.5).double(), stats((t, n, 8), 6).abs().add(0.5).double()

    def f(po, co):
        return torch_npu.npu_ring_attention_update(po, pm, ps, co, cm, cs, input_layout="TND")[0]

    assert torch.autograd.gradcheck(f, (po, co))
    meta = torch.empty(5, 2, 12, device="meta", dtype=torch.bfloat16)
    st = torch.empty(2, 3, 5, 8, device="meta")
    out, m, total = torch_npu.npu_ring_attention_update(meta, st, st, meta, st, st)
    assert out.shape == (5, 2, 12) and out.dtype == torch.bfloat16 and m.shape == total.shape == (2, 3, 5, 8)
    with pytest.raises(NotImplementedError, match="input_softmax_layout"):
        torch_npu.npu_ring_attention_update(meta, st, st, meta, st, st, input_softmax_layout="SBH")
