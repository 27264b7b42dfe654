"""Drawing images (chapters 04 and 08): pixels from any of the course's image formats, heat-map overlays, and the
patch grid of chapter 04.

Images may be uint8 (b, C, H, W) as ``data.load`` gives them, floats in [0, 1], or normalised floats (shown
rescaled to their own range).
"""

import math

import matplotlib.pyplot as plt
import numpy as np
import torch
from matplotlib.collections import LineCollection
from matplotlib.colors import ListedColormap

from ..patches import patch_grid

# Heat maps: inferno whose opacity rises with the value, so a low weight leaves the image visible instead of
# darkening it, and a high one is bright and opaque.
HEAT = ListedColormap(np.column_stack([plt.get_cmap("inferno")(np.linspace(0, 1, 256))[:, :3],
                                       np.linspace(0.1, 0.9, 256)]), name="inferno_rising")
OVERLAY = dict(cmap=HEAT, vmin=0.0, vmax=1.0)


def to_pixels(images):
    """uint8 or float images (b, C, H, W) or (C, H, W) -> float in [0, 1], same shape.

    Floats already in [0, 1] stay as they are; other floats (normalised inputs) are rescaled per
    image to their own range, which recovers the picture up to per-channel contrast.
    """
    images = torch.as_tensor(images).detach().cpu()
    if images.dtype == torch.uint8:
        return images.float() / 255
    images = images.float()
    if images.min() >= 0 and images.max() <= 1:
        return images
    flat = images.flatten(-3)  # (..., C*H*W)
    lo, hi = flat.amin(-1)[..., None, None, None], flat.amax(-1)[..., None, None, None]
    return (images - lo) / (hi - lo).clamp_min(1e-12)


def one_image(image, who):
    """Raise a ValueError naming the shape unless ``image`` is one (C, H, W) image of 1 or 3 channels."""
    shape = tuple(image.shape)
    if len(shape) != 3 or shape[0] not in (1, 3):
        hint = (": a batch, pass images[0]" if len(shape) == 4 else
                ": channels last, pass image.permute(2, 0, 1)" if len(shape) == 3 and shape[-1] in (1, 3) else "")
        raise ValueError(f"{who} takes one image (C, H, W) of 1 or 3 channels, got shape {shape}{hint}")


def show_image(ax, image, title=None):
    """Draw one (C, H, W) image (grey for one channel) on ``ax`` without ticks."""
    one_image(image, "show_image")
    pixels = to_pixels(image)  # (C, H, W) in [0, 1]
    if pixels.shape[0] == 1:
        ax.imshow(pixels[0].numpy(), cmap="gray", vmin=0, vmax=1)
    else:
        ax.imshow(pixels.permute(1, 2, 0).numpy())  # (H, W, C)
    ax.set_xticks([]), ax.set_yticks([])
    if title:
        ax.set_title(title, fontsize=8)


def show_overlay(ax, image, heat, title=None):
    """A heat map (H, W) in [0, 1] over the image, drawn in light grey so that the map's colours stand out.

    Returns the heat map's image (``AxesImage``), for a colour bar: ``fig.colorbar(shown, ax=...)``.
    """
    grey = to_pixels(image).mean(dim=0)  # (H, W) in [0, 1]
    ax.imshow(grey.numpy(), cmap="gray", vmin=-0.4, vmax=1.1)  # lightened: black shows as dark grey
    ax.set_xticks([]), ax.set_yticks([])
    if title:
        ax.set_title(title, fontsize=8)
    return ax.imshow(torch.as_tensor(heat).detach().cpu().numpy(), **OVERLAY)


