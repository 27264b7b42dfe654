"""The figures of chapter 08, after section 4.5 of the ViT paper: attention maps and rollout over images, the mean
attention distance per head, position-embedding similarity, the embedding filters, and the deletion test.
"""

import math

import matplotlib.pyplot as plt
import numpy as np
import torch

from ..batches import normalize
from ..embeddings import embedding_filters, position_embedding_similarity
from ..interpret import attention_map, rollout_map, run_model
from .images import outline_cells, show_image, show_overlay


def plot_attention_maps(attentions, image, grid_size, layers=None, heads=None, pool=None):
    """Attention from the class token to the patches, per head (columns) and layer (rows), over the image, each
    token's cell drawn as one square; the image itself in the first column.

    Args:
        attentions: the model's list of per-layer weights (b, h, n, n); the first image is drawn
        image: (C, H, W) the image they were computed on
        grid_size: the model's patch grid (gh, gw)
        layers, heads: indices to draw (default: all)
        pool: the model's pooling (``interpret.pooled_row``): "mean" draws the row a mean-pooled head reads
    """
    layers = list(range(len(attentions))) if layers is None else list(layers)
    heads = list(range(attentions[0].shape[1])) if heads is None else list(heads)
    size = image.shape[-2:]
    fig, axes = plt.subplots(len(layers), len(heads) + 1, figsize=(1.6 * len(heads) + 2.4, 1.6 * len(layers)),
                             squeeze=False, layout="constrained")
    for row, layer in zip(axes, layers, strict=True):
        maps = attention_map(attentions[layer][:1], grid_size, image_size=size, pool=pool)[0]  # (h, H, W)
        for ax, head in zip(row[1:], heads, strict=True):
            shown = show_overlay(ax, image, maps[head])
        row[0].axis("off")
        row[1].set_ylabel(f"layer {layer + 1}", fontsize=9)
    show_image(axes[0, 0], image, "the image")
    for ax, head in zip(axes[0, 1:], heads, strict=True):
        ax.set_title(f"head {head + 1}", fontsize=9)
    bar = fig.colorbar(shown, ax=axes, shrink=0.5, aspect=30)
    bar.set_label("attention, as a share of the map's largest", fontsize=8)
    return fig


