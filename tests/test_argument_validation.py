"""Device arguments and argument types are checked as the real torch_npu 2.13 checks them.

Spec: the real ``torch_npu/npu/utils.py::_get_device_index`` (an int is taken
as is; a str goes through ``torch.device``; a non-npu ``torch.device`` is a
``ValueError``; anything else defers to ``torch._utils._get_device_index``,
which gives the current device when the index is optional, so a float means
"current device"), SURFACE.md "Invalid device ordinal" (``AssertionError("Invalid
device id")``, ``RuntimeError`` from ``aclrtSetDevice``), and CUDA's signatures
that the real functions share (``device_count()`` takes no argument).
"""
import pytest
import torch

import torch_npu  # noqa: F401

npu = torch.npu


@pytest.fixture(autouse=True)
def _device_zero():
    npu.set_device(0)
    yield
    npu.set_device(0)


@pytest.mark.parametrize("arg,expected", [(1, 1), ("npu:1", 1), (torch.device("npu", 1), 1), ("npu", 0),
                                          (torch.device("npu"), 0), (None, 0), (0.0, 0), (1.0, 0), (-1, 0)])
def test_set_device_forms(arg, expected):
    npu.set_device(arg)      # index-less forms and floats keep the current device; -1 is a no-op
    assert npu.current_device() == expected


@pytest.mark.parametrize("fn", [npu.set_device, npu.synchronize, npu.get_device_name, npu.mem_get_info,
                                npu.memory_stats, npu.memory_allocated, npu.current_stream, npu.default_stream,
                                npu.get_device_properties, npu.utilization, npu.device])
def test_cpu_device_is_a_value_error(fn):
    for arg in ("cpu", torch.device("cpu")):
        with pytest.raises(ValueError, match="Expected a npu device, but got: cpu"):
            fn(arg)


@pytest.mark.parametrize("fn", [npu.set_device, npu.synchronize, npu.mem_get_info, npu.get_device_name])
def test_unparsable_device_string_is_torch_device_error(fn):
    with pytest.raises(RuntimeError) as parsed:
        torch.device("not-a-device")
    with pytest.raises(RuntimeError) as raised:
        fn("not-a-device")
    assert str(raised.value) == str(parsed.value)


@pytest.mark.parametrize("fn", [npu.get_device_name, npu.get_device_properties, npu.mem_get_info,
                                npu.utilization, npu.memory_allocated, npu.reset_peak_memory_stats])
def test_out_of_range_index_is_invalid_device_id(fn):
    for arg in (99, -2, "npu:99"):
        with pytest.raises(AssertionError, match="Invalid device id"):
            fn(arg)


def test_set_device_out_of_range_fails_in_the_runtime():
    with pytest.raises(RuntimeError, match="Invalid device ID"):
        npu.set_device(99)
    assert npu.current_device() == 0


@pytest.mark.parametrize("arg", [0, "npu:0", torch.device("npu", 0), None, "npu"])
def test_every_device_form_reaches_the_same_device(arg):
    assert npu.get_device_name(arg) == npu.get_device_name(0)
    assert npu.mem_get_info(arg) == npu.mem_get_info(0)
    assert npu.memory_allocated(arg) == npu.memory_allocated(0)
    assert npu.current_stream(arg) == npu.current_stream(0)
    assert npu.synchronize(arg) is None


def test_device_count_takes_no_argument():
    assert isinstance(npu.device_count(), int) and npu.device_count() >= 2
    with pytest.raises(TypeError):
        npu.device_count(0)


def test_streams_and_events_check_their_arguments():
    assert npu.Stream(device="npu:1").device == torch.device("npu", 1)
    with pytest.raises(ValueError, match="Expected a npu device"):
        npu.Stream(device="cpu")
    with pytest.raises(RuntimeError):
        npu.Stream(device=99)
    with pytest.raises(TypeError):
        npu.Event(enable_timing="yes")
    with pytest.raises(AttributeError):   # the real set_stream reads stream.stream_id
        npu.set_stream("stream")
    assert npu.set_stream(None) is None


def test_memory_fraction_and_rng_argument_types():
    with pytest.raises(TypeError):
        npu.set_per_process_memory_fraction("half")
    with pytest.raises(ValueError):
        npu.set_per_process_memory_fraction(2.0)
    with pytest.raises(RuntimeError, match="Invalid device_index"):
        npu.get_rng_state(99)


def test_device_context_manager_forms():
    assert npu.device("npu:1").idx == 1
    assert npu.device(torch.device("npu", 1)).idx == 1
    assert npu.device(npu.device(1)).idx == 1
    assert npu.device(1.0).idx == npu.current_device()
    with npu.device("npu:1"):
        assert npu.current_device() == 1
    assert npu.current_device() == 0
