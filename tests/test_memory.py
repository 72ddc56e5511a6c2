"""Caching allocator of torch.npu: statistics, segments, limits and OOM (spec: real torch_npu 2.13.0).

Sizes are checked by arithmetic against the allocator rules torch_npu shares
with CUDA's caching allocator: blocks rounded to 512 bytes, requests <= 1 MiB
packed in 2 MiB segments, 1-10 MiB requests in 20 MiB segments, larger ones
rounded up to 2 MiB.  torch_npu also pads every block by 32 bytes before the
512-byte rounding (``round_size``; upstream test/npu/test_allocator_envs.py
expects ``ceil((n + 32) / 512) * 512``).  Tests that must hold whatever the
padding use sizes where it does not change the result (e.g. 4000 bytes -> 4096).
"""
import gc
import math

import pytest
import torch

import torch_npu  # noqa: F401
from _subproc import result, run_many

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB
SMALL_SEGMENT = 2 * MiB
MEDIUM_SEGMENT = 20 * MiB


def npu_block_size(nbytes):
    """Block size torch_npu's round_size gives a request (32-byte pad, 512-byte rounding)."""
    return max(512, math.ceil((nbytes + 32) / 512) * 512)


def format_size(n):
    """torch_npu's format_size (OOM messages)."""
    if n <= 1024:
        return f"{n} bytes"
    if n <= MiB:
        return f"{n / 1024:.2f} KiB"
    if n <= GiB:
        return f"{n / MiB:.2f} MiB"
    return f"{n / GiB:.2f} GiB"


@pytest.fixture(autouse=True)
def _device0_no_gc():
    # Exact byte accounting: tensors of earlier tests kept alive by reference
    # cycles must not be collected in the middle of a measurement.
    gc.collect()
    gc.disable()
    torch.npu.set_device(0)
    try:
        yield
    finally:
        gc.enable()
        torch.npu.set_device(0)


OOM_TAIL = ("reserved in total by PyTorch).If reserved memory is >> allocated memory try setting "
            "max_split_size_mb to avoid fragmentation.")


# --------------------------------------------------------------------------
# Fresh processes (exact segment accounting needs an empty allocator).
# --------------------------------------------------------------------------

_FRESH = r'''
import torch, torch_npu
M = 2 ** 20
def snap(dev=0):
    return [torch.npu.memory_allocated(dev), torch.npu.memory_reserved(dev)]
R = {}
torch.npu.init()
R["start"] = snap()
R["info0"] = list(torch.npu.mem_get_info())
x = torch.empty(1000, device="npu")                    # 4000 B: small pool
R["small"] = snap()
x2 = torch.empty(1000, device="npu")                   # same 2 MiB segment
R["small2"] = snap()
st = torch.npu.memory_stats()
R["small_stats"] = [st["segment.small_pool.current"], st["segment.large_pool.current"],
                    st["reserved_bytes.small_pool.current"]]
y = torch.empty((2 * M - 4096) // 4, device="npu")     # 1-10 MiB: a 20 MiB segment
R["medium"] = snap()
z = torch.empty((30 * M - 4096) // 4, device="npu")    # >= 10 MiB: rounded up to 2 MiB
R["large"] = snap()
st = torch.npu.memory_stats()
R["large_stats"] = [st["segment.small_pool.current"], st["segment.large_pool.current"],
                    st["reserved_bytes.large_pool.current"]]
R["info1"] = list(torch.npu.mem_get_info())
del y, z
R["after_del"] = snap()
torch.npu.empty_cache()
R["after_empty"] = snap()
R["info2"] = list(torch.npu.mem_get_info())
a = torch.empty(600 * M, dtype=torch.uint8, device="npu")
R["before_oom"] = snap()
R["ooms0"] = torch.npu.memory_stats()["num_ooms"]
R["oom"] = catch(lambda: torch.empty(600 * M, dtype=torch.uint8, device="npu"))
R["ooms1"] = torch.npu.memory_stats()["num_ooms"]
R["after_oom"] = snap()
R["usable"] = (torch.arange(5.0, device="npu") * 2 + 1).cpu().tolist()
del a
b = torch.empty(900 * M, dtype=torch.uint8, device="npu")   # fits once a is gone
R["big_after_free"] = b.numel()
del b, x, x2
torch.npu.empty_cache()
R["end"] = snap()
emit(R)
'''

