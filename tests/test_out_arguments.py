"""out= arguments on every kernel path (zero-copy CPU kernels, the emulated CPU
fallback, direct kernels), against CPU/CUDA semantics:

- a CPU tensor passed as out= next to npu inputs raises the generated device
  check's error (out arguments are checked first, as in the real torch_npu's
  and CUDA's wrappers), 0-dim ones included; 0-dim CPU *inputs* stay allowed;
- a non-contiguous out= keeps its strides and storage; one of the wrong shape
  is resized as the CPU kernel resizes it.
"""
import re

import pytest
import torch
import torch_npu  # noqa: F401

SAME_DEVICE = "Expected all tensors to be on the same device, but found at least two devices, "


def npu0d(v=1.5):
    return torch.tensor(v, device="npu")


def idx0d():
    return torch.tensor(0, device="npu")


# (name, call(out), out factory on a device, wrapper name): the ops the conformance
# suite found accepting a 0-dim CPU out= and returning a CPU tensor.
ZERO_DIM_OUT_CASES = [
    ("mul", lambda out: torch.mul(npu0d(), npu0d(), out=out), "mul_out"),
    ("eq", lambda out: torch.eq(npu0d(), npu0d(), out=out), "eq_Tensor_out"),
    ("sub", lambda out: torch.sub(npu0d(), npu0d(), out=out), "sub_out"),
    ("gt", lambda out: torch.gt(npu0d(), npu0d(0.5), out=out), "gt_Tensor_out"),
    ("log", lambda out: torch.log(npu0d(), out=out), "log_out"),
    ("take", lambda out: torch.take(npu0d(), idx0d(), out=out), "take_out"),
    ("index_select", lambda out: torch.index_select(npu0d(), 0, idx0d(), out=out), "index_select_out"),
    ("special.ndtri (emulated fallback)", lambda out: torch.special.ndtri(npu0d(0.25), out=out), "special_ndtri_out"),
]
_DTYPE = {"eq": torch.bool, "gt": torch.bool, "take": torch.float32}


@pytest.mark.parametrize("name,call,wrapper", ZERO_DIM_OUT_CASES, ids=[c[0] for c in ZERO_DIM_OUT_CASES])
def test_zero_dim_cpu_out_next_to_npu_inputs_raises(name, call, wrapper):
    out = torch.zeros((), dtype=_DTYPE.get(name, torch.float32))
    before = out.clone()
    with pytest.raises(RuntimeError, match="^" + re.escape(
            SAME_DEVICE + f"cpu and npu:0! (when checking argument for argument self in method wrapper_NPU__{wrapper})")):
        call(out)
    assert torch.equal(out, before), "the CPU out= tensor was written before the error"
    # The same call with an npu out= computes what the CPU computes.
    npu_out = torch.zeros((), dtype=out.dtype, device="npu")
    r = call(npu_out)
    assert r is npu_out and r.device.type == "npu"


def test_zero_dim_cpu_out_values_match_cpu_when_on_npu():
    for op, args in [(torch.mul, (1.5, 2.5)), (torch.sub, (1.5, 2.5)), (torch.atan2, (0.3, -0.7))]:
        cpu = op(torch.tensor(args[0]), torch.tensor(args[1]))
        out = torch.empty((), device="npu")
        op(torch.tensor(args[0], device="npu"), torch.tensor(args[1], device="npu"), out=out)
        assert torch.equal(out.cpu(), cpu)


def test_two_cpu_outs_name_the_first_npu_input():
    mn, mx = torch.empty(()), torch.empty(())
    with pytest.raises(RuntimeError, match="^" + re.escape(
            SAME_DEVICE + "cpu and npu:0! (when checking argument for argument self in method wrapper_NPU__aminmax_out)")):
        torch.aminmax(torch.randn(5, device="npu"), out=(mn, mx))


def test_mixed_outs_name_the_cpu_out():
    mn = torch.empty((), device="npu")
    with pytest.raises(RuntimeError, match="^" + re.escape(
            SAME_DEVICE + "npu:0 and cpu! (when checking argument for argument max in method wrapper_NPU__aminmax_out)")):
        torch.aminmax(torch.randn(5, device="npu"), out=(mn, torch.empty(())))


def test_norm_with_zero_dim_cpu_out_raises():
    with pytest.raises(RuntimeError, match="^" + re.escape(SAME_DEVICE + "cpu and npu:0! ")):
        torch.norm(torch.randn(3, device="npu"), out=torch.empty(()))


