"""The hybrid ViT's conv stem (chapters 06-07): a small CNN whose feature map is cut into patches.

The paper's section 3.1 feeds a ViT with a CNN's feature map instead of raw pixels; the CPU recipes of
chapters 06 and 07 use such a stem because it gives a small model the locality that a plain ViT must
learn from data. ``ViT(stem_channels=...)`` builds it through ``hybrid_stem``.
"""

import torch
from torch import nn


class ConvStem(nn.Module):
    """A few stages, each halving the map: conv3x3 -> BatchNorm -> ReLU -> max-pool (stride 2), or with
    ``pool=False`` a stride-2 conv3x3 -> BatchNorm -> ReLU (the convolutional stem of Xiao et al. 2021, "Early
    Convolutions Help Transformers See Better").

    The max-pool version convolves at the full resolution of its input, the strided one at the halved
    resolution: a quarter of the multiply-adds for the same weights. For the cifar10 recipe on a 2-core CPU that
    fitted 12.5 epochs in the time of 9.0, and ended no more accurate (benchmarks/results/ablate_cifar10.json).

    Each stage maps a side of n pixels to ceil(n / 2) (padding 1, stride 2), so odd sides work: MNIST's 28 goes
    28 -> 14 -> 7 -> 4 through three stages.

    forward(images (b, C, H, W)) -> (b, channels[-1], ceil(H / 2^s), ceil(W / 2^s))
    """

    def __init__(self, in_channels, channels, pool=True):
        super().__init__()
        layers = []
        for c_in, c_out in zip((in_channels, *channels[:-1]), channels, strict=True):
            conv = nn.Conv2d(c_in, c_out, 3, stride=1 if pool else 2, padding=1, bias=False)
            layers += [conv, nn.BatchNorm2d(c_out), nn.ReLU(inplace=True)]
            layers += [nn.MaxPool2d(3, stride=2, padding=1)] if pool else []
        self.layers = nn.Sequential(*layers)
        self.out_channels, self.reduction = channels[-1], 2 ** len(channels)
        # Channels-last (NHWC) memory: oneDNN's CPU convolutions, batch norms and max-pools are faster on it
        # (benchmarks/memory_format.py), and the (b, C, h, w) -> (b, h*w, C) rearrange that follows is a view.
        self.to(memory_format=torch.channels_last)

    def forward(self, images):
        layout = memory_layout(images.device)
        x = images.contiguous(memory_format=layout)  # (b, C, H, W)
        for layer in self.layers:
            x = layer(x.contiguous(memory_format=layout))  # a no-op where x is in that layout already
        return x  # (b, channels[-1], h, w)


def memory_layout(device):
    """The stem's memory layout on ``device``: channels-last, except on Apple's MPS, where BatchNorm2d has computed
    wrong gradients for channels-last input (PyTorch issue #175189, training diverges within steps; fixed only in
    2026 releases), so every layer there gets the standard contiguous layout."""
    return torch.contiguous_format if device.type == "mps" else torch.channels_last


def hybrid_stem(in_channels, stem_channels, image_size, pool=True):
    """-> (stem, size of the map the patches are cut from, its channels); ``pool``: see ``ConvStem``.

    No ``stem_channels``: ``nn.Identity()``, and patches are cut from the image itself.
    """
    height, width = image_size
    if not stem_channels:
        return nn.Identity(), (height, width), in_channels
    for _ in stem_channels:  # each stage maps n to ceil(n / 2), as count_parameters counts it too
        height, width = (height + 1) // 2, (width + 1) // 2
    return ConvStem(in_channels, tuple(stem_channels), pool), (height, width), stem_channels[-1]