_CONF_SPLIT = r'''
import torch, torch_npu
M = 2 ** 20
R = {}
x = torch.arange(1000.0, device="npu")
R["sum"] = (x * 2).sum().item()
R["fraction"] = torch.npu.get_per_process_memory_fraction()
st = torch.npu.memory_stats()
R["max_split"] = st["max_split_size"]
big = torch.empty(100 * M, dtype=torch.uint8, device="npu")      # >= 64 MiB: oversize
mid = torch.empty(30 * M, dtype=torch.uint8, device="npu")       # < 64 MiB: normal
st = torch.npu.memory_stats()
R["oversize"] = [st["oversize_allocations.current"], st["oversize_segments.current"]]
R["over_limit"] = catch(lambda: torch.empty(600 * M, dtype=torch.uint8, device="npu"))   # > 0.5 * 1 GiB
R["under_limit"] = catch(lambda: torch.empty(300 * M, dtype=torch.uint8, device="npu"))
emit(R)
'''

_CONF_MISC = r'''
import torch, torch_npu
R = {}
a = torch.arange(12.0).reshape(3, 4)
n = a.npu()
R["mm"] = (n @ n.T).cpu().tolist()
R["ref"] = (a @ a.T).tolist()
big = torch.empty(50 * 2 ** 20, dtype=torch.uint8, device="npu")
R["alloc_ok"] = torch.npu.memory_allocated() >= 50 * 2 ** 20
R["info"] = list(torch.npu.mem_get_info())
emit(R)
'''

_CONF_BAD = r'''
import torch, torch_npu
R = {"import_ok": True}
R["first_use"] = catch(lambda: torch.ones(1).npu())
emit(R)
'''

_NO_CACHE = r'''
import torch, torch_npu
def snap():
    return [torch.npu.memory_allocated(), torch.npu.memory_reserved()]
R = {}
x = torch.ones(1000, device="npu")
R["during"] = snap()
del x
R["after"] = snap()
y = torch.empty(30 * 2 ** 20, dtype=torch.uint8, device="npu")
R["during_large"] = snap()
del y
R["after_large"] = snap()
emit(R)
'''

_JOBS = {
    "fresh": (_FRESH, {"TORCH_NPU_EMU_MEMORY": "1GiB"}),
    "conf_split": (_CONF_SPLIT, {"TORCH_NPU_EMU_MEMORY": "1GiB",
                                 "PYTORCH_NPU_ALLOC_CONF": "max_split_size_mb:64,per_process_memory_fraction:0.5"}),
    "conf_misc": (_CONF_MISC, {"PYTORCH_NPU_ALLOC_CONF": "garbage_collection_threshold:0.6,expandable_segments:True",
                               "TORCH_NPU_EMU_MEMORY": "512MiB"}),
    "conf_bad": (_CONF_BAD, {"PYTORCH_NPU_ALLOC_CONF": "max_split_size_mb:64,bogus_key:1"}),
    "no_cache": (_NO_CACHE, {"PYTORCH_NO_NPU_MEMORY_CACHING": "1"}),
}


@pytest.fixture(scope="module")
def fresh():
    return run_many(_JOBS)


def test_fresh_allocator_starts_empty(fresh):
    r = result(fresh, "fresh")
    assert r["start"] == [0, 0]
    assert r["info0"] == [GiB, GiB]


