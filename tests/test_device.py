"""Device management API of torch.npu (spec: real torch_npu 2.13.0, SURFACE.md §2, §3, §10)."""
import re
import uuid

import pytest
import torch

import torch_npu
from _subproc import result, run_many

MiB = 1024 * 1024
GiB = 1024 * MiB

FORK_MSG = ("Cannot re-initialize NPU in forked subprocess. To use NPU with multiprocessing, "
            "you must use the 'spawn' start method")


@pytest.fixture(autouse=True)
def _device0():
    torch.npu.set_device(0)
    yield
    torch.npu.set_device(0)


# --------------------------------------------------------------------------
# Fresh-process checks, all started together (see _subproc.run_many).
# --------------------------------------------------------------------------

_DEFAULT_ENV = r'''
import os, torch, torch_npu
R = {}
R["count"] = torch.npu.device_count()
R["acc_count"] = torch.accelerator.device_count()
R["name"] = torch.npu.get_device_name(0)
p = torch.npu.get_device_properties(0)
R["total_memory"] = p.total_memory
R["mem_total"] = torch.npu.mem_get_info(0)[1]
R["last_ok"] = torch.ones(2, device="npu:7").add(1).cpu().tolist()
R["past_last"] = catch(lambda: torch.ones(2, device="npu:8"))
emit(R)
'''

# Lazy init, custom emulator configuration and the fork rule, in one process.
_CONFIGURED = r'''
import os, torch, torch_npu
R = {}
R["init_after_import"] = torch.npu.is_initialized()
R["count"] = torch.npu.device_count()
R["available"] = torch.npu.is_available()
R["acc_count"] = torch.accelerator.device_count()
R["alloc_before_init"] = torch.npu.memory_allocated()
R["stats_before_init"] = dict(torch.npu.memory_stats())
R["init_after_queries"] = torch.npu.is_initialized()

def child_report(fns):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        rep = {"initialized": torch.npu.is_initialized()}
        for key, fn in fns.items():
            rep[key] = catch(fn)
        rep["cpu_ok"] = (torch.ones(3) * 2).tolist()
        os.write(w, json.dumps(rep).encode())
        os._exit(7)
    os.close(w)
    chunks = []
    while True:
        b = os.read(r, 65536)
        if not b:
            break
        chunks.append(b)
    _, status = os.waitpid(pid, 0)
    return json.loads(b"".join(chunks).decode()), os.waitstatus_to_exitcode(status)

import json
# Fork before any NPU use: the child may initialise the NPU itself.
R["fork_before_init"] = child_report({"tensor": lambda: torch.ones(1).npu().add_(1).cpu()})
x = torch.ones(4).npu()
R["init_after_tensor"] = torch.npu.is_initialized()
R["name"] = torch.npu.get_device_name(1)
p = torch.npu.get_device_properties(2)
R["props_name"] = p.name
R["total_memory"] = p.total_memory
R["repr"] = repr(p)
R["mem_info"] = list(torch.npu.mem_get_info(0))
R["dev3"] = catch(lambda: torch.empty(2, device="npu:3"))
R["name3"] = catch(lambda: torch.npu.get_device_name(3))
# Fork after initialisation: every NPU use in the child must fail.
R["fork_after_init"] = child_report({
    "init": lambda: torch.npu.init(),
    "tensor": lambda: torch.ones(1).npu(),
    "factory": lambda: torch.empty(2, device="npu"),
    "factory1": lambda: torch.zeros(2, device="npu:1"),
    "to": lambda: torch.ones(2).to("npu"),
})
R["parent_after_fork"] = (x * 3).cpu().tolist()
emit(R)
'''

_VISIBLE = r'''
import torch, torch_npu
R = {"count": torch.npu.device_count(), "available": torch.npu.is_available(),
     "acc_count": torch.accelerator.device_count()}
if R["count"] >= 2:
    a = torch.arange(6, dtype=torch.float32, device="npu:1")
    R["dev1"] = [str(a.device), (a * 2 + 1).cpu().tolist()]
    R["past"] = catch(lambda: torch.empty(1, device="npu:%d" % R["count"]))
if R["count"] == 0:
    R["use"] = catch(lambda: torch.ones(1).npu())
emit(R)
'''

_ODD_MEMORY = r'''
import torch, torch_npu
p = torch.npu.get_device_properties(0)
emit({"total": p.total_memory, "repr": repr(p)})
'''

