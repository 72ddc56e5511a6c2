"""Data-parallel training with Hugging Face accelerate on 2 (emulated) NPUs.

Launch it the way you would on an Ascend server:

    accelerate launch --multi_gpu --num_processes 2 examples/accelerate_ddp.py
    accelerate launch --multi_gpu --num_processes 2 --mixed_precision bf16 examples/accelerate_ddp.py

accelerate sees ``torch_npu``, starts one process per NPU, puts rank *r* on
``npu:r`` and initialises the process group with the ``hccl`` backend; the
model is wrapped in DDP and each rank trains on its shard of every batch.
With ``--out FILE`` rank 0 writes what happened (backend, devices, losses, the
final weights of each rank) as JSON.
"""
import argparse
import json

import torch
import torch.nn as nn

import torch_npu  # noqa: F401


def make_data(size, seed):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(size, 8, generator=generator)
    y = (x @ torch.linspace(-1, 1, 8)).unsqueeze(1) + 0.01 * torch.randn(size, 1, generator=generator)
    return torch.utils.data.TensorDataset(x, y)


def make_model(seed):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 1))


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=8, help="per process")
    parser.add_argument("--samples", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="rank 0 writes a JSON report here")
    return parser.parse_args(argv)


def main(argv=None):
    from accelerate import Accelerator

    args = parse_args(argv)
    accelerator = Accelerator()
    # Moved before the optimizer is built: the emulator's Module.to("npu") still
    # replaces the Parameter objects, so an optimizer built on the CPU module
    # would keep stepping the CPU copies (see docs/ecosystem.md, "Known gaps").
    model = make_model(args.seed).to(accelerator.device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    loader = torch.utils.data.DataLoader(make_data(args.samples, args.seed), batch_size=args.batch_size, shuffle=False)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)

    losses = []
    for epoch in range(args.epochs):
        for x, y in loader:
            with accelerator.autocast():
                loss = nn.functional.mse_loss(model(x).float(), y)
            optimizer.zero_grad()
            accelerator.backward(loss)
            optimizer.step()
            # The mean over ranks of this step's loss, through an hccl all-reduce.
            losses.append(accelerator.reduce(loss.detach(), reduction="mean").item())
        accelerator.print(f"epoch {epoch}  loss {losses[-1]:.5f}")

    weights = torch.cat([p.detach().float().flatten() for p in accelerator.unwrap_model(model).parameters()])
    all_weights = accelerator.gather(weights.unsqueeze(0))  # one row per rank
    report = {
        "world_size": accelerator.num_processes,
        "backend": torch.distributed.get_backend() if torch.distributed.is_initialized() else None,
        "devices": accelerator.gather_for_metrics([str(accelerator.device)], use_gather_object=True),
        "mixed_precision": accelerator.mixed_precision,
        "losses": losses,
        "weights_per_rank": all_weights.cpu().tolist(),
    }
    if accelerator.is_main_process:
        accelerator.print(f"{report['world_size']} processes on {report['devices']}, backend {report['backend']}")
        if args.out:
            with open(args.out, "w") as f:
                json.dump(report, f)
    accelerator.end_training()
    return report


if __name__ == "__main__":
    main()