def test_non_scalar_cpu_out_raises_with_out_checked_first():
    with pytest.raises(RuntimeError, match="^" + re.escape(
            SAME_DEVICE + "cpu and npu:0! (when checking argument for argument self in method wrapper_NPU__add_out)")):
        torch.add(torch.ones(3, device="npu"), torch.ones(3, device="npu"), out=torch.empty(3))


def test_in_place_on_cpu_scalar_with_npu_other_raises():
    with pytest.raises(RuntimeError, match="^" + re.escape(SAME_DEVICE + "cpu and npu:0! ")):
        torch.tensor(1.0).add_(torch.ones((), device="npu"))


def test_zero_dim_cpu_inputs_stay_allowed():
    a = torch.randn(4)
    s = torch.tensor(2.5)
    for op in (torch.mul, torch.add, torch.fmax):  # zero-copy, zero-copy, emulated fallback
        r = op(a.npu(), s)
        assert r.device.type == "npu" and torch.equal(r.cpu(), op(a, s))


def test_cross_device_copy_is_not_an_out_argument():
    cpu = torch.zeros(())
    cpu.copy_(torch.tensor(3.0, device="npu"))
    assert cpu.item() == 3.0
    dst = torch.zeros(3, device="npu")
    dst.copy_(torch.arange(3.0))
    assert torch.equal(dst.cpu(), torch.arange(3.0))


def test_index_put_keeps_its_own_cpu_index_rule():
    x = torch.zeros(4, device="npu")
    x.index_put_((torch.tensor([1, 3]),), torch.tensor(2.0))  # CPU indices and 0-dim value: fine, as on CUDA
    assert x.cpu().tolist() == [0.0, 2.0, 0.0, 2.0]
    with pytest.raises(IndexError, match=re.escape(
            "indices should be either on cpu or on the same device as the indexed tensor (cpu)")):
        torch.zeros(4).index_put_((torch.tensor([1], device="npu"),), torch.tensor(2.0))


# --- non-contiguous out= on the emulated CPU fallback -------------------------
def _strided_out(device, shape=(4, 10), dtype=torch.float32):
    """Every second column of a buffer filled with 7 (the others must stay 7)."""
    return torch.full((shape[0], shape[1] * 2), 7.0, dtype=dtype, device=device)[:, ::2]


def _x(shape=(4, 10), lo=0.1, hi=0.9):
    g = torch.Generator().manual_seed(0)
    return torch.rand(shape, generator=g) * (hi - lo) + lo


STRIDED_CASES = [
    ("conj_physical", lambda x, out: torch.conj_physical(x, out=out), lambda: _x()),
    ("log_softmax", lambda x, out: torch.log_softmax(x, 1, out=out), lambda: _x()),  # composite: resize_
    ("_log_softmax", lambda x, out: torch._log_softmax(x, 1, False, out=out), lambda: _x()),
    ("ones (composite: resize_ + fill_)", lambda x, out: torch.ones(x.shape, out=out), lambda: _x()),
    ("mvlgamma", lambda x, out: torch.mvlgamma(x, 2, out=out), lambda: _x(lo=1.0, hi=3.0)),
    ("special.ndtri", lambda x, out: torch.special.ndtri(x, out=out), lambda: _x()),
    ("special.bessel_j0", lambda x, out: torch.special.bessel_j0(x, out=out), lambda: _x()),
    ("special.modified_bessel_i1", lambda x, out: torch.special.modified_bessel_i1(x, out=out), lambda: _x()),
]


@pytest.mark.parametrize("name,call,make", STRIDED_CASES, ids=[c[0] for c in STRIDED_CASES])
def test_non_contiguous_out_keeps_its_strides(name, call, make):
    x = make()
    cpu_out = _strided_out("cpu")
    npu_out = _strided_out("npu")
    ptr, strides = npu_out.data_ptr(), npu_out.stride()
    call(x, cpu_out)
    r = call(x.npu(), npu_out)
    assert r is npu_out
    assert cpu_out.stride() == strides == (20, 2), "the CPU kernel itself keeps the strides"
    assert x.device.type == "cpu"
    assert npu_out.stride() == strides and npu_out.data_ptr() == ptr
    assert torch.equal(npu_out.cpu(), cpu_out)
    # The whole buffer, the elements between the strided ones included, is the CPU's
    # (untouched 7s, except where the CPU kernel itself writes there: _log_softmax.out).
    assert torch.equal(npu_out._base.cpu(), cpu_out._base)