def test_small_allocations_share_a_2mib_segment(fresh):
    r = result(fresh, "fresh")
    assert r["small"] == [4096, SMALL_SEGMENT]
    assert r["small2"] == [8192, SMALL_SEGMENT]
    assert r["small_stats"] == [1, 0, SMALL_SEGMENT]


def test_medium_and_large_segments(fresh):
    r = result(fresh, "fresh")
    assert r["medium"][1] - r["small2"][1] == MEDIUM_SEGMENT
    assert r["large"][1] - r["medium"][1] == 30 * MiB
    assert r["large_stats"] == [1, 2, MEDIUM_SEGMENT + 30 * MiB]
    assert r["large"][0] >= 8192 + (2 * MiB - 4096) + (30 * MiB - 4096)


def test_mem_get_info_tracks_reserved(fresh):
    r = result(fresh, "fresh")
    assert r["info1"][1] == GiB
    assert r["info0"][0] - r["info1"][0] == r["large"][1] - r["start"][1]
    assert r["info2"] == [GiB - SMALL_SEGMENT, GiB]


def test_free_keeps_cache_and_empty_cache_releases_it(fresh):
    r = result(fresh, "fresh")
    assert r["after_del"] == [8192, r["large"][1]]           # freed blocks stay cached
    assert r["after_empty"] == [8192, SMALL_SEGMENT]          # only the segment holding x, x2 remains
    assert r["end"] == [0, 0]


def test_oom_past_capacity_message_and_recovery(fresh):
    r = result(fresh, "fresh")
    oom = r["oom"]
    assert oom is not None
    name, msg, is_runtime = oom
    assert name == "OutOfMemoryError" and is_runtime
    assert msg.startswith("NPU out of memory. Tried to allocate ")
    assert "(NPU 0; 1024.00 MiB total capacity; " in msg
    assert " already allocated; " in msg and " free; " in msg
    assert OOM_TAIL in msg
    assert "allowed;" not in msg
    assert r["ooms1"] == r["ooms0"] + 1
    assert r["after_oom"][0] == r["before_oom"][0]            # the failed request left nothing allocated
    assert r["usable"] == [1.0, 3.0, 5.0, 7.0, 9.0]
    assert r["big_after_free"] == 900 * MiB


def test_alloc_conf_max_split_and_fraction(fresh):
    r = result(fresh, "conf_split")
    assert r["sum"] == 999000.0
    assert r["fraction"] == 0.5
    assert r["max_split"] == 64 * MiB
    assert r["oversize"] == [1, 1]
    assert r["over_limit"] is not None
    assert r["over_limit"][0] == "OutOfMemoryError"
    assert r["over_limit"][1].startswith("NPU out of memory.")
    assert r["under_limit"] is None


def test_alloc_conf_gc_threshold_and_expandable_segments_accepted(fresh):
    r = result(fresh, "conf_misc")
    assert r["mm"] == r["ref"]
    assert r["alloc_ok"] is True
    assert r["info"][1] == 512 * MiB


def test_alloc_conf_unknown_key_rejected_on_first_use(fresh):
    r = result(fresh, "conf_bad")
    assert r["import_ok"] is True
    err = r["first_use"]
    assert err is not None and err[2], err
    assert "bogus_key" in err[1]


def test_no_memory_caching(fresh):
    r = result(fresh, "no_cache")
    assert r["during"][0] >= 4000 and r["during"][1] >= r["during"][0]
    assert r["after"] == [0, 0]
    assert r["during_large"][0] >= 30 * MiB
    assert r["after_large"] == [0, 0]


# --------------------------------------------------------------------------
# In-process checks.
# --------------------------------------------------------------------------

def test_allocated_grows_by_rounded_block_and_returns():
    before = torch.npu.memory_allocated()
    x = torch.empty(1000, dtype=torch.float32, device="npu")
    assert torch.npu.memory_allocated() - before == 4096
    assert torch.npu.memory_reserved() >= torch.npu.memory_allocated()
    y = torch.empty(10, dtype=torch.float32, device="npu")
    assert torch.npu.memory_allocated() - before == 4096 + 512
    del x, y
    assert torch.npu.memory_allocated() == before


