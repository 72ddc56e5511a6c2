"""torch_npu.profiler: the real output layout and CSV headers, a trace with host
and device lanes, CPU-fallback ops marked, the data-loading bottleneck
reported, TensorBoard's loader, and the API's argument handling.

Expected headers are copied from the reference (PROFILER.md, torch_npu
2.13.0's _csv_headers.py / parsers); expected counts, shapes and bytes come
from the workload the test runs and from torch_npu.emulator.fallback_report().
"""
import csv
import glob
import json
import os
import re
import socket
import time
import warnings

import pytest
import torch

import torch_npu
import torch_npu.profiler as P

KERNEL_HEADERS = ["Step Id", "Device_id", "Name", "Type", "Accelerator Core", "Start Time(us)", "Duration(us)",
                  "Wait Time(us)", "Block Num", "Mix Block Num", "Input Shapes", "Input Data Types",
                  "Input Formats", "Output Shapes", "Output Data Types", "Output Formats"]
OPERATOR_HEADERS = ["Name", "Input Shapes", "Call Stack", "Host Self Duration(us)", "Host Total Duration(us)",
                    "Device Self Duration(us)", "Device Total Duration(us)", "Device Self Duration With AICore(us)",
                    "Device Total Duration With AICore(us)"]
OP_STATISTIC_HEADERS = ["OP Type", "Core Type", "Count", "Total Time(us)", "Min Time(us)", "Avg Time(us)",
                        "Max Time(us)", "Ratio(%)"]
STEP_TRACE_HEADERS = ["Device_id", "Step", "Computing", "Communication(Not Overlapped)", "Overlapped",
                      "Communication", "Free", "Stage", "Bubble", "Communication(Not Overlapped and Exclude Receive)",
                      "Preparing"]
MEMORY_RECORD_HEADERS = ["Component", "Timestamp(us)", "Total Allocated(MB)", "Total Reserved(MB)",
                         "Total Active(MB)", "Stream Ptr", "Device Type"]
OPERATOR_MEMORY_HEADERS = ["Name", "Size(KB)", "Allocation Time(us)", "Release Time(us)", "Active Release Time(us)",
                           "Duration(us)", "Active Duration(us)", "Allocation Total Allocated(MB)",
                           "Allocation Total Reserved(MB)", "Allocation Total Active(MB)",
                           "Release Total Allocated(MB)", "Release Total Reserved(MB)", "Release Total Active(MB)",
                           "Stream Ptr", "Device Type"]

STEPS = 6
RECORDED_STEPS = [2, 3]          # schedule(wait=1, warmup=1, active=2, repeat=1)
MM_PER_STEP = 2


def _read_csv(path):
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.reader(f))
    return rows[0], [dict(zip(rows[0], r)) for r in rows[1:]]


def _workload(x, w, out):
    y = x @ w                                   # native: aten::mm
    z = (y @ w.t()).relu()                      # native
    torch.fmax(z, x, out=out)                   # CPU fallback on hardware: aten::fmax.out
    return z


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """One scheduled profile of a small workload (fallback op and mstx range included)."""
    root = tmp_path_factory.mktemp("prof")
    x = torch.randn(8, 16, device="npu")
    w = torch.randn(16, 4, device="npu")
    out = torch.empty(8, 16, device="npu")
    _workload(x, w, out)                        # warm: the once-per-op CAUTION line is printed here
    torch_npu.emulator.reset_fallback_report()
    torch.npu.reset_peak_memory_stats()
    ready = []
    handler = P.tensorboard_trace_handler(str(root))
    with P.profile(activities=[P.ProfilerActivity.CPU, P.ProfilerActivity.NPU],
                   schedule=P.schedule(wait=1, warmup=1, active=2, repeat=1),
                   on_trace_ready=lambda p: (ready.append(p.step_num), handler(p)),
                   record_shapes=True, profile_memory=True,
                   experimental_config=P._ExperimentalConfig(mstx=True)) as prof:
        for step in range(STEPS):
            if step == RECORDED_STEPS[0]:
                torch_npu.emulator.reset_fallback_report()
            with torch.npu.mstx.annotate(f"train_step_{step}"):
                _workload(x, w, out)
            if step == RECORDED_STEPS[-1]:
                report = torch_npu.emulator.fallback_report()
            prof.step()
    dirs = glob.glob(os.path.join(root, "*_ascend_pt"))
    assert len(dirs) == 1, dirs
    return {"dir": dirs[0], "ready": ready, "fallback_report": report, "prof": prof,
            "peak": torch.npu.max_memory_allocated()}


