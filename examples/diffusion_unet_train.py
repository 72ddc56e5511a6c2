"""Text-to-image style diffusion training with diffusers on the (emulated) NPU.

A tiny ``UNet2DConditionModel`` learns to predict the noise added to 16x16
"latents" (coloured squares), conditioned on the caption through a tiny
``CLIPTextModel``. Both models are built from configs in code: nothing is
downloaded. When ``torch_npu`` is importable, diffusers routes every GEGLU
feed-forward through ``torch_npu.npu_geglu`` and would use
``torch_npu.npu_fusion_attention`` with ``set_use_npu_flash_attention(True)``.

    python examples/diffusion_unet_train.py --steps 30
    python examples/diffusion_unet_train.py --steps 30 --bf16
"""
import argparse

import torch
import torch.nn.functional as F

import torch_npu  # noqa: F401  (diffusers switches to its NPU paths when this imports)

CAPTIONS = ["a red square", "a green square", "a blue square", "a white square"]
COLOURS = torch.tensor([[1.0, -1, -1, 0], [-1, 1, -1, 0], [-1, -1, 1, 0], [1, 1, 1, 0]])


def tiny_text_encoder():
    from transformers import CLIPTextConfig, CLIPTextModel
    config = CLIPTextConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                            num_attention_heads=4, max_position_embeddings=16,
                            pad_token_id=0, bos_token_id=1, eos_token_id=2)
    return CLIPTextModel(config)


def tiny_unet():
    from diffusers import UNet2DConditionModel
    return UNet2DConditionModel(
        sample_size=16, in_channels=4, out_channels=4, layers_per_block=1,
        block_out_channels=(32, 64), norm_num_groups=32,
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=32, attention_head_dim=8)


def tokenize(captions, length=8):
    """A character-level toy tokenizer (no vocabulary file to download)."""
    ids = torch.zeros(len(captions), length, dtype=torch.long)
    for row, text in enumerate(captions):
        codes = [1 + (ord(ch) % 62) for ch in text[:length]]
        ids[row, :len(codes)] = torch.tensor(codes)
    return ids


def make_batch(batch_size, generator):
    """Latents of one colour per caption, with a square of it in the middle."""
    which = torch.randint(len(CAPTIONS), (batch_size,), generator=generator)
    latents = torch.full((batch_size, 4, 16, 16), -1.0)
    latents[:, :, 4:12, 4:12] = COLOURS[which][:, :, None, None]
    return latents, tokenize([CAPTIONS[i] for i in which])


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="npu", help="npu (default) or cpu, for a reference run")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--bf16", action="store_true", help="train under torch.autocast(device, bfloat16)")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def main(argv=None):
    """Train; return the per-step losses and the trained UNet."""
    from diffusers import DDPMScheduler

    args = parse_args(argv)
    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    text_encoder = tiny_text_encoder().to(device).eval().requires_grad_(False)
    unet = tiny_unet().to(device).train()
    scheduler = DDPMScheduler(num_train_timesteps=100)
    optimizer = torch.optim.AdamW(unet.parameters(), lr=args.lr)
    # Data and noise come from a CPU generator so a cpu run sees the same numbers.
    data_gen = torch.Generator().manual_seed(args.seed)

    losses = []
    for step in range(args.steps):
        latents, input_ids = make_batch(args.batch_size, data_gen)
        noise = torch.randn(latents.shape, generator=data_gen)
        timesteps = torch.randint(0, scheduler.config.num_train_timesteps, (args.batch_size,), generator=data_gen)
        noisy = scheduler.add_noise(latents, noise, timesteps)
        noisy, noise, timesteps = noisy.to(device), noise.to(device), timesteps.to(device)
        with torch.no_grad():
            text_states = text_encoder(input_ids.to(device)).last_hidden_state
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.bf16):
            prediction = unet(noisy, timesteps, encoder_hidden_states=text_states).sample
        loss = F.mse_loss(prediction.float(), noise)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        if __name__ == "__main__" and (step % 10 == 0 or step == args.steps - 1):
            print(f"step {step:4d}  loss {losses[-1]:.4f}  on {prediction.device}")
    if __name__ == "__main__" and device.type == "npu":
        print(f"peak device memory: {torch.npu.max_memory_allocated(device) / 2**20:.1f} MiB")
        print("ops that would fall back to the CPU on hardware:", torch_npu.emulator.fallback_report())
    return {"losses": losses, "unet": unet}


if __name__ == "__main__":
    main()