def plot_rollout_grid(model, images, labels, class_names, mean=None, std=None, ncols=4):
    """Attention rollout for a grid of images: each image next to its rollout, titled with its true and
    predicted class (green when right, red when wrong).

    Each map is drawn cell by cell and stretched over its own range, from its smallest cell (0) to its largest
    (1), so that its contrast shows; the quarter of the cells it ranks highest, the quarter the deletion test
    (``faithfulness``) removes, is outlined.
    images (b, C, H, W) uint8 or float; mean, std: the model's per-channel normalisation (``batches.normalize``).
    """
    logits, attentions = run_model(model, normalize(images, mean, std))
    cells = rollout_map(attentions, model.grid_size, pool=model.pool, normalize=False)  # (b, gh, gw)
    low = cells.flatten(1).amin(1)[:, None, None]  # (b, 1, 1)
    high = cells.flatten(1).amax(1)[:, None, None]
    cells = (cells - low) / (high - low).clamp_min(1e-12)  # (b, gh, gw), each map over its own range [0, 1]
    gh, gw = cells.shape[-2:]
    cell = images.shape[-1] // gw  # pixels per cell
    heat = cells.repeat_interleave(cell, -2).repeat_interleave(cell, -1)  # (b, H, W), cell by cell
    quarter = max(1, round(gh * gw / 4))
    top = cells.flatten(1).topk(quarter, dim=1).indices  # (b, quarter)
    predicted = logits.argmax(-1)
    rows = math.ceil(len(images) / ncols)
    fig, axes = plt.subplots(rows, 2 * ncols, figsize=(2.4 * ncols, 1.45 * rows + 0.3), squeeze=False,
                             layout="constrained")
    for ax in axes.flat:
        ax.axis("off")
    for i in range(len(images)):
        left, right = axes[i // ncols, 2 * (i % ncols)], axes[i // ncols, 2 * (i % ncols) + 1]
        true, pred = int(labels[i]), int(predicted[i])
        show_image(left, images[i])
        shown = show_overlay(right, images[i], heat[i])
        outline_cells(right, torch.zeros(gh * gw, dtype=torch.bool).index_fill(0, top[i], True).view(gh, gw), cell)
        left.set_title(f"{class_names[true]} → {class_names[pred]}", fontsize=8, loc="left",
                       color="green" if true == pred else "red")
    bar = fig.colorbar(shown, ax=axes, shrink=0.6, aspect=30)
    bar.set_label("rollout, from the map's smallest cell (0) to its largest (1)", fontsize=8)
    fig.suptitle("attention rollout (true → predicted); outlined: each map's top quarter of the patches",
                 fontsize=10)
    return fig


HEAD_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")


def plot_attention_distance(distances, reference=None, title="mean attention distance", local=0.8):
    """The ViT paper's Figure 7 (right): layer on x, one dot per head, distance in pixels on y.

    Args:
        distances: (L, h) from ``attention_distances``; or {name: (L, h)} to draw models side by side, one
            panel each on a shared distance axis (chapter 08 compares two trainings of one architecture)
        reference: optional distance to draw as a dashed line (e.g. uniform attention's)
        local: with a reference, a dotted line at this share of it, below which chapter 08 calls a head local
            (None: no line)
    """
    panels = distances if isinstance(distances, dict) else {title: distances}
    panels = {name: torch.as_tensor(d).cpu() for name, d in panels.items()}
    top = 1.1 * max(max(d.max().item() for d in panels.values()), reference or 0.0)
    fig, axes = plt.subplots(1, len(panels), figsize=(5.4 + 3.6 * (len(panels) - 1), 3.2), sharey=True,
                             layout="constrained", squeeze=False)
    for ax, (name, d) in zip(axes[0], panels.items(), strict=True):
        depth, heads = d.shape
        for head in range(heads):  # each head its own marker, so the heads are told apart without colour
            marker = HEAD_MARKERS[head % len(HEAD_MARKERS)]
            ax.scatter(np.arange(1, depth + 1), d[:, head].numpy(), s=24, marker=marker, label=f"head {head + 1}",
                       **({"facecolors": "none", "edgecolors": f"C{head}"} if head % 2 else {}))
        if reference is not None:
            ax.axhline(reference, ls="--", color="gray", lw=1, label="uniform attention")
            if local is not None:
                ax.axhline(local * reference, ls=":", color="gray", lw=1, label=f"local below ({local:g} of uniform)")
        ax.set(xlabel="network depth (layer)", title=name, xticks=range(1, depth + 1), ylim=(0, top))
    axes[0, 0].set_ylabel("mean attention distance (pixels)")
    axes[0, -1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside the axes: dots visible
    return fig


def plot_position_similarity(pos_embed, grid_size, title="position embedding similarity", vmin=-1.0):
    """The paper's Figure 7 (centre): a gh x gw grid of gh x gw maps, tile (i, j) the cosine
    similarity of patch (i, j)'s position embedding with every patch's. The colours span [vmin, 1]
    as in the paper; vmin=None spans the smallest similarity instead (fixed sin-cos tables sit
    mostly above 0.5, where [-1, 1] washes their structure out). Rows and columns are numbered from 0, as the
    tensor's indices are."""
    gh, gw = (grid_size, grid_size) if isinstance(grid_size, int) else grid_size
    sim = position_embedding_similarity(pos_embed.detach().float().cpu(), (gh, gw)).numpy()  # (gh, gw, gh, gw)
    canvas = np.full((gh * (gh + 1) - 1, gw * (gw + 1) - 1), np.nan)  # tiles with one blank row/column between
    for i in range(gh):
        for j in range(gw):
            canvas[i * (gh + 1):i * (gh + 1) + gh, j * (gw + 1):j * (gw + 1) + gw] = sim[i, j]
    fig, ax = plt.subplots(figsize=(5.2, 4.6), layout="constrained")
    cmap = plt.get_cmap("viridis").with_extremes(bad="white")
    shown = ax.imshow(canvas, cmap=cmap, vmin=np.nanmin(canvas) if vmin is None else vmin, vmax=1)
    ax.set_xticks([j * (gw + 1) + (gw - 1) / 2 for j in range(gw)], [str(j) for j in range(gw)])
    ax.set_yticks([i * (gh + 1) + (gh - 1) / 2 for i in range(gh)], [str(i) for i in range(gh)])
    ax.tick_params(length=0, labelsize=8)
    ax.set(xlabel="input patch column (from 0)", ylabel="input patch row (from 0)", title=title)
    fig.colorbar(shown, ax=ax, shrink=0.8, label="cosine similarity")
    return fig


def _percent(share):
    """13% for large shares, 0.4% below 1%: a share of variance as a tile's label."""
    return f"{100 * share:.0f}%" if share >= 0.01 else f"{100 * share:.1f}%"


def plot_embedding_filters(weight, patch_size, in_channels, k=28, ncols=7):
    """The paper's Figure 7 (left): the top-k principal components of the patch-embedding filters as
    P x P images (RGB, or grey for one channel), each scaled to its own range, titled with its share of the
    variance."""
    if in_channels not in (1, 3):
        raise ValueError(f"filters over {in_channels} channels are not images (a hybrid model embeds a "
                         f"feature map): plot_embedding_filters needs in_channels 1 or 3")
    filters, explained = embedding_filters(weight, patch_size, in_channels, k)  # (k, P, P, C), (k,)
    lo = filters.flatten(1).amin(1)[:, None, None, None]  # (k, 1, 1, 1)
    hi = filters.flatten(1).amax(1)[:, None, None, None]
    filters = (filters - lo) / (hi - lo).clamp_min(1e-12)  # (k, P, P, C), each in [0, 1]
    rows = math.ceil(len(filters) / ncols)
    fig, axes = plt.subplots(rows, ncols, figsize=(0.95 * ncols, 1.1 * rows + 0.35), squeeze=False,
                             layout="constrained")
    for ax in axes.flat:
        ax.axis("off")
    for ax, f, share in zip(axes.flat, filters, explained, strict=False):
        show_image(ax, f.permute(2, 0, 1))  # (C, P, P)
        ax.set_title(_percent(share), fontsize=9, pad=2)
    fig.suptitle(f"top {len(filters)} principal components of the patch embedding (share of the variance)",
                 fontsize=10)
    return fig


LINE_STYLES = (dict(marker="o", ls="-"), dict(marker="s", ls="-.", mfc="none"), dict(marker="^", ls=(0, (4, 2))),
               dict(marker="D", ls=(0, (6, 2, 1, 2, 1, 2)), mfc="none"), dict(marker="v", ls=(0, (1, 1.5))))


def plot_deletion(fractions, curves, clean=None, title="the deletion test", band=None,
                  band_label="random, other draws"):
    """Accuracy against the share of patches deleted, one line per ranking (``faithfulness.deletion_curves``).

    A ranking that finds the patches the model uses drops below the random line; ``clean`` (the accuracy with
    nothing deleted) is drawn as a dotted line. ``band``, a pair (lowest, highest) of accuracies per fraction (e.g.
    over other random draws), is shaded grey: how far the random line alone could move. The accuracy axis spans
    the curves and the band, not 0-100%, so that gaps of a few points show.
    """
    fig, ax = plt.subplots(figsize=(5.4, 3.4), layout="constrained")
    if band is not None:
        low, high = band
        ax.fill_between([100 * f for f in fractions], [100 * a for a in low], [100 * a for a in high],
                        color="gray", alpha=0.25, lw=0, label=band_label)
    styles = iter(LINE_STYLES * len(curves))
    for name, accuracies in curves.items():  # each line its own marker and dash, so overlapping lines stay apart
        style = dict(color="gray", ls="--", marker="x") if name == "random" else next(styles)
        ax.plot([100 * f for f in fractions], [100 * a for a in accuracies], label=name, ms=6, lw=1.5, **style)
    if clean is not None:
        ax.axhline(100 * clean, ls=":", color="black", lw=1, label="nothing deleted")
    values = [100 * a for accuracies in [*curves.values(), *(band or [])] for a in accuracies]
    values += [100 * clean] if clean else []
    low, high = min(values), max(values)
    pad = 0.08 * (high - low) + 0.5
    ax.set(xlabel="patches deleted (%)", ylabel="test accuracy (%)", title=title, ylim=(low - pad, high + pad))
    ax.legend(fontsize=8, loc="lower left")  # the curves fall to the right: the lower left stays clear
    return fig