def _out(run, name):
    return os.path.join(run["dir"], "ASCEND_PROFILER_OUTPUT", name)


def test_output_directory_layout(run):
    name = os.path.basename(run["dir"])
    assert re.fullmatch(re.escape(f"{socket.gethostname()}_{os.getpid()}_") + r"\d{17}_ascend_pt", name), name
    for f in ("profiler_info.json", "profiler_metadata.json"):
        assert os.path.isfile(os.path.join(run["dir"], f))
    for f in ("trace_view.json", "kernel_details.csv", "operator_details.csv", "op_statistic.csv",
              "step_trace_time.csv", "memory_record.csv", "operator_memory.csv", "npu_module_mem.csv",
              "summary.txt", "summary.html"):
        assert os.path.isfile(_out(run, f)), f
    assert len(glob.glob(os.path.join(run["dir"], "*.pt.trace.json"))) == 1
    assert run["ready"] == [RECORDED_STEPS[-1] + 1]     # saved once, at the RECORD_AND_SAVE step's end


def test_csv_headers_are_torch_npu_headers(run):
    assert _read_csv(_out(run, "kernel_details.csv"))[0] == KERNEL_HEADERS
    assert _read_csv(_out(run, "operator_details.csv"))[0] == OPERATOR_HEADERS
    assert _read_csv(_out(run, "op_statistic.csv"))[0] == OP_STATISTIC_HEADERS
    assert _read_csv(_out(run, "step_trace_time.csv"))[0] == STEP_TRACE_HEADERS
    assert _read_csv(_out(run, "memory_record.csv"))[0] == MEMORY_RECORD_HEADERS
    assert _read_csv(_out(run, "operator_memory.csv"))[0] == OPERATOR_MEMORY_HEADERS


def test_kernels_of_the_recorded_steps_with_shapes(run):
    _, rows = _read_csv(_out(run, "kernel_details.csv"))
    mm = [r for r in rows if r["Name"] == "aten::mm"]
    assert len(mm) == MM_PER_STEP * len(RECORDED_STEPS)
    assert sorted({int(r["Step Id"]) for r in mm}) == RECORDED_STEPS
    assert {r["Input Shapes"] for r in mm} == {"8,16;16,4", "8,4;4,16"}
    assert {r["Input Data Types"] for r in mm} == {"FLOAT;FLOAT"}
    assert all(r["Accelerator Core"] == "AI_CORE" and r["Device_id"] == "0" for r in mm)
    assert all(float(r["Duration(us)"]) > 0 for r in mm)
    _, stats = _read_csv(_out(run, "op_statistic.csv"))
    mm_stat = [s for s in stats if s["OP Type"] == "mm"]
    assert len(mm_stat) == 1 and int(mm_stat[0]["Count"]) == len(mm)
    total = sum(float(r["Duration(us)"]) for r in mm)
    assert float(mm_stat[0]["Total Time(us)"]) == pytest.approx(total, abs=0.01)
    assert sum(float(s["Ratio(%)"]) for s in stats) == pytest.approx(100, abs=0.1)


def test_fallback_op_marked_with_bytes_copied(run):
    _, rows = _read_csv(_out(run, "kernel_details.csv"))
    fb = [r for r in rows if r["Accelerator Core"] == "CPU_FALLBACK"]
    assert {r["Name"] for r in fb} == {"aten::fmax.out"}
    assert len(fb) == len(RECORDED_STEPS)
    report = {e["op"]: e for e in run["fallback_report"]}["aten::fmax.out"]
    assert report["calls"] == len(RECORDED_STEPS)
    trace = json.load(open(_out(run, "trace_view.json")))
    fb_events = [e for e in trace if e.get("ph") == "X" and e["args"].get("CPU fallback")]
    assert len(fb_events) == len(RECORDED_STEPS)
    assert sum(e["args"]["Bytes copied host<->device"] for e in fb_events) == \
        report["bytes_to_cpu"] + report["bytes_to_npu"]
    summary = open(_out(run, "summary.txt")).read()
    section = summary.split("Ops that fell back to the CPU")[1].split("\n\n")[0]
    assert "aten::fmax.out" in section
    assert str(report["bytes_to_cpu"] + report["bytes_to_npu"]) in section


