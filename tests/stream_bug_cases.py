"""The classic stream bugs and their fixes, run under the NPU sanitizer (tests/test_stream_sanitizer.py).

Run as ``python tests/stream_bug_cases.py CASE...`` with ``TORCH_NPU_SANITIZER`` set; each case
runs with a fresh sanitizer state and its outcome is printed as one JSON line after
``@@CASE@@``: the errors raised (CSAN's ``CUDASanitizerErrors``), the missing-record_stream
errors reported at frees or by a flush, and the text the sanitizer printed. The cases are
plain functions in a file (not ``-c`` code) so that stack traces carry their source lines.
"""
import contextlib
import io
import json
import os
import sys

import torch
import torch.cuda._sanitizer as csan
import torch.distributed as dist

import torch_npu
from torch_npu.npu import _sanitizer, _stream_check

N = 4096  # elements: big enough for a block of its own
# What a case wants the test to know (pointers, stream ids), kept even when the case raises.
INFO = {}


def side_stream():
    s = torch.npu.Stream()
    s.wait_stream(torch.npu.current_stream())  # the side stream starts after what came before
    return s


# --- 1. written on a side stream, read on the default stream ------------------------------
def race_read_without_wait_stream():
    x = torch.zeros(N, device="npu")
    s = side_stream()
    INFO.update(ptr=x.data_ptr(), side=s.stream_id)
    with torch.npu.stream(s):
        x.add_(1)  # SIDE-WRITE
    return {"y": (x * 2).sum().item()}  # DEFAULT-READ


def race_read_without_wait_stream_fixed():
    x = torch.zeros(N, device="npu")
    s = side_stream()
    with torch.npu.stream(s):
        x.add_(1)
    torch.npu.current_stream().wait_stream(s)
    return {"y": (x * 2).sum().item()}


# --- 2. a tensor used on a side stream, freed without record_stream -----------------------
def missing_record_stream():
    x = torch.ones(N, device="npu")  # ALLOC-ON-DEFAULT
    s = side_stream()
    with torch.npu.stream(s):
        y = x * 2  # SIDE-USE
    INFO.update(ptr=x.untyped_storage().data_ptr(), side=s.stream_id)
    del x  # FREE: the default stream may reuse the block while s still reads it
    return {}


def missing_record_stream_fixed_by_record_stream():
    x = torch.ones(N, device="npu")
    s = side_stream()
    with torch.npu.stream(s):
        y = x * 2
        x.record_stream(s)
    del x
    return {}


def missing_record_stream_fixed_by_wait_stream():
    x = torch.ones(N, device="npu")
    s = side_stream()
    with torch.npu.stream(s):
        y = x * 2
    torch.npu.current_stream().wait_stream(s)
    del x
    return {}


def side_stream_tensor_freed_after_default_use():
    s = side_stream()
    with torch.npu.stream(s):
        x = torch.ones(N, device="npu")  # ALLOC-ON-SIDE
    torch.npu.current_stream().wait_stream(s)
    y = x * 2  # DEFAULT-USE
    INFO.update(ptr=x.untyped_storage().data_ptr(), side=s.stream_id)
    del x
    return {}


def missing_record_stream_flush():
    x = torch.ones(N, device="npu")
    s = side_stream()
    with torch.npu.stream(s):
        y = x * 2
    INFO.update(ptr=x.untyped_storage().data_ptr(), side=s.stream_id)
    found = _sanitizer.npu_sanitizer.event_handler.flush_record_stream_warnings()
    return {"flushed": [[e.data_ptr, e.allocation_stream, e.usage_stream] for e in found]}


# --- 3. a non_blocking copy to the host, read before synchronize --------------------------
def non_blocking_copy_read_early():
    x = torch.arange(N, dtype=torch.float32, device="npu")
    host = x.to("cpu", non_blocking=True)  # D2H-COPY
    INFO.update(ptr=host.data_ptr(), pinned=host.is_pinned())
    return {"sum": host.sum().item()}  # HOST-READ


def non_blocking_copy_read_after_synchronize():
    x = torch.arange(N, dtype=torch.float32, device="npu")
    host = x.to("cpu", non_blocking=True)
    torch.npu.synchronize()
    return {"sum": host.sum().item()}


def non_blocking_copy_read_after_event_synchronize():
    x = torch.arange(N, dtype=torch.float32, device="npu")
    host = x.to("cpu", non_blocking=True)
    done = torch.npu.Event()
    done.record()
    done.synchronize()
    return {"sum": host.sum().item()}


