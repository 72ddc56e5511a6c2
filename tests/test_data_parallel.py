"""torch.nn.DataParallel on npu: one device runs the module, several devices raise
an error that names DistributedDataParallel and torch_npu_run (not the
AttributeError about torch._C._scatter)."""
import pytest
import torch
import torch.nn as nn

import torch_npu  # noqa: F401


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 3))


def test_single_device_runs_module_with_inputs_moved_to_the_device():
    ref = _model()
    dp = nn.DataParallel(_model().npu(), device_ids=[0])
    x = torch.randn(4, 6)
    out = dp(x)  # a CPU input is copied to npu:0, as DataParallel's scatter does
    assert out.device == torch.device("npu", 0)
    assert torch.equal(out.cpu(), ref(x))
    out.sum().backward()
    ref(x).sum().backward()
    for p, q in zip(dp.module.parameters(), ref.parameters()):
        assert torch.equal(p.grad.cpu(), q.grad)


def test_single_device_keeps_kwargs_and_nested_structures():
    class Takes(nn.Module):
        def forward(self, pair, *, scale, extra=None):
            a, b = pair
            assert a.is_npu and b.is_npu and scale.is_npu and extra["k"].is_npu
            return (a + b) * scale + extra["k"]

    dp = nn.DataParallel(Takes(), device_ids=[0])
    a, b, s, k = torch.ones(2), torch.full((2,), 2.0), torch.tensor(3.0), torch.tensor([1.0, -1.0])
    out = dp((a, b), scale=s, extra={"k": k})
    assert torch.equal(out.cpu(), (a + b) * s + k)


def test_functional_data_parallel_single_device():
    ref = _model()
    x = torch.randn(3, 6)
    out = nn.parallel.data_parallel(_model().npu(), x.npu(), device_ids=[0])
    assert torch.equal(out.cpu(), ref(x))


@pytest.mark.parametrize("device_ids", [None, [0, 1]])
def test_several_devices_raise_naming_ddp_and_torch_npu_run(device_ids):
    assert torch.npu.device_count() > 1
    dp = nn.DataParallel(_model().npu(), device_ids=device_ids)
    with pytest.raises(RuntimeError) as info:
        dp(torch.randn(4, 6).npu())
    msg = str(info.value)
    assert "DistributedDataParallel" in msg and "torch_npu_run" in msg and "hccl" in msg
    assert "_scatter" not in msg
    assert "ERR00007" in msg  # torch_npu's "feature not supported" error code