def test_trace_view_has_host_and_device_lanes(run):
    trace = json.load(open(_out(run, "trace_view.json")))
    assert isinstance(trace, list)
    meta = [e for e in trace if e["ph"] == "M"]
    names = {(e["pid"], e["args"].get("name")) for e in meta if e["name"] == "process_name"}
    labels = {e["pid"]: e["args"]["labels"] for e in meta if e["name"] == "process_labels"}
    host = [pid for pid, n in names if n == "Python"]
    hardware = [pid for pid, n in names if n == "Ascend Hardware"]
    assert len(host) == 1 and labels[host[0]] == "CPU"
    assert len(hardware) == 1 and labels[hardware[0]] == "NPU 0"
    xs = [e for e in trace if e["ph"] == "X"]
    host_mm = [e for e in xs if e["pid"] == host[0] and e["name"] == "aten::mm"]
    dev_mm = [e for e in xs if e["pid"] == hardware[0] and e["name"] == "aten::mm"]
    assert len(dev_mm) == len(host_mm) == MM_PER_STEP * len(RECORDED_STEPS)
    for k in dev_mm:   # synchronous device: each kernel runs inside its host op
        assert any(h["ts"] <= k["ts"] and k["ts"] + k["dur"] <= h["ts"] + h["dur"] + 1e-3 for h in host_mm)
    starts = [e for e in trace if e["ph"] == "s" and e["name"] == "torch_to_npu"]
    ends = {e["id"] for e in trace if e["ph"] == "f" and e["name"] == "torch_to_npu"}
    assert starts and {e["id"] for e in starts} == ends
    steps = sorted(e["name"] for e in xs if e["name"].startswith("ProfilerStep#"))
    assert steps == [f"ProfilerStep#{s}" for s in RECORDED_STEPS]
    mstx = sorted(e["name"] for e in xs if e.get("cat") == "MsTx")
    assert mstx == [f"train_step_{s}" for s in RECORDED_STEPS]
    overlap = {e["name"] for e in xs if e.get("cat") in ("Computing", "Free")}
    assert "Computing" in overlap


def test_step_trace_time_adds_up(run):
    _, rows = _read_csv(_out(run, "step_trace_time.csv"))
    assert [int(r["Step"]) for r in rows] == RECORDED_STEPS
    trace = json.load(open(_out(run, "trace_view.json")))
    for r in rows:
        step = [e for e in trace if e["ph"] == "X" and e["name"] == f"ProfilerStep#{r['Step']}"][0]
        # computing + free = the step's span (no communication in this workload)
        assert float(r["Computing"]) + float(r["Free"]) == pytest.approx(step["dur"], abs=0.01)
        assert float(r["Communication"]) == 0


def test_memory_record_peak_matches_allocator(run):
    _, rows = _read_csv(_out(run, "memory_record.csv"))
    assert rows and {r["Device Type"] for r in rows} == {"NPU:0"}
    peak_mb = max(float(r["Total Allocated(MB)"]) for r in rows)
    assert peak_mb * 2**20 == pytest.approx(run["peak"], abs=2**20 * 1e-6)
    summary = open(_out(run, "summary.txt")).read()
    assert f"npu:0  {run['peak'] / 2**20:.3f} MB" in summary


def test_torch_tb_profiler_loads_the_trace(run, tmp_path):
    from torch_tb_profiler.profiler.data import RunProfileData
    path = glob.glob(os.path.join(run["dir"], "*.pt.trace.json"))[0]
    data = RunProfileData.parse("worker", None, path, str(tmp_path))
    assert data.has_kernel
    assert sorted(int(s) for s in data.steps_names) == RECORDED_STEPS
    kernels = {k.name for k in data.kernel_list_groupby_name_op}
    assert {"aten::mm", "aten::fmax.out"} <= kernels
    assert 0 in data.used_devices


