"""Private formats: the format is storage metadata, the data layout stays ND."""
import io

import pytest
import torch

import torch_npu
from torch_npu import Format

from _subproc import run_json


def test_base_formats_follow_the_rank():
    # torch_npu's documented example: a 4-D tensor starts in NCHW (0).
    assert torch_npu.get_npu_format(torch.rand(2, 3, 4, 5).npu()) == Format.NCHW
    assert torch_npu.get_npu_format(torch.rand(2, 3, 4, 5, 6).npu()) == Format.NCDHW
    assert torch_npu.get_npu_format(torch.rand(3, 4).npu()) == Format.ND
    assert torch_npu.get_npu_format(torch.rand(3, 4)) == Format.ND


def test_cast_returns_a_copy_with_the_format_and_same_values():
    x = torch.rand(2, 3, 4, 5).npu()
    y = torch_npu.npu_format_cast(x, 2)  # the documented example: NCHW -> ND
    assert torch_npu.get_npu_format(y) == 2 and torch_npu.get_npu_format(x) == Format.NCHW
    nz = torch_npu.npu_format_cast(torch.rand(16, 32).npu(), Format.FRACTAL_NZ)
    assert torch_npu.get_npu_format(nz) == 29
    src = torch.rand(16, 32).npu()
    cast = torch_npu.npu_format_cast(src, Format.FRACTAL_NZ)
    assert cast.data_ptr() != src.data_ptr() and torch.equal(cast.cpu(), src.cpu())
    # Already in that format: the tensor itself.
    assert torch_npu.npu_format_cast(cast, 29) is cast
    # The Tensor overload takes dst's format.
    assert torch_npu.get_npu_format(torch_npu.npu_format_cast(src, cast)) == 29


def test_inplace_cast_is_seen_by_views_and_results_start_in_base_format():
    x = torch.rand(8, 16).npu()
    v = x[2:, ::2]
    out = torch_npu.npu_format_cast_(x, Format.FRACTAL_NZ)
    assert out is x and torch_npu.get_npu_format(v) == 29
    assert torch_npu.get_npu_format(x.view(16, 8)) == 29
    assert torch_npu.get_npu_format(x + 1) == Format.ND
    ref = torch.rand(8, 16).npu()
    torch_npu.npu_format_cast_(ref, 3)
    torch_npu.npu_format_cast_(x, ref)
    assert torch_npu.get_npu_format(x) == Format.NC1HWC0


def test_freed_memory_does_not_leak_its_format():
    x = torch_npu.empty_with_format([64, 64], device="npu", acl_format=29)
    assert torch_npu.get_npu_format(x) == 29
    ptr = x.data_ptr()
    del x
    y = torch.empty(64, 64, device="npu")
    assert y.data_ptr() == ptr  # the cached block is reused ...
    assert torch_npu.get_npu_format(y) == Format.ND  # ... without the old tag


def test_empty_with_format_and_invalid_format():
    e = torch_npu.empty_with_format([4, 4], dtype=torch.float16, device="npu", acl_format=29)
    assert e.dtype == torch.float16 and e.device.type == "npu" and torch_npu.get_npu_format(e) == 29
    assert torch_npu.get_npu_format(torch_npu.empty_with_format([4, 4], device="npu")) == 2
    with pytest.raises(RuntimeError, match="acl_format 5 is not a torch_npu.Format value"):
        torch_npu.npu_format_cast(torch.rand(2).npu(), 5)


def test_format_survives_save_and_load():
    x = torch_npu.npu_format_cast(torch.rand(4, 8).npu(), Format.FRACTAL_NZ)
    plain = torch.rand(4, 8).npu()
    buf = io.BytesIO()
    torch.save({"x": x, "plain": plain}, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=True)
    assert loaded["x"].device.type == "npu" and torch.equal(loaded["x"].cpu(), x.cpu())
    assert torch_npu.get_npu_format(loaded["x"]) == 29
    assert torch_npu.get_npu_format(loaded["plain"]) == Format.ND


def test_cast_keeps_gradients_and_works_under_fake_tensors():
    a = torch.rand(4, 4, device="npu", requires_grad=True)
    torch_npu.npu_format_cast(a, 29).sum().backward()
    torch.testing.assert_close(a.grad.cpu(), torch.ones(4, 4))
    from torch._subclasses import FakeTensorMode
    with FakeTensorMode():
        f = torch.empty(4, 4, device="npu")
        assert torch_npu.npu_format_cast(f, 29).shape == (4, 4)


def test_allow_internal_format_false_keeps_base_format():
    out = run_json("""
import warnings, torch, torch_npu
assert torch.npu.config.allow_internal_format is True   # the default on a 910B (Atlas A2)
torch.npu.config.allow_internal_format = False
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    y = torch_npu.npu_format_cast(torch.rand(4, 4).npu(), 29)
emit([torch_npu.get_npu_format(y), any("allow_internal_format" in str(x.message) for x in w)])
""")
    assert out == [2, True]
