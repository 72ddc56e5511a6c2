"""npu_softmax_cross_entropy_with_logits against -sum(labels * log_softmax(x))."""
import math

import pytest
import torch

import torch_npu

from _op_helpers import DEVICES, close_ref as close


@pytest.mark.parametrize("device", DEVICES)
def test_softmax_cross_entropy_with_logits(device):
    g = torch.Generator().manual_seed(11)
    x = torch.randn(4, 5, generator=g, dtype=torch.float64)
    lab = torch.rand(4, 5, generator=g, dtype=torch.float64)
    lab = lab / lab.sum(-1, keepdim=True)
    exp = []
    for row, lr in zip(x.tolist(), lab.tolist()):
        lse = math.log(sum(math.exp(v) for v in row))
        exp.append(-sum(l * (v - lse) for v, l in zip(row, lr)))
    out = torch_npu.npu_softmax_cross_entropy_with_logits(x.float().to(device), lab.float().to(device))
    close(out, torch.tensor(exp), torch.float32, device)