def test_torch_tb_profiler_gives_each_op_its_kernels_device_time(run, tmp_path):
    # The operator view's device times come from launch ("runtime") events that link an
    # op (by External id) to its kernels (by correlation); the plugin must recognize them.
    from torch_tb_profiler.profiler.data import RunProfileData
    path = glob.glob(os.path.join(run["dir"], "*.pt.trace.json"))[0]
    data = RunProfileData.parse("worker", None, path, str(tmp_path))
    data.process()
    assert data.has_runtime
    _, kernels = _read_csv(_out(run, "kernel_details.csv"))
    ops = {op.name: op for op in data.op_list_groupby_name}
    mm_kernels = [float(k["Duration(us)"]) for k in kernels if k["Name"] == "aten::mm"]
    assert ops["aten::mm"].calls == len(mm_kernels) == MM_PER_STEP * len(RECORDED_STEPS)
    assert ops["aten::mm"].self_device_duration == pytest.approx(sum(mm_kernels), abs=0.01)
    assert ops["aten::mm"].device_duration == pytest.approx(sum(mm_kernels), abs=0.01)


def test_analyse_offline_gives_the_same_views(run, tmp_path):
    prof = run["prof"]
    P.tensorboard_trace_handler(str(tmp_path), worker_name="offline", analyse_flag=False)(prof)
    (prof_dir,) = glob.glob(os.path.join(tmp_path, "*_ascend_pt"))
    assert re.fullmatch(r"offline_\d{17}_ascend_pt", os.path.basename(prof_dir))
    assert not os.path.exists(os.path.join(prof_dir, "ASCEND_PROFILER_OUTPUT"))
    P.analyse(str(tmp_path))
    for name in ("kernel_details.csv", "op_statistic.csv", "step_trace_time.csv"):
        with open(os.path.join(prof_dir, "ASCEND_PROFILER_OUTPUT", name)) as a, open(_out(run, name)) as b:
            assert a.read() == b.read(), name


def test_export_chrome_trace_has_device_lane(run, tmp_path):
    path = tmp_path / "trace.json"
    run["prof"].export_chrome_trace(str(path))
    trace = json.load(open(path))
    assert any(e["ph"] == "X" and e["cat"] == "AI_CORE" and e["name"] == "aten::mm" for e in trace)


class _SlowDataset(torch.utils.data.Dataset):
    def __init__(self, delay_s):
        self.delay_s = delay_s

    def __len__(self):
        return 4

    def __getitem__(self, i):
        time.sleep(self.delay_s)
        return torch.full((64, 256), float(i))


def _profile_loader(root, delay_s):
    model = torch.nn.Linear(256, 256).npu()
    loader = torch.utils.data.DataLoader(_SlowDataset(delay_s), batch_size=1)
    with P.profile(schedule=P.schedule(wait=0, active=len(loader), repeat=1),
                   on_trace_ready=P.tensorboard_trace_handler(str(root))) as prof:
        for batch in loader:
            x = batch.npu()
            for _ in range(3):
                model(x).sum().backward()
            prof.step()
    from torch_npu.profiler.analysis import _summary
    from torch_npu.profiler.analysis._profile_data import ProfileData
    (prof_dir,) = glob.glob(os.path.join(root, "*_ascend_pt"))
    return _summary.compute(ProfileData(prof_dir)), prof_dir


def test_slow_data_loader_shows_as_idle_and_input_wait(tmp_path):
    delay_ms = 200
    slow, prof_dir = _profile_loader(tmp_path / "slow", delay_s=delay_ms / 1000)
    fast, _ = _profile_loader(tmp_path / "fast", delay_s=0.0)
    assert len(slow["steps"]) == 4
    for s in slow["steps"]:
        wait_ms = s["input_wait_share"] * s["step_ms"]
        idle_ms = s["idle_ratio"] * s["step_ms"]
        assert delay_ms * 0.95 <= wait_ms <= s["step_ms"], s      # the loader's sleep is inside its range
        assert idle_ms >= wait_ms - 1.0, s                         # no kernel runs while waiting for input
    for s in fast["steps"]:
        assert s["input_wait_share"] * s["step_ms"] < delay_ms * 0.5, s
    text = open(os.path.join(prof_dir, "ASCEND_PROFILER_OUTPUT", "summary.txt")).read()
    assert text.splitlines()[2].startswith("Data-loading bottleneck")


