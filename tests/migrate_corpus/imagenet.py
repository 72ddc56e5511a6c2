"""pytorch/examples imagenet style (--dummy data): the DataParallel fallback chosen by
``device.type == 'cuda'``, cudnn.benchmark, ``.cuda(non_blocking=True)`` batches, top-1 accuracy.
Run on one card (as ``--gpu 0`` would): with more, its DataParallel path fails on the NPU under
transfer_to_npu too; ``migrate --fix`` leaves that test as written.
# corpus: one-card
"""
import torch
import torch.backends.cudnn as cudnn
import torch.nn as nn


def make_model():
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.AdaptiveAvgPool2d(2),
                         nn.Flatten(), nn.Linear(32, 10))


def main():
    torch.manual_seed(0)
    if torch.cuda.is_available():
        device = torch.device("cuda")
    else:
        device = torch.device("cpu")
    print("device", torch.empty(0, device=device).device.type)
    model = make_model()
    if device.type == 'cuda' and torch.cuda.device_count() > 1:
        # DataParallel will divide and allocate batch_size to all available GPUs
        model = torch.nn.DataParallel(model).cuda()
    else:
        model = model.to(device)
    criterion = nn.CrossEntropyLoss().to(device)
    optimizer = torch.optim.SGD(model.parameters(), 0.1, momentum=0.9, weight_decay=1e-4)
    cudnn.benchmark = True
    images_all = torch.randn(4, 8, 3, 8, 8)
    target_all = torch.randint(0, 10, (4, 8))
    model.train()
    for i in range(4):
        images, target = images_all[i], target_all[i]
        if torch.cuda.is_available():
            images = images.cuda(non_blocking=True)
            target = target.cuda(non_blocking=True)
        output = model(images)
        loss = criterion(output, target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        acc1 = (output.argmax(1) == target).float().mean().item()
        print("loss", loss.item())
        print("acc1", acc1)


if __name__ == "__main__":
    main()
