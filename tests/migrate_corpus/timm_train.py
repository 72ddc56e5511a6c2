"""timm train.py style: channels_last, cudnn.benchmark, .cuda(non_blocking=True), AMP autocast,
model EMA updated after each step, label smoothing.
# corpus: amp
"""
import copy

import torch
import torch.nn as nn

torch.backends.cudnn.benchmark = True


class ModelEma:
    def __init__(self, model, decay=0.9):
        self.module = copy.deepcopy(model).eval()
        self.decay = decay

    @torch.no_grad()
    def update(self, model):
        for e, m in zip(self.module.state_dict().values(), model.state_dict().values()):
            if e.dtype.is_floating_point:
                e.mul_(self.decay).add_(m.detach(), alpha=1 - self.decay)


def main():
    torch.manual_seed(3)
    use_cuda = torch.cuda.is_available()
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.SiLU(), nn.AdaptiveAvgPool2d(1),
                          nn.Flatten(), nn.Linear(8, 5))
    if use_cuda:
        model.cuda()
    model = model.to(memory_format=torch.channels_last)
    print("device", next(model.parameters()).device.type)
    ema = ModelEma(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True)
    loss_fn = nn.CrossEntropyLoss(label_smoothing=0.1)
    inputs = torch.randn(4, 6, 3, 8, 8)
    targets = torch.randint(0, 5, (4, 6))
    for step in range(4):
        x, y = inputs[step], targets[step]
        if use_cuda:
            x, y = x.cuda(non_blocking=True), y.cuda(non_blocking=True)
        x = x.contiguous(memory_format=torch.channels_last)
        with torch.autocast(device_type="cuda", dtype=torch.float16, enabled=use_cuda):
            loss = loss_fn(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        ema.update(model)
        if use_cuda:
            torch.cuda.synchronize()
        with torch.no_grad():
            ema_loss = loss_fn(ema.module(x).float(), y)
        print("loss", loss.item())
        print("ema_loss", ema_loss.item())


if __name__ == "__main__":
    main()
