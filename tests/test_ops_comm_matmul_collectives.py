"""Matmul + collective ops (torch_npu/op_plugin/comm/matmul_collectives.py): single-rank semantics against
float64 references, autograd, meta shapes, and a 2-process gloo run for the real collectives."""
import os
import socket
import subprocess
import sys
import textwrap

import pytest
import torch

import torch_npu

from _op_helpers import DEVICES

TOL = {torch.float32: 1e-5, torch.float16: 2e-2, torch.bfloat16: 5e-2}


def rnd(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def mm_ref(x1, x2):
    """Matmul as a sum of products (independent of torch.matmul)."""
    return (x1.unsqueeze(-1) * x2).sum(-2)


def close(actual, expected, dtype, device):
    assert actual.dtype == dtype and actual.device.type == device
    tol = TOL[dtype]
    torch.testing.assert_close(actual.cpu().double(), expected, rtol=tol, atol=tol)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("x1_dims", [2, 3])
def test_mm_all_reduce_single_rank(device, dtype, x1_dims):
    x1 = rnd(*((2, 5, 8) if x1_dims == 3 else (5, 8)), seed=1)
    x2, bias = rnd(8, 6, seed=2), rnd(6, seed=3)
    x3 = rnd(*(x1.shape[:-1] + (6,)), seed=4)
    cast = lambda t: t.to(dtype).to(device)
    out = torch_npu.npu_mm_all_reduce_base(cast(x1), cast(x2), "any_group", bias=cast(bias), x3=cast(x3))
    q = lambda t: t.to(dtype).double()
    close(out, mm_ref(q(x1), q(x2)) + q(bias) + q(x3), dtype, device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("group_size", [0, 4])
def test_mm_all_reduce_weight_only_quant(device, group_size):
    x1 = rnd(3, 8, seed=5).half()
    w = torch.randint(-8, 8, (8, 4), generator=torch.Generator().manual_seed(6), dtype=torch.int8)
    rows = 2 if group_size else 1
    scale, offset = rnd(rows, 4, seed=7).abs().half() + 0.1, rnd(rows, 4, seed=8).half()
    out = torch_npu.npu_mm_all_reduce_base(x1.to(device), w.to(device), "g", antiquant_scale=scale.to(device),
                                           antiquant_offset=offset.to(device), antiquant_group_size=group_size)
    s, o = scale.double(), offset.double()
    if group_size:
        s, o = s.repeat_interleave(group_size, 0), o.repeat_interleave(group_size, 0)
    close(out, mm_ref(x1.double(), (w.double() + o) * s), torch.float16, device)


def test_mm_all_reduce_grad_and_errors():
    x1, x2 = rnd(4, 3, seed=9).requires_grad_(), rnd(3, 2, seed=10).requires_grad_()
    torch.autograd.gradcheck(lambda a, b: torch_npu.npu_mm_all_reduce_base(a, b, "g"), (x1, x2))
    with pytest.raises(RuntimeError, match="reduce_op must be 'sum'"):
        torch_npu.npu_mm_all_reduce_base(x1, x2, "g", reduce_op="max")
    with pytest.raises(NotImplementedError, match="dequant_scale"):
        torch_npu.npu_mm_all_reduce_base(x1, x2, "g", dequant_scale=torch.ones(1))
    with pytest.raises(NotImplementedError, match="quantised matmul"):
        torch_npu.npu_mm_all_reduce_base(x1.to(torch.int8), x2.to(torch.int8), "g")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_reduce_scatter_and_all_gather_single_rank(device, dtype):
    x1, x2, bias = rnd(6, 8, seed=11), rnd(8, 5, seed=12), rnd(5, seed=13)
    cast = lambda t: t.to(dtype).to(device)
    q = lambda t: t.to(dtype).double()
    out = torch_npu.npu_mm_reduce_scatter_base(cast(x1), cast(x2), "g", 1, bias=cast(bias))
    close(out, mm_ref(q(x1), q(x2)) + q(bias), dtype, device)
    out, gathered = torch_npu.npu_all_gather_base_mm(cast(x1), cast(x2), "g", 1, bias=cast(bias))
    close(out, mm_ref(q(x1), q(x2)) + q(bias), dtype, device)
    close(gathered, q(x1), dtype, device)
    _, empty = torch_npu.npu_all_gather_base_mm(cast(x1), cast(x2), "g", 1, gather_output=False)
    assert empty.numel() == 0


def test_single_rank_world_size_and_grad():
    x1, x2 = rnd(4, 3, seed=14), rnd(3, 2, seed=15)
    with pytest.raises(RuntimeError, match="world_size 2 does not match the 1 rank"):
        torch_npu.npu_mm_reduce_scatter_base(x1, x2, "g", 2)
    with pytest.raises(RuntimeError, match="gather_index must be 0"):
        torch_npu.npu_all_gather_base_mm(x1, x2, "g", 1, gather_index=1)
    a, b = x1.clone().requires_grad_(), x2.clone().requires_grad_()
    torch.autograd.gradcheck(lambda a, b: torch_npu.npu_all_gather_base_mm(a, b, "g", 1)[0], (a, b))
    torch.autograd.gradcheck(lambda a, b: torch_npu.npu_mm_reduce_scatter_base(a, b, "g", 1), (a, b))


def test_meta_shapes():
    m = lambda *s: torch.empty(*s, device="meta", dtype=torch.float16)
    assert torch_npu.npu_mm_all_reduce_base(m(2, 5, 8), m(8, 6), "g").shape == (2, 5, 6)
    assert torch_npu.npu_mm_reduce_scatter_base(m(6, 8), m(8, 4), "g", 1).shape == (6, 4)
    out, g = torch_npu.npu_all_gather_base_mm(m(6, 8), m(8, 4), "g", 1)
    assert out.shape == (6, 4) and g.shape == (6, 8)


_WORKER = textwrap.dedent("""
    import sys, torch, torch.distributed as dist
    import torch_npu
    rank, port = int(sys.argv[1]), sys.argv[2]
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:" + port, rank=rank, world_size=2)
    hcom = dist.group.WORLD.group_name
    g = torch.Generator().manual_seed(100)
    x1 = [torch.randn(4, 3, generator=g, dtype=torch.float64) for _ in range(2)]
    x2 = [torch.randn(3, 5, generator=g, dtype=torch.float64) for _ in range(2)]
    mm = lambda a, b: (a.unsqueeze(-1) * b).sum(-2)
    total = mm(x1[0], x2[0]) + mm(x1[1], x2[1])
    ok = []
    out = torch_npu.npu_mm_all_reduce_base(x1[rank], x2[rank], hcom)
    ok.append(torch.allclose(out, total))
    out = torch_npu.npu_mm_reduce_scatter_base(x1[rank], x2[rank], hcom, 2)
    ok.append(out.shape == (2, 5) and torch.allclose(out, total[2 * rank:2 * rank + 2]))
    out, gathered = torch_npu.npu_all_gather_base_mm(x1[rank], x2[0], hcom, 2)
    ok.append(torch.allclose(gathered, torch.cat(x1)) and torch.allclose(out, mm(torch.cat(x1), x2[0])))
    try:
        torch_npu.npu_mm_reduce_scatter_base(x1[rank], x2[rank], hcom, 4)
        ok.append(False)
    except RuntimeError as e:
        ok.append("does not match the 2 rank" in str(e))
    dist.destroy_process_group()
    print("RESULT", ok)
""")


def test_two_ranks_gloo():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    env = dict(os.environ)
    procs = [subprocess.Popen([sys.executable, "-c", _WORKER, str(r), port], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env) for r in range(2)]
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err[-2000:]
        assert "RESULT [True, True, True, True]" in out, out + err[-2000:]
