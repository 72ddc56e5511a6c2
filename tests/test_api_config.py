"""torch.npu options, switches, limits, mstx, legacy types, CANN version and
utils helpers (spec: SURFACE.md §3/§8, error_messages.txt, the real texts)."""
import re
import warnings

import pytest
import torch

import torch_npu
from torch_npu.npu import _option_store

ERR_PARAM = "ERR00001 PTA invalid parameter"


@pytest.fixture(autouse=True)
def _restore_options():
    saved = dict(_option_store._options)
    yield
    _option_store._options.clear()
    _option_store._options.update(saved)


def test_set_option_validation_and_messages():
    with pytest.raises(TypeError, match=r"^npu option must be a dict\.") as ei:
        torch.npu.set_option(["ACL_PRECISION_MODE"])
    assert ERR_PARAM in str(ei.value)
    with pytest.raises(ValueError) as ei:
        torch.npu.set_option({"ACL_PRECISION_MODE": "fast"})
    assert str(ei.value).startswith("value of ACL_PRECISION_MODE should be in "
                                    "['allow_fp32_to_fp16', 'must_keep_origin_dtype'] but got fast")
    for bad in (0, 33, "x"):
        with pytest.raises(ValueError, match="value of ACL_AICORE_NUM"):
            torch.npu.set_option({"ACL_AICORE_NUM": bad})
    torch.npu.set_option({"ACL_AICORE_NUM": 8, "ACL_OP_COMPILER_CACHE_MODE": "force", "MY_KEY": 1})
    assert _option_store.get_option("ACL_AICORE_NUM") == b"8"
    assert _option_store.get_option("MY_KEY") == b"1"   # unknown keys pass through as str
    with pytest.warns(UserWarning, match="ACL_OP_SELECT_IMPL_MODE will be deprecated"):
        torch.npu.set_option({"ACL_OP_SELECT_IMPL_MODE": "high_precision"})


def test_mm_bmm_nd_default_and_option():
    assert torch.npu.get_mm_bmm_format_nd() is True
    torch.npu.set_option({"MM_BMM_ND_ENABLE": "disable"})
    assert torch.npu.get_mm_bmm_format_nd() is False
    torch.npu.set_mm_bmm_format_nd(True)
    assert torch.npu.get_mm_bmm_format_nd() is True


def test_compile_mode():
    assert torch.npu.is_jit_compile_false() is True       # 910B default: binary kernels
    torch.npu.set_compile_mode(jit_compile=True)
    assert torch.npu.is_jit_compile_false() is False
    torch.npu.set_compile_mode(jit_compile=False)
    assert torch.npu.is_jit_compile_false() is True


def test_hf32_switches_defaults_types_and_aclnn():
    assert torch.npu.matmul.allow_hf32 is False
    assert torch.npu.conv.allow_hf32 is True
    assert torch.npu.aclnn.allow_hf32 is True and torch.npu.aclnn.version() is None
    torch.npu.matmul.allow_hf32 = True
    torch.npu.conv.allow_hf32 = False
    assert torch.npu.matmul.allow_hf32 is True and torch.npu.conv.allow_hf32 is False
    assert torch.npu.aclnn.allow_hf32 is False               # same state as conv
    with torch.npu.aclnn.flags(allow_hf32=True):
        assert torch.npu.conv.allow_hf32 is True
    assert torch.npu.conv.allow_hf32 is False
    for obj in (torch.npu.matmul, torch.npu.conv):
        with pytest.raises(TypeError, match="allow_hf32 must be a bool") as ei:
            obj.allow_hf32 = 1
        assert "ERR00002 PTA invalid type" in str(ei.value)
    assert torch.npu.matmul.cube_math_type is None          # unset, as the torch_npu docs print it
    torch.npu.matmul.cube_math_type = torch.npu.CubeMathType.USE_HF32
    assert torch.npu.matmul.cube_math_type == 3
    with pytest.raises(ValueError):
        torch.npu.matmul.cube_math_type = 9
    torch.npu.config.allow_internal_format = True
    assert torch.npu.config.allow_internal_format is True


