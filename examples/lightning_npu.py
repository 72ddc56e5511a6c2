"""Train a small model with PyTorch Lightning on the (emulated) NPU.

Lightning has no NPU accelerator of its own; ``torch_npu.contrib.lightning``
ships one; with it, ``devices=1`` lands on ``npu:0`` and ``precision="bf16-mixed"``
autocasts on ``npu``:

    python examples/lightning_npu.py --epochs 5
    python examples/lightning_npu.py --epochs 5 --precision bf16-mixed
"""
import argparse

import torch
import torch.nn as nn

import torch_npu  # noqa: F401


def make_data(size, seed):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(size, 8, generator=generator)
    y = torch.sin(x.sum(dim=1, keepdim=True))
    return torch.utils.data.TensorDataset(x, y)


def make_module(lr, seed):
    import lightning.pytorch as pl

    class Regressor(pl.LightningModule):
        def __init__(self):
            super().__init__()
            torch.manual_seed(seed)
            self.net = nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.Linear(32, 1))
            self.step_losses = []
            self.step_devices = set()
            self.output_dtypes = set()

        def training_step(self, batch, batch_index):
            x, y = batch
            out = self.net(x)
            self.output_dtypes.add(str(out.dtype))
            loss = nn.functional.mse_loss(out.float(), y)
            self.step_losses.append(loss.item())
            self.step_devices.add(str(loss.device))
            self.log("train_loss", loss, prog_bar=True)
            return loss

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=lr)

    return Regressor()


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--precision", choices=["32-true", "bf16-mixed", "16-mixed"], default="32-true")
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def main(argv=None):
    import lightning.pytorch as pl
    from torch_npu.contrib.lightning import NPUAccelerator

    args = parse_args(argv)
    module = make_module(args.lr, args.seed)
    trainer = pl.Trainer(accelerator=NPUAccelerator(), devices=1, max_epochs=args.epochs, precision=args.precision,
                         logger=False, enable_checkpointing=False, enable_progress_bar=__name__ == "__main__",
                         enable_model_summary=False)
    loader = torch.utils.data.DataLoader(make_data(128, args.seed), batch_size=32)
    trainer.fit(module, loader)
    if __name__ == "__main__":
        print(f"trained on {sorted(module.step_devices)} with {type(trainer.accelerator).__name__}, "
              f"precision {args.precision}: loss {module.step_losses[0]:.4f} -> {module.step_losses[-1]:.4f}")
    return {"losses": module.step_losses, "devices": sorted(module.step_devices),
            "output_dtypes": sorted(module.output_dtypes),
            "strategy_device": str(trainer.strategy.root_device), "precision_plugin": trainer.precision_plugin,
            "module": module, "trainer": trainer}


if __name__ == "__main__":
    main()
