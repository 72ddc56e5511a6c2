"""The NPU trace hooks (torch_npu.utils._npu_trace, torch_npu._C._activate_npu_trace).

The reference for every identity is what Python sees of the same object:
``Stream.npu_stream``, ``Event.npu_event``, ``untyped_storage().data_ptr()``.
"""
import gc
import sys

import pytest
import torch

import torch_npu
from torch_npu.utils import _npu_trace as trace

STREAM_KINDS = [
    "npu_event_creation", "npu_event_deletion", "npu_event_record", "npu_event_wait",
    "npu_memory_allocation", "npu_memory_deallocation", "npu_stream_creation",
    "npu_device_synchronization", "npu_stream_synchronization", "npu_event_synchronization",
    "npu_record_stream", "npu_erase_stream",
]
KERNEL_KINDS = ["acl_start_execution", "acl_finish_execution"]


@pytest.fixture(autouse=True)
def _clean_trace():
    """Hooks off and registries empty around each test (both are process-wide)."""
    saved = [list(r.callback_list) for r in trace._REGISTRIES]
    torch_npu._C._deactivate_npu_trace()
    for r in trace._REGISTRIES:
        r.callback_list.clear()
    torch.npu.set_stream(torch.npu.default_stream(0))
    yield
    torch_npu._C._deactivate_npu_trace()
    torch.npu.set_stream(torch.npu.default_stream(0))
    for r, cbs in zip(trace._REGISTRIES, saved):
        r.callback_list[:] = cbs


def _record_all(kinds):
    """Register a recorder on every registry in `kinds`; returns the shared log."""
    log = []
    for kind in kinds:
        register = getattr(trace, "register_callback_for_" + kind)
        register(lambda *args, _k=kind: log.append((_k,) + args), "test-recorder")
    return log


def _only(log, *kinds):
    return [e for e in log if e[0] in kinds]


def test_registry_names_match_the_real_module():
    for kind in STREAM_KINDS + KERNEL_KINDS:
        assert callable(getattr(trace, "register_callback_for_" + kind))
    # The dispatcher's table follows the core's Kind order: 14 kinds.
    assert len(trace._REGISTRIES) == 14
    assert trace._REGISTRIES[0] is trace.NPUACLStartExecuteCallbacks
    assert trace._REGISTRIES[13] is trace.NPUEraseStreamCallbacks


def test_nothing_fires_while_inactive():
    log = _record_all(STREAM_KINDS + KERNEL_KINDS)
    s = torch.npu.Stream()
    with torch.npu.stream(s):
        x = torch.ones(100, device="npu")
        y = x + 1
    e = torch.npu.Event()
    e.record(s)
    torch.npu.current_stream().wait_event(e)
    e.synchronize()
    s.synchronize()
    torch.npu.synchronize()
    y.record_stream(s)
    torch_npu.erase_stream(y, s)
    del x, y, e
    gc.collect()
    assert log == []
    assert torch_npu._C._npu_trace_active_mask() == 0


def test_bad_mode_is_rejected():
    with pytest.raises(ValueError, match="mode must be 0 .* or 1 .*got 2"):
        torch_npu._C._activate_npu_trace(2)
    assert torch_npu._C._npu_trace_active_mask() == 0


def test_stream_creation_reports_the_python_identity():
    log = _record_all(STREAM_KINDS)
    torch_npu._C._activate_npu_trace(0)
    s1 = torch.npu.Stream()
    s2 = torch.npu.Stream(device=1)
    assert s1.npu_stream == s1.stream_id and s1.npu_stream != s2.npu_stream
    assert torch.npu.default_stream().npu_stream == 0
    assert log == [("npu_stream_creation", s1.npu_stream), ("npu_stream_creation", s2.npu_stream)]


def test_event_lifecycle_in_order():
    log = _record_all(STREAM_KINDS)
    torch_npu._C._activate_npu_trace(0)
    s = torch.npu.Stream()
    other = torch.npu.Stream()
    del log[:]
    e = torch.npu.Event()
    assert log == []  # created lazily, at the first record (as CUDA)
    e.record(s)
    ev = e.npu_event
    assert ev != 0
    other.wait_event(e)
    e.synchronize()
    e.record(other)
    handle = e.npu_event
    del e
    gc.collect()
    assert handle == ev
    assert log == [
        ("npu_event_creation", ev),
        ("npu_event_record", ev, s.npu_stream),
        ("npu_event_wait", ev, other.npu_stream),
        ("npu_event_synchronization", ev),
        ("npu_event_record", ev, other.npu_stream),
        ("npu_event_deletion", ev),
    ]


