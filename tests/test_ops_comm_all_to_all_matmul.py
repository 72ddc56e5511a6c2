"""Collective + matmul fusions (npu_all_to_all_matmul, npu_matmul_all_to_all,
npu_quant_mm_reduce_scatter, npu_all_gather_quant_mm) on one and two ranks."""
import os
import socket
import subprocess
import sys
import textwrap

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import torch_npu  # noqa: F401

I8, I32, I64, F32, BF16, U8 = torch.int8, torch.int32, torch.int64, torch.float32, torch.bfloat16, torch.uint8


_COMM_WORKER = textwrap.dedent("""
    import sys, torch, torch.distributed as dist
    import torch_npu
    me, port = int(sys.argv[1]), sys.argv[2]
    torch.npu.set_device(me)
    dist.init_process_group("hccl", init_method="tcp://127.0.0.1:" + port, rank=me, world_size=2)
    hcom = dist.group.WORLD.group_name
    W, BS, H, N = 2, 4, 3, 5
    g = torch.Generator().manual_seed(3)
    x1 = [torch.randn(BS, H, generator=g).half() for _ in range(W)]
    x2 = [torch.randn(H * W, N, generator=g).half() for _ in range(W)]
    bias = [torch.randn(N, generator=g).half() for _ in range(W)]
    ok = []
    # all_to_all_matmul: rows me*BS/W.. of every rank's x1, side by side, then @ x2 + bias of this rank
    rows = BS // W
    permuted = torch.cat([x1[s][me * rows:(me + 1) * rows].double() for s in range(W)], dim=1)
    y_ref = permuted @ x2[me].double() + bias[me].double()
    y, comm = torch_npu.npu_all_to_all_matmul(x1[me].npu(), x2[me].npu(), hcom, W, bias=bias[me].npu())
    ok.append(y.device.type == "npu" and y.dtype == torch.float16 and tuple(y.shape) == (rows, N))
    ok.append(torch.allclose(y.cpu().double(), y_ref, atol=1e-2, rtol=1e-2))
    ok.append(torch.equal(comm.cpu().double(), permuted))
    _, none = torch_npu.npu_all_to_all_matmul(x1[me].npu(), x2[me].npu(), hcom, W, all2all_out_flag=False)
    ok.append(none is None)
    # matmul_all_to_all: column block me of every rank's x1 @ x2 + bias, stacked by source rank
    Nw = 4                                                   # the (H, Nw) weights' columns split into W blocks
    w2 = [torch.randn(H, Nw, generator=g).half() for _ in range(W)]
    b2 = [torch.randn(Nw, generator=g).half() for _ in range(W)]
    cols = Nw // W
    ref = torch.cat([(x1[s].double() @ w2[s].double() + b2[s].double()).half().double()[:, me * cols:(me + 1) * cols]
                     for s in range(W)])
    y = torch_npu.npu_matmul_all_to_all(x1[me].npu(), w2[me].npu(), hcom, W, bias=b2[me].npu())
    ok.append(tuple(y.shape) == (W * BS, cols))
    ok.append(torch.allclose(y.cpu().double(), ref, atol=1e-2, rtol=1e-2))
    # quant_mm_reduce_scatter, float16: sum over ranks of x1 @ x2 + bias, rank me keeps its row block
    K, N2 = 6, 3
    a = [torch.randn(BS, K, generator=g).half() for _ in range(W)]
    b = [torch.randn(K, N2, generator=g).half() for _ in range(W)]
    full = sum(a[s].double() @ b[s].double() for s in range(W))
    y, amax = torch_npu.npu_quant_mm_reduce_scatter(a[me].npu(), b[me].npu(), hcom, W)
    ok.append(amax is None and y.dtype == torch.float16 and tuple(y.shape) == (BS // W, N2))
    ok.append(torch.allclose(y.cpu().double(), full[me * rows:(me + 1) * rows], atol=1e-2, rtol=1e-2))
    # int8 per-token x per-channel: sum over ranks of (s1 * s2) * (x1 @ x2) + bias
    qa = [torch.randint(-8, 8, (BS, K), generator=g, dtype=torch.int8) for _ in range(W)]
    qb = [torch.randint(-8, 8, (K, N2), generator=g, dtype=torch.int8) for _ in range(W)]
    s1 = [torch.rand(BS, 1, generator=g) for _ in range(W)]
    s2 = [torch.rand(1, N2, generator=g) for _ in range(W)]
    qbias = [torch.rand(N2, generator=g) for _ in range(W)]
    qfull = sum(s1[s].double() * s2[s].double() * (qa[s].double() @ qb[s].double()) + qbias[s].double()
                for s in range(W))
    y, _ = torch_npu.npu_quant_mm_reduce_scatter(qa[me].npu(), qb[me].npu(), hcom, W, bias=qbias[me].npu(),
                                                 x1_scale=s1[me].npu(), x2_scale=s2[me].npu(), y_dtype=torch.float32)
    ok.append(y.dtype == torch.float32 and torch.allclose(y.cpu().double(), qfull[me * rows:(me + 1) * rows],
                                                          atol=1e-4, rtol=1e-5))
    # all_gather_quant_mm: the ranks' x1 stacked in rank order, @ x2 + bias
    gathered_ref = torch.cat([a[s] for s in range(W)])
    gbias = torch.randn(N2, generator=g).half()
    y, gout, amax = torch_npu.npu_all_gather_quant_mm(a[me].npu(), b[me].npu(), hcom, W, bias=gbias.npu())
    ok.append(amax is None and torch.equal(gout.cpu(), gathered_ref))
    ok.append(torch.allclose(y.cpu().double(), gathered_ref.double() @ b[me].double() + gbias.double(),
                             atol=1e-2, rtol=1e-2))
    _, gout, _ = torch_npu.npu_all_gather_quant_mm(a[me].npu(), b[me].npu(), hcom, W, gather_output=False)
    ok.append(tuple(gout.shape) == (0,))
    dist.destroy_process_group()
    print("RESULT", ok)
""")