_JOBS = {
    "default": (_DEFAULT_ENV, {}),
    "configured": (_CONFIGURED, {"TORCH_NPU_EMU_DEVICE_COUNT": "3", "TORCH_NPU_EMU_DEVICE_NAME": "Ascend910_9392",
                                 "TORCH_NPU_EMU_MEMORY": "3GiB"}),
    "vis_2_5": (_VISIBLE, {"ASCEND_RT_VISIBLE_DEVICES": "2,5"}),
    "vis_3_1": (_VISIBLE, {"ASCEND_RT_VISIBLE_DEVICES": "3,1"}),
    "vis_1_a_2": (_VISIBLE, {"ASCEND_RT_VISIBLE_DEVICES": "1,a,2"}),
    "vis_0__3": (_VISIBLE, {"ASCEND_RT_VISIBLE_DEVICES": "0,,3"}),
    "vis_7_9": (_VISIBLE, {"ASCEND_RT_VISIBLE_DEVICES": "7,9"}),
    "odd_memory": (_ODD_MEMORY, {"TORCH_NPU_EMU_MEMORY": "1000000000"}),
}


@pytest.fixture(scope="module")
def fresh():
    return run_many(_JOBS)


def test_default_emulated_machine(fresh):
    r = result(fresh, "default")
    assert r["count"] == 8
    assert r["acc_count"] == 8
    assert r["name"] == "Ascend910B4"
    assert r["total_memory"] == 64 * GiB
    assert r["mem_total"] == 64 * GiB
    assert r["last_ok"] == [2.0, 2.0]
    assert r["past_last"] is not None and r["past_last"][2]
    assert "error code is 107001" in r["past_last"][1]


def test_device_count_from_env(fresh):
    r = result(fresh, "configured")
    assert r["count"] == 3
    assert r["acc_count"] == 3
    assert r["available"] is True


def test_device_name_and_memory_from_env(fresh):
    r = result(fresh, "configured")
    assert r["name"] == "Ascend910_9392"
    assert r["props_name"] == "Ascend910_9392"
    assert r["total_memory"] == 3 * GiB
    assert r["mem_info"][1] == 3 * GiB
    assert 0 < r["mem_info"][0] <= 3 * GiB
    assert r["repr"].startswith("_NPUDeviceProperties(name='Ascend910_9392', total_memory=3072MB, ")


def test_devices_past_configured_count_are_invalid(fresh):
    r = result(fresh, "configured")
    assert r["dev3"] is not None and r["dev3"][0] == "RuntimeError"
    assert "error code is 107001" in r["dev3"][1] and "Invalid device ID" in r["dev3"][1]
    assert r["name3"] is not None and r["name3"][0] == "AssertionError"
    assert r["name3"][1].startswith("Invalid device id")


def test_lazy_init(fresh):
    r = result(fresh, "configured")
    assert r["init_after_import"] is False
    # Queries that must not initialise the runtime (as torch.cuda).
    assert r["alloc_before_init"] == 0
    assert r["stats_before_init"] == {}
    assert r["init_after_queries"] is False
    assert r["init_after_tensor"] is True


def test_fork_before_init_is_allowed(fresh):
    rep, code = result(fresh, "configured")["fork_before_init"]
    assert code == 7
    assert rep["tensor"] is None
    assert rep["cpu_ok"] == [2.0, 2.0, 2.0]


def test_fork_after_init_refuses_npu_in_child(fresh):
    r = result(fresh, "configured")
    rep, code = r["fork_after_init"]
    assert code == 7
    assert rep["initialized"] is False
    for key in ("init", "tensor"):
        assert rep[key] is not None, key
        assert rep[key][0] == "RuntimeError", rep[key]
        assert rep[key][1] == FORK_MSG
    assert rep["cpu_ok"] == [2.0, 2.0, 2.0]           # CPU work in the child is unaffected
    assert r["parent_after_fork"] == [3.0] * 4         # and the parent keeps its NPU


def test_fork_after_init_refuses_factories_in_child(fresh):
    rep, code = result(fresh, "configured")["fork_after_init"]
    assert code == 7
    for key in ("factory", "factory1", "to"):
        assert rep[key] is not None, key
        assert rep[key][0] == "RuntimeError", rep[key]
        assert rep[key][1] == FORK_MSG


def test_visible_devices_two_ids(fresh):
    r = result(fresh, "vis_2_5")
    assert r["count"] == 2 and r["acc_count"] == 2 and r["available"] is True
    assert r["dev1"] == ["npu:1", [1.0, 3.0, 5.0, 7.0, 9.0, 11.0]]
    assert r["past"] is not None and "error code is 107001" in r["past"][1]


def test_visible_devices_not_ascending_means_none(fresh):
    r = result(fresh, "vis_3_1")
    assert r["count"] == 0 and r["acc_count"] == 0
    assert r["available"] is False
    assert r["use"] is not None and r["use"][2]
    assert r["use"][1].startswith("No NPUs are available")


