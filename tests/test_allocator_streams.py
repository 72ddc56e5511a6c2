"""Stream-ordered reuse in the npu caching allocator (CUDA's rule).

A block freed on stream A goes back to A's pool: only allocations on A reuse it.
After ``record_stream(B)`` the freed block waits (still "active") until B has
progressed past the free: an event recorded on B, ``B.synchronize()``,
``torch.npu.synchronize()``; ``empty_cache`` (and the out-of-memory retry) wait
for every stream at once. Expected pointers and sizes come from the allocator's
documented rounding: 4096 bytes is one 4608-byte small-pool block in a 2 MiB segment.
"""
import gc

import pytest
import torch

import torch_npu

NBYTES = 4096
BLOCK = 4608  # torch_npu pads a request by 32 bytes, then rounds up to 512
SMALL_SEGMENT = 2 * 1024 * 1024


def _alloc():
    return torch.empty(NBYTES, dtype=torch.uint8, device="npu")


def _ptr(t):
    return t.untyped_storage().data_ptr()


def _stat(key):
    return torch.npu.memory_stats()[key]


@pytest.fixture(autouse=True)
def _fresh():
    torch.npu.set_device(0)
    torch.npu.set_stream(torch.npu.default_stream(0))
    gc.collect()
    torch.npu.empty_cache()
    yield
    torch.npu.set_stream(torch.npu.default_stream(0))
    gc.collect()
    torch.npu.empty_cache()


def _on(stream):
    return torch.npu.stream(stream)


def _free_after_use_on(*streams, before_free=None):
    """Allocate a block on the current stream, record_stream it on `streams`,
    run `before_free`, free it; returns its pointer."""
    x = _alloc()
    p = _ptr(x)
    for s in streams:
        x.record_stream(s)
    if before_free is not None:
        before_free(x)
    del x
    return p


def test_block_freed_on_one_stream_is_not_handed_to_another():
    a, b = torch.npu.Stream(), torch.npu.Stream()
    with _on(a):
        x = _alloc()
    p = _ptr(x)
    del x
    reserved = torch.npu.memory_reserved()
    with _on(b):
        y = _alloc()
    assert _ptr(y) != p
    # b had no segment: a new one was reserved although a's block is free.
    assert torch.npu.memory_reserved() == reserved + SMALL_SEGMENT
    with _on(a):
        z = _alloc()
    assert _ptr(z) == p
    assert torch.npu.memory_reserved() == reserved + SMALL_SEGMENT
    del y, z


def test_default_stream_and_side_stream_have_separate_pools():
    x = _alloc()
    p = _ptr(x)
    del x
    s = torch.npu.Stream()
    with _on(s):
        y = _alloc()
    assert _ptr(y) != p
    z = _alloc()
    assert _ptr(z) == p


def test_segments_carry_their_stream_in_the_snapshot():
    s = torch.npu.Stream()
    with _on(s):
        x = _alloc()
    segs = [seg for seg in torch.npu.memory_snapshot() if seg["address"] <= _ptr(x) < seg["address"] + seg["total_size"]]
    assert len(segs) == 1 and segs[0]["stream"] == s.npu_stream


def test_record_stream_delays_reuse_until_the_other_stream_progresses():
    a, b = torch.npu.Stream(), torch.npu.Stream()
    with _on(a):
        x = _alloc()
        p = _ptr(x)
        x.record_stream(b)
        active = _stat("active_bytes.all.current")
        allocated = _stat("allocated_bytes.all.current")
        del x
        # Freed: no longer allocated, but still active (pending) as on CUDA.
        assert _stat("allocated_bytes.all.current") == allocated - BLOCK
        assert _stat("active_bytes.all.current") == active
        state = [blk["state"] for seg in torch.npu.memory_snapshot() for blk in seg["blocks"] if blk["address"] == p]
        assert state == ["active_pending_free"]
        y = _alloc()
        assert _ptr(y) != p  # b has not been seen to progress
        del y
        b.record_event()  # b reaches a point after the free
        z = _alloc()
        assert _ptr(z) == p
        assert _stat("active_bytes.all.current") == active


