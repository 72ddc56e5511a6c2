"""YOLOv5's Focus layer (space-to-depth then Conv-BN-LeakyReLU) with index_select slicing."""
import torch
import torch.nn as nn

__all__ = []


def autopad(k, p=None):
    """'same' padding for odd kernels when ``p`` is None."""
    if p is None:
        p = k // 2 if isinstance(k, int) else [x // 2 for x in k]
    return p


class Conv(nn.Module):
    def __init__(self, c1, c2, k=1, s=1, p=None, g=1, act=True):
        super().__init__()
        self.conv = nn.Conv2d(c1, c2, k, s, autopad(k, p), groups=g, bias=False)
        self.bn = nn.BatchNorm2d(c2)
        self.act = nn.LeakyReLU(0.1, inplace=True) if act else nn.Identity()

    def forward(self, x):
        return self.act(self.bn(self.conv(x)))

    def fuseforward(self, x):
        return self.act(self.conv(x))


def fast_slice(x):
    """``[x[..., ::2, ::2], x[..., 1::2, ::2], x[..., ::2, 1::2], x[..., 1::2, 1::2]]``: columns
    by strided slicing, rows by index_select (contiguous results)."""
    h = x.shape[2]
    even_rows = torch.arange(0, h - h % 2, 2, device=x.device)
    odd_rows = torch.arange(1, h - h % 2, 2, device=x.device)
    even_cols = x[..., ::2].contiguous()
    odd_cols = x[..., 1::2].contiguous()
    return [even_cols.index_select(2, even_rows), even_cols.index_select(2, odd_rows),
            odd_cols.index_select(2, even_rows), odd_cols.index_select(2, odd_rows)]


class Focus(nn.Module):
    def __init__(self, c1, c2, k=1, s=1, p=None, g=1, act=True):
        super().__init__()
        self.conv = Conv(c1 * 4, c2, k, s, p, g, act)

    def forward(self, x):
        return self.conv(torch.cat(fast_slice(x), 1))
