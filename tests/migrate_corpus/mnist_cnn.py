"""pytorch/examples mnist style: a small CNN, SGD + StepLR, device chosen by torch.cuda."""
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.optim.lr_scheduler import StepLR


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 4, 3, 1)
        self.conv2 = nn.Conv2d(4, 8, 3, 1)
        self.fc1 = nn.Linear(8 * 4 * 4, 16)
        self.fc2 = nn.Linear(16, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = torch.flatten(x, 1)
        return F.log_softmax(self.fc2(F.relu(self.fc1(x))), dim=1)


def main():
    use_cuda = torch.cuda.is_available()
    torch.manual_seed(1)
    device = torch.device("cuda" if use_cuda else "cpu")
    print("device", torch.empty(0, device=device).device.type)
    data = torch.randn(64, 1, 12, 12)
    target = torch.randint(0, 10, (64,))
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(data, target), batch_size=16,
                                         pin_memory=use_cuda)
    model = Net().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scheduler = StepLR(optimizer, step_size=1, gamma=0.7)
    for epoch in range(2):
        model.train()
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad()
            loss = F.nll_loss(model(x), y)
            loss.backward()
            optimizer.step()
            print("loss", loss.item())
        scheduler.step()


if __name__ == "__main__":
    main()
