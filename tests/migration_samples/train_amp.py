"""CUDA-style training loop with AMP, a pinned DataLoader and a checkpoint round trip.

Planted CUDA constructs carry an `expect:` marker naming the kind `torch-npu migrate` reports.
Prints one `loss <step> <value>` line per step (fixed seeds).
"""
import os
import sys

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

os.environ.setdefault("CUDA_VISIBLE_DEVICES", "0")  # expect: cuda-visible-devices
torch.backends.cudnn.benchmark = True  # expect: cudnn-flag

torch.manual_seed(0)
torch.cuda.manual_seed_all(0)  # expect: torch-cuda
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # expect: device-string torch-cuda


def make_loader():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(64, 16, generator=g)
    y = torch.randn(64, 1, generator=g)
    # The loader pins host batches for fast copies to the device.
    return DataLoader(TensorDataset(x, y), batch_size=16, shuffle=False, pin_memory=True,
                      pin_memory_device="cuda")  # expect: pin-memory-device


model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1)).cuda()  # expect: cuda-call
opt = torch.optim.SGD(model.parameters(), lr=0.05)
scaler = torch.cuda.amp.GradScaler()  # expect: cuda-amp

step = 0
for epoch in range(2):
    for xb, yb in make_loader():
        xb, yb = xb.to(device, non_blocking=True), yb.cuda(non_blocking=True)  # expect: cuda-call
        assert xb.is_cuda  # expect: is-cuda
        opt.zero_grad()
        with torch.autocast(device_type="cuda", dtype=torch.float16):  # expect: device-string
            loss = nn.functional.mse_loss(model(xb).float(), yb)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        print(f"loss {step} {loss.item():.10f}")
        step += 1

ckpt = os.path.join(sys.argv[1] if len(sys.argv) > 1 else ".", "ckpt.pt")
torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, ckpt)
state = torch.load(ckpt, map_location="cuda:0")  # expect: map-location
model.load_state_dict(state["model"])
with torch.no_grad():
    probe = torch.ones(4, 16, device="cuda")  # expect: device-string
    print(f"probe {model(probe).sum().item():.10f}")
print(f"peak {torch.cuda.max_memory_allocated()}")  # expect: torch-cuda
