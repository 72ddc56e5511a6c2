"""User-facing errors of torch_npu (spec: real torch_npu 2.13.0, SURFACE.md §10 and error_messages.txt)."""
import datetime
import os
import re

import pytest
import torch

import torch_npu  # noqa: F401
from _subproc import result, run_many

SAME_DEVICE = "Expected all tensors to be on the same device, but found at least two devices, "

SUFFIX_RE = (r"\n\[ERROR\] (?P<stamp>\d{4}-\d{2}-\d{2}-\d{2}:\d{2}:\d{2}) "
             r"\(PID:(?P<pid>\d+), Device:(?P<device>-?\d+), RankID:(?P<rank>-?\d+)\) ")


def suffix(code_text):
    """Regex of the error suffix with a given 'ERR<sub><code> <SUB> <text>' tail."""
    return SUFFIX_RE + re.escape(code_text)


ACL_SUFFIX = suffix("ERR00100 PTA call acl api failed")
INVALID_DEVICE_TAIL = r"\n\[Error\]: Invalid device ID\.\n        Check whether the device ID is valid\."
SPARSE_RE = r"CAUTION: The operator 'aten::[\w.]+' is not currently supported on the NPU backend\."


@pytest.fixture(autouse=True)
def _device0():
    torch.npu.set_device(0)
    yield
    torch.npu.set_device(0)


def _check_stamp(stamp):
    t = datetime.datetime.strptime(stamp, "%Y-%m-%d-%H:%M:%S")
    assert abs((datetime.datetime.now() - t).total_seconds()) < 300


def _expected_rank():
    v = os.environ.get("RANK", "-1")
    return int(v) if v.lstrip("-").isdigit() else -1


# --------------------------------------------------------------------------
# Device mismatch
# --------------------------------------------------------------------------

def test_npu_plus_cpu_tensor():
    a = torch.ones(3).npu()
    with pytest.raises(RuntimeError) as ei:
        a + torch.ones(3)
    assert str(ei.value).startswith(
        "Expected all tensors to be on the same device, but found at least two devices, npu:0 and cpu! "
        "(when checking argument for argument other in method wrapper_NPU__add_Tensor)")


@pytest.mark.parametrize("op", [lambda a, b: a * b, lambda a, b: torch.mm(a, b), lambda a, b: torch.cat([a, b])])
def test_other_ops_npu_with_cpu_tensor(op):
    with pytest.raises(RuntimeError) as ei:
        op(torch.ones(2, 2).npu(), torch.ones(2, 2))
    assert str(ei.value).startswith(SAME_DEVICE + "npu:0 and cpu! (when checking argument for argument ")


def test_npu0_plus_npu1_tensor():
    with pytest.raises(RuntimeError) as ei:
        torch.ones(3, device="npu:0") + torch.ones(3, device="npu:1")
    assert str(ei.value).startswith(
        SAME_DEVICE + "npu:0 and npu:1! (when checking argument for argument other in method wrapper_NPU__add_Tensor)")


def test_zero_dim_cpu_tensor_with_npu_tensor_is_allowed():
    a_cpu = torch.tensor([1.5, -2.0, 3.0])
    a = a_cpu.npu()
    s = torch.tensor(2.5)
    for got, ref in ((a + s, a_cpu + s), (s * a, s * a_cpu), (torch.maximum(a, torch.tensor(0.0)), a_cpu.clamp(min=0))):
        assert got.device == torch.device("npu:0")
        assert torch.equal(got.cpu(), ref)
    i = torch.tensor([1, 2, 3]).npu()
    got = i * torch.tensor(4)
    assert got.dtype == torch.int64 and got.cpu().tolist() == [4, 8, 12]


def test_cross_device_copy_is_allowed():
    a = torch.arange(4.0)
    n = torch.empty(4, device="npu:1")
    n.copy_(a)
    m = torch.empty(4, device="npu:0")
    m.copy_(n)
    assert m.cpu().tolist() == [0.0, 1.0, 2.0, 3.0]


