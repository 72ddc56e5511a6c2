"""npu_alltoallv_gmm / npu_gmm_alltoallv against references written here as float64 Python loops
over the documented layout (send/recv_counts[rank * e + expert]), on one rank and on 2 ranks
over the hccl backend (all_to_all_single on the group hcom names)."""
import os
import socket
import subprocess
import sys
import textwrap

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import torch_npu

from _op_helpers import DEVICES


def rowdot(row, w):
    return [sum(row[i] * w[i][c] for i in range(len(row))) for c in range(len(w[0]))]


def one_rank_ref(x, w, counts, order_by_expert_first):
    """One rank: the exchange is the identity; gmm rows are (expert, rank) blocks = counts itself."""
    xs, ws = x.double().tolist(), w.double().tolist()
    out, r = [], 0
    for j, c in enumerate(counts):  # world 1: counts[j] are expert j's rows
        for _ in range(c):
            out.append(rowdot(xs[r], ws[j]))
            r += 1
    return torch.tensor(out, dtype=torch.float64)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.float16, 2e-3), (torch.bfloat16, 1e-2)])
def test_one_rank(device, dtype, tol):
    gen = torch.Generator().manual_seed(9)
    counts = [3, 0, 2]
    x = (torch.randn(5, 6, generator=gen) * 0.5).to(dtype)
    w = (torch.randn(3, 6, 4, generator=gen) * 0.5).to(dtype)
    mx, mw = (torch.randn(2, 6, generator=gen) * 0.5).to(dtype), (torch.randn(4, 6, generator=gen) * 0.5).to(dtype)
    ref = one_rank_ref(x, w, counts, True)
    y, mm_y, perm = torch_npu.npu_alltoallv_gmm(x.to(device), w.to(device), "g", 1, counts, counts,
                                                mm_x=mx.to(device), mm_weight=mw.to(device), trans_mm_weight=True,
                                                permute_out_flag=True)
    assert y.dtype == dtype and y.device.type == device and y.shape == (5, 4)
    torch.testing.assert_close(y.cpu().double(), ref, rtol=tol, atol=tol)
    assert torch.equal(perm.cpu(), x)
    mm_ref = torch.tensor([rowdot(r, mw.double().t().tolist()) for r in mx.double().tolist()], dtype=torch.float64)
    torch.testing.assert_close(mm_y.cpu().double(), mm_ref, rtol=tol, atol=tol)
    y2, mm2 = torch_npu.npu_gmm_alltoallv(x.to(device), w.transpose(1, 2).contiguous().to(device), "g", 1,
                                          counts, counts, trans_gmm_weight=True)
    torch.testing.assert_close(y2.cpu().double(), ref, rtol=tol, atol=tol)
    assert mm2.numel() == 0


def test_one_rank_checks_and_meta():
    x, w = torch.randn(5, 6), torch.randn(2, 6, 4)
    with pytest.raises(RuntimeError, match="world_size 2 does not match"):
        torch_npu.npu_alltoallv_gmm(x, w, "g", 2, [1, 1, 1, 2], [1, 1, 1, 2])
    with pytest.raises(RuntimeError, match="send_counts sum"):
        torch_npu.npu_alltoallv_gmm(x, w, "g", 1, [1, 1], [1, 1])
    with pytest.raises(NotImplementedError, match="send_counts_tensor"):
        torch_npu.npu_gmm_alltoallv(x, w, "g", 1, [2, 3], [2, 3], send_counts_tensor=torch.tensor([2, 3]))
    y, mm_y, perm = torch_npu.npu_alltoallv_gmm(x, w, "g", 1, [2, 3], [2, 3])
    assert mm_y.shape == (0,) and perm.shape == (0,)
    with FakeTensorMode():
        y, _, perm = torch_npu.npu_alltoallv_gmm(torch.empty(5, 6, dtype=torch.float16),
                                                 torch.empty(2, 6, 4, dtype=torch.float16), "g", 4,
                                                 [1] * 5 + [0] * 3, [2] * 8, permute_out_flag=True)
        z, _ = torch_npu.npu_gmm_alltoallv(torch.empty(5, 6, dtype=torch.float16),
                                           torch.empty(2, 6, 4, dtype=torch.float16), "g", 4, [1] * 5 + [0] * 3, [3] * 8)
    assert y.shape == (16, 4) and perm.shape == (16, 6) and z.shape == (24, 4)


_WORKER = textwrap.dedent("""
    import sys, torch, torch.distributed as dist
    import torch_npu
    me, port = int(sys.argv[1]), sys.argv[2]
    torch.npu.set_device(me)
    dist.init_process_group("hccl", init_method="tcp://127.0.0.1:" + port, rank=me, world_size=2)
    hcom = dist.group.WORLD.group_name
    W, e, H, N = 2, 2, 3, 2
    g = torch.Generator().manual_seed(11)
    send = [[2, 1, 0, 3], [1, 2, 2, 1]]          # send[r][d * e + j]: rank r -> expert j of rank d
    xs = [torch.randn(sum(send[r]), H, generator=g, dtype=torch.float64) for r in range(W)]
    ws = [torch.randn(e, H, N, generator=g, dtype=torch.float64) for r in range(W)]
    recv = [send[r][me * e + j] for r in range(W) for j in range(e)]
    dot = lambda row, w: [sum(row[i] * w[i][c] for i in range(H)) for c in range(N)]
    def block(r, d, j, expert_major):
        # rows of rank r's x in block (dest d, expert j); layout (d, j) or (j, d)
        keys = [(jj, dd) for jj in range(e) for dd in range(W)] if expert_major else [(dd, jj) for dd in range(W) for jj in range(e)]
        start = 0
        for key in keys:
            dd, jj = (key[1], key[0]) if expert_major else key
            c = send[r][dd * e + jj]
            if (dd, jj) == (d, j):
                return xs[r][start:start + c].tolist()
            start += c
    ok = []
    # alltoallv_gmm: permute rows (expert j, source r); gmm with my weights
    perm_ref = [row for j in range(e) for r in range(W) for row in block(r, me, j, False)]
    gmm_ref = [dot(row, ws[me][j].tolist()) for j in range(e) for r in range(W) for row in block(r, me, j, False)]
    y, _, perm = torch_npu.npu_alltoallv_gmm(xs[me].npu(), ws[me].npu(), hcom, W, send[me], recv, permute_out_flag=True)
    ok.append(y.device.type == "npu" and torch.allclose(perm.cpu(), torch.tensor(perm_ref, dtype=torch.float64)))
    ok.append(torch.allclose(y.cpu(), torch.tensor(gmm_ref, dtype=torch.float64)))
    # gmm_alltoallv: x rows are (expert j, dest d); result rows (source r, expert j), computed with the source's weights
    y_ref = [dot(row, ws[r][j].tolist()) for r in range(W) for j in range(e) for row in block(r, me, j, True)]
    y, _ = torch_npu.npu_gmm_alltoallv(xs[me].npu(), ws[me].npu(), hcom, W, send[me], recv)
    ok.append(torch.allclose(y.cpu(), torch.tensor(y_ref, dtype=torch.float64)))
    dist.destroy_process_group()
    print("RESULT", ok)
""")


def test_two_ranks_hccl():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    procs = [subprocess.Popen([sys.executable, "-c", _WORKER, str(r), port], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=dict(os.environ)) for r in range(2)]
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err[-2000:]
        assert "RESULT [True, True, True]" in out, out + err[-2000:]
