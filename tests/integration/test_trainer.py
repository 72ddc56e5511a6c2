"""transformers Trainer on npu: device choice, bf16 / fp16 + GradScaler, and exact checkpoint resume."""
import pytest
import torch

from _clients import load_example, require

require("transformers")
require("accelerate")


def test_trainer_picks_npu_and_bf16_is_supported():
    from transformers.utils import is_torch_npu_available
    assert is_torch_npu_available()
    assert torch.npu.is_bf16_supported()


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_trainer_resume_from_checkpoint_reproduces_the_uninterrupted_run(precision, tmp_path):
    example = load_example("hf_trainer")
    result = example.main(["--precision", precision, "--steps", "4", "--resume", "--out", str(tmp_path)])
    assert result["device"] == "npu:0"
    if precision == "fp16":
        assert result["scaler"] == "GradScaler"
        scaler_state = torch.load(tmp_path / "checkpoint-2" / "scaler.pt", weights_only=True)
        assert scaler_state["scale"] > 0
    else:
        assert result["scaler"] == "NoneType"  # bf16: autocast only
    rng = torch.load(tmp_path / "checkpoint-2" / "rng_state.pth", weights_only=False)
    assert "npu" in rng  # Trainer saves the npu RNG state for exact resume
    losses, resumed = result["losses"], result["resumed_losses"]
    assert sorted(resumed) == [3, 4]
    assert all(resumed[step] == losses[step] for step in resumed), (losses, resumed)
    for name, value in result["final_params"].items():
        torch.testing.assert_close(result["resumed_params"][name], value, rtol=0, atol=0, msg=name)


def test_fp16_autocast_changes_the_numbers_but_not_by_much(tmp_path):
    example = load_example("hf_trainer")
    fp32 = example.main(["--precision", "fp32", "--steps", "2", "--out", str(tmp_path / "a")])
    fp16 = example.main(["--precision", "fp16", "--steps", "2", "--out", str(tmp_path / "b")])
    first32, first16 = fp32["losses"][1], fp16["losses"][1]
    assert first32 != first16  # autocast really ran the matmuls in half precision
    assert abs(first32 - first16) < 2e-2 * first32