def test_numpy_on_npu_tensor():
    with pytest.raises(TypeError) as ei:
        torch.ones(2).npu().numpy()
    assert str(ei.value) == ("can't convert npu:0 device type tensor to numpy. "
                             "Use Tensor.cpu() to copy the tensor to host memory first.")
    with pytest.raises(TypeError) as ei:
        torch.ones(2, device="npu:2").numpy()
    assert str(ei.value).startswith("can't convert npu:2 device type tensor to numpy.")


# --------------------------------------------------------------------------
# Error suffix
# --------------------------------------------------------------------------

def test_acl_error_suffix_format():
    torch.npu.set_device(0)
    with pytest.raises(RuntimeError) as ei:
        torch.empty(2, device="npu:99")
    msg = str(ei.value)
    m = re.search(r"NPU function error: .+, error code is 107001" + ACL_SUFFIX + INVALID_DEVICE_TAIL, msg)
    assert m, msg
    assert int(m["pid"]) == os.getpid()
    assert int(m["device"]) == 0
    assert int(m["rank"]) == _expected_rank()
    _check_stamp(m["stamp"])


def test_python_error_suffix_format():
    with pytest.raises(AssertionError) as ei:
        torch.npu.get_device_name(99)
    m = re.fullmatch("Invalid device id" + suffix("ERR00003 PTA invalid value"), str(ei.value))
    assert m, str(ei.value)
    assert int(m["pid"]) == os.getpid()
    _check_stamp(m["stamp"])
    with pytest.raises(ValueError) as ei:
        torch_npu.npu.utils._get_device_index("cpu")
    assert re.fullmatch("Expected a npu device, but got: cpu" + suffix("ERR00003 PTA invalid value"), str(ei.value))


def test_pta_error_helper_format():
    from torch_npu.utils._error_code import ErrCode, pta_error
    s = pta_error(ErrCode.UNAVAIL)
    assert re.fullmatch(suffix("ERR00009 PTA resource unavailable"), s)


_RANKED = r'''
import os, torch, torch_npu
torch.npu.set_device(3)
R = {"pid": os.getpid()}
R["acl"] = catch(lambda: torch.empty(2, device="npu:99"))
R["py"] = catch(lambda: torch.npu.get_device_name(99))
emit(R)
'''

_COMPACT = r'''
import torch, torch_npu
R = {}
R["acl"] = catch(lambda: torch.empty(2, device="npu:99"))
R["py"] = catch(lambda: torch.npu.get_device_name(99))
R["idx"] = catch(lambda: torch_npu.npu.utils._get_device_index("cpu"))
R["oom"] = catch(lambda: torch.empty(2 ** 50, dtype=torch.uint8, device="npu"))
i = torch.tensor([[0, 1], [1, 0]])
v = torch.tensor([1.0, 2.0])
R["sparse"] = catch(lambda: torch.sparse_coo_tensor(i, v, (2, 2)).npu())
emit(R)
'''


@pytest.fixture(scope="module")
def fresh():
    return run_many({
        "ranked": (_RANKED, {"RANK": "5"}),
        "compact": (_COMPACT, {"TORCH_NPU_COMPACT_ERROR_OUTPUT": "1"}),
    })


def test_suffix_reports_current_device_and_rank(fresh):
    r = result(fresh, "ranked")
    for key, code in (("acl", "ERR00100 PTA call acl api failed"), ("py", "ERR00003 PTA invalid value")):
        assert r[key] is not None
        m = re.search(suffix(code), r[key][1])
        assert m, r[key][1]
        assert (int(m["pid"]), int(m["device"]), int(m["rank"])) == (r["pid"], 3, 5)


def test_compact_error_output_drops_suffix(fresh):
    r = result(fresh, "compact")
    acl = r["acl"][1]
    assert "error code is 107001" in acl
    assert "[ERROR]" not in acl and "ERR00100" not in acl
    assert r["py"][:2] == ["AssertionError", "Invalid device id"]
    assert r["idx"][:2] == ["ValueError", "Expected a npu device, but got: cpu"]
    assert r["oom"][0] == "OutOfMemoryError"
    assert r["oom"][1].startswith("NPU out of memory. Tried to allocate ")
    assert r["oom"][1].endswith("If reserved memory is >> allocated memory try setting max_split_size_mb "
                                "to avoid fragmentation.")
    assert r["sparse"][2] and re.fullmatch(SPARSE_RE, r["sparse"][1]), r["sparse"]


