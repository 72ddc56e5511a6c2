"""The main job: train a small model on the (emulated) Ascend NPU.

Runs exactly as on an Ascend server: move the model with .npu(), train,
watch the loss fall, and read the device memory the step used.
"""
import torch
import torch.nn as nn

import torch_npu  # noqa: F401  (also loaded automatically by `import torch`)


def main():
    torch.manual_seed(0)
    torch.npu.manual_seed(0)
    device = torch.device("npu:0")
    print(f"torch {torch.__version__}, torch_npu {torch_npu.__version__}")
    print(f"{torch.npu.device_count()} x {torch.npu.get_device_name(0)}, "
          f"{torch.npu.get_device_properties(0).total_memory / 2**30:.0f} GiB each")

    # A small regression task with a known answer.
    x = torch.randn(512, 32)
    true_w = torch.randn(32, 1)
    y = x @ true_w + 0.01 * torch.randn(512, 1)

    model = nn.Sequential(nn.Linear(32, 128), nn.GELU(), nn.Linear(128, 1)).npu()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    xb, yb = x.to(device), y.to(device)

    torch.npu.reset_peak_memory_stats()
    for step in range(1, 201):
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.mse_loss(model(xb), yb)
        loss.backward()
        opt.step()
        if step == 1 or step % 40 == 0:
            print(f"step {step:4d}  loss {loss.item():.5f}  (on {loss.device})")

    print()
    print(f"peak device memory in the loop: {torch.npu.max_memory_allocated() / 2**20:.2f} MiB")
    print(torch.npu.memory_summary(abbreviated=True))


if __name__ == "__main__":
    main()