@pytest.mark.parametrize("nbytes", [512, 4096, 1000 * 1024, 40 * MiB * 4])
def test_block_size_includes_32_byte_padding(nbytes):
    before = torch.npu.memory_allocated()
    t = torch.empty(nbytes, dtype=torch.uint8, device="npu")
    assert torch.npu.memory_allocated() - before == npu_block_size(nbytes)
    del t


def test_memory_functions_follow_current_device():
    with torch.npu.device(2):
        t = torch.empty(1000, device="npu")
        assert torch.npu.memory_allocated() == torch.npu.memory_allocated(2)
        assert torch.npu.memory_reserved() == torch.npu.memory_reserved("npu:2")
        assert torch.npu.memory_allocated(torch.device("npu", 2)) == torch.npu.memory_allocated(2)
    del t


def test_memory_is_per_device():
    s0 = dict(torch.npu.memory_stats(0))
    a1 = torch.npu.memory_allocated(1)
    t = torch.empty(1000, device="npu:1")
    u = t * 2
    assert torch.npu.memory_allocated(1) - a1 == 2 * 4096
    s0_after = torch.npu.memory_stats(0)
    for key in ("allocated_bytes.all.current", "reserved_bytes.all.current", "allocation.all.current",
                "allocation.all.allocated"):
        assert s0_after[key] == s0[key], key
    del t, u
    assert torch.npu.memory_allocated(1) == a1


def test_peak_stats_and_reset():
    torch.npu.reset_peak_memory_stats()
    base = torch.npu.memory_allocated()
    assert torch.npu.max_memory_allocated() == base
    t = torch.empty(1000, device="npu")
    assert torch.npu.max_memory_allocated() == base + 4096
    del t
    assert torch.npu.memory_allocated() == base
    assert torch.npu.max_memory_allocated() == base + 4096          # peak is kept
    assert torch.npu.max_memory_reserved() >= torch.npu.memory_reserved()
    torch.npu.reset_peak_memory_stats()
    assert torch.npu.max_memory_allocated() == base
    assert torch.npu.max_memory_reserved() == torch.npu.memory_reserved()


def test_reset_accumulated_stats():
    t = torch.empty(1000, device="npu")
    del t
    assert torch.npu.memory_stats()["allocation.all.allocated"] >= 1
    torch.npu.reset_accumulated_memory_stats()
    st = torch.npu.memory_stats()
    assert st["allocation.all.allocated"] == 0 and st["allocation.all.freed"] == 0
    assert st["allocated_bytes.all.allocated"] == 0
    t = torch.empty(1000, device="npu")
    st = torch.npu.memory_stats()
    assert st["allocation.all.allocated"] == 1
    assert st["allocated_bytes.all.allocated"] == 4096
    assert st["requested_bytes.all.allocated"] == 4000
    del t


CUDA_KEYS = [
    "allocated_bytes.all.current", "allocated_bytes.all.peak", "allocated_bytes.all.allocated",
    "allocated_bytes.all.freed", "allocated_bytes.small_pool.current", "allocated_bytes.large_pool.current",
    "reserved_bytes.all.current", "reserved_bytes.large_pool.peak", "reserved_bytes.small_pool.current",
    "active_bytes.all.current", "inactive_split_bytes.all.current", "requested_bytes.all.current",
    "allocation.all.current", "allocation.large_pool.current", "segment.all.current", "active.all.current",
    "inactive_split.all.current", "num_alloc_retries", "num_ooms", "num_sync_all_streams",
    "num_device_alloc", "num_device_free", "max_split_size", "oversize_allocations.current",
    "oversize_segments.current",
]


