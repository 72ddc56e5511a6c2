"""peft LoRA on a tiny LLaMA on npu: only the adapters train, the run equals the CPU run, the saved adapter reloads."""
import torch

from _clients import load_example, require

require("peft")
require("transformers")


def test_lora_finetune_on_npu_equals_cpu_and_adapter_reloads():
    example = load_example("lora_llama_peft")
    npu = example.main(["--steps", "3"])
    cpu = example.main(["--steps", "3", "--device", "cpu"])
    model = npu["model"]
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    assert all(p.device == torch.device("npu", 0) for p in model.parameters())
    # r=8 on q,k,v,o of 2 layers (hidden 32, kv 2 heads x 8 = 16): A is r x in, B is out x r.
    per_layer = sum(8 * 32 + out * 8 for out in (32, 16, 16, 32))
    assert npu["trainable"] == 2 * per_layer
    torch.testing.assert_close(torch.tensor(npu["losses"]), torch.tensor(cpu["losses"]), rtol=1e-5, atol=1e-6)
    assert npu["logits_device"] == "npu:0"
    assert npu["reload_max_diff"] == 0.0