@pytest.mark.parametrize("job", ["vis_1_a_2", "vis_0__3", "vis_7_9"])
def test_visible_devices_parsing_stops_early(fresh, job):
    # "1,a,2": reading stops at the first non digit/comma; "0,,3": an empty
    # element ends the list; "7,9": id 9 does not exist (8 devices) and truncates.
    r = result(fresh, job)
    assert r["count"] == 1 and r["acc_count"] == 1 and r["available"] is True


def test_properties_repr_total_memory_is_fractional_mb(fresh):
    r = result(fresh, "odd_memory")
    assert r["total"] == 1000000000
    assert "total_memory=%gMB," % (1000000000 / MiB) in r["repr"]   # "953.674MB"


# --------------------------------------------------------------------------
# In-process checks (default emulator: at least 8 devices expected).
# --------------------------------------------------------------------------

def test_enough_devices_for_this_module():
    assert torch.npu.is_available()
    assert torch.npu.device_count() >= 6


def test_registration_identity():
    assert torch.npu is torch_npu.npu
    assert torch.get_device_module("npu") is torch.npu
    assert torch.get_device_module(torch.device("npu:1")) is torch.npu
    assert torch._C._get_privateuse1_backend_name() == "npu"


def test_set_device_and_current_device():
    assert torch.npu.current_device() == 0
    torch.npu.set_device(2)
    assert torch.npu.current_device() == 2
    assert torch.empty(1, device="npu").device == torch.device("npu:2")
    assert torch.ones(1).npu().device == torch.device("npu:2")
    torch.npu.set_device("npu:3")
    assert torch.npu.current_device() == 3
    torch.npu.set_device(torch.device("npu", 1))
    assert torch.npu.current_device() == 1


def test_device_context_switches_and_restores():
    with torch.npu.device(3):
        assert torch.npu.current_device() == 3
        assert torch.ones(2).npu().device == torch.device("npu:3")
        with torch.npu.device("npu:1"):
            assert torch.npu.current_device() == 1
        assert torch.npu.current_device() == 3
    assert torch.npu.current_device() == 0


def test_device_of_context():
    t = torch.ones(2, device="npu:4")
    with torch.npu.device_of(t):
        assert torch.npu.current_device() == 4
    assert torch.npu.current_device() == 0
    with torch.npu.device_of(torch.ones(2)):  # CPU tensor: no change
        assert torch.npu.current_device() == 0


def test_tensor_npu_and_is_npu():
    cpu = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    assert cpu.is_npu is False
    n = cpu.npu()
    assert n.is_npu is True
    assert n.device == torch.device("npu:0")
    assert torch.equal(n.cpu(), cpu)
    assert cpu.npu(3).device == torch.device("npu:3")
    assert cpu.npu(device="npu:2").device == torch.device("npu:2")
    assert torch.equal((cpu.npu(5) * 2).cpu(), cpu * 2)


def test_module_npu():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    x = torch.randn(5, 4)
    ref = m(x)
    m.npu()
    assert all(p.device == torch.device("npu:0") for p in m.parameters())
    out = m(x.npu())
    assert out.device == torch.device("npu:0")
    torch.testing.assert_close(out.cpu(), ref)
    m.npu(1)
    assert all(p.device == torch.device("npu:1") for p in m.parameters())


def test_untyped_storage_npu():
    s = torch.arange(6, dtype=torch.uint8).untyped_storage()
    assert s.is_npu is False
    ns = s.npu()
    assert ns.is_npu is True
    assert ns.device == torch.device("npu:0")
    assert list(ns.cpu()) == [0, 1, 2, 3, 4, 5]
    assert torch.ones(2).npu().untyped_storage().is_npu is True


def test_typed_storage_with_unsupported_quantized_dtype():
    s = torch.TypedStorage(4, dtype=torch.qint8)
    with pytest.raises(RuntimeError) as ei:
        s.npu()
    assert str(ei.value) == "Cannot create npu storage as torch.qint8 dtype is not supported by this backend"
    fs = torch.TypedStorage(4, dtype=torch.float32).npu()
    assert fs.is_npu and fs.device == torch.device("npu:0")


@pytest.mark.parametrize("qdtype", [torch.qint8, torch.quint8, torch.qint32])
def test_quantized_tensor_npu_raises(qdtype):
    q = torch.quantize_per_tensor(torch.tensor([0.5, 1.0, 2.0]), 0.1, 0, qdtype)
    with pytest.raises(RuntimeError):
        q.npu()