@pytest.mark.parametrize("how", ["stream_sync", "device_sync", "wait_stream"])
def test_synchronising_the_recorded_stream_releases_the_block(how):
    a, b = torch.npu.Stream(), torch.npu.Stream()
    with _on(a):
        p = _free_after_use_on(b)
        if how == "stream_sync":
            b.synchronize()
        elif how == "device_sync":
            torch.npu.synchronize()
        else:
            a.wait_stream(b)  # records an event on b
        y = _alloc()
        assert _ptr(y) == p


def test_a_sync_before_the_free_does_not_count():
    a, b = torch.npu.Stream(), torch.npu.Stream()
    with _on(a):
        p = _free_after_use_on(b, before_free=lambda x: (b.synchronize(), torch.npu.synchronize()))
        y = _alloc()
        assert _ptr(y) != p


def test_every_recorded_stream_must_progress():
    a, b, c = torch.npu.Stream(), torch.npu.Stream(), torch.npu.Stream()
    with _on(a):
        p = _free_after_use_on(b, c)
        b.synchronize()
        y = _alloc()
        assert _ptr(y) != p
        c.synchronize()
        z = _alloc()
        assert _ptr(z) == p


def test_record_stream_on_the_allocation_stream_changes_nothing():
    a = torch.npu.Stream()
    with _on(a):
        p = _free_after_use_on(a)
        y = _alloc()
        assert _ptr(y) == p


def test_erase_stream_cancels_the_delay():
    a, b = torch.npu.Stream(), torch.npu.Stream()
    with _on(a):
        p = _free_after_use_on(b, before_free=lambda x: torch_npu.erase_stream(x, b))
        y = _alloc()
        assert _ptr(y) == p


def test_empty_cache_waits_for_every_stream_and_releases():
    a, b = torch.npu.Stream(), torch.npu.Stream()
    syncs = _stat("num_sync_all_streams")
    with _on(a):
        x = _alloc()
        x.record_stream(b)
        reserved = torch.npu.memory_reserved()
        del x
        assert torch.npu.memory_reserved() == reserved
        torch.npu.empty_cache()
    assert _stat("num_sync_all_streams") == syncs + 1
    assert _stat("active_bytes.all.current") == 0
    assert torch.npu.memory_reserved() == 0
    assert _stat("segment.small_pool.current") == 0


def test_per_pool_statistics_follow_the_streams():
    a, b = torch.npu.Stream(), torch.npu.Stream()
    with _on(a):
        x = _alloc()
    with _on(b):
        y = _alloc()
    assert _stat("segment.small_pool.current") == 2
    assert _stat("allocation.small_pool.current") == 2
    assert _stat("reserved_bytes.small_pool.current") == 2 * SMALL_SEGMENT
    del x, y
    assert _stat("allocation.small_pool.current") == 0
    assert _stat("reserved_bytes.small_pool.current") == 2 * SMALL_SEGMENT
    torch.npu.empty_cache()
    assert _stat("segment.small_pool.current") == 0


def test_out_of_memory_retry_waits_for_pending_blocks():
    """The retry before an OOM returns pending blocks, as CUDA's
    synchronize_and_free_events, so a record_stream'd block cannot cause an OOM."""
    a, b = torch.npu.Stream(), torch.npu.Stream()
    total = torch.npu.get_device_properties(0).total_memory
    limit = 64 << 20
    big = 40 << 20  # two of these never fit under the limit at once
    retries = _stat("num_alloc_retries")
    torch.npu.set_per_process_memory_fraction(limit / total, 0)
    try:
        with _on(a):
            x = torch.empty(big, dtype=torch.uint8, device="npu")
            x.record_stream(b)
            del x
            y = torch.empty(big, dtype=torch.uint8, device="npu")  # fits only once the pending block is released
            assert y.numel() == big
            del y
    finally:
        torch.npu.set_per_process_memory_fraction(1.0, 0)
    assert _stat("num_alloc_retries") == retries + 1
