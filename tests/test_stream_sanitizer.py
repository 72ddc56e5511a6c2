"""The NPU stream sanitizer (``TORCH_NPU_SANITIZER``, ``torch_npu.npu._sanitizer``).

Each classic stream bug is caught, with the real error kinds and texts, and its fix runs
clean (tests/stream_bug_cases.py, in fresh interpreters with the variable set); the
argument parser and the record_stream bookkeeping are checked directly; kernel mode
gives the real warning and does nothing else; a 2-rank DDP step and an FSDP2 step run
clean under it (tests/dist_workers/sanitized_training.py).
"""
import json
import os
import subprocess
import sys
import warnings

import pytest
import torch
import torch.cuda._sanitizer as csan

import torch_npu
from torch_npu.npu import _sanitizer, _stream_check
from _subproc import REPO, make_env

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "dist_workers"))
from launch import free_port, launch  # noqa: E402
from models import reference_steps  # noqa: E402

CASES = REPO / "tests" / "stream_bug_cases.py"
N = 4096
SEPARATOR = "============================\n"


def _run_cases(cases, env):
    return subprocess.Popen([sys.executable, str(CASES), *cases], cwd=str(REPO), env=make_env(**env),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _collect(proc):
    out, err = proc.communicate(timeout=300)
    found = {}
    for line in out.splitlines():
        if line.startswith("@@CASE@@"):
            r = json.loads(line[len("@@CASE@@"):])
            found[r["case"]] = r
    assert proc.returncode == 0 and found, out[-3000:] + err[-3000:]
    return found


LOCAL = ["race_read_without_wait_stream", "race_read_without_wait_stream_fixed",
         "missing_record_stream", "missing_record_stream_fixed_by_record_stream",
         "missing_record_stream_fixed_by_wait_stream", "missing_record_stream_flush",
         "side_stream_tensor_freed_after_default_use",
         "non_blocking_copy_read_early", "non_blocking_copy_read_after_synchronize",
         "non_blocking_copy_read_after_event_synchronize", "blocking_copy_read",
         "event_waited_before_record", "event_recorded_then_waited"]
COMM = ["comm_stream_without_wait", "comm_result_used_without_wait", "comm_overlap_fixed"]


@pytest.fixture(scope="module")
def outcomes():
    procs = {
        "one": _run_cases(LOCAL, {"TORCH_NPU_SANITIZER": "1"}),
        "comm": _run_cases(COMM, {"TORCH_NPU_SANITIZER": "1", "SAN_PORT": free_port()}),
        # any other value: the stream check without the check at frees
        "zero": _run_cases(["race_read_without_wait_stream", "missing_record_stream",
                            "missing_record_stream_flush"], {"TORCH_NPU_SANITIZER": "0"}),
    }
    found = {}
    for name, proc in procs.items():
        for case, r in _collect(proc).items():
            found[(name, case)] = r
    return found


def case(outcomes, name, run="one"):
    key = ("comm" if name.startswith("comm") else run, name)
    r = outcomes[key]
    assert r["enabled"] and r["launches"] > 0, r  # the sanitizer saw the case's ops
    return r


def clean(r):
    assert r["raised"] is None, r["printed"][-3000:]
    assert r["record_stream_errors"] == [], r["printed"][-3000:]
    assert r["printed"] == ""
    return r["result"]


def single_race(r):
    assert r["raised"] is not None and len(r["raised"]) == 1, r
    err = r["raised"][0]
    assert err["type"] == "UnsynchronizedAccessError"
    assert err["data_ptr"] == r["info"]["ptr"]
    # the error was printed (stderr) before it was raised
    assert err["text"] in r["printed"]
    return err


def test_variable_enables_the_sanitizer_and_1_adds_the_free_check(outcomes):
    assert case(outcomes, "race_read_without_wait_stream")["check_record_stream"] is True
    assert case(outcomes, "race_read_without_wait_stream", "zero")["check_record_stream"] is False


# ---- 1. written on a side stream, read on the default stream without wait_stream ------------

def test_read_on_default_stream_of_a_side_stream_write_is_a_race(outcomes):
    r = case(outcomes, "race_read_without_wait_stream")
    err = single_race(r)
    side = r["info"]["side"]
    assert side != 0 and err["streams"] == [0, side]
    text = err["text"]
    assert text.startswith(SEPARATOR + f"CSAN detected a possible data race on tensor with data pointer "
                                       f"{r['info']['ptr']}\nAccess by stream 0 during kernel:\naten::mul.Tensor")
    assert f"Previous access by stream {side} during kernel:\naten::add_.Tensor" in text
    assert "reading from argument(s) self" in text and "writing to argument(s) self, and to the output" in text
    # both stack traces, down to the user's lines
    assert "x.add_(1)  # SIDE-WRITE" in text and "# DEFAULT-READ" in text
    assert "Tensor was allocated with stack trace:" in text and 'x = torch.zeros(N, device="npu")' in text


def test_wait_stream_fixes_the_read(outcomes):
    assert clean(case(outcomes, "race_read_without_wait_stream_fixed")) == {"y": 2.0 * N}


def test_any_value_checks_races(outcomes):
    single_race(case(outcomes, "race_read_without_wait_stream", "zero"))


# ---- 2. side-stream use of a tensor freed without record_stream ------------------------------

def test_free_after_side_stream_use_without_record_stream_is_reported(outcomes):
    r = case(outcomes, "missing_record_stream")
    assert r["raised"] is None  # reported at the free, not raised
    assert len(r["record_stream_errors"]) == 1, r
    err = r["record_stream_errors"][0]
    side = r["info"]["side"]
    assert err["type"] == "MissingRecordStreamError"
    assert (err["data_ptr"], err["allocation_stream"], err["usage_stream"]) == (r["info"]["ptr"], 0, side)
    assert err["operator"].startswith("aten::mul.Tensor(")
    text = err["text"]
    assert text.startswith(SEPARATOR + "NPUSanitizer: missing record_stream detected!\n"
                           f"Tensor (data ptr: {r['info']['ptr']}) allocated on stream 0\n"
                           f"was used on stream {side} ")
    assert f"A) tensor.record_stream(usage_stream)" in text and "B) allocation_stream.wait_stream(usage_stream)" in text
    assert "y = x * 2  # SIDE-USE" in text and "# ALLOC-ON-DEFAULT" in text
    assert "No streams were recorded via record_stream." in text
    assert text in r["printed"]


@pytest.mark.parametrize("fix", ["missing_record_stream_fixed_by_record_stream",
                                 "missing_record_stream_fixed_by_wait_stream"])
def test_record_stream_or_wait_stream_fixes_the_free(outcomes, fix):
    clean(case(outcomes, fix))


def test_allocation_stream_is_the_blocks_stream(outcomes):
    # made on the side stream, used on the default one: the side stream is the allocation stream
    r = case(outcomes, "side_stream_tensor_freed_after_default_use")
    assert r["raised"] is None
    assert [(e["data_ptr"], e["allocation_stream"], e["usage_stream"]) for e in r["record_stream_errors"]] == [
        (r["info"]["ptr"], r["info"]["side"], 0)]
    assert "# ALLOC-ON-SIDE" in r["record_stream_errors"][0]["text"]
    assert "# DEFAULT-USE" in r["record_stream_errors"][0]["text"]


def test_flush_reports_live_tensors_used_across_streams(outcomes):
    r = case(outcomes, "missing_record_stream_flush")
    assert r["result"]["flushed"] == [[r["info"]["ptr"], 0, r["info"]["side"]]]


def test_other_values_do_not_check_frees_but_flush_still_reports(outcomes):
    r = case(outcomes, "missing_record_stream", "zero")
    assert r["raised"] is None and r["record_stream_errors"] == [] and r["printed"] == ""
    r = case(outcomes, "missing_record_stream_flush", "zero")
    assert r["result"]["flushed"] == [[r["info"]["ptr"], 0, r["info"]["side"]]]


# ---- 3. non_blocking copy to the host, read before synchronize -------------------------------

def test_host_read_of_a_non_blocking_copy_before_synchronize_is_caught(outcomes):
    r = case(outcomes, "non_blocking_copy_read_early")
    assert r["info"]["pinned"]  # non_blocking device-to-host copies land in pinned memory
    assert r["raised"] is not None and len(r["raised"]) == 1, r
    err = r["raised"][0]
    assert err["type"] == "UnsynchronizedHostAccessError" and err["data_ptr"] == r["info"]["ptr"]
    assert err["streams"] == [0]
    text = err["text"]
    assert text.startswith(SEPARATOR + "NPUSanitizer: host access to a non_blocking device-to-host copy "
                                       "before synchronization!\n")
    assert "aten::sum(" in text and "aten::_to_copy(" in text
    assert "# HOST-READ" in text and "# D2H-COPY" in text


@pytest.mark.parametrize("fix", ["non_blocking_copy_read_after_synchronize",
                                 "non_blocking_copy_read_after_event_synchronize", "blocking_copy_read"])
def test_synchronize_before_the_host_read_is_clean(outcomes, fix):
    assert clean(case(outcomes, fix)) == {"sum": float(N * (N - 1) // 2)}


# ---- 4. an event waited before it was recorded -----------------------------------------------

def test_waiting_an_event_before_its_record_orders_nothing(outcomes):
    r = case(outcomes, "event_waited_before_record")
    err = single_race(r)
    assert err["streams"] == [0, r["info"]["side"]]
    assert "# READ-AFTER-EARLY-WAIT" in err["text"] and "aten::add_.Tensor" in err["text"]


def test_record_then_wait_is_clean(outcomes):
    assert clean(case(outcomes, "event_recorded_then_waited")) == {"y": 2.0 * N}


# ---- 5. communication overlapped on a side stream --------------------------------------------

def test_collective_on_a_side_stream_that_did_not_wait_for_the_gradient(outcomes):
    r = case(outcomes, "comm_stream_without_wait")
    err = single_race(r)
    assert err["streams"] == [r["info"]["side"], 0]
    assert err["text"].split("Access by stream", 1)[1].split("\n")[1].startswith("c10d::allreduce_(")
    assert "# COMM-BEFORE-GRAD-READY" in err["text"] and "# GRAD-ON-DEFAULT" in err["text"]


def test_gradient_used_before_the_side_stream_collective_is_waited_for(outcomes):
    r = case(outcomes, "comm_result_used_without_wait")
    err = single_race(r)
    assert err["streams"] == [0, r["info"]["side"]]
    assert "Previous access by stream" in err["text"] and "c10d::allreduce_(" in err["text"]
    assert "# USE-BEFORE-COMM-DONE" in err["text"] and "# COMM-WRITE" in err["text"]


def test_collective_overlap_with_both_waits_and_record_stream_is_clean(outcomes):
    # one rank: the all-reduce leaves the gradient as it was
    assert clean(case(outcomes, "comm_overlap_fixed")) == {"y": 1.0 * N}


# ---- the pieces, checked directly -------------------------------------------------------------

def test_argument_handler_reads_writes_and_views_from_the_schema():
    a = torch.ones(8, device="npu")
    b = torch.ones(8, device="npu")
    h = _stream_check.NPUArgumentHandler()
    schema = torch.ops.aten.add_.Tensor._schema
    h.parse_inputs(schema, (a, b), {}, is_factory=False)
    h.parse_outputs(schema, a, is_factory=False)
    assert h.dataptrs_written == {a.data_ptr()} and h.dataptrs_read == {b.data_ptr()}
    assert h.outputs == {a.data_ptr()} and h.tensor_aliases[a.data_ptr()] == ["self"]
    assert h.storage_dataptrs_accessed == {a.data_ptr(), b.data_ptr()}
    # a view reads nothing: its input and output are metadata only
    v = _stream_check.NPUArgumentHandler()
    schema = torch.ops.aten.view.default._schema
    out = a.view(2, 4)
    v.parse_inputs(schema, (a, [2, 4]), {}, is_factory=False)
    v.parse_outputs(schema, out, is_factory=False)
    assert v.dataptrs_read == set() and v.dataptrs_written == set() and v.storage_dataptrs_accessed == set()
    # CPU tensors are no npu memory: kept apart for the host check only
    c = _stream_check.NPUArgumentHandler()
    cpu = torch.ones(8)
    c.parse_inputs(torch.ops.aten.add.Tensor._schema, (cpu, a), {}, is_factory=False)
    assert c.dataptrs_read == {a.data_ptr()} and c.host_tensors == [cpu]


def _launch(h, stream, ptr, write=False, op="op"):
    reads, writes = (set(), {ptr}) if write else ({ptr}, set())
    return h._handle_kernel_launch(stream, reads, writes, set(), op, {ptr: []}, storage_dataptrs_accessed={ptr})


def test_record_stream_handler_sequence_rules():
    h = _stream_check.NPURecordStreamHandler()
    for s in (1, 2):
        h._handle_stream_creation(s)
    h._handle_memory_allocation(1000, 0)
    assert _launch(h, 0, 1000, write=True) == []
    h._handle_event_record(7, 0)
    h._handle_event_wait(7, 1)          # stream 1 waits for the write
    assert _launch(h, 1, 1000) == []    # so its read is ordered
    # the default stream waits for stream 1's use: covered ...
    h._handle_event_record(8, 1)
    h._handle_event_wait(8, 0)
    assert h.flush_record_stream_warnings() == []
    # ... but not a later use on stream 1
    assert _launch(h, 1, 1000) == []
    found = h.flush_record_stream_warnings()
    assert [(e.data_ptr, e.allocation_stream, e.usage_stream) for e in found] == [(1000, 0, 1)]
    # record_stream(1) covers it; erase_stream takes it back
    h._handle_record_stream(1000, 1)
    assert h.flush_record_stream_warnings() == []
    h._handle_erase_stream(1000, 1)
    assert len(h.flush_record_stream_warnings()) == 1
    # a device synchronize covers every use
    h._handle_device_synchronization()
    assert h.flush_record_stream_warnings() == []
    # a new allocation at the same address starts with no recorded streams
    h._handle_record_stream(1000, 2)
    h._handle_memory_deallocation(1000)
    h._handle_memory_allocation(1000, 0)
    assert h._npu_tensors[1000].recorded_streams == set()


def test_record_stream_handler_race_is_csans_error():
    h = _stream_check.NPURecordStreamHandler()
    h._handle_stream_creation(1)
    h._handle_memory_allocation(2000, 0)
    assert _launch(h, 0, 2000, write=True, op="first") == []
    errors = _launch(h, 1, 2000, op="second")
    assert len(errors) == 1 and isinstance(errors[0], csan.UnsynchronizedAccessError)
    assert errors[0].previous_access.operator == "first" and errors[0].current_access.stream == 1
    assert issubclass(_stream_check.MissingRecordStreamError, csan.SynchronizationError)
    assert issubclass(_stream_check.UnsynchronizedHostAccessError, csan.SynchronizationError)


def test_modes_and_public_names():
    assert (_sanitizer.SanitizerMode.STREAM, _sanitizer.SanitizerMode.KERNEL) == (0, 1)
    assert isinstance(_sanitizer.npu_sanitizer, _sanitizer.NPUSanitizer)
    assert callable(_sanitizer.enable_npu_sanitizer)
    assert issubclass(_stream_check.NPUSanitizerDispatchMode, torch.utils._python_dispatch.TorchDispatchMode)
    assert issubclass(_stream_check.NPURecordStreamHandler, csan.EventHandler)
    assert issubclass(_stream_check.NPUArgumentHandler, csan.ArgumentHandler)


def test_kernel_check_without_debug_path_warns_and_does_nothing(monkeypatch):
    monkeypatch.delenv("ASCEND_OPP_DEBUG_PATH", raising=False)
    san = _sanitizer.NPUSanitizer()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert san.enable_kernel_check() is False
    assert [str(w.message) for w in caught] == ["ASCEND_OPP_DEBUG_PATH is not set! TORCH_NPU_SANITIZER takes no effect!"]
    assert (san.enabled, san.event_handler, san.dispatch) == (False, None, None)


def test_debug_path_selects_kernel_mode_which_has_nothing_to_check(monkeypatch, tmp_path):
    monkeypatch.setenv("ASCEND_OPP_DEBUG_PATH", str(tmp_path))
    san = _sanitizer.NPUSanitizer()
    with pytest.warns(UserWarning, match="emulated NPU runs no CANN debug kernels"):
        san.enable()
    assert san.mode == _sanitizer.SanitizerMode.KERNEL
    assert (san.enabled, san.event_handler, san.dispatch) == (False, None, None)


def test_unset_variable_leaves_it_off():
    r = subprocess.run([sys.executable, "-c", "import torch_npu; from torch_npu.npu import _sanitizer as s; "
                        "print(s.npu_sanitizer.enabled, torch_npu._C._npu_trace_active_mask())"],
                       cwd=str(REPO), env=make_env(TORCH_NPU_SANITIZER=None), capture_output=True, text=True,
                       timeout=120)
    assert r.stdout.split() == ["False", "0"], r.stderr[-2000:]


# ---- clean training under the sanitizer ------------------------------------------------------

def test_ddp_and_fsdp2_steps_on_two_ranks_report_nothing():
    results = launch("sanitized_training.py", 2, timeout=300, env={"TORCH_NPU_SANITIZER": "1"})
    ref_losses, ref_params = reference_steps(3)
    for rank, res in enumerate(results):
        for name in ("ddp", "fsdp2"):
            r = res[name]
            assert "error" not in r, f"rank {rank} {name}:\n{r.get('error')}"
            assert r["enabled"] and r["launches"] > 100  # the steps ran under the sanitizer
            assert r["raised"] == [] and r["record_stream_errors"] == [], (rank, name, r)
            # and trained as without it: the full-batch reference
            assert max((r["params"][k] - ref_params[k]).abs().max().item() for k in ref_params) <= 1e-6
    for name in ("ddp", "fsdp2"):
        mean = [sum(results[r][name]["losses"][i] for r in range(2)) / 2 for i in range(3)]
        assert mean == pytest.approx(ref_losses, abs=1e-6)
        # FSDP2 overlaps its all-gathers and reduce-scatters on streams of its own
        assert res["fsdp2"]["streams"] > res["ddp"]["streams"] >= 1, res


def test_demo_runs_clean_under_the_sanitizer(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, str(REPO / "examples" / "demo.py"), "--size", "tiny", "--out-dir", str(out)],
                          cwd=str(REPO), env=make_env(TORCH_NPU_SANITIZER="1", TORCH_NPU_LOGS="env"),
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    logs = "".join(p.read_text(errors="replace") for p in sorted((out / "logs").glob("*.log")))
    # every process of the three 2-rank jobs ran under it (the launchers too)
    assert logs.count("NPU sanitizer enabled: stream check, record_stream check at frees on") >= 6, logs[-3000:]
    for marker in ("NPUSanitizer:", "CSAN detected", "CUDASanitizerErrors"):
        assert marker not in logs and marker not in proc.stdout + proc.stderr, marker
