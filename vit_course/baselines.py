"""The CNNs the ViTs are measured against (chapter 07 and ``benchmarks/data_scaling.py``).

Locality and weight sharing are built into a convolution: the assumptions a ViT has to learn from data.
``small_cnn`` is chapter 07's quick rival (two conv-ReLU-maxpool stages); ``small_resnet`` is the data-scaling
experiment's CNN, a residual network of about the plain ViT's size, so that neither side is starved of capacity.
"""

import torch.nn.functional as F
from torch import nn


def small_cnn(num_classes=10, in_channels=3, image_size=32, channels=(32, 64)):
    """Conv3x3-ReLU-maxpool stages of ``channels``, then a linear head: (b, C, H, W) -> logits (b, K)."""
    layers, c_in = [], in_channels
    for c_out in channels:
        layers += [nn.Conv2d(c_in, c_out, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2)]  # halves H and W
        c_in = c_out
    side = image_size // 2 ** len(channels)
    if side < 1:
        raise ValueError(f"{len(channels)} pooling stages shrink a {image_size}-pixel image to nothing")
    return nn.Sequential(*layers, nn.Flatten(), nn.Linear(c_in * side * side, num_classes))


class BasicBlock(nn.Module):
    """Two conv3x3-BatchNorm layers and a shortcut (He et al. 2016): (b, c_in, H, W) -> (b, c_out, H/s, W/s)."""

    def __init__(self, c_in, c_out, stride=1):
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        same = stride == 1 and c_in == c_out  # else a 1x1 convolution matches the shapes
        self.shortcut = nn.Identity() if same else nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride, bias=False),
                                                                 nn.BatchNorm2d(c_out))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))  # (b, c_out, H/s, W/s)
        return F.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


def small_resnet(num_classes=10, in_channels=3, channels=(16, 32, 64), blocks=2):
    """A CIFAR-style ResNet: a conv3x3 stem, stages of ``blocks`` BasicBlocks (each stage after the first halves
    H and W), global average pooling and a linear head: (b, C, H, W) -> logits (b, K). The defaults make a
    14-layer network of about 0.17 M parameters."""
    if not channels or blocks < 1:
        raise ValueError(f"small_resnet needs at least one stage and one block, got channels={channels}, "
                         f"blocks={blocks}")
    layers = [nn.Conv2d(in_channels, channels[0], 3, padding=1, bias=False), nn.BatchNorm2d(channels[0]), nn.ReLU()]
    c_in = channels[0]
    for i, c_out in enumerate(channels):
        for j in range(blocks):
            layers.append(BasicBlock(c_in, c_out, stride=2 if i > 0 and j == 0 else 1))
            c_in = c_out
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c_in, num_classes))
