"""pytorch/examples vae style: args.cuda decides the device and the loader's pin_memory; the
reparameterization noise comes from a seeded CPU generator."""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F


class VAE(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc21, self.fc22 = nn.Linear(36, 16), nn.Linear(16, 4), nn.Linear(16, 4)
        self.fc3, self.fc4 = nn.Linear(4, 16), nn.Linear(16, 36)

    def forward(self, x, eps):
        h = F.relu(self.fc1(x))
        mu, logvar = self.fc21(h), self.fc22(h)
        z = mu + eps * torch.exp(0.5 * logvar)
        return torch.sigmoid(self.fc4(F.relu(self.fc3(z)))), mu, logvar


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--no-cuda", action="store_true", default=False)
    args, _ = parser.parse_known_args()
    args.cuda = not args.no_cuda and torch.cuda.is_available()
    torch.manual_seed(1)
    device = torch.device("cuda" if args.cuda else "cpu")
    print("device", torch.empty(0, device=device).device.type)
    kwargs = {"num_workers": 0, "pin_memory": True} if args.cuda else {}
    data = torch.rand(32, 36)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(data), batch_size=8, **kwargs)
    model = VAE().to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(7)
    for (x,) in loader:
        x = x.to(device)
        eps = torch.randn(x.size(0), 4, generator=g).to(device)
        recon, mu, logvar = model(x, eps)
        bce = F.binary_cross_entropy(recon, x, reduction="sum")
        kld = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())
        loss = bce + kld
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print("loss", loss.item())


if __name__ == "__main__":
    main()
