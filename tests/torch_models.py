"""Small models of every kind the PyTorch drop-in is for, quick on the CPU (also model specs for the
CLI tests: ``torch_models:resnet_like`` and so on)."""

import torch
from torch import nn

from convtune.torch.models import longconv, replknet, slak


class _Bottleneck(nn.Module):
    def __init__(self, cin, mid, cout, stride):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(cin, mid, 1, bias=False), nn.BatchNorm2d(mid), nn.ReLU(),
                                  nn.Conv2d(mid, mid, 3, stride, 1, bias=False), nn.BatchNorm2d(mid), nn.ReLU(),
                                  nn.Conv2d(mid, cout, 1, bias=False), nn.BatchNorm2d(cout))
        self.short = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        return torch.relu(self.body(x) + self.short(x))


def resnet_like():
    """A ResNet stem (7x7 stride 2) and two bottlenecks (1x1, 3x3 with stride, 1x1, projection)."""
    return nn.Sequential(nn.Conv2d(3, 8, 7, 2, 3, bias=False), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(3, 2, 1),
                         _Bottleneck(8, 4, 16, 1), _Bottleneck(16, 8, 24, 2), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(24, 5))


class _ConvNeXtBlock(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.dw = nn.Conv2d(c, c, 7, padding=3, groups=c)
        self.norm = nn.LayerNorm(c)
        self.mlp = nn.Sequential(nn.Linear(c, 4 * c), nn.GELU(), nn.Linear(4 * c, c))

    def forward(self, x):
        y = self.mlp(self.norm(self.dw(x).permute(0, 2, 3, 1)))
        return x + y.permute(0, 3, 1, 2)


def convnext_like():
    """ConvNeXt's stem (4x4 stride 4), depthwise 7x7 blocks (the permuted, channels_last-strided
    tensors they make included) and a 2x2 stride-2 downsampling."""
    return nn.Sequential(nn.Conv2d(3, 8, 4, 4), _ConvNeXtBlock(8), nn.Conv2d(8, 16, 2, 2), _ConvNeXtBlock(16),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 5))


def replknet_tiny():
    return replknet(channels=(8, 16), depths=(1, 1), kernels=(13, 9), small=3, num_classes=5)


def slak_tiny():
    return slak(channels=(8, 16), depths=(1, 1), kernels=(13, 9), small=3, num_classes=5)


def longconv_tiny():
    return longconv(channels=6, length=48, depth=2, num_classes=5)


#: name -> (factory, input shape)
MODELS = {
    "resnet_like": (resnet_like, (2, 3, 32, 32)),
    "convnext_like": (convnext_like, (2, 3, 32, 32)),
    "replknet_tiny": (replknet_tiny, (2, 3, 40, 40)),
    "slak_tiny": (slak_tiny, (2, 3, 40, 40)),
    "longconv_tiny": (longconv_tiny, (2, 6, 48)),
}