def test_get_device_name_and_properties():
    p = torch.npu.get_device_properties(0)
    assert torch.npu.get_device_name() == p.name == torch.npu.get_device_name(0)
    assert torch.npu.get_device_name("npu:1") == p.name
    assert torch.npu.get_device_name(torch.device("npu:2")) == p.name
    assert isinstance(p.total_memory, int) and p.total_memory > 0
    assert p.total_memory == torch.npu.mem_get_info(0)[1]
    for field in ("cube_core_num", "vector_core_num", "L2_cache_size"):
        v = getattr(p, field)
        assert isinstance(v, int) and v > 0, field
    for field in ("major", "minor", "is_multi_gpu_board", "is_integrated", "multi_processor_count",
                  "max_threads_per_multi_processor", "warp_size", "regs_per_multiprocessor", "gcnArchName", "uuid"):
        assert hasattr(p, field), field


def test_device_properties_repr_format():
    p = torch.npu.get_device_properties(1)
    m = re.fullmatch(r"_NPUDeviceProperties\(name='(?P<name>[^']*)', total_memory=(?P<mem>[0-9.e+]+)MB, "
                     r"cube_core_num=(?P<cube>\d+), vector_core_num=(?P<vec>\d+), uuid=(?P<uuid>[^,]+), "
                     r"L2_cache_size=(?P<l2>[0-9.e+]+)MB\)", repr(p))
    assert m, repr(p)
    assert m["name"] == p.name
    assert float(m["mem"]) == pytest.approx(p.total_memory / MiB, rel=1e-5)
    assert int(m["cube"]) == p.cube_core_num
    assert int(m["vec"]) == p.vector_core_num
    assert float(m["l2"]) == pytest.approx(p.L2_cache_size / MiB, rel=1e-5)
    assert m["uuid"] == str(p.uuid)


def test_device_uuid_is_hex_uuid_and_distinct():
    seen = set()
    for i in range(3):
        s = str(torch.npu.get_device_properties(i).uuid)
        assert re.fullmatch(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", s), s
        uuid.UUID(s)
        seen.add(s)
    assert len(seen) == 3


@pytest.mark.parametrize("fn", [torch.npu.get_device_name, torch.npu.get_device_properties, torch.npu.mem_get_info])
@pytest.mark.parametrize("bad", [-1, 8, 99])
def test_invalid_device_id_assertion(fn, bad):
    with pytest.raises(AssertionError) as ei:
        fn(bad if bad != 8 else torch.npu.device_count())
    assert str(ei.value).startswith("Invalid device id")


def test_get_device_index_rejects_cpu():
    from torch_npu.npu.utils import _get_device_index
    with pytest.raises(ValueError) as ei:
        _get_device_index("cpu")
    assert str(ei.value).startswith("Expected a npu device, but got: cpu")
    assert _get_device_index("npu:3") == 3
    assert _get_device_index(torch.device("npu", 2)) == 2
    assert _get_device_index(5) == 5
    assert _get_device_index(None, optional=True) == torch.npu.current_device()
    assert _get_device_index("cpu", allow_cpu=True) == -1


def test_tensor_on_nonexistent_device():
    with pytest.raises(RuntimeError) as ei:
        torch.empty(2, device="npu:99")
    msg = str(ei.value)
    assert "error code is 107001" in msg
    assert "Invalid device ID" in msg


def test_set_device_nonexistent():
    with pytest.raises(RuntimeError) as ei:
        torch.npu.set_device(99)
    assert "error code is 107001" in str(ei.value)
    assert torch.npu.current_device() == 0


def test_negative_device_index():
    with pytest.raises(RuntimeError) as ref:
        torch.device("cpu", -1)
    with pytest.raises(RuntimeError) as ei:
        torch.device("npu", -1)
    assert str(ei.value) == str(ref.value) == "Device index must not be negative"


def test_torch_accelerator():
    assert torch.accelerator.is_available()
    assert torch.accelerator.device_count() == torch.npu.device_count()
    acc = torch.accelerator.current_accelerator()
    assert acc.type == "npu"
    assert torch.accelerator.current_device_index() == 0
    torch.accelerator.set_device_index(1)
    assert torch.npu.current_device() == 1
    assert torch.accelerator.current_device_index() == 1
    assert torch.empty(1, device="npu").device == torch.device("npu:1")
    torch.accelerator.set_device_index(0)
    assert torch.npu.current_device() == 0
    with torch.accelerator.device_index(3):
        assert torch.npu.current_device() == 3
        assert torch.accelerator.current_device_index() == 3
    assert torch.npu.current_device() == 0
    x = torch.ones(3, device="npu")
    torch.accelerator.synchronize()
    torch.accelerator.synchronize(1)
    torch.npu.synchronize()
    torch.npu.synchronize(2)
    assert x.sum().item() == 3.0
