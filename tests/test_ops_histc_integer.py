"""torch.histc on npu counts integer tensors, as the NPU's histc does (aclnnHistc takes
INT8-INT64 and UINT8 and returns the input's dtype); ATen's CPU kernel refuses them.
transformers' MoE experts (Mixtral, Qwen-MoE) call it on int32 expert ids on any
non-CPU device, so without it those models fail on npu."""
import pytest
import torch

import torch_npu  # noqa: F401


@pytest.mark.parametrize("dtype", [torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8])
def test_integer_histc_counts_like_bincount(dtype):
    torch.manual_seed(0)
    x = torch.randint(0, 8, (500,), dtype=dtype)
    got = torch.histc(x.npu(), bins=8, min=0, max=7)
    assert got.device.type == "npu" and got.dtype == dtype
    assert torch.equal(got.cpu(), torch.bincount(x.long(), minlength=8).to(dtype))


def test_integer_histc_drops_values_outside_the_range():
    x = torch.tensor([-3, 0, 1, 2, 9, 4], dtype=torch.int32)
    got = torch.histc(x.npu(), bins=2, min=0, max=4)   # bins [0, 2) and [2, 4]
    assert got.cpu().tolist() == [2, 2]


def test_float_histc_is_the_cpu_kernel():
    x = torch.randn(1000)
    assert torch.equal(torch.histc(x.npu(), bins=10, min=-2, max=2).cpu(), torch.histc(x, bins=10, min=-2, max=2))


def test_bool_histc_raises_as_on_cpu():
    x = torch.tensor([True, False])
    with pytest.raises(NotImplementedError, match="not implemented for .Bool."):
        torch.histc(x, bins=2)
    with pytest.raises(NotImplementedError, match="not implemented for .Bool."):
        torch.histc(x.npu(), bins=2)