def test_memory_stats_keys_and_consistency():
    st0 = torch.npu.memory_stats()
    keep = [torch.empty(1000, device="npu"), torch.empty(3 * MiB, dtype=torch.uint8, device="npu")]
    drop = torch.empty(100, device="npu")
    del drop
    st = torch.npu.memory_stats()
    missing = [k for k in CUDA_KEYS if k not in st]
    assert not missing
    assert list(st.keys()) == sorted(st.keys())
    for stat in ("allocated_bytes", "reserved_bytes", "active_bytes", "requested_bytes", "allocation",
                 "segment", "active", "inactive_split", "inactive_split_bytes"):
        for field in ("current", "allocated", "freed"):
            assert (st[f"{stat}.all.{field}"]
                    == st[f"{stat}.small_pool.{field}"] + st[f"{stat}.large_pool.{field}"]), (stat, field)
        delta = {f: st[f"{stat}.all.{f}"] - st0[f"{stat}.all.{f}"] for f in ("current", "allocated", "freed")}
        assert delta["current"] == delta["allocated"] - delta["freed"], stat
        assert st[f"{stat}.all.peak"] >= st[f"{stat}.all.current"], stat
    assert st["allocated_bytes.all.current"] == torch.npu.memory_allocated()
    assert st["reserved_bytes.all.current"] == torch.npu.memory_reserved()
    assert st["requested_bytes.all.current"] <= st["allocated_bytes.all.current"]
    assert st["active_bytes.all.current"] >= st["allocated_bytes.all.current"]
    assert (st["reserved_bytes.all.current"]
            >= st["allocated_bytes.all.current"] + st["inactive_split_bytes.all.current"])
    assert st["allocation.all.current"] - st0["allocation.all.current"] == 2
    assert st["allocation.all.allocated"] - st0["allocation.all.allocated"] == 3
    assert st["allocation.all.freed"] - st0["allocation.all.freed"] == 1
    assert st["allocation.large_pool.current"] - st0["allocation.large_pool.current"] == 1
    assert st["requested_bytes.all.current"] - st0["requested_bytes.all.current"] == 4000 + 3 * MiB
    nested = torch.npu.memory_stats_as_nested_dict()
    assert nested["allocated_bytes"]["all"]["current"] == st["allocated_bytes.all.current"]
    del keep


def test_allocation_count_tracks_tensors():
    n0 = torch.npu.memory_stats()["allocation.all.current"]
    ts = [torch.empty(100, device="npu") for _ in range(5)]
    assert torch.npu.memory_stats()["allocation.all.current"] == n0 + 5
    del ts
    assert torch.npu.memory_stats()["allocation.all.current"] == n0


def test_memory_summary():
    s = torch.npu.memory_summary()
    assert "PyTorch NPU memory summary, device ID 0" in s
    assert "Allocated memory" in s and "NPU reserved memory" in s
    assert "PyTorch NPU memory summary, device ID 3" in torch.npu.memory_summary(device=3)
    assert "from large pool" not in torch.npu.memory_summary(abbreviated=True)


def test_memory_snapshot_contains_live_tensor():
    t = torch.empty(1000, device="npu")
    big = torch.empty(12 * MiB, dtype=torch.uint8, device="npu:1")
    segs = torch.npu.memory_snapshot()
    for tensor, dev, kind in ((t, 0, "small"), (big, 1, "large")):
        ptr = tensor.data_ptr()
        hits = [s for s in segs if s["address"] <= ptr < s["address"] + s["total_size"]]
        assert len(hits) == 1
        seg = hits[0]
        assert seg["device"] == dev
        assert seg["segment_type"] == kind
        assert sum(b["size"] for b in seg["blocks"]) == seg["total_size"]
        blocks = [b for b in seg["blocks"] if b["address"] == ptr]
        assert len(blocks) == 1
        assert blocks[0]["state"] == "active_allocated"
        assert blocks[0]["requested_size"] == tensor.untyped_storage().nbytes()
        assert blocks[0]["size"] >= tensor.untyped_storage().nbytes()
    assert torch.npu.memory_snapshot()  # still non-empty
    del t, big


