"""Save and resume: torch.save of a CUDA model and optimizer, torch.load with a CUDA
map_location, training continued from the checkpoint (losses before and after)."""
import os
import sys
import tempfile

import torch
import torch.nn as nn


def train(model, opt, xs, ys, device, steps):
    for i in range(steps):
        loss = nn.functional.mse_loss(model(xs[i].to(device)), ys[i].to(device))
        opt.zero_grad()
        loss.backward()
        opt.step()
        print("loss", loss.item())


def main():
    torch.manual_seed(5)
    device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    print("device", torch.empty(0, device=device).device.type)
    model = nn.Sequential(nn.Linear(6, 12), nn.Tanh(), nn.Linear(12, 1)).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    xs, ys = torch.randn(6, 8, 6), torch.randn(6, 8, 1)
    train(model, opt, xs[:3], ys[:3], device, 3)
    path = os.path.join(tempfile.mkdtemp(dir=sys.argv[1] if len(sys.argv) > 1 else None), "ckpt.pt")
    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, path)
    map_location = "cuda:0" if torch.cuda.is_available() else "cpu"
    state = torch.load(path, map_location=map_location)
    model2 = nn.Sequential(nn.Linear(6, 12), nn.Tanh(), nn.Linear(12, 1)).to(device)
    model2.load_state_dict(state["model"])
    opt2 = torch.optim.Adam(model2.parameters(), lr=1e-2)
    opt2.load_state_dict(state["opt"])
    train(model2, opt2, xs[3:], ys[3:], device, 3)


if __name__ == "__main__":
    main()