def test_autograd_profiler_use_device_npu_has_npu_times():
    a = torch.randn(64, 64, device="npu")
    with torch.autograd.profiler.profile(use_device="npu") as prof:
        a @ a
    mm = [e for e in prof.key_averages() if e.key == "aten::mm"]
    assert mm and mm[0].self_device_time_total > 0
    assert "Self NPU" in prof.key_averages().table()


def test_activities_schedule_and_enums():
    assert P.supported_activities() == {P.ProfilerActivity.CPU, P.ProfilerActivity.NPU}
    assert torch.profiler.ProfilerActivity.NPU in torch.profiler.supported_activities()
    prof = P.profile(activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.NPU])
    assert prof.activities == {P.ProfilerActivity.CPU, P.ProfilerActivity.NPU}
    s = P.schedule(wait=1, warmup=1, active=2, repeat=1, skip_first=1)
    assert [s(i) for i in range(7)] == [P.ProfilerAction.NONE, P.ProfilerAction.NONE, P.ProfilerAction.WARMUP,
                                        P.ProfilerAction.RECORD, P.ProfilerAction.RECORD_AND_SAVE,
                                        P.ProfilerAction.NONE, P.ProfilerAction.NONE]
    assert [a.value for a in P.ProfilerAction] == [0, 1, 2, 3]
    with pytest.raises(ValueError):
        s(-1)
    assert P.supported_profiler_level() == {"Level0", "Level1", "Level2", "Level_none"}
    assert P.supported_export_type() == {"text", "db"}
    assert P.AiCMetrics.AiCoreNone in P.supported_ai_core_metrics()
    assert P.HostSystem.CPU == "cpu"


def test_invalid_and_hardware_only_options_never_raise(capsys):
    cfg = P._ExperimentalConfig(profiler_level="Level9", aic_metrics="bogus", export_type="xml")
    printed = capsys.readouterr().out
    assert "Invalid parameter profiler_level, reset it to default." in printed
    assert cfg.profiler_level == "Level0" and cfg.aic_metrics == "ACL_AICORE_PIPE_UTILIZATION"
    assert cfg.export_type == ["text"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        P._ExperimentalConfig(l2_cache=True)
        P._ExperimentalConfig(l2_cache=True)
    assert len([w for w in caught if "l2_cache" in str(w.message)]) == 1   # once per process
    prof = P.profile(record_shapes="yes")
    assert prof.record_shapes is False


def test_aic_metrics_none_writes_base_kernel_headers(tmp_path):
    a = torch.randn(8, 8, device="npu")
    with P.profile(on_trace_ready=P.tensorboard_trace_handler(str(tmp_path)),
                   experimental_config=P._ExperimentalConfig(aic_metrics=P.AiCMetrics.AiCoreNone)):
        a @ a
    (prof_dir,) = glob.glob(os.path.join(tmp_path, "*_ascend_pt"))
    headers, rows = _read_csv(os.path.join(prof_dir, "ASCEND_PROFILER_OUTPUT", "kernel_details.csv"))
    assert headers == KERNEL_HEADERS[1:9]
    assert [r["Name"] for r in rows] == ["aten::mm"]
    # without profile_memory there are no memory files
    assert not os.path.exists(os.path.join(prof_dir, "ASCEND_PROFILER_OUTPUT", "memory_record.csv"))


def _write_synthetic(prof_dir, base_ns, device_events):
    """A hand-made raw profile: one step of 1000 us and the given device events."""
    os.makedirs(os.path.join(prof_dir, "FRAMEWORK"))
    host = {"baseTimeNanoseconds": base_ns, "traceEvents": [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 7, "tid": 7, "ts": 0.0,
         "dur": 1000.0, "args": {}}]}
    with open(os.path.join(prof_dir, "FRAMEWORK", "torch_host_trace.json"), "w") as f:
        json.dump(host, f)
    with open(os.path.join(prof_dir, "FRAMEWORK", "device_timeline.json"), "w") as f:
        json.dump(device_events, f)
    with open(os.path.join(prof_dir, "profiler_info.json"), "w") as f:
        json.dump({"config": {"common_config": {"activities": ["CPU", "NPU"]}, "experimental_config": {}}}, f)