def test_wait_stream_is_a_record_on_the_waited_stream_and_a_wait_on_the_waiter():
    log = _record_all(STREAM_KINDS)
    torch_npu._C._activate_npu_trace(0)
    a, b = torch.npu.Stream(), torch.npu.Stream()
    del log[:]
    a.wait_stream(b)
    recs = _only(log, "npu_event_record", "npu_event_wait")
    assert [(k, st) for k, _, st in recs] == [("npu_event_record", b.npu_stream), ("npu_event_wait", a.npu_stream)]
    assert recs[0][1] == recs[1][1]  # the same event


def test_synchronizations():
    log = _record_all(STREAM_KINDS)
    torch_npu._C._activate_npu_trace(0)
    s = torch.npu.Stream()
    del log[:]
    s.synchronize()
    torch.npu.synchronize()
    torch.npu.default_stream().synchronize()
    torch.accelerator.synchronize()
    assert log == [("npu_stream_synchronization", s.npu_stream), ("npu_device_synchronization",),
                   ("npu_stream_synchronization", 0), ("npu_device_synchronization",)]


def test_memory_allocation_and_free_report_the_block_pointer():
    log = _record_all(["npu_memory_allocation", "npu_memory_deallocation"])
    torch_npu._C._activate_npu_trace(0)
    s = torch.npu.Stream()
    with torch.npu.stream(s):
        x = torch.empty(1000, device="npu")
    ptr = x.untyped_storage().data_ptr()
    view = x[10:]
    assert log == [("npu_memory_allocation", ptr)]
    del x
    assert log == [("npu_memory_allocation", ptr)]  # the view keeps the block alive
    del view
    assert log == [("npu_memory_allocation", ptr), ("npu_memory_deallocation", ptr)]


def test_op_outputs_are_reported():
    log = _record_all(["npu_memory_allocation", "npu_memory_deallocation"])
    x = torch.ones(64, device="npu")
    torch_npu._C._activate_npu_trace(0)
    y = x * 2
    assert ("npu_memory_allocation", y.untyped_storage().data_ptr()) in log
    del y
    assert log[-1][0] == "npu_memory_deallocation"


def test_record_stream_and_erase_stream():
    log = _record_all(["npu_record_stream", "npu_erase_stream"])
    torch_npu._C._activate_npu_trace(0)
    s = torch.npu.Stream()
    x = torch.empty(256, device="npu")
    view = x[3:]
    view.record_stream(s)
    torch_npu.erase_stream(view, s)
    ptr = x.untyped_storage().data_ptr()
    assert log == [("npu_record_stream", ptr, s.npu_stream), ("npu_erase_stream", ptr, s.npu_stream)]


def test_kernel_mode_reports_kernels_only():
    log = _record_all(STREAM_KINDS + KERNEL_KINDS)
    x = torch.ones(8, device="npu")
    torch_npu._C._activate_npu_trace(1)
    y = torch.add(x, x)
    torch.npu.Stream()
    torch.npu.synchronize()
    assert log == [("acl_start_execution", "aten::add.Tensor"), ("acl_finish_execution", "aten::add.Tensor")]
    assert torch.equal(y.cpu(), torch.full((8,), 2.0))


def test_kernel_mode_reports_unboxed_kernels_in_place_tuple_and_list_ops():
    # these run on the unboxed kernels (csrc/aten/UnboxedKernels.cpp), not the boxed one
    log = _record_all(KERNEL_KINDS)
    x = torch.ones(2, 4, device="npu")
    torch_npu._C._activate_npu_trace(1)
    x.add_(x)
    torch.cat([x, x])
    x.max(1)
    torch.npu.synchronize()
    names = [e[1] for e in log if e[0] == "acl_start_execution"]
    assert names == ["aten::add_.Tensor", "aten::cat", "aten::max.dim"]
    assert [e[1] for e in log if e[0] == "acl_finish_execution"] == names


def test_kernel_mode_reports_arange_as_one_kernel():
    # arange's functional forms have an npu kernel of their own (aten/DirectKernels.cpp), as
    # in torch_npu: not the composite's empty plus arange.start_out
    log = _record_all(KERNEL_KINDS)
    torch_npu._C._activate_npu_trace(1)
    a = torch.arange(6, device="npu")
    b = torch.arange(1, 2, 0.25, device="npu")
    torch.npu.synchronize()
    names = [e[1] for e in log if e[0] == "acl_start_execution"]
    assert names == ["aten::arange.start_step", "aten::arange.start_step"]
    assert torch.equal(a.cpu(), torch.arange(6)) and torch.equal(b.cpu(), torch.arange(1, 2, 0.25))


