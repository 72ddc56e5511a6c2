"""torch.npu.NPUGraph / graph / make_graphed_callables: replay equals eager,
and the capture constraints raise clear errors."""
import copy

import pytest
import torch
import torch.nn as nn

import torch_npu  # noqa: F401

NPU = torch.device("npu")


def test_replay_recomputes_on_captured_memory():
    g = torch.Generator().manual_seed(0)
    x_cpu, w_cpu = torch.randn(4, 8, generator=g), torch.randn(8, 8, generator=g)
    x, w = x_cpu.to(NPU), w_cpu.to(NPU)
    graph = torch.npu.NPUGraph()
    assert not torch.npu.is_current_stream_capturing()
    with torch.npu.graph(graph):
        assert torch.npu.is_current_stream_capturing()
        y = torch.relu(x @ w) + 1
        x.mul_(2)                       # in-place work is replayed too
    address = y.data_ptr()
    for _ in range(2):
        new = torch.randn(4, 8, generator=g)
        x.copy_(new)                    # new data goes into the captured input
        graph.replay()
        assert y.data_ptr() == address  # results land in the captured output
        torch.testing.assert_close(y.cpu(), torch.relu(new @ w_cpu) + 1)
        torch.testing.assert_close(x.cpu(), new * 2)


def test_capture_constraints_raise():
    graph = torch.npu.NPUGraph()
    with pytest.raises(RuntimeError, match="without a preceding successful capture"):
        graph.replay()
    with pytest.raises(RuntimeError, match="non-default stream"):
        graph.capture_begin()
    x = torch.ones(3).to(NPU)
    with pytest.raises(RuntimeError, match="operation not permitted when stream is capturing"):
        with torch.npu.graph(torch.npu.NPUGraph()):
            (x * 2).sum().item()
    with pytest.raises(RuntimeError, match="operation not permitted when stream is capturing"):
        with torch.npu.graph(torch.npu.NPUGraph()):
            (x * 2).cpu()
    assert not torch.npu.is_current_stream_capturing()   # a failed capture ends cleanly
    captured = torch.npu.NPUGraph()
    with torch.npu.graph(captured):
        x + 1
    with pytest.raises(RuntimeError, match="already owns a captured graph"):
        captured.capture_begin()
    x.resize_(5)                        # the captured input changed shape and storage
    with pytest.raises(RuntimeError, match="static shapes and addresses"):
        captured.replay()


def test_graph_pool_handle_and_shared_pool():
    pool = torch.npu.graph_pool_handle()
    a, b = torch.npu.NPUGraph(), torch.npu.NPUGraph()
    x = torch.ones(2).to(NPU)
    with torch.npu.graph(a, pool=pool):
        y = x + 1
    with torch.npu.graph(b, pool=a.pool()):
        z = y * 3
    assert a.pool() == b.pool() == pool
    x.fill_(5)
    a.replay()
    b.replay()
    assert torch.equal(z.cpu(), torch.full((2,), 18.0))


def test_make_graphed_callables_matches_eager_training():
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 3))
    model = copy.deepcopy(ref).to(NPU)
    sample = torch.randn(4, 8).to(NPU).requires_grad_()
    graphed = torch.npu.make_graphed_callables(model, (sample,))
    opt_ref = torch.optim.SGD(ref.parameters(), lr=0.1)
    opt = torch.optim.SGD(graphed.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    for _ in range(3):
        x = torch.randn(4, 8, generator=g)
        xr, xn = x.clone().requires_grad_(), x.to(NPU).requires_grad_()
        out_ref, out = ref(xr), graphed(xn)
        torch.testing.assert_close(out.detach().cpu(), out_ref.detach())
        (out_ref ** 2).sum().backward()
        (out ** 2).sum().backward()
        torch.testing.assert_close(xn.grad.cpu(), xr.grad)
        for p, q in zip(graphed.parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad.cpu(), q.grad)
        opt_ref.step(), opt.step()
        opt_ref.zero_grad(), opt.zero_grad()
    for p, q in zip(graphed.parameters(), ref.parameters()):
        torch.testing.assert_close(p.detach().cpu(), q.detach())
