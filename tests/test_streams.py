"""Streams and events of torch.npu (spec: real torch_npu 2.13.0, same semantics as torch.cuda)."""
import time

import pytest
import torch

import torch_npu  # noqa: F401


def _reset():
    torch.npu.set_device(0)
    for d in range(min(torch.npu.device_count(), 4)):
        torch.npu.set_stream(torch.npu.default_stream(d))
    torch.npu.set_device(0)


@pytest.fixture(autouse=True)
def _restore_streams():
    _reset()
    yield
    _reset()


def test_stream_creation():
    s = torch.npu.Stream()
    assert isinstance(s, torch.npu.Stream)
    assert isinstance(s, torch.Stream)
    assert s.device == torch.device("npu:0")
    assert s.device_index == 0
    s2 = torch.npu.Stream()
    assert s != s2 and s.stream_id != s2.stream_id
    assert s == s and hash(s) == hash(s)
    assert s != torch.npu.default_stream()
    s1 = torch.npu.Stream(device=1)
    assert s1.device == torch.device("npu:1")
    assert torch.npu.Stream(device="npu:2", priority=-1).device == torch.device("npu:2")
    with torch.npu.device(3):
        assert torch.npu.Stream().device == torch.device("npu:3")


def test_current_and_default_stream():
    d = torch.npu.default_stream()
    c = torch.npu.current_stream()
    assert d == c
    assert d.device == torch.device("npu:0")
    assert torch.npu.default_stream(1).device == torch.device("npu:1")
    assert torch.npu.current_stream(2) == torch.npu.default_stream(2)
    assert torch.npu.default_stream(1) != d
    torch.npu.set_device(2)
    assert torch.npu.current_stream().device == torch.device("npu:2")
    assert torch.npu.current_stream() == torch.npu.default_stream(2)


def test_stream_context_switches_and_restores():
    s = torch.npu.Stream()
    s2 = torch.npu.Stream()
    default = torch.npu.default_stream()
    with torch.npu.stream(s):
        assert torch.npu.current_stream() == s
        with torch.npu.stream(s2):
            assert torch.npu.current_stream() == s2
        assert torch.npu.current_stream() == s
        x = torch.arange(4.0, device="npu") * 3
    assert torch.npu.current_stream() == default
    assert x.cpu().tolist() == [0.0, 3.0, 6.0, 9.0]
    with torch.npu.stream(None):      # no-op
        assert torch.npu.current_stream() == default


def test_set_stream():
    s = torch.npu.Stream()
    torch.npu.set_stream(s)
    assert torch.npu.current_stream() == s
    assert torch.npu.current_stream() != torch.npu.default_stream()
    torch.npu.set_stream(torch.npu.default_stream())
    assert torch.npu.current_stream() == torch.npu.default_stream()


def test_stream_context_on_other_device_switches_device():
    s1 = torch.npu.Stream(device=1)
    with torch.npu.stream(s1):
        assert torch.npu.current_device() == 1
        assert torch.npu.current_stream() == s1
    assert torch.npu.current_device() == 0
    assert torch.npu.current_stream() == torch.npu.default_stream(0)
    assert torch.npu.current_stream(1) == torch.npu.default_stream(1)
    torch.npu.set_stream(s1)
    assert torch.npu.current_device() == 1
    assert torch.npu.current_stream() == s1


def test_query_synchronize_wait_stream():
    s = torch.npu.Stream()
    a = torch.randn(64, 64)
    with torch.npu.stream(s):
        out = a.npu() @ a.npu()
    assert s.query() is True
    s.synchronize()
    default = torch.npu.current_stream()
    default.wait_stream(s)
    torch.testing.assert_close(out.cpu(), a @ a)
    s.wait_stream(default)
    assert default.query() is True
    torch.npu.synchronize()
    torch.npu.synchronize(1)


def test_record_event():
    s = torch.npu.Stream()
    e = s.record_event()
    assert isinstance(e, torch.npu.Event)
    assert e.query() is True
    e.synchronize()
    e2 = torch.npu.Event()
    s.record_event(e2)
    e2.wait()                  # current stream waits on it
    e2.wait(s)
    s.wait_event(e2)
    assert e2.query() is True


