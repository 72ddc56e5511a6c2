"""Load: allocation storms near device capacity, no leaks, many threads on different devices.

Each scenario runs in a fresh process with a small emulated device
(TORCH_NPU_EMU_MEMORY=256MiB, 4 devices) and a time limit, so a hang or a
crash fails the test instead of wedging the suite.
"""
import pytest

from _subproc import run_many, result

MiB = 1 << 20
ENV = {"TORCH_NPU_EMU_MEMORY": "256MiB", "TORCH_NPU_EMU_DEVICE_COUNT": "4"}

_HELPERS = r'''
import math, random, re, torch, torch_npu
MiB = 1 << 20
def block(nbytes):                      # torch_npu's round_size: 32-byte pad, 512-byte rounding
    return max(512, math.ceil((nbytes + 32) / 512) * 512)
def fmt(n):                             # torch_npu's format_size
    if n <= 1024: return f"{n} bytes"
    if n <= MiB: return f"{n / 1024:.2f} KiB"
    if n <= 1 << 30: return f"{n / MiB:.2f} MiB"
    return f"{n / (1 << 30):.2f} GiB"
OOM = re.compile(r"NPU out of memory\. Tried to allocate (?P<size>[^(]+) \(NPU (?P<dev>\d+); (?P<total>[^;]+) total "
                 r"capacity; (?P<alloc>[^;]+) already allocated; (?P<active>[^;]+) current active; (?P<free>[^;]+) "
                 r"free; (?P<reserved>[^;]+) reserved in total by PyTorch\)\.If reserved memory is >> allocated "
                 r"memory try setting max_split_size_mb to avoid fragmentation\.")
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096
'''

_STORM = _HELPERS + r'''
rng = random.Random(7)
cap = torch.npu.get_device_properties(0).total_memory
problems, ooms, rss_after_round = [], 0, []
for round_ in range(2):
    live = {}                            # id -> (tensor, requested bytes)
    for it in range(500):
        nbytes = int(math.exp(rng.uniform(math.log(512), math.log(96 * MiB))))
        before = torch.npu.memory_allocated()
        try:
            t = torch.empty(nbytes, dtype=torch.uint8, device="npu")
            if it % 16 == 0:
                t[:4096].fill_(it % 251)   # touch some pages, as real tensors would
            live[id(t)] = (t, nbytes)
            t = None                       # ``live`` holds the only reference
        except torch.OutOfMemoryError as e:
            ooms += 1
            m = OOM.match(str(e))
            if m is None:
                problems.append(["message", str(e)[:300]])
            elif (m["dev"], m["total"], m["alloc"], m["reserved"]) != ("0", fmt(cap), fmt(before),
                                                                      fmt(torch.npu.memory_reserved())):
                problems.append(["numbers", m.groupdict(), before, torch.npu.memory_reserved()])
            if torch.npu.memory_allocated() != before:
                problems.append(["failed allocation left memory allocated", it])
            for key in rng.sample(sorted(live), len(live) // 2):
                del live[key]
            if it % 3 == 0:
                torch.npu.empty_cache()
        # Three views must agree: our own books, the statistics, and the allocator's snapshot.
        stats = torch.npu.memory_stats()
        blocks = [b for seg in torch.npu.memory_snapshot() for b in seg["blocks"] if b["state"] == "active_allocated"]
        view = [sum(n for _, n in live.values()), len(live), sum(block(n) for _, n in live.values())]
        if not (view[:2] == [sum(b["requested_size"] for b in blocks), len(blocks)]
                and stats["allocation.all.current"] == len(live)
                and stats["allocated_bytes.all.current"] == torch.npu.memory_allocated()
                == stats["active_bytes.all.current"] == sum(b["size"] for b in blocks) >= view[2]
                and stats["requested_bytes.all.current"] == view[0]
                and torch.npu.memory_allocated() <= torch.npu.memory_reserved() <= cap
                and torch.npu.memory_reserved() == sum(seg["total_size"] for seg in torch.npu.memory_snapshot())):
            problems.append(["stats", it, view, torch.npu.memory_allocated(), stats["allocation.all.current"],
                             stats.get("requested_bytes.all.current"), torch.npu.memory_reserved()])
            break
    live.clear()
    after_free = [torch.npu.memory_allocated(), torch.npu.memory_stats()["active.all.current"]]
    torch.npu.empty_cache()
    rss_after_round.append(rss())
    stats = torch.npu.memory_stats()
emit({"ooms": ooms, "num_ooms": stats["num_ooms"], "problems": problems[:5], "after_free": after_free,
      "reserved_after_empty": torch.npu.memory_reserved(), "segments": stats["segment.all.current"],
      "mem_get_info": list(torch.npu.mem_get_info()), "cap": cap, "rss": rss_after_round,
      "alloc_retries_recorded": "num_alloc_retries" in stats})
'''

