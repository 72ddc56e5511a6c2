"""Hugging Face ``Trainer`` on the (emulated) NPU: bf16 or fp16 + GradScaler, checkpoint and resume.

The Trainer finds the NPU by itself (through accelerate, because ``torch_npu``
imports) and puts the model on ``npu:0``. ``--precision fp16`` trains under
``torch.autocast("npu", float16)`` with accelerate's ``torch.npu.amp.GradScaler``;
``bf16`` uses autocast only. The run saves a checkpoint halfway; ``--resume``
then trains a second time from that checkpoint (model, optimizer, scheduler,
scaler and the npu RNG state all restored) and compares the losses after the
checkpoint with the uninterrupted run's.

    python examples/hf_trainer.py --precision bf16 --steps 20
    python examples/hf_trainer.py --precision fp16 --steps 20 --resume
"""
import argparse
import tempfile

import torch

import torch_npu  # noqa: F401


class CountingDataset(torch.utils.data.Dataset):
    """Sequences that count up by one (mod 100), fixed by the seed."""

    def __init__(self, size, seq_len, seed):
        generator = torch.Generator().manual_seed(seed)
        start = torch.randint(3, 100, (size, 1), generator=generator)
        self.ids = 3 + (start + torch.arange(seq_len)) % 100

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, index):
        return {"input_ids": self.ids[index], "labels": self.ids[index]}


def tiny_llama(seed):
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         pad_token_id=0, bos_token_id=1, eos_token_id=2)
    return LlamaForCausalLM(config)


def make_trainer(args, output_dir):
    from transformers import Trainer, TrainingArguments
    training_args = TrainingArguments(
        output_dir=output_dir, max_steps=args.steps, per_device_train_batch_size=4,
        learning_rate=args.lr, warmup_steps=2, lr_scheduler_type="linear",
        logging_steps=1, save_steps=args.steps // 2, save_strategy="steps", report_to=[],
        bf16=args.precision == "bf16", fp16=args.precision == "fp16",
        dataloader_num_workers=0, seed=args.seed, disable_tqdm=__name__ != "__main__")
    return Trainer(model=tiny_llama(args.seed), args=training_args,
                   train_dataset=CountingDataset(4 * args.steps, 16, args.seed))


def step_losses(trainer):
    return {entry["step"]: entry["loss"] for entry in trainer.state.log_history if "loss" in entry}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--precision", choices=["fp32", "bf16", "fp16"], default="bf16")
    parser.add_argument("--steps", type=int, default=20, help="total steps; a checkpoint is saved at half")
    parser.add_argument("--lr", type=float, default=5e-3)
    parser.add_argument("--resume", action="store_true", help="also resume from the halfway checkpoint and compare")
    parser.add_argument("--out", default=None, help="output directory (default: a temporary one)")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        out = args.out or tmp
        trainer = make_trainer(args, out)
        trainer.train()
        result = {"device": str(trainer.args.device), "losses": step_losses(trainer),
                  "scaler": type(getattr(trainer.accelerator, "scaler", None)).__name__,
                  "final_params": {k: v.detach().float().cpu() for k, v in trainer.model.state_dict().items()}}
        if __name__ == "__main__":
            print(f"trained on {result['device']} ({args.precision}, grad scaler: {result['scaler']})")
            print("losses:", " ".join(f"{loss:.3f}" for loss in result["losses"].values()))
        if args.resume:
            half = args.steps // 2
            resumed = make_trainer(args, out)
            resumed.train(resume_from_checkpoint=f"{out}/checkpoint-{half}")
            result["resumed_losses"] = {s: v for s, v in step_losses(resumed).items() if s > half}
            result["resumed_params"] = {k: v.detach().float().cpu() for k, v in resumed.model.state_dict().items()}
            if __name__ == "__main__":
                same = all(result["losses"][s] == v for s, v in result["resumed_losses"].items())
                print(f"resumed from checkpoint-{half}: losses after it equal the uninterrupted run's: {same}")
    return result


if __name__ == "__main__":
    main()