def test_stream_mode_does_not_report_kernels():
    log = _record_all(KERNEL_KINDS)
    x = torch.ones(8, device="npu")
    torch_npu._C._activate_npu_trace(0)
    x.add_(1)
    assert log == []


def test_a_failing_callback_reaches_the_caller_and_the_others_still_run():
    seen = []

    def bad(stream):
        raise KeyError("listener broke")

    trace.register_callback_for_npu_stream_creation(bad, "bad-listener")
    trace.register_callback_for_npu_stream_creation(seen.append, "good-listener")
    torch_npu._C._activate_npu_trace(0)
    with pytest.raises(KeyError, match="listener broke") as info:
        torch.npu.Stream()
    assert any("bad-listener" in n for n in getattr(info.value, "__notes__", []))
    assert len(seen) == 1


def test_a_failing_deallocation_callback_goes_to_unraisablehook(monkeypatch):
    caught = []
    monkeypatch.setattr(sys, "unraisablehook", caught.append)

    def bad(ptr):
        raise RuntimeError("dealloc listener broke")

    trace.register_callback_for_npu_memory_deallocation(bad, "bad-listener")
    torch_npu._C._activate_npu_trace(0)
    x = torch.empty(10, device="npu")
    del x
    assert len(caught) == 1 and isinstance(caught[0].exc_value, RuntimeError)
    assert "dealloc listener broke" in str(caught[0].exc_value)


def test_csan_event_handler_accepts_the_callbacks():
    """torch.cuda._sanitizer's EventHandler consumes the reports as they come
    (its handlers assert on unknown events and pointers)."""
    import torch.cuda._sanitizer as csan

    handler = csan.EventHandler()
    pairs = {
        "npu_event_creation": handler._handle_event_creation,
        "npu_event_deletion": handler._handle_event_deletion,
        "npu_event_record": handler._handle_event_record,
        "npu_event_wait": handler._handle_event_wait,
        "npu_memory_allocation": handler._handle_memory_allocation,
        "npu_memory_deallocation": handler._handle_memory_deallocation,
        "npu_stream_creation": handler._handle_stream_creation,
        "npu_device_synchronization": handler._handle_device_synchronization,
        "npu_stream_synchronization": handler._handle_stream_synchronization,
        "npu_event_synchronization": handler._handle_event_synchronization,
    }
    for kind, fn in pairs.items():
        getattr(trace, "register_callback_for_" + kind)(fn, "csan")
    torch_npu._C._activate_npu_trace(0)
    s = torch.npu.Stream()
    with torch.npu.stream(s):
        x = torch.ones(32, device="npu")
    e = s.record_event()
    torch.npu.current_stream().wait_event(e)
    # CSAN's own happens-before state: the default stream now waits for s.
    x_ptr = x.untyped_storage().data_ptr()
    assert x_ptr in handler.tensors_accessed.accesses
    assert s.npu_stream in handler.syncs.current_sync_states
    # A write on s after the event, then a read on the default stream, which
    # waited only for the event recorded *before* the write: CSAN finds the
    # race from our ids.
    errors = handler._handle_kernel_launch(s.npu_stream, set(), {x_ptr}, set(), "aten::mul_", {x_ptr: ["x"]})
    assert errors == []
    errors = handler._handle_kernel_launch(
        torch.npu.current_stream().npu_stream, {x_ptr}, set(), set(), "aten::sum", {x_ptr: ["x"]})
    assert len(errors) == 1 and isinstance(errors[0], csan.UnsynchronizedAccessError)
    torch.npu.synchronize()
    del x, e
    gc.collect()
    assert x_ptr not in handler.tensors_accessed.accesses



def test_block_stream_is_known_in_the_allocation_and_deallocation_callbacks():
    seen = []
    for kind in ("npu_memory_allocation", "npu_memory_deallocation"):
        getattr(trace, "register_callback_for_" + kind)(
            lambda ptr, _k=kind: seen.append((_k, torch_npu._C._npu_block_stream(ptr))), "block-stream")
    torch_npu._C._activate_npu_trace(0)
    s = torch.npu.Stream()
    with torch.npu.stream(s):
        z = torch.empty(50, device="npu")
        # Another device's allocation uses that device's current stream (its default here).
        w = torch.empty(50, device="npu:1")
    ptr = z.untyped_storage().data_ptr()
    assert torch_npu._C._npu_block_stream(ptr) == s.npu_stream
    del z, w
    assert seen == [("npu_memory_allocation", s.npu_stream), ("npu_memory_allocation", 0),
                    ("npu_memory_deallocation", s.npu_stream), ("npu_memory_deallocation", 0)]
    assert torch_npu._C._npu_block_stream(ptr) == -1