_OP_OOM = _HELPERS + r'''
# OOM raised by an op's output (not a factory), inside autograd, then the step runs again at a smaller size.
cap = torch.npu.get_device_properties(0).total_memory
w = torch.randn(1024, 1024, device="npu", requires_grad=True)      # 4 MiB
errors = []
for rows in (70 * 1024, 96 * 1024):                               # outputs of 280 / 384 MiB: over capacity
    try:
        (torch.ones(rows, 1024, device="npu") @ w).sum().backward()
    except torch.OutOfMemoryError as e:
        errors.append(str(e).split(" (NPU")[0])
left = torch.npu.memory_allocated()
x = torch.ones(512, 1024, device="npu")
(x @ w).sum().backward()
ok = bool(torch.equal(w.grad.cpu(), torch.full((1024, 1024), 512.0)))
del x
w.grad = None
emit({"errors": errors, "left": left, "w_bytes": block(4 * MiB), "ok": ok,
      "final": torch.npu.memory_allocated()})
'''

_THREADS = _HELPERS + r'''
import threading, time
N_THREADS, ITERS = 8, 1000
a_cpu = torch.randn(64, 96, generator=torch.Generator().manual_seed(1))
b_cpu = torch.randn(96, 32, generator=torch.Generator().manual_seed(2))
expected = (a_cpu @ b_cpu).relu().sum(0)
baseline = [torch.npu.memory_allocated(d) for d in range(4)]
failures, stop = [], threading.Event()

def worker(k):
    dev = k % 4
    try:
        torch.npu.set_device(dev)
        for i in range(ITERS):
            if torch.npu.current_device() != dev:
                failures.append(["current device leaked", k, torch.npu.current_device()]); return
            a, b = a_cpu.npu(), b_cpu.to(f"npu:{dev}")
            out = (a @ b).relu().sum(0)
            if out.device != torch.device("npu", dev) or not torch.equal(out.cpu(), expected):
                failures.append(["wrong result", k, i, str(out.device)]); return
            scratch = [torch.empty((i % 7 + 1) * 4096 * (k + 1), device="npu") for _ in range(3)]
            del scratch, a, b, out
    except BaseException as e:
        failures.append(["raised", k, repr(e)[:300]])

def oom_worker():                         # keeps hitting OOM on device 3 while others use it
    count = 0
    torch.npu.set_device(3)
    while not stop.is_set():
        try:
            torch.empty(300 * MiB, dtype=torch.uint8, device="npu")
        except torch.OutOfMemoryError:
            count += 1
    oom_count.append(count)

oom_count = []
start = time.monotonic()
threads = [threading.Thread(target=worker, args=(k,)) for k in range(N_THREADS)]
oom_thread = threading.Thread(target=oom_worker)
oom_thread.start()
for t in threads: t.start()
for t in threads: t.join(timeout=120)
stop.set(); oom_thread.join(timeout=30)
hung = [t.name for t in threads + [oom_thread] if t.is_alive()]
emit({"failures": failures[:5], "hung": hung, "seconds": time.monotonic() - start,
      "main_device": torch.npu.current_device(), "ooms": oom_count,
      "leaked": [torch.npu.memory_allocated(d) - baseline[d] for d in range(4)],
      "num_ooms_dev3": torch.npu.memory_stats(3)["num_ooms"]})
'''


@pytest.fixture(scope="module")
def runs():
    return run_many({"storm": (_STORM, ENV), "op_oom": (_OP_OOM, ENV), "threads": (_THREADS, ENV)}, timeout=240)


def test_allocation_storm_near_capacity(runs):
    r = result(runs, "storm")
    assert r["problems"] == []
    assert r["ooms"] >= 30, "the storm did not reach the capacity often enough to test anything"
    assert r["num_ooms"] == r["ooms"]
    assert r["after_free"] == [0, 0]
    assert r["reserved_after_empty"] == 0 and r["segments"] == 0
    assert r["mem_get_info"] == [r["cap"], r["cap"]] == [256 * MiB, 256 * MiB]


def test_no_host_memory_leak_over_1000_iterations(runs):
    r = result(runs, "storm")
    first, second = r["rss"]
    assert second - first < 32 * MiB, f"RSS grew by {(second - first) / MiB:.1f} MiB between identical rounds"


def test_op_output_oom_recovers(runs):
    r = result(runs, "op_oom")
    assert r["errors"] == ["NPU out of memory. Tried to allocate 280.00 MiB",
                           "NPU out of memory. Tried to allocate 384.00 MiB"]
    assert r["left"] == r["w_bytes"]   # only the weight is left after the failed steps
    assert r["ok"] is True
    assert r["final"] == r["w_bytes"]


def test_many_threads_on_different_devices(runs):
    r = result(runs, "threads")
    assert r["failures"] == [] and r["hung"] == []
    assert r["main_device"] == 0           # set_device in threads is thread-local
    assert r["leaked"] == [0, 0, 0, 0]
    assert r["ooms"][0] >= 1 and r["num_ooms_dev3"] == r["ooms"][0]
