"""The small CNN the ViTs are measured against (chapter 07 and ``benchmarks/data_scaling.py``).

Two conv3x3-ReLU-maxpool stages and a linear head: locality and weight sharing built in, the assumptions a ViT
has to learn from data. One definition, so the chapter's race and the data-scaling benchmark train the same
network.
"""

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
