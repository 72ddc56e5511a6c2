"""pytorch/examples dcgan style: generator and discriminator, BCELoss, two Adam optimizers."""
import torch
import torch.backends.cudnn as cudnn
import torch.nn as nn

cudnn.benchmark = True
nz, ngf, ndf = 8, 8, 8


class Generator(nn.Module):
    def __init__(self, ngpu):
        super().__init__()
        self.ngpu = ngpu
        self.main = nn.Sequential(
            nn.ConvTranspose2d(nz, ngf * 2, 4, 1, 0, bias=False), nn.BatchNorm2d(ngf * 2), nn.ReLU(True),
            nn.ConvTranspose2d(ngf * 2, 1, 4, 2, 1, bias=False), nn.Tanh())

    def forward(self, x):
        if x.is_cuda and self.ngpu > 1:
            return nn.parallel.data_parallel(self.main, x, range(self.ngpu))
        return self.main(x)


class Discriminator(nn.Module):
    def __init__(self):
        super().__init__()
        self.main = nn.Sequential(
            nn.Conv2d(1, ndf, 4, 2, 1, bias=False), nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(ndf, 1, 4, 1, 0, bias=False), nn.Sigmoid())

    def forward(self, x):
        return self.main(x).view(-1, 1).squeeze(1)


def main():
    torch.manual_seed(999)
    device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    print("device", torch.empty(0, device=device).device.type)
    netG, netD = Generator(ngpu=1).to(device), Discriminator().to(device)
    criterion = nn.BCELoss()
    optD = torch.optim.Adam(netD.parameters(), lr=2e-4, betas=(0.5, 0.999))
    optG = torch.optim.Adam(netG.parameters(), lr=2e-4, betas=(0.5, 0.999))
    real = torch.rand(8, 1, 8, 8).mul(2).sub(1)
    noises = torch.randn(4, 8, nz, 1, 1)
    for step in range(4):
        netD.zero_grad()
        real_cpu = real.to(device)
        label = torch.full((8,), 1.0, device=device)
        errD_real = criterion(netD(real_cpu), label)
        errD_real.backward()
        fake = netG(noises[step].to(device))
        label.fill_(0.0)
        errD_fake = criterion(netD(fake.detach()), label)
        errD_fake.backward()
        optD.step()
        netG.zero_grad()
        label.fill_(1.0)
        errG = criterion(netD(fake), label)
        errG.backward()
        optG.step()
        print("loss", (errD_real + errD_fake).item())
        print("loss", errG.item())


if __name__ == "__main__":
    main()
