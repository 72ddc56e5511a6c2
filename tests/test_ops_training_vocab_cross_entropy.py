"""Vocab-parallel cross entropy ops (npu_fused_linear_online_max_sum,
npu_fused_cross_entropy_loss_with_max_sum and its backward) against F.cross_entropy."""
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import torch_npu  # noqa: F401

from _op_helpers import DEVICES

npu = torch.ops.npu


I8, I32, I64, F32, BF16, U8 = torch.int8, torch.int32, torch.int64, torch.float32, torch.bfloat16, torch.uint8


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("logits_dtype,tol", [(torch.float32, 1e-6), (torch.float16, 1e-3), (torch.bfloat16, 1e-2)])
def test_fused_cross_entropy_loss_with_max_sum(device, logits_dtype, tol):
    b, v = 5, 7
    logits = torch.randn(b, v).to(logits_dtype)
    ref = logits.double()
    mx = ref.max(-1).values
    sum_exp = torch.exp(ref - mx[:, None]).sum(-1)
    target = torch.tensor([0, 3, 6, 2, 1])
    predicted = ref[torch.arange(b), target] - mx
    args = [t.float().to(device) for t in (mx, sum_exp, predicted)]
    loss, softmax = npu.npu_fused_cross_entropy_loss_with_max_sum(*args, vocab_parallel_logits=logits.to(device))
    # loss = log(sum exp(l - max)) - (l[target] - max) = cross entropy of the row
    expected_loss = torch.nn.functional.cross_entropy(ref, target, reduction="none")
    assert loss.dtype == torch.float32 and softmax.dtype == torch.float32 and softmax.shape == (b, v)
    torch.testing.assert_close(loss.cpu().double(), expected_loss, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(softmax.cpu().double(), torch.softmax(ref, -1), atol=1e-6, rtol=1e-5)
    loss2, none = npu.npu_fused_cross_entropy_loss_with_max_sum(*args)
    assert none is None
    torch.testing.assert_close(loss2, loss)
    with pytest.raises(NotImplementedError, match="label_smoothing"):
        npu.npu_fused_cross_entropy_loss_with_max_sum(*args, label_smoothing=0.1)


def _vocab_ce_reference(inp, weight, target, start, end):
    """float64 statistics of one vocabulary shard, written from the npu_fused_linear_online_max_sum doc."""
    logits = inp.double() @ weight.double().t()
    mx = logits.max(-1).values
    sub = logits - mx[:, None]
    mask = [bool(t < start or t > end) for t in target.tolist()]
    masked = torch.tensor([0 if m else t - start for t, m in zip(target.tolist(), mask)])
    predicted = torch.tensor([0.0 if m else float(sub[b, masked[b]]) for b, m in enumerate(mask)],
                             dtype=torch.float64)
    padded = mask + [True] * (-len(mask) % 8)                # padding bits are 1
    packed = [sum(int(padded[8 * k + j]) << j for j in range(8)) for k in range(len(padded) // 8)]
    return mx, torch.exp(sub).sum(-1), predicted, packed, masked, logits


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_fused_linear_online_max_sum_shard(device, dtype):
    bt, h, v = 11, 6, 9
    inp, weight = torch.randn(bt, h).to(dtype), torch.randn(v, h).to(dtype)
    target = torch.tensor([0, 3, 4, 5, 9, 12, 13, 2, 7, 6, 11], dtype=torch.int32)
    start, end = 4, 12                                        # this shard owns vocabulary ids 4..12
    outs = torch_npu.npu_fused_linear_online_max_sum(inp.to(device), weight.to(device), target.to(device), start,
                                                     end, return_logits=True)
    mx, sum_exp, predicted, packed, masked, logits = _vocab_ce_reference(inp, weight, target, start, end)
    torch.testing.assert_close(outs[0].cpu().double(), mx, atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(outs[1].cpu().double(), sum_exp, atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(outs[2].cpu().double(), predicted, atol=1e-4, rtol=1e-5)
    assert outs[3].dtype == torch.uint8 and outs[3].cpu().tolist() == packed
    assert outs[4].dtype == torch.int32 and outs[4].cpu().tolist() == masked.tolist()
    assert outs[5].dtype == dtype
    torch.testing.assert_close(outs[5].cpu(), logits.to(dtype))
    assert all(o.device.type == device for o in outs)
    assert torch_npu.npu_fused_linear_online_max_sum(inp, weight, target.long(), start, end)[5] is None


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("with_softmax", [True, False])
def test_vocab_parallel_cross_entropy_single_rank_pipeline(device, with_softmax):
    """one rank owning the whole vocabulary: loss and gradients are those of plain cross entropy."""
    bt, h, v = 10, 8, 16
    g = torch.Generator().manual_seed(8)
    inp = torch.randn(bt, h, generator=g).to(torch.bfloat16)
    weight = torch.randn(v, h, generator=g).to(torch.bfloat16)
    target = torch.randint(0, v, (bt,), generator=g)
    mx, sum_exp, predicted, mask, masked, logits = torch_npu.npu_fused_linear_online_max_sum(
        inp.to(device), weight.to(device), target.to(device), 0, v - 1, return_logits=with_softmax)
    loss, softmax = torch_npu.npu_fused_cross_entropy_loss_with_max_sum(mx, sum_exp, predicted,
                                                                        vocab_parallel_logits=logits)
    x = inp.double().requires_grad_()
    w = weight.double().requires_grad_()
    ref = torch.nn.functional.cross_entropy(x @ w.t(), target, reduction="none")
    torch.testing.assert_close(loss.cpu().double(), ref.detach(), atol=1e-5, rtol=1e-5)
    upstream = torch.rand(bt, dtype=torch.float64, generator=g)
    gx, gw = torch.autograd.grad(ref, (x, w), upstream)
    if with_softmax:
        # the high-performance path's softmax comes from the logits output, which is in input's dtype,
        # normalised by the float32 statistics: exp(bf16(logits) - max) / sum_exp
        exact = inp.double() @ weight.double().t()
        soft = torch.exp(exact.to(torch.bfloat16).double() - exact.max(-1, keepdim=True).values) \
            / torch.exp(exact - exact.max(-1, keepdim=True).values).sum(-1, keepdim=True)
        grad_logits = (soft - torch.nn.functional.one_hot(target, v).double()) * upstream[:, None]
        gx, gw = grad_logits @ weight.double(), grad_logits.t() @ inp.double()
    kwargs = {"softmax": softmax} if with_softmax else {"logits_max": mx, "sum_exp_logits": sum_exp}
    ig, wg = torch_npu.npu_fused_linear_cross_entropy_loss_with_max_sum_backward(
        upstream.float().to(device), inp.to(device), weight.to(device), mask, masked, **kwargs)
    assert ig.dtype == torch.bfloat16 and wg.dtype == torch.bfloat16
    # one bfloat16 rounding of the outputs
    torch.testing.assert_close(ig.cpu().double(), gx, atol=1e-2, rtol=8e-3)
    torch.testing.assert_close(wg.cpu().double(), gw, atol=1e-2, rtol=8e-3)


def test_vocab_ce_backward_masked_rows_and_fake():
    """rows whose target is outside the shard only get the softmax term (no -1 at their target)."""
    bt, h, v = 9, 4, 5
    inp, weight = torch.randn(bt, h).half(), torch.randn(v, h).half()
    softmax = torch.rand(bt, v)
    masked_target = torch.randint(0, v, (bt,))
    rows_masked = [1, 4, 8]
    packed = torch.tensor([sum(1 << j for j in range(8) if j in rows_masked), 1 | 0b11111110], dtype=torch.uint8)
    grad = torch.rand(bt)
    g = softmax.double().clone()
    for b in range(bt):
        if b not in rows_masked:
            g[b, masked_target[b]] -= 1
    g *= grad.double()[:, None]
    ig, wg = torch_npu.npu_fused_linear_cross_entropy_loss_with_max_sum_backward(
        grad, inp, weight, packed, masked_target, softmax=softmax)
    torch.testing.assert_close(ig.double(), (g @ weight.double()).half().double(), atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(wg.double(), (g.t() @ inp.double()).half().double(), atol=1e-2, rtol=1e-2)
    with FakeTensorMode():
        outs = torch_npu.npu_fused_linear_online_max_sum(torch.empty(10, 8, dtype=BF16), torch.empty(32, 8, dtype=BF16),
                                                         torch.empty(10, dtype=I64), 0, 15)
        assert [tuple(o.shape) for o in outs[:5]] == [(10,), (10,), (10,), (2,), (10,)] and outs[5] is None
        assert [o.dtype for o in outs[:5]] == [F32, F32, F32, U8, I64]
        ig, wg = torch_npu.npu_fused_linear_cross_entropy_loss_with_max_sum_backward(
            torch.empty(10), torch.empty(10, 8, dtype=BF16), torch.empty(32, 8, dtype=BF16), torch.empty(2, dtype=U8),
            torch.empty(10, dtype=I32), softmax=torch.empty(10, 32))
        assert (ig.shape, ig.dtype, wg.shape, wg.dtype) == ((10, 8), BF16, (32, 8), BF16)
    with pytest.raises(NotImplementedError, match="label_smoothing"):
        torch_npu.npu_fused_linear_cross_entropy_loss_with_max_sum_backward(
            grad, inp, weight, packed, masked_target, 0.1, softmax=softmax)
    with pytest.raises(RuntimeError, match="logits_max and sum_exp_logits are required"):
        torch_npu.npu_fused_linear_cross_entropy_loss_with_max_sum_backward(grad, inp, weight, packed, masked_target)
