"""Lightning on npu through torch_npu.contrib.lightning.NPUAccelerator."""
import pytest
import torch
import torch.nn as nn

from _clients import load_example, require

require("lightning")


def test_trainer_with_npu_accelerator_trains_on_npu_and_matches_a_plain_loop():
    example = load_example("lightning_npu")
    result = example.main(["--epochs", "2"])
    assert result["devices"] == ["npu:0"]
    assert result["strategy_device"] == "npu:0"
    assert result["output_dtypes"] == ["torch.float32"]
    # Reference: the same module, data and Adam steps in a plain CPU loop.
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.Linear(32, 1))
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-2)
    x, y = example.make_data(128, 0).tensors
    losses = []
    for _ in range(2):
        for start in range(0, 128, 32):
            loss = nn.functional.mse_loss(net(x[start:start + 32]), y[start:start + 32])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    torch.testing.assert_close(torch.tensor(result["losses"]), torch.tensor(losses), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("precision, dtype", [("bf16-mixed", torch.bfloat16), ("16-mixed", torch.float16)])
def test_mixed_precision_autocasts_on_npu(precision, dtype):
    from torch_npu.contrib.lightning import NPUMixedPrecision
    example = load_example("lightning_npu")
    result = example.main(["--epochs", "1", "--precision", precision])
    plugin = result["precision_plugin"]
    assert isinstance(plugin, NPUMixedPrecision) and plugin.device == "npu"
    assert (plugin.scaler is not None) == (precision == "16-mixed")
    assert result["devices"] == ["npu:0"]
    assert result["output_dtypes"] == [str(dtype)]  # the Linear layers ran under npu autocast
    assert all(torch.isfinite(torch.tensor(result["losses"])))


def test_accelerator_device_parsing_and_registry():
    from lightning.pytorch.accelerators import AcceleratorRegistry
    from torch_npu.contrib.lightning import NPUAccelerator
    count = torch.npu.device_count()
    assert NPUAccelerator.parse_devices(2) == [0, 1]
    assert NPUAccelerator.parse_devices("0,1") == [0, 1]
    assert NPUAccelerator.parse_devices(-1) == list(range(count))
    assert NPUAccelerator.get_parallel_devices([1]) == [torch.device("npu", 1)]
    with pytest.raises(ValueError):
        NPUAccelerator.parse_devices(count + 1)
    assert NPUAccelerator.auto_device_count() == count
    assert "npu" in AcceleratorRegistry
