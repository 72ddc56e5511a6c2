"""C++ core services used by the profiler, graph mode and version gates:
the device timeline, the zero-copy CPU bridges and the emulated CANN version."""
import time

import pytest
import torch

import torch_npu

C = torch_npu._C


def _record(fn):
    C._npu_timeline_drain()
    C._npu_timeline_enable(True)
    try:
        fn()
    finally:
        C._npu_timeline_enable(False)
    return C._npu_timeline_drain()


def test_timeline_records_kernels_with_times_and_stream():
    x = torch.randn(64, 64, device="npu")
    t0 = time.time_ns()
    events = _record(lambda: torch.mm(x, x).sin())
    t1 = time.time_ns()
    names = [e[0] for e in events]
    assert names == ["aten::mm", "aten::sin"]
    for name, device, stream, start, end, kind, nbytes, tid in events:
        assert device == 0 and stream == 0 and kind == "kernel" and nbytes == 0
        assert t0 <= start <= end <= t1


def test_timeline_marks_fallback_with_copied_bytes():
    a = torch.randn(100, device="npu")
    b = torch.randn(100, device="npu")
    out = torch.empty(100, device="npu")
    events = _record(lambda: torch.fmax(a, b, out=out))
    fallback = [e for e in events if e[5] == "fallback"]
    assert [e[0] for e in fallback] == ["aten::fmax.out"]
    # a, b and out copied to the host (3 x 400 bytes), out copied back (400).
    assert fallback[0][6] == 4 * 400
    torch.testing.assert_close(out.cpu(), torch.fmax(a.cpu(), b.cpu()))


def test_timeline_off_records_nothing_and_follows_device_and_stream():
    x = torch.randn(8, device="npu:1")
    assert _record(lambda: None) == []
    x.sin()
    assert C._npu_timeline_drain() == []
    s = torch.npu.Stream(device="npu:1")

    def on_stream():
        with torch.npu.stream(s):
            x.cos()

    (event,) = _record(on_stream)
    assert event[0] == "aten::cos" and event[1] == 1 and event[2] == s.stream_id


def test_autograd_profiler_reports_npu_time():
    x = torch.randn(128, 128, device="npu")
    with torch.autograd.profiler.profile(use_device="npu") as prof:
        torch.mm(x, x)
    mm = [e for e in prof.key_averages() if e.key == "aten::mm"][0]
    assert mm.device_time_total > 0


def test_cpu_alias_and_adopt_are_zero_copy():
    x = torch.randn(4, 5, device="npu")[:, 1:]
    a = C._npu_cpu_alias(x)
    assert a.device.type == "cpu" and a.data_ptr() == x.data_ptr() and a.stride() == x.stride()
    a.mul_(2)  # writes through to device memory
    with C._DeviceMemoryScope(0):
        r = a + 1
    before = torch.npu.memory_allocated(0)
    y = C._npu_adopt(r, 0)
    assert y.device == torch.device("npu:0") and y.data_ptr() == r.data_ptr()
    assert torch.npu.memory_allocated(0) == before  # r's memory already came from the pool
    torch.testing.assert_close(y.cpu(), x.cpu() + 1)
    # Memory from outside the pool is copied in.
    z = C._npu_adopt(torch.ones(3), 0)
    assert z.device.type == "npu" and z.cpu().tolist() == [1.0, 1.0, 1.0]
    with pytest.raises(RuntimeError, match="expects an npu tensor"):
        C._npu_cpu_alias(torch.ones(2))


def test_module_to_npu_keeps_parameter_identity():
    # As CPU -> CUDA: an optimizer built before the move keeps training the model.
    torch.manual_seed(0)
    m = torch.nn.Linear(3, 2)
    ref = torch.nn.Linear(3, 2)
    ref.load_state_dict(m.state_dict())
    weight = m.weight
    opt = torch.optim.SGD(m.parameters(), lr=0.5)
    m.to("npu")
    assert m.weight is weight and weight.device.type == "npu"
    x = torch.randn(4, 3)
    m(x.npu()).square().sum().backward()
    opt.step()
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.5)
    ref(x).square().sum().backward()
    ref_opt.step()
    torch.testing.assert_close(m.weight.detach().cpu(), ref.weight.detach())
    assert not torch._has_compatible_shallow_copy_type(torch.ones(1, device="npu"),
                                                        torch.ones(1).to_sparse())


def test_deterministic_mode_fills_uninitialized_memory_like_cpu():
    torch.use_deterministic_algorithms(True)
    try:
        for dtype in (torch.float32, torch.bfloat16, torch.int32, torch.uint8):
            npu, cpu = torch.empty(3, dtype=dtype, device="npu"), torch.empty(3, dtype=dtype)
            if dtype.is_floating_point:
                assert bool(npu.isnan().all()) and bool(cpu.isnan().all())
            else:
                assert torch.equal(npu.cpu(), cpu) and int(cpu[0]) == torch.iinfo(dtype).max
        s = torch.empty_strided((2, 2), (1, 2), device="npu")
        assert bool(s.isnan().all())
        x = torch.zeros(2, device="npu")
        x.resize_(5)
        y = torch.zeros(2)
        y.resize_(5)
        assert x.cpu()[:2].tolist() == [0.0, 0.0] and bool(x.cpu()[2:].isnan().all())
        assert bool(y[2:].isnan().all())
    finally:
        torch.use_deterministic_algorithms(False)


def test_dynamo_backends_are_declared_as_entry_points():
    # As the real wheel: torch._dynamo finds the backends through package metadata.
    from importlib.metadata import entry_points
    declared = {e.name: e.value for e in entry_points(group="torch_dynamo_backends")}
    assert declared == {"npu": "torch_npu.dynamo.backends:_npu_backend",
                        "npugraph_ex": "torch_npu.dynamo.backends:_npugraph_ex_backend",
                        "npugraphs": "torch_npu.dynamo.backends:_npugraphs_backend"}
    import torch._dynamo
    assert {"npu", "npugraph_ex", "npugraphs"} <= set(torch._dynamo.list_backends(exclude_tags=()))