def test_compatible_impl_and_deterministic_level():
    assert torch.npu.are_compatible_impl_enabled() is False
    torch.npu.use_compatible_impl(True)
    assert torch.npu.are_compatible_impl_enabled() is True
    try:
        with pytest.warns(UserWarning, match="has been configured to 'True'"):
            torch.npu.set_deterministic_level(1)
        assert torch.are_deterministic_algorithms_enabled()
        with pytest.warns(UserWarning, match="has been configured to 'False'"):
            torch.npu.set_deterministic_level(0)
        assert not torch.are_deterministic_algorithms_enabled()
    finally:
        torch.use_deterministic_algorithms(False)


def test_deterministic_region_forward_and_backward():
    seen = []
    x = torch.ones(3, device="npu", requires_grad=True)
    y = torch.npu.enable_deterministic_with_backward(x * 2)
    seen.append(torch.are_deterministic_algorithms_enabled())
    z = torch.npu.disable_deterministic_with_backward(y * 3)
    seen.append(torch.are_deterministic_algorithms_enabled())
    z.register_hook(lambda g: seen.append(torch.are_deterministic_algorithms_enabled()))
    y.register_hook(lambda g: seen.append(torch.are_deterministic_algorithms_enabled()))
    z.sum().backward()
    seen.append(torch.are_deterministic_algorithms_enabled())
    torch.use_deterministic_algorithms(False)
    # forward: on, off; backward: z's grad before the end marker (off), y's inside the region (on), then off.
    assert seen == [True, False, False, True, False]
    assert torch.equal(x.grad.cpu(), torch.full((3,), 6.0))


def test_device_and_stream_limits():
    props = torch.npu.get_device_properties(0)
    assert torch.npu.get_device_limit(0) == {"cube_core_num": props.cube_core_num,
                                             "vector_core_num": props.vector_core_num}
    torch.npu.set_device_limit(0, cube_num=8)
    assert torch.npu.get_device_limit(0) == {"cube_core_num": 8, "vector_core_num": props.vector_core_num}
    with pytest.raises(ValueError):
        torch.npu.set_device_limit(0, cube_num=props.cube_core_num + 1)
    s = torch.npu.Stream()
    torch.npu.set_stream_limit(s, 4, 16)
    assert torch.npu.get_stream_limit(s) == {"cube_core_num": 4, "vector_core_num": 16}
    torch.npu.reset_stream_limit(s)
    assert torch.npu.get_stream_limit(s)["cube_core_num"] == 8
    with pytest.raises(ValueError):
        torch.npu.set_stream_limit(s, 9)  # above the device limit
    torch.npu.set_device_limit(0, props.cube_core_num, props.vector_core_num)


def test_mstx_markers_show_up_in_profiler():
    mstx = torch.npu.mstx
    with torch.profiler.profile() as prof:
        mstx.mark("step-begin")
        rid = mstx.range_start("forward")
        torch.ones(4, device="npu").sum()
        mstx.range_end(rid)
        mstx.range_push("push")
        assert mstx.range_pop() > 0

        @mstx.mstx_range("decorated")
        def f():
            return 1
        f()
        with mstx.annotate("block"):
            pass
    names = [e.name for e in prof.events()]
    for expected in ("mstx::mark::step-begin", "mstx::forward", "mstx::push", "mstx::decorated", "mstx::block"):
        assert expected in names
    fwd = next(e for e in prof.events() if e.name == "mstx::forward")
    inner = [e for e in prof.events() if e.name == "aten::sum"]
    assert inner and fwd.time_range.start <= inner[0].time_range.start <= inner[0].time_range.end <= fwd.time_range.end
    with pytest.warns(UserWarning):
        assert mstx.range_start("") == 0


def test_legacy_storages_and_tensor_types():
    s = torch.npu.FloatStorage(4)
    assert s.device.type == "npu" and s.dtype == torch.float32 and s.size() == 4
    with pytest.raises(RuntimeError, match="from_buffer: Not available for NPU storage"):
        torch.npu.HalfStorage.from_buffer(b"\x00\x00")
    t = torch.npu.LongTensor([1, 2, 3])
    assert t.device.type == "npu" and t.dtype == torch.long and t.tolist() == [1, 2, 3]
    assert torch.npu.BFloat16Tensor(2, 3).shape == (2, 3)
    assert isinstance(t, torch.npu.LongTensor) and not isinstance(t, torch.npu.IntTensor)
    assert not isinstance(t.cpu(), torch.npu.LongTensor)