def test_communication_overlap_in_step_trace_time(tmp_path):
    base = 1_700_000_000_000_000_000

    def ev(name, kind, start_us, end_us, nbytes=0):
        return {"name": name, "device": 0, "stream": 0 if kind != "communication" else 1,
                "start_ns": base + start_us * 1000, "end_ns": base + end_us * 1000, "kind": kind,
                "bytes": nbytes, "thread_id": 7}

    prof_dir = tmp_path / "w_20240101000000000_ascend_pt"
    _write_synthetic(str(prof_dir), base, [ev("aten::mm", "kernel", 100, 400),
                                           ev("hcom_allReduce_", "communication", 300, 600, 4096),
                                           ev("hcom_allReduce_", "communication", 700, 800, 4096)])
    P.analyse(str(prof_dir))
    _, rows = _read_csv(str(prof_dir / "ASCEND_PROFILER_OUTPUT" / "step_trace_time.csv"))
    (row,) = rows
    # by hand: compute [100,400]; comm [300,600]+[700,800]; busy [100,600]+[700,800] of the 1000 us step
    expected = {"Step": 1, "Computing": 300, "Communication": 400, "Communication(Not Overlapped)": 300,
                "Overlapped": 100, "Free": 400, "Stage": 700, "Bubble": 0, "Preparing": 100,
                "Communication(Not Overlapped and Exclude Receive)": 300}
    assert {k: float(row[k]) for k in expected} == {k: float(v) for k, v in expected.items()}
    trace = json.load(open(prof_dir / "ASCEND_PROFILER_OUTPUT" / "trace_view.json"))
    comm = [e for e in trace if e["ph"] == "X" and e["cat"] == "HCCL"]
    assert [e["args"]["Data Size(B)"] for e in comm] == [4096, 4096]
    lanes = {e["name"]: e for e in trace if e["ph"] == "X" and e["name"] == "Communication(Not Overlapped)"}
    assert lanes   # the overlap-analysis lane exists


def test_dynamic_profile_follows_the_config_file(tmp_path):
    from torch_npu.profiler import dynamic_profile
    a = torch.randn(8, 8, device="npu")
    dynamic_profile.init(str(tmp_path / "cfg"))
    config = json.load(open(tmp_path / "cfg" / "profiler_config.json"))
    config.update(start_step=2, active=2, prof_dir=str(tmp_path / "out"), analyse=True)
    time.sleep(0.01)   # a distinct mtime
    with open(tmp_path / "cfg" / "profiler_config.json", "w") as f:
        json.dump(config, f)
    os.utime(tmp_path / "cfg" / "profiler_config.json", (time.time() + 5, time.time() + 5))
    for _ in range(6):
        a @ a
        dynamic_profile.step()
    (prof_dir,) = glob.glob(str(tmp_path / "out" / "*_ascend_pt"))
    _, rows = _read_csv(os.path.join(prof_dir, "ASCEND_PROFILER_OUTPUT", "kernel_details.csv"))
    assert [r["Name"] for r in rows] == ["aten::mm", "aten::mm"]    # the 2 active steps


def test_async_mode_parses_in_a_background_thread(tmp_path):
    import threading
    a = torch.randn(8, 8, device="npu")
    with P.profile(on_trace_ready=P.tensorboard_trace_handler(str(tmp_path), async_mode=True)):
        a @ a
    for t in threading.enumerate():
        if t.name == "torch_npu-profiler-analyse":
            t.join(60)
    (prof_dir,) = glob.glob(os.path.join(tmp_path, "*_ascend_pt"))
    assert os.path.exists(os.path.join(prof_dir, "ASCEND_PROFILER_OUTPUT", "summary.txt"))