def test_linalg_solve_ex_non_contiguous_outs_keep_their_strides():
    g = torch.Generator().manual_seed(0)
    a = torch.randn(3, 3, generator=g) + 3 * torch.eye(3)
    b = torch.randn(3, 4, generator=g)
    outs = {}
    for dev in ("cpu", "npu"):
        res = torch.empty(3, 8, device=dev)[:, ::2]
        info = torch.empty((), dtype=torch.int32, device=dev)
        torch.linalg.solve_ex(a.to(dev), b.to(dev), out=(res, info))
        outs[dev] = res
    assert outs["npu"].stride() == outs["cpu"].stride() == (8, 2)
    assert torch.equal(outs["npu"].cpu(), outs["cpu"])


def test_native_batch_norm_legit_non_contiguous_out_keeps_its_strides():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 3, generator=g)
    w, b = torch.ones(3), torch.zeros(3)
    rm, rv = torch.zeros(3), torch.ones(3)
    res = {}
    for dev in ("cpu", "npu"):
        out = torch.empty(4, 6, device=dev)[:, ::2]
        mean, invstd = torch.empty(3, device=dev), torch.empty(3, device=dev)
        torch.ops.aten._native_batch_norm_legit.out(x.to(dev), w.to(dev), b.to(dev), rm.clone().to(dev),
                                                    rv.clone().to(dev), True, 0.1, 1e-5,
                                                    out=out, save_mean=mean, save_invstd=invstd)
        res[dev] = (out, mean, invstd)
    assert res["npu"][0].stride() == res["cpu"][0].stride() == (6, 2)
    for n, c in zip(res["npu"], res["cpu"]):
        assert torch.equal(n.cpu(), c)


def test_wrong_shape_out_is_resized_as_on_cpu():
    x = _x()
    cpu_out = torch.empty(0)
    npu_base = torch.zeros(64, device="npu")
    npu_out = npu_base[8:9]  # a view with a storage offset
    torch.special.ndtri(x, out=cpu_out)
    torch.special.ndtri(x.npu(), out=npu_out)
    assert npu_out.shape == cpu_out.shape and npu_out.stride() == cpu_out.stride()
    assert npu_out.storage_offset() == 8, "a resize keeps the storage offset, as on CPU"
    assert torch.equal(npu_out.cpu(), cpu_out)


def test_resize_to_the_same_shape_keeps_strides():
    for dev in ("cpu", "npu"):
        t = torch.zeros(4, 20, device=dev)[:, ::2]
        t.resize_(4, 10)
        assert t.stride() == (20, 2), dev
        t.resize_(2, 3)
        assert t.stride() == (3, 1), dev


def test_in_place_op_that_would_broadcast_self_raises_as_on_cpu():
    # logical_and_ / ldexp_ call their out= overload with self as out: the
    # kernel must see one tensor, so it refuses to resize it, as on CPU.
    a, b = torch.randn(3, 1), torch.randn(3, 4)
    for fn in (torch.Tensor.logical_and_, torch.Tensor.ldexp_):
        with pytest.raises(RuntimeError, match=re.escape("output with shape [3, 1] doesn't match the broadcast shape [3, 4]")):
            fn(a.clone(), b)
        x = a.npu()
        with pytest.raises(RuntimeError, match=re.escape("output with shape [3, 1] doesn't match the broadcast shape [3, 4]")):
            fn(x, b.npu())
        assert x.shape == (3, 1)


def test_cat_into_one_of_its_inputs_raises_as_on_cpu():
    for dev in ("cpu", "npu"):
        x = torch.randn(4, 6, device=dev)
        with pytest.raises(RuntimeError, match="the written-to tensor refer to a single memory location"):
            torch.cat([x, x], dim=0, out=x)


def test_addr_in_place_on_a_self_that_is_not_2d_raises_as_on_cpu():
    # addr_'s composite tells in-place from out= by reference identity: on npu
    # it runs on the CPU alias, so a 1-D self is rejected, not resized.
    v = torch.arange(1.0, 4.0)
    for dev in ("cpu", "npu"):
        s = torch.zeros(3, device=dev)
        with pytest.raises(RuntimeError, match=re.escape("2D tensor expected, got 1D tensor for input")):
            s.addr_(v.to(dev), v.to(dev))
        assert s.shape == (3,)
    s2 = torch.ones(3, 3).npu()
    s2.addr_(v.npu(), v.npu(), beta=2.0, alpha=0.5)
    assert torch.equal(s2.cpu(), torch.ones(3, 3).addr_(v, v, beta=2.0, alpha=0.5))
