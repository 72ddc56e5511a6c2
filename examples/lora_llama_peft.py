"""LoRA fine-tuning of a tiny LLaMA with peft on the (emulated) NPU.

The base model is a ``LlamaForCausalLM`` built from a config in code (random
weights, nothing downloaded). peft wraps its attention projections with LoRA
adapters; only the adapters train. The adapter is saved, loaded back onto a
fresh copy of the base model, and must give the same logits.

    python examples/lora_llama_peft.py --steps 40
    python examples/lora_llama_peft.py --steps 40 --out /tmp/lora_adapter
"""
import argparse
import tempfile

import torch

import torch_npu  # noqa: F401


def tiny_llama(seed):
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         pad_token_id=0, bos_token_id=1, eos_token_id=2)
    return LlamaForCausalLM(config)


def counting_batches(batch_size, seq_len, generator):
    """Sequences that count up by one (mod 100): a pattern a LoRA adapter can learn."""
    start = torch.randint(3, 100, (batch_size, 1), generator=generator)
    return 3 + (start + torch.arange(seq_len)) % 100


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="npu", help="npu (default) or cpu, for a reference run")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--lr", type=float, default=5e-3)
    parser.add_argument("--out", default=None, help="where to save the adapter (default: a temporary directory)")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def main(argv=None):
    """Fine-tune; return losses, trainable/total parameter counts and the reload check."""
    from peft import LoraConfig, PeftModel, get_peft_model

    args = parse_args(argv)
    device = torch.device(args.device)
    lora = LoraConfig(r=args.rank, lora_alpha=2 * args.rank, lora_dropout=0.0,
                      target_modules=["q_proj", "k_proj", "v_proj", "o_proj"], task_type="CAUSAL_LM")
    model = get_peft_model(tiny_llama(args.seed), lora).to(device)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=args.lr)
    data_gen = torch.Generator().manual_seed(args.seed)

    losses = []
    model.train()
    for step in range(args.steps):
        ids = counting_batches(8, 16, data_gen).to(device)
        loss = model(input_ids=ids, labels=ids).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        if __name__ == "__main__" and (step % 10 == 0 or step == args.steps - 1):
            print(f"step {step:4d}  loss {losses[-1]:.4f}  on {loss.device}")

    # Save only the adapter, load it onto a fresh base model, compare logits.
    model.eval()
    probe = counting_batches(2, 16, data_gen).to(device)
    with torch.no_grad():
        logits = model(input_ids=probe).logits
    with tempfile.TemporaryDirectory() as tmp:
        out = args.out or tmp
        model.save_pretrained(out)
        reloaded = PeftModel.from_pretrained(tiny_llama(args.seed), out).to(device).eval()
        with torch.no_grad():
            reloaded_logits = reloaded(input_ids=probe).logits
    max_diff = (logits - reloaded_logits).abs().max().item()
    if __name__ == "__main__":
        print(f"trainable parameters: {trainable} of {total} ({100 * trainable / total:.1f}%)")
        print(f"adapter reloaded on {reloaded_logits.device}: max |logits difference| = {max_diff:.3g}")
    return {"losses": losses, "trainable": trainable, "total": total, "reload_max_diff": max_diff,
            "logits_device": str(reloaded_logits.device), "model": model}


if __name__ == "__main__":
    main()