def test_mem_get_info_in_process():
    free, total = torch.npu.mem_get_info()
    assert total == torch.npu.get_device_properties(0).total_memory
    assert 0 <= free <= total - torch.npu.memory_reserved(0)


def test_caching_allocator_alloc_and_delete():
    before = torch.npu.memory_allocated()
    p = torch.npu.caching_allocator_alloc(10000)
    assert isinstance(p, int) and p != 0
    assert torch.npu.memory_allocated() - before == 10240
    torch.npu.caching_allocator_delete(p)
    assert torch.npu.memory_allocated() == before
    b3 = torch.npu.memory_allocated(3)
    p3 = torch.npu.caching_allocator_alloc(4000, device=3, stream=torch.npu.current_stream(3))
    assert torch.npu.memory_allocated(3) - b3 == 4096
    assert torch.npu.memory_allocated() == before
    torch.npu.caching_allocator_delete(p3)
    assert torch.npu.memory_allocated(3) == b3


def test_empty_cache_releases_to_driver():
    dev = 6
    t = torch.empty(50 * MiB, dtype=torch.uint8, device=f"npu:{dev}")
    reserved_with = torch.npu.memory_reserved(dev)
    del t
    assert torch.npu.memory_reserved(dev) == reserved_with               # cached
    torch.npu.empty_cache()
    assert torch.npu.memory_reserved(dev) <= reserved_with - 50 * MiB
    assert torch.npu.memory_reserved(dev) >= torch.npu.memory_allocated(dev)


def test_per_process_memory_fraction_limits_allocations():
    dev = 5
    total = torch.npu.get_device_properties(dev).total_memory
    try:
        torch.npu.set_per_process_memory_fraction(0.01, dev)
        assert torch.npu.get_per_process_memory_fraction(dev) == 0.01
        ooms = torch.npu.memory_stats(dev)["num_ooms"]
        ok = torch.empty(64 * MiB, dtype=torch.uint8, device=f"npu:{dev}")
        with pytest.raises(torch.OutOfMemoryError) as ei:
            torch.empty(int(total * 0.02), dtype=torch.uint8, device=f"npu:{dev}")
        msg = str(ei.value)
        assert msg.startswith("NPU out of memory. Tried to allocate ")
        assert f"(NPU {dev}; " in msg
        assert f"{format_size(int(total * 0.01))} allowed; " in msg
        assert OOM_TAIL in msg
        assert torch.npu.memory_stats(dev)["num_ooms"] == ooms + 1
        del ok
    finally:
        torch.npu.set_per_process_memory_fraction(1.0, dev)
    big = torch.empty(int(total * 0.02), dtype=torch.uint8, device=f"npu:{dev}")   # allowed again
    del big
    torch.npu.empty_cache()


def test_set_per_process_memory_fraction_argument_checks():
    with pytest.raises(ValueError):
        torch.npu.set_per_process_memory_fraction(1.5)
    with pytest.raises(TypeError):
        torch.npu.set_per_process_memory_fraction(1)
    assert torch.npu.get_per_process_memory_fraction() == 1.0


def test_oom_past_capacity_in_process():
    total = torch.npu.get_device_properties(0).total_memory
    ooms = torch.npu.memory_stats()["num_ooms"]
    before = torch.npu.memory_allocated()
    with pytest.raises(torch.OutOfMemoryError) as ei:
        torch.empty(total + GiB, dtype=torch.uint8, device="npu")
    assert isinstance(ei.value, RuntimeError)
    msg = str(ei.value)
    assert msg.startswith("NPU out of memory. Tried to allocate ")
    assert f"(NPU 0; {format_size(total)} total capacity; " in msg
    assert OOM_TAIL in msg
    assert torch.npu.memory_stats()["num_ooms"] == ooms + 1
    assert torch.npu.memory_allocated() == before
    # The process keeps working.
    a = torch.randn(64, 64)
    b = torch.randn(64, 64)
    torch.testing.assert_close((a.npu() @ b.npu()).cpu(), a @ b)


