"""pytorch/examples regression style: fit a polynomial with a Linear layer, the device taken from
torch.cuda, timed with torch.cuda.synchronize and reported with max_memory_allocated."""
import time

import torch
import torch.nn.functional as F

POLY_DEGREE = 4


def make_features(x):
    x = x.unsqueeze(1)
    return torch.cat([x ** i for i in range(1, POLY_DEGREE + 1)], 1)


def main():
    torch.manual_seed(0)
    dev = "cuda:0" if torch.cuda.is_available() else "cpu"
    print("device", torch.empty(0, device=dev).device.type)
    w_target = (torch.randn(POLY_DEGREE, 1) * 5).to(dev)
    b_target = (torch.randn(1) * 5).to(dev)
    fc = torch.nn.Linear(w_target.size(0), 1).to(dev)
    xs = torch.randn(6, 16)
    start = time.time()
    for step in range(6):
        x = make_features(xs[step].to(dev))
        y = x.mm(w_target) + b_target.item()
        fc.zero_grad()
        loss = F.smooth_l1_loss(fc(x), y)
        loss.backward()
        for param in fc.parameters():
            param.data.add_(-0.01 * param.grad)
        print("loss", loss.item())
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        assert torch.cuda.max_memory_allocated() > 0
    assert time.time() >= start


if __name__ == "__main__":
    main()