# --------------------------------------------------------------------------
# Sparse tensors: a clear error, never a crash
# --------------------------------------------------------------------------

def _coo():
    return torch.tensor([[0, 1, 1], [2, 0, 2]]), torch.tensor([3.0, 4.0, 5.0])


@pytest.mark.parametrize("make", [
    lambda: torch.sparse_coo_tensor(*_coo(), (2, 3)).npu(),
    lambda: torch.sparse_coo_tensor(*_coo(), (2, 3)).to("npu:1"),
    lambda: torch.sparse_coo_tensor(_coo()[0].npu(), _coo()[1].npu(), (2, 3)),
], ids=["to_npu", "to_npu1", "construct_on_npu"])
def test_sparse_npu_ops_raise_clear_error(make):
    with pytest.raises(RuntimeError) as ei:
        make()
    msg = str(ei.value)
    assert re.match(SPARSE_RE + suffix("ERR01007 OPS feature not supported"), msg), msg
    # and the process keeps working
    assert (torch.ones(3).npu() * 2).sum().item() == 6.0


# --------------------------------------------------------------------------
# Argument / dtype errors: same exception and message as on the CPU
# --------------------------------------------------------------------------

DTYPE_CASES = {
    "mm_int_float": lambda d: torch.mm(torch.ones(2, 2, dtype=torch.int32, device=d), torch.ones(2, 2, device=d)),
    "matmul_double_float": lambda d: torch.matmul(torch.ones(2, 2, dtype=torch.float64, device=d),
                                                  torch.ones(2, 2, device=d)),
    "addmm_dtype": lambda d: torch.addmm(torch.ones(2, 2, dtype=torch.float64, device=d), torch.ones(2, 2, device=d),
                                         torch.ones(2, 2, device=d)),
    "matmul_shape": lambda d: torch.ones(2, 3, device=d) @ torch.ones(2, 3, device=d),
    "inplace_complex_into_float": lambda d: torch.ones(2, device=d).add_(torch.ones(2, dtype=torch.complex64,
                                                                                    device=d)),
    "out_float_into_long": lambda d: torch.mul(torch.ones(2, device=d), 1.5,
                                               out=torch.empty(2, dtype=torch.int64, device=d)),
    "cat_sizes": lambda d: torch.cat([torch.ones(2, 3, device=d), torch.ones(2, 4, device=d)], 0),
    "bmm_dims": lambda d: torch.bmm(torch.ones(2, 3, device=d), torch.ones(3, 2, device=d)),
    "index_select_float_index": lambda d: torch.index_select(torch.ones(3, device=d), 0, torch.ones(2, device=d)),
    "gather_float_index": lambda d: torch.gather(torch.ones(3, device=d), 0, torch.zeros(2, device=d)),
    "bool_sub": lambda d: torch.ones(2, dtype=torch.bool, device=d) - torch.ones(2, dtype=torch.bool, device=d),
    "where_float_cond": lambda d: torch.where(torch.ones(2, device=d), torch.ones(2, device=d),
                                              torch.zeros(2, device=d)),
    "conv_dtype": lambda d: torch.nn.functional.conv2d(torch.ones(1, 1, 3, 3, dtype=torch.float64, device=d),
                                                       torch.ones(1, 1, 2, 2, device=d)),
    "lerp_dtype": lambda d: torch.lerp(torch.ones(2, device=d), torch.ones(2, dtype=torch.float64, device=d), 0.5),
    "view_shape": lambda d: torch.ones(3, device=d).view(2, 2),
    "sum_bad_dim": lambda d: torch.ones(2, 3, device=d).sum(5),
    "randint_bad_range": lambda d: torch.randint(5, 2, (3,), device=d),
}


@pytest.mark.parametrize("name", sorted(DTYPE_CASES))
def test_errors_match_cpu(name):
    fn = DTYPE_CASES[name]
    with pytest.raises(Exception) as ref:
        fn("cpu")
    with pytest.raises(Exception) as got:
        fn("npu")
    assert type(got.value) is type(ref.value)
    assert str(got.value) == str(ref.value)