def test_oom_more_than_1eb():
    with pytest.raises(torch.OutOfMemoryError) as ei:
        torch.empty(2 ** 60, dtype=torch.uint8, device="npu")
    assert str(ei.value).startswith("NPU out of memory. Tried to allocate more than 1EB memory.")


def test_op_outputs_live_in_device_memory():
    n = 1 << 20
    a_cpu = torch.randn(n)
    b_cpu = torch.randn(n)
    a, b = a_cpu.npu(), b_cpu.npu()
    m0 = torch.npu.memory_allocated()
    c = a + b
    grown = torch.npu.memory_allocated() - m0
    assert 4 * MiB <= grown <= npu_block_size(4 * MiB)
    assert c.device == torch.device("npu:0")
    torch.testing.assert_close(c.cpu(), a_cpu + b_cpu)
    ptr = c.data_ptr()
    assert any(s["device"] == 0 and s["address"] <= ptr < s["address"] + s["total_size"]
               for s in torch.npu.memory_snapshot())
    del c
    assert torch.npu.memory_allocated() == m0
    # same on another device
    m1 = torch.npu.memory_allocated(1)
    x = torch.randn(256, 256, device="npu:1")
    y = x @ x
    assert torch.npu.memory_allocated(1) - m1 >= 2 * 256 * 256 * 4
    del x, y
    assert torch.npu.memory_allocated(1) == m1


def test_temporaries_do_not_leak():
    x_cpu = torch.randn(128, 128)
    x = x_cpu.npu()
    y = ((x * 2 + 1).relu() @ x).sum(dim=0)
    baseline = torch.npu.memory_allocated()
    seen = []
    for _ in range(100):
        y = ((x * 2 + 1).relu() @ x).sum(dim=0)
        seen.append(torch.npu.memory_allocated())
    assert set(seen) == {baseline}
    torch.testing.assert_close(y.cpu(), ((x_cpu * 2 + 1).relu() @ x_cpu).sum(dim=0), rtol=1e-4, atol=1e-3)
    del y
    assert torch.npu.memory_allocated() < baseline


def test_views_inplace_and_out_do_not_allocate():
    x_cpu = torch.randn(1000, 10)
    x = x_cpu.npu()
    m0 = torch.npu.memory_allocated()
    v, r, t = x[10:], x.view(10000), x.t()
    assert x.npu() is x and x.to("npu:0") is x
    e = torch.empty(0, device="npu")
    assert torch.npu.memory_allocated() == m0
    ptr = x.data_ptr()
    x.add_(1).mul_(2)
    assert x.data_ptr() == ptr and torch.npu.memory_allocated() == m0
    out = torch.empty(1000, 10, device="npu")
    m1 = torch.npu.memory_allocated()
    assert m1 - m0 == npu_block_size(40000) == 40448
    optr = out.data_ptr()
    torch.add(x, x, out=out)
    assert out.data_ptr() == optr and torch.npu.memory_allocated() == m1
    torch.testing.assert_close(out.cpu(), ((x_cpu + 1) * 2) * 2)
    c = t.contiguous()
    assert torch.npu.memory_allocated() - m1 == 40448
    del v, r, t, e, c, out


def test_torch_accelerator_memory_api_agrees():
    keep = torch.empty(1000, device="npu")
    assert torch.accelerator.memory_allocated() == torch.npu.memory_allocated()
    assert torch.accelerator.memory_reserved() == torch.npu.memory_reserved()
    assert torch.accelerator.memory_stats()["allocated_bytes.all.current"] == torch.npu.memory_allocated()
    assert tuple(torch.accelerator.get_memory_info()) == tuple(torch.npu.mem_get_info())
    del keep