def outline_cells(ax, mask, cell, color="cyan", lw=1.2):
    """Draw the outline of the cells where ``mask`` (gh, gw) is true, each ``cell`` pixels a side, on ``ax``:
    the edges between a marked cell and an unmarked one (or the image's border)."""
    mask = torch.as_tensor(mask).bool().cpu()
    gh, gw = mask.shape
    padded = torch.nn.functional.pad(mask, (1, 1, 1, 1))  # (gh + 2, gw + 2): unmarked all around
    segments = []
    for r, c in mask.nonzero().tolist():
        y0, x0, y1, x1 = r * cell - 0.5, c * cell - 0.5, (r + 1) * cell - 0.5, (c + 1) * cell - 0.5
        if not padded[r, c + 1]:
            segments.append([(x0, y0), (x1, y0)])  # top
        if not padded[r + 2, c + 1]:
            segments.append([(x0, y1), (x1, y1)])  # bottom
        if not padded[r + 1, c]:
            segments.append([(x0, y0), (x0, y1)])  # left
        if not padded[r + 1, c + 2]:
            segments.append([(x1, y0), (x1, y1)])  # right
    ax.add_collection(LineCollection(segments, colors=color, linewidths=lw))


def plot_patch_grid(image, patch_size, per_row=16, title=None):
    """Chapter 04: an image (C, H, W) with its P x P grid and numbered patches, and below it the patch
    sequence (row by row from the top-left), wrapped every ``per_row`` patches."""
    one_image(image, "plot_patch_grid")
    _, height, width = image.shape
    gh, gw = patch_grid((height, width), patch_size)
    n = gh * gw
    pixels = to_pixels(image)  # (C, H, W)
    rows = math.ceil(n / per_row)
    fig = plt.figure(figsize=(10, 4.6), layout="constrained")
    left, right = fig.subfigures(1, 2, width_ratios=[1.15, 1.6])
    ax = left.subplots()
    show_image(ax, pixels)
    ax.set_title(title or f"P = {patch_size}: {gh} x {gw} = {n} patches", fontsize=10)
    for x in range(0, width + 1, patch_size):
        ax.axvline(x - 0.5, color="white", lw=0.8)
    for y in range(0, height + 1, patch_size):
        ax.axhline(y - 0.5, color="white", lw=0.8)
    if n <= 64:  # numbered in reading order, centred in each patch, legible on any background
        size = 10 if max(gh, gw) <= 4 else 8
        for i in range(n):
            r, c = divmod(i, gw)
            ax.text((c + 0.5) * patch_size - 0.5, (r + 0.5) * patch_size - 0.5, str(i), color="yellow",
                    fontsize=size, fontweight="bold", ha="center", va="center",
                    bbox=dict(boxstyle="round,pad=0.15", fc="black", ec="none", alpha=0.55))
    gap, channels = max(1, patch_size // 4), pixels.shape[0]
    step = patch_size + gap
    strip = torch.ones(channels, rows * step - gap, per_row * step - gap)  # white paper between patches
    for i in range(n):
        r, c = divmod(i, gw)
        y, x = divmod(i, per_row)
        strip[:, y * step:y * step + patch_size, x * step:x * step + patch_size] = \
            pixels[:, r * patch_size:(r + 1) * patch_size, c * patch_size:(c + 1) * patch_size]
    ax = right.subplots()
    show_image(ax, strip)
    ax.set_yticks([y * step + (patch_size - 1) / 2 for y in range(rows)], [str(y * per_row) for y in range(rows)])
    ax.tick_params(length=0, labelsize=7)
    right.suptitle(f"the sequence: {n} tokens of {patch_size}x{patch_size}x{pixels.shape[0]} = "
                   f"{patch_size * patch_size * pixels.shape[0]} values", fontsize=9)
    return fig


def plot_patch_sizes(image, patch_sizes):
    """The static stand-in of the patch explorer: the same image cut with each patch size, with the
    token count N and the attention matrix's (N + 1)^2 entries in the titles."""
    one_image(image, "plot_patch_sizes")
    fig, axes = plt.subplots(1, len(patch_sizes), figsize=(2.6 * len(patch_sizes), 3), squeeze=False,
                             layout="constrained")
    for ax, p in zip(axes[0], patch_sizes, strict=True):
        gh, gw = patch_grid(image.shape[-2:], p)
        n = gh * gw
        show_image(ax, image, f"P = {p}: N = {n}\nattention {n + 1}x{n + 1} = {(n + 1) ** 2:,}")
        for x in range(0, image.shape[-1] + 1, p):
            ax.axvline(x - 0.5, color="white", lw=0.6)
        for y in range(0, image.shape[-2] + 1, p):
            ax.axhline(y - 0.5, color="white", lw=0.6)
    return fig
