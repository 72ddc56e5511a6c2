"""diffusers on npu: GEGLU through torch_npu.npu_geglu, and the example's training equals the CPU run."""
import torch
import torch.nn.functional as F

import torch_npu
from _clients import load_example, require

require("diffusers")
require("transformers")


def test_diffusers_sees_torch_npu():
    from diffusers.utils import is_torch_npu_available
    assert is_torch_npu_available()  # needs the `torch_npu` distribution metadata


def test_geglu_goes_through_npu_geglu_and_matches_the_tanh_formula(monkeypatch):
    from diffusers.models.activations import GEGLU
    calls = []
    real = torch_npu.npu_geglu

    def counting(x, dim=-1, approximate=1, **kwargs):
        calls.append((tuple(x.shape), dim, approximate, x.device.type))
        return real(x, dim=dim, approximate=approximate, **kwargs)

    monkeypatch.setattr(torch_npu, "npu_geglu", counting)
    torch.manual_seed(0)
    layer = GEGLU(8, 16).npu()
    x = torch.randn(2, 5, 8, device="npu", requires_grad=True)
    out = layer(x)
    assert calls == [((2, 5, 32), -1, 1, "npu")]
    # Independent reference: diffusers' own non-NPU formula with the tanh gelu
    # that approximate=1 selects; the first half is the value, the second the gate.
    h, gate = layer.proj(x).chunk(2, dim=-1)
    expected = h * F.gelu(gate, approximate="tanh")
    torch.testing.assert_close(out, expected, rtol=1e-6, atol=1e-6)
    out.sum().backward()
    x_ref = x.detach().clone().requires_grad_(True)
    h, gate = layer.proj(x_ref).chunk(2, dim=-1)
    (h * F.gelu(gate, approximate="tanh")).sum().backward()
    torch.testing.assert_close(x.grad, x_ref.grad, rtol=1e-5, atol=1e-6)


def test_unet_training_on_npu_equals_cpu_and_uses_npu_geglu(monkeypatch):
    example = load_example("diffusion_unet_train")
    devices = []
    real = torch_npu.npu_geglu
    monkeypatch.setattr(torch_npu, "npu_geglu",
                        lambda x, dim=-1, approximate=1: devices.append(x.device.type) or real(x, dim, approximate))
    npu = example.main(["--steps", "2", "--batch-size", "2"])
    assert devices and set(devices) == {"npu"}
    assert next(npu["unet"].parameters()).device == torch.device("npu", 0)
    devices.clear()
    cpu = example.main(["--steps", "2", "--batch-size", "2", "--device", "cpu"])
    assert devices and set(devices) == {"cpu"}  # diffusers calls it on CPU tensors too
    # npu ops run the CPU kernels: same data, same init, so the same numbers.
    torch.testing.assert_close(torch.tensor(npu["losses"]), torch.tensor(cpu["losses"]), rtol=1e-5, atol=1e-6)
    for (name, p_npu), p_cpu in zip(npu["unet"].named_parameters(), cpu["unet"].parameters()):
        torch.testing.assert_close(p_npu.detach().cpu(), p_cpu.detach(), rtol=1e-4, atol=1e-5, msg=name)


def test_unet_bf16_autocast_step_runs_in_bf16():
    example = load_example("diffusion_unet_train")
    result = example.main(["--steps", "1", "--batch-size", "2", "--bf16"])
    loss = result["losses"][0]
    assert torch.isfinite(torch.tensor(loss))
    # Under autocast the convolutions produce bf16 on npu.
    unet = result["unet"]
    with torch.autocast("npu", dtype=torch.bfloat16):
        y = unet.conv_in(torch.randn(1, 4, 16, 16, device="npu"))
    assert y.dtype == torch.bfloat16 and y.device.type == "npu"