def blocking_copy_read():
    x = torch.arange(N, dtype=torch.float32, device="npu")
    host = x.to("cpu")
    return {"sum": host.sum().item()}


# --- 4. an event waited before it was recorded ---------------------------------------------
def event_waited_before_record():
    x = torch.zeros(N, device="npu")
    s = side_stream()
    done = torch.npu.Event()
    INFO.update(ptr=x.data_ptr(), side=s.stream_id)
    torch.npu.current_stream().wait_event(done)  # nothing recorded yet: waits for nothing
    with torch.npu.stream(s):
        x.add_(1)
        done.record()
    return {"y": (x * 2).sum().item()}  # READ-AFTER-EARLY-WAIT


def event_recorded_then_waited():
    x = torch.zeros(N, device="npu")
    s = side_stream()
    done = torch.npu.Event()
    with torch.npu.stream(s):
        x.add_(1)
        done.record()
    torch.npu.current_stream().wait_event(done)
    return {"y": (x * 2).sum().item()}


# --- 5. communication overlapped on a side stream (the DDP / FSDP pattern) ------------------
def _group():
    if not dist.is_initialized():
        dist.init_process_group("hccl", init_method=f"tcp://127.0.0.1:{os.environ['SAN_PORT']}", rank=0,
                                world_size=1)


def comm_stream_without_wait():
    _group()
    grad = torch.randn(N, device="npu")  # GRAD-ON-DEFAULT
    comm = torch.npu.Stream()
    INFO.update(ptr=grad.data_ptr(), side=comm.stream_id)
    with torch.npu.stream(comm):
        dist.all_reduce(grad)  # COMM-BEFORE-GRAD-READY
    return {}


def comm_result_used_without_wait():
    _group()
    grad = torch.randn(N, device="npu")
    comm = torch.npu.Stream()
    comm.wait_stream(torch.npu.current_stream())
    INFO.update(ptr=grad.data_ptr(), side=comm.stream_id)
    with torch.npu.stream(comm):
        dist.all_reduce(grad)  # COMM-WRITE
        grad.record_stream(comm)
    return {"y": (grad * 2).sum().item()}  # USE-BEFORE-COMM-DONE


def comm_overlap_fixed():
    _group()
    grad = torch.full((N,), 0.5, device="npu")
    comm = torch.npu.Stream()
    comm.wait_stream(torch.npu.current_stream())
    with torch.npu.stream(comm):
        dist.all_reduce(grad)
        grad.record_stream(comm)
    torch.npu.current_stream().wait_stream(comm)
    y = (grad * 2).sum().item()
    del grad
    return {"y": y}


CASES = {name: fn for name, fn in list(globals().items())
         if callable(fn) and getattr(fn, "__module__", None) == "__main__" and not name.startswith("_")
         and name not in ("side_stream", "run_case")}


def run_case(name):
    """Run one case with a fresh sanitizer; its outcome as a JSON-able dict."""
    san = _sanitizer.npu_sanitizer
    san.disable()
    san.enable()
    handler = san.event_handler
    printed = io.StringIO()
    INFO.clear()
    out = {"case": name, "enabled": san.enabled, "check_record_stream": san.check_record_stream}
    with contextlib.redirect_stderr(printed):
        try:
            out["result"] = CASES[name]()
            out["raised"] = None
        except csan.CUDASanitizerErrors as e:
            out["raised"] = [{"type": type(err).__name__, "data_ptr": err.data_ptr,
                              "streams": _streams(err), "text": str(err)} for err in e.errors]
        import gc
        gc.collect()
    out["record_stream_errors"] = [{"type": type(e).__name__, "data_ptr": e.data_ptr,
                                    "allocation_stream": e.allocation_stream, "usage_stream": e.usage_stream,
                                    "operator": e.usage.operator, "text": str(e)}
                                   for e in handler.record_stream_errors]
    out["info"] = dict(INFO)
    out["launches"] = handler.seq_num
    out["printed"] = printed.getvalue()
    return out


def _streams(err):
    if isinstance(err, csan.UnsynchronizedAccessError):
        return [err.current_access.stream, err.previous_access.stream]
    if isinstance(err, _stream_check.UnsynchronizedHostAccessError):
        return [err.copy.stream]
    return []


if __name__ == "__main__":
    for case in sys.argv[1:]:
        print("@@CASE@@" + json.dumps(run_case(case)), flush=True)
    if dist.is_initialized():
        dist.destroy_process_group()
