"""The hybrid ViT's conv stem (chapters 06-07): a small CNN whose feature map is cut into patches.

The paper's section 3.1 feeds a ViT with a CNN's feature map instead of raw pixels; the CPU recipes of
chapters 06 and 07 use such a stem because it gives a small model the locality that a plain ViT must
learn from data. ``ViT(stem_channels=...)`` builds it through ``hybrid_stem``.
"""

import torch
from torch import nn


class ConvStem(nn.Module):
    """conv3x3 -> BatchNorm -> ReLU -> max-pool (stride 2) per stage, so the map shrinks by 2 per stage.

    forward(images (b, C, H, W)) -> (b, channels[-1], H / 2^s, W / 2^s)
    """

    def __init__(self, in_channels, channels):
        super().__init__()
        layers = []
        for c_in, c_out in zip((in_channels, *channels[:-1]), channels, strict=True):
            layers += [nn.Conv2d(c_in, c_out, 3, padding=1, bias=False), nn.BatchNorm2d(c_out),
                       nn.ReLU(inplace=True), nn.MaxPool2d(3, stride=2, padding=1)]
        self.layers = nn.Sequential(*layers)
        self.out_channels, self.reduction = channels[-1], 2 ** len(channels)
        # Channels-last (NHWC) memory: oneDNN's CPU convolutions, batch norms and max-pools are faster on it
        # (benchmarks/memory_format.py), and the (b, C, h, w) -> (b, h*w, C) rearrange that follows is a view.
        self.to(memory_format=torch.channels_last)

    def forward(self, images):
        return self.layers(images.contiguous(memory_format=torch.channels_last))


def hybrid_stem(in_channels, stem_channels, image_size):
    """-> (stem, size of the map the patches are cut from, its channels).

    No ``stem_channels``: ``nn.Identity()``, and patches are cut from the image itself.
    """
    height, width = image_size
    if not stem_channels:
        return nn.Identity(), (height, width), in_channels
    stem = ConvStem(in_channels, tuple(stem_channels))
    if height % stem.reduction or width % stem.reduction:
        raise ValueError(f"image of {height}x{width} pixels: the conv stem needs sides divisible by {stem.reduction}")
    return stem, (height // stem.reduction, width // stem.reduction), stem.out_channels
