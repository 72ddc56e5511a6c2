"""Every public ``torch.accelerator`` function works with npu as the current
accelerator, and agrees with its ``torch.npu`` counterpart.

The name lists are enumerated from ``torch.accelerator.__all__`` and its
submodules' ``__all__``: a name PyTorch adds without a case here fails
``test_every_public_name_has_a_case``.
"""
import subprocess
import sys

import pytest
import torch

import torch_npu  # noqa: F401

from _subproc import REPO, make_env

A = torch.accelerator


def _public_names():
    names = set(A.__all__)
    for sub in ("memory", "graphs"):
        names |= set(getattr(A, sub).__all__)
    return names


@pytest.fixture(autouse=True)
def _device_zero():
    torch.npu.set_device(0)
    yield
    torch.npu.set_device(0)


def _device_queries():
    assert A.is_available() is True
    assert A.current_accelerator() == torch.device("npu")
    assert A.device_count() == torch.npu.device_count()
    assert A.current_device_index() == A.current_device_idx() == torch.npu.current_device() == 0
    A.set_device_index(1)
    assert torch.npu.current_device() == 1 and A.current_device_index() == 1
    A.set_device_idx(0)
    assert torch.npu.current_device() == 0
    with A.device_index(1):
        assert torch.npu.current_device() == 1
    assert torch.npu.current_device() == 0
    with A.device_index(None):            # None: a no-op, as documented
        assert torch.npu.current_device() == 0


def _capability():
    cap = A.get_device_capability()
    assert {torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.bool} <= cap["supported_dtypes"]
    assert A.get_device_capability("npu:1") == cap
    with pytest.raises(RuntimeError, match="Invalid device_index"):
        A.get_device_capability(99)


def _streams():
    cur = A.current_stream()
    ref = torch.npu.current_stream()
    assert (cur.device, cur.stream_id) == (ref.device, ref.stream_id)
    assert A.current_stream(1).device == torch.device("npu", 1)
    side = torch.npu.Stream()
    A.set_stream(side)
    try:
        assert torch.npu.current_stream() == side
        assert A.current_stream().stream_id == side.stream_id
    finally:
        A.set_stream(ref)
    assert torch.npu.current_stream() == ref
    assert A.synchronize() is None and A.synchronize(1) is None and A.synchronize("npu:0") is None


def _memory():
    A.empty_cache()
    A.reset_peak_memory_stats()
    A.reset_accumulated_memory_stats()
    x = torch.empty(1 << 20, dtype=torch.uint8, device="npu")
    assert A.memory_allocated() == torch.npu.memory_allocated() >= 1 << 20
    assert A.max_memory_allocated() == torch.npu.max_memory_allocated() >= 1 << 20
    assert A.memory_reserved() == torch.npu.memory_reserved() >= 1 << 20
    assert A.max_memory_reserved() == torch.npu.max_memory_reserved()
    stats = A.memory_stats()
    assert stats["allocated_bytes.all.current"] == torch.npu.memory_stats()["allocated_bytes.all.current"]
    assert A.get_memory_info() == torch.npu.mem_get_info()
    del x
    A.empty_cache()
    assert A.memory_reserved() == torch.npu.memory_reserved() == 0
    assert A.max_memory_allocated() >= 1 << 20          # the peak survives until reset
    A.reset_peak_memory_stats()
    assert A.max_memory_allocated() == 0
    A.reset_accumulated_memory_stats()
    assert A.memory_stats()["allocation.all.allocated"] == 0


def _host_cache():
    pinned = torch.ones(1024).pin_memory()
    assert pinned.is_pinned()
    assert A.empty_host_cache() is None
    assert torch.equal(pinned, torch.ones(1024))        # a live pinned block is not released


def _graph():
    x = torch.zeros(4, device="npu")
    g = A.Graph()
    with torch.Stream(device="npu"), g:
        x.add_(1)
    before = x.clone()
    g.replay()
    assert torch.equal(x.cpu(), before.cpu() + 1)
    shared = A.Graph(keep_graph=True, pool=g.pool())
    with torch.npu.stream(torch.npu.Stream()):
        shared.capture_begin()
        x.mul_(2)
        shared.capture_end()
    shared.instantiate()
    before = x.clone()
    shared.replay()
    assert torch.equal(x.cpu(), before.cpu() * 2)
    g.reset()
    with pytest.raises(RuntimeError, match="without a preceding successful capture"):
        g.replay()
    with pytest.raises(RuntimeError, match="non-default stream"):
        A.Graph().capture_begin()


_CASES = {
    "is_available": _device_queries, "current_accelerator": _device_queries, "device_count": _device_queries,
    "current_device_index": _device_queries, "current_device_idx": _device_queries,
    "set_device_index": _device_queries, "set_device_idx": _device_queries, "device_index": _device_queries,
    "get_device_capability": _capability,
    "current_stream": _streams, "set_stream": _streams, "synchronize": _streams,
    "empty_cache": _memory, "memory_allocated": _memory, "max_memory_allocated": _memory,
    "memory_reserved": _memory, "max_memory_reserved": _memory, "memory_stats": _memory,
    "reset_accumulated_memory_stats": _memory, "reset_peak_memory_stats": _memory, "get_memory_info": _memory,
    "empty_host_cache": _host_cache, "Graph": _graph,
}


def test_every_public_name_has_a_case():
    assert _public_names() - set(_CASES) == set()


@pytest.mark.parametrize("check", sorted(set(_CASES.values()), key=lambda f: f.__name__),
                         ids=lambda f: f.__name__.strip("_"))
def test_accelerator_api_matches_torch_npu(check):
    check()


def test_generic_events_time_and_order_work():
    start, end = torch.Event(device="npu", enable_timing=True), torch.Event(device="npu", enable_timing=True)
    start.record()
    torch.ones(64, device="npu").sum()
    end.record()
    end.synchronize()
    assert start.query() and end.query() and start.elapsed_time(end) >= 0
    side = torch.Stream(device="npu")
    side.wait_event(end)
    side.wait_stream(A.current_stream())
    side.synchronize()
    assert side.query()


def test_empty_host_cache_after_device_use_in_a_fresh_process():
    # It used to crash (no host allocator registered for npu) once the device was in use.
    code = ("import torch, torch_npu\n"
            "x = torch.zeros(4, device='npu'); torch.accelerator.synchronize()\n"
            "torch.accelerator.memory.empty_host_cache(); torch.accelerator.empty_host_cache()\n"
            "print('ok')\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=str(REPO), env=make_env(), capture_output=True,
                          text=True, timeout=240)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", (proc.returncode, proc.stderr[-2000:])