def test_event_elapsed_time_matches_sleep():
    start = torch.npu.Event(enable_timing=True)
    end = torch.npu.Event(enable_timing=True)
    start.record()
    time.sleep(0.05)
    end.record()
    end.synchronize()
    ms = start.elapsed_time(end)
    assert 40.0 <= ms <= 500.0
    quick_start = torch.npu.Event(enable_timing=True)
    quick_end = torch.npu.Event(enable_timing=True)
    quick_start.record()
    quick_end.record()
    quick = quick_start.elapsed_time(quick_end)
    assert 0.0 <= quick < ms


def test_event_elapsed_time_on_streams():
    s = torch.npu.Stream()
    start = torch.npu.Event(enable_timing=True)
    end = torch.npu.Event(enable_timing=True)
    start.record(s)
    time.sleep(0.02)
    end.record(s)
    assert start.elapsed_time(end) >= 15.0


def test_elapsed_time_requires_timing():
    a = torch.npu.Event()
    b = torch.npu.Event()
    a.record()
    b.record()
    with pytest.raises(RuntimeError) as ei:
        a.elapsed_time(b)
    assert "enable_timing=True" in str(ei.value)
    t1 = torch.npu.Event(enable_timing=True)
    t1.record()
    with pytest.raises(RuntimeError):
        t1.elapsed_time(a)


def test_elapsed_time_requires_recorded_events():
    a = torch.npu.Event(enable_timing=True)
    b = torch.npu.Event(enable_timing=True)
    a.record()
    with pytest.raises(RuntimeError):
        a.elapsed_time(b)


@pytest.mark.parametrize("kind", ["torch.npu.Event", "torch.Event"])
def test_elapsed_time_between_devices_raises_like_cuda(kind):
    """CUDA cannot compare two devices' clocks (cudaEventElapsedTime fails); neither can the npu."""
    if torch.npu.device_count() < 4:
        pytest.skip("needs npu:3")
    if kind == "torch.npu.Event":
        a, b = torch.npu.Event(enable_timing=True), torch.npu.Event(enable_timing=True)
    else:
        a, b = torch.Event(device="npu:0", enable_timing=True), torch.Event(device="npu:3", enable_timing=True)
    a.record(torch.npu.current_stream(0))
    b.record(torch.npu.current_stream(3))
    expected = ("Both events must be recorded on the same device to calculate elapsed time, but the start event "
                "was recorded on npu:0 and the end event on npu:3.")
    with pytest.raises(RuntimeError) as ei:
        a.elapsed_time(b)
    assert expected in str(ei.value)
    with pytest.raises(RuntimeError, match="start event was recorded on npu:3 and the end event on npu:0"):
        b.elapsed_time(a)
    # two events on the one device still time
    c = torch.npu.Event(enable_timing=True) if kind == "torch.npu.Event" else \
        torch.Event(device="npu:3", enable_timing=True)
    c.record(torch.npu.current_stream(3))
    assert 0.0 <= b.elapsed_time(c) < 60_000


def test_tensor_record_stream():
    s = torch.npu.Stream()
    x = torch.arange(6.0, device="npu")
    with torch.npu.stream(s):
        y = x * 2
    x.record_stream(s)
    y.record_stream(torch.npu.current_stream())
    assert y.cpu().tolist() == [0.0, 2.0, 4.0, 6.0, 8.0, 10.0]


def test_generic_torch_stream_and_event():
    ts = torch.Stream(device="npu")
    assert ts.device == torch.device("npu:0")
    assert ts.device.type == "npu"
    assert ts.device_type == torch._C._autograd.DeviceType.PrivateUse1.value
    assert ts.query() is True
    ts.synchronize()
    t1 = torch.Stream(device="npu:1")
    assert t1.device_index == 1
    with torch.npu.stream(ts):
        assert torch.npu.current_stream().stream_id == ts.stream_id
    ev = torch.Event(device="npu")
    ev.record(ts)
    ev.synchronize()
    assert ev.query() is True
    cur = torch.accelerator.current_stream()
    npu_cur = torch.npu.current_stream()
    assert (cur.stream_id, cur.device) == (npu_cur.stream_id, npu_cur.device)