def test_all_to_all_matmul_two_ranks():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = str(sock.getsockname()[1])
    procs = [subprocess.Popen([sys.executable, "-c", _COMM_WORKER, str(r), port], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=dict(os.environ)) for r in range(2)]
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err[-2000:]
        assert "RESULT [" + ", ".join(["True"] * 12) + "]" in out, out + err[-2000:]


def test_mc2_quant_ops_fake_and_errors():
    with FakeTensorMode():
        y, amax = torch_npu.npu_quant_mm_reduce_scatter(torch.empty(8, 4, dtype=I8), torch.empty(4, 6, dtype=I8), "g",
                                                        4, y_dtype=torch.bfloat16)
        assert (y.shape, y.dtype, amax) == ((2, 6), BF16, None)
        y, gout, _ = torch_npu.npu_all_gather_quant_mm(torch.empty(3, 4).half(), torch.empty(4, 5).half(), "g", 8)
        assert (y.shape, gout.shape) == ((24, 5), (24, 4))
    x1, x2 = torch.randn(4, 3).half(), torch.randn(3, 5).half()
    with pytest.raises(NotImplementedError, match="amax_output=True"):
        torch_npu.npu_quant_mm_reduce_scatter(x1, x2, "g", 2, amax_output=True)
    with pytest.raises(NotImplementedError, match="float8_e4m3fn inputs"):
        torch_npu.npu_all_gather_quant_mm(x1.to(torch.float8_e4m3fn), x2.to(torch.float8_e4m3fn), "g", 2,
                                          y_dtype=torch.float16)
    with pytest.raises(RuntimeError, match="y_dtype is required"):
        torch_npu.npu_quant_mm_reduce_scatter(x1.to(I8), x2.to(I8), "g", 2)
    with pytest.raises(RuntimeError, match="does not match the 1 rank"):
        torch_npu.npu_quant_mm_reduce_scatter(x1, x2, "g", 2)


def test_all_to_all_matmul_fake_single_rank_and_errors():
    with FakeTensorMode():
        y, comm = torch_npu.npu_all_to_all_matmul(torch.empty(8, 3, dtype=BF16), torch.empty(12, 5, dtype=BF16),
                                                  "g", 4)
        assert (y.shape, comm.shape, y.dtype) == ((2, 5), (2, 12), BF16)
        y = torch_npu.npu_matmul_all_to_all(torch.empty(8, 3).half(), torch.empty(3, 8).half(), "g", 2)
        assert y.shape == (16, 4)
    x1, x2 = torch.randn(4, 3).half(), torch.randn(6, 5).half()
    with pytest.raises(RuntimeError, match="does not match the 1 rank"):
        torch_npu.npu_all_to_all_matmul(x1, x2, "g", 2)
    with pytest.raises(RuntimeError, match="world_size should be in"):
        torch_npu.npu_all_to_all_matmul(x1, x2, "g", 3)
    with pytest.raises(RuntimeError, match="bias must be torch.float32"):
        torch_npu.npu_all_to_all_matmul(x1.bfloat16(), x2.bfloat16(), "g", 2, bias=torch.zeros(5).bfloat16())
    with pytest.raises(NotImplementedError, match="comm_mode"):
        torch_npu.npu_matmul_all_to_all(x1, torch.randn(3, 4).half(), "g", 2, comm_mode="aiv")
