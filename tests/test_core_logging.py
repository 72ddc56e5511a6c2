"""The C++ core logs allocator growth/release/OOM and CPU fallbacks through
torch_npu's loggers (TORCH_NPU_LOGS), and nothing when logging is off."""
import subprocess
import sys

from _subproc import make_env, REPO

SNIPPET = """
import torch, torch_npu
x = torch.empty(4 << 20, dtype=torch.uint8, device="npu")   # a new 20 MiB large segment (CUDA rounding)
del x
torch.npu.empty_cache()                                      # released
a = torch.rand(8, device="npu")
torch.fmax(a, a, out=torch.empty(8, device="npu"))           # emulated CPU fallback
try:
    torch.empty(1 << 30, dtype=torch.uint8, device="npu")    # over the 256 MiB device
except torch.OutOfMemoryError:
    print("OOM")
"""


def _run(**env):
    env.setdefault("TORCH_NPU_EMU_MEMORY", str(256 << 20))
    proc = subprocess.run([sys.executable, "-c", SNIPPET], cwd=str(REPO), env=make_env(**env),
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "OOM" in proc.stdout
    return proc.stderr


def test_core_records_reach_the_component_loggers():
    err = _run(TORCH_NPU_LOGS="+memory,dispatch")
    memory = [line for line in err.splitlines() if line.startswith("[torch_npu.memory]")]
    assert any("INFO" in line and "device 0: new large segment of 20.00 MiB" in line for line in memory), err
    assert any("device 0: released a segment of 20.00 MiB" in line for line in memory), err
    assert any("ERROR" in line and "device 0: out of memory allocating 1024.00 MiB" in line for line in memory), err
    dispatch = [line for line in err.splitlines() if line.startswith("[torch_npu.dispatch]")]
    assert len(dispatch) == 1 and "operator aten::fmax.out falls back to the CPU" in dispatch[0], err


def test_component_thresholds_apply():
    err = _run(TORCH_NPU_LOGS="-memory")  # ERROR and up only
    memory = [line for line in err.splitlines() if line.startswith("[torch_npu.memory]")]
    assert len(memory) == 1 and "out of memory" in memory[0], err
    assert "[torch_npu.dispatch]" not in err


def test_nothing_logged_by_default():
    err = _run(TORCH_NPU_LOGS=None, ASCEND_GLOBAL_LOG_LEVEL=None)
    assert "[torch_npu." not in err


def test_invalid_emulator_settings_fail_at_first_device_use():
    from _subproc import run_json
    code = """
import torch, torch_npu
emit(catch(lambda: torch.ones(1, device="npu")))
"""
    for env, text in [
        ({"TORCH_NPU_EMU_MEMORY": "lots"}, "TORCH_NPU_EMU_MEMORY must be a size such as 512MiB, 16GiB or a byte "
                                           "count, got 'lots'"),
        ({"TORCH_NPU_EMU_MEMORY": "12XB"}, "got '12XB'"),
        ({"TORCH_NPU_EMU_MEMORY": "-5"}, "got '-5'"),
        ({"TORCH_NPU_EMU_DEVICE_COUNT": "abc"}, "TORCH_NPU_EMU_DEVICE_COUNT must be an integer from 0 to 64, "
                                                "got 'abc'"),
        ({"TORCH_NPU_EMU_DEVICE_COUNT": "100"}, "got '100'"),
    ]:
        err = run_json(code, env=env)
        assert err is not None and err[0] == "RuntimeError" and text in err[1], (env, err)
    assert run_json(code, env={"TORCH_NPU_EMU_MEMORY": "512MiB", "TORCH_NPU_EMU_DEVICE_COUNT": "2"}) is None