def test_cann_version_and_gates(monkeypatch):
    assert torch.version.cann == torch_npu.emulator.cann_version()
    assert torch_npu.utils.get_cann_version() == torch_npu._C._get_cann_version("CANN") == torch.version.cann
    assert torch.npu.utils.get_cann_version("HCCL") == torch.version.cann
    assert torch_npu._C._is_gte_cann_version("8.1.RC1", "CANN") is True
    assert torch_npu._C._is_gte_cann_version("99.0.0", "CANN") is False
    # The Python implementation (used while the C++ core lacks the functions).
    from torch_npu.utils import _cann
    monkeypatch.setattr(_cann, "_native", lambda name: None)
    assert _cann.is_gte_cann_version("8.1.RC1") is True and _cann.is_gte_cann_version("99.0.0") is False
    assert _cann.get_cann_version("DRIVER") == _cann.EMULATED_DRIVER_VERSION
    with pytest.raises(RuntimeError, match="When the module is DRIVER, this function is not supported."):
        _cann.is_gte_cann_version("8.2.RC1", "DRIVER")
    with pytest.raises(RuntimeError, match=r'When the version 7\.0\.0 is less than "8\.1\.RC1"'):
        _cann.is_gte_cann_version("7.0.0", "CANN")
    from torch_npu.utils._cann import version_to_num
    order = ["8.2.T5", "8.2.RC1", "8.2.RC2", "8.2.0", "8.2.1", "8.3.RC1", "9.0.0"]
    assert [version_to_num(v) for v in order] == sorted(version_to_num(v) for v in order)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # C++ warns on stderr, the Python fallback with warnings
        assert torch_npu.utils.get_cann_version("FOO") == ""


def test_health_and_runtime_calls():
    assert torch.npu.stress_detect() == 0
    with pytest.raises(ValueError):
        torch.npu.stress_detect("gpu")
    assert torch.npu.check_uce_in_memory(0) == 0
    assert torch.npu.stop_device(1) == 0
    torch.npu.restart_device(1)
    with pytest.raises(AssertionError, match="Invalid device id"):
        torch.npu.stop_device(99)
    torch.npu.set_task_queue_enable(2)
    assert torch.npu.get_task_queue_enable() == 2
    with pytest.raises(ValueError):
        torch.npu.set_task_queue_enable(3)
    torch.npu.set_op_timeout_ms(1000)
    with pytest.raises(RuntimeError, match="ERR00007 PTA feature not supported"):
        torch.npu.obfuscation_initialize(8, 0, 1)
    with pytest.raises(AssertionError, match="path does not exists"):
        torch.npu.set_dump("/nonexistent/cfg.json")
    ev1, ev2 = torch.npu.Event(enable_timing=True), torch.npu.ExternalEvent()
    ev1.record()
    assert ev1.recorded_time() > 0
    ev2.record()
    ev2.reset()
    with pytest.raises(RuntimeError):
        ev2.recorded_time()


def test_utils_combine_tensors_and_flops():
    a, b = torch.arange(4.0, device="npu"), torch.ones(2, 3, device="npu")
    combined = torch_npu.utils.npu_combine_tensors([a, b])
    assert combined.shape == (10,) and torch.equal(combined.cpu()[:4], torch.arange(4.0))
    assert torch_npu.utils.is_combined_tensor_valid(combined, [a, b])
    combined.add_(1)            # the inputs are views of the combined buffer
    assert torch.equal(b.cpu(), torch.full((2, 3), 2.0))
    assert torch.equal(torch_npu.utils.get_part_combined_tensor(combined, 4, 6).cpu(), torch.full((6,), 2.0))
    assert not torch_npu.utils.is_combined_tensor_valid(combined, [b, a])

    counter = torch_npu.utils.FlopsCounter()
    x, w = torch.randn(8, 16, device="npu"), torch.randn(16, 4, device="npu")
    counter.start()
    x @ w
    counter.pause()
    x @ w
    counter.resume()
    counter.stop()
    one_mm = 2 * 8 * 16 * 4
    assert counter.get_flops() == [one_mm, 2 * one_mm]
