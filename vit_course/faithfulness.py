"""Does attention point at what matters? The deletion test of chapter 08.

A map that ranks the patches by importance (attention rollout, or the last layer's class-token attention) is
put to the test: delete the patches it ranks highest and see how much accuracy falls, against deleting as many
patches chosen at random. "Deleting" sets a patch to zero in the normalised input, which is the dataset's mean
colour. A map worth reading costs more accuracy than random deletion, and more than two rankings that know nothing
of the model: patches near the image centre first (where datasets like CIFAR-10 put their objects), and patches
far from the mean colour first (whose deletion changes the input most).

Shapes: b images, C channels, H x W pixels, P x P patches on a gh x gw grid, N = gh * gw patches.
"""

import torch
from einops import rearrange

from .interpret import attention_rollout, layer_attentions, num_prefix, pooled_row
from .patches import patch_grid, patchify, to_pair
from .train import eval_mode


def delete_patches(images, ranking, fraction, patch_size):
    """Zero the ``fraction`` of each image's patches that ``ranking`` scores highest.

    Args:
        images: (b, C, H, W) normalised images (zero is the dataset's mean)
        ranking: (b, N) a score per patch, patches numbered row by row from the top-left (as ``patchify``)
        fraction: share of the N patches to delete, in [0, 1]; round(fraction * N) patches are deleted
        patch_size: P
    Returns: a new (b, C, H, W) tensor; ``images`` is left unchanged.
    Raises: ValueError when ranking is not (b, N) for these images, or fraction is outside [0, 1].
    """
    gh, gw = patch_grid(images.shape[-2:], patch_size)
    if ranking.shape != (images.shape[0], gh * gw):
        raise ValueError(f"ranking must be (batch, patches) = ({images.shape[0]}, {gh * gw}) for images of shape "
                         f"{tuple(images.shape)} and patch size {patch_size}, got {tuple(ranking.shape)}")
    if not 0 <= fraction <= 1:
        raise ValueError(f"fraction must be in [0, 1], got {fraction}")
    count = round(fraction * gh * gw)
    keep = torch.ones(ranking.shape, dtype=images.dtype, device=images.device)  # (b, N), beside the images
    keep.scatter_(1, ranking.topk(count, dim=1).indices.to(images.device), 0.0)  # 0: the `count` highest-ranked patches
    mask = rearrange(keep, "b (h w) -> b 1 h w", h=gh).repeat_interleave(patch_size, -2)  # (b, 1, H, W/P)
    return images * mask.repeat_interleave(patch_size, -1)  # (b, C, H, W)


def attention_rankings(model, inputs, batch_size=256):
    """Two rankings of the patches per image, from the head's point of view: -> dict of (b, N).

    "rollout": the row of the attention rollout through every layer that the head reads; "last layer": that row
    of the last layer's attention, averaged over the heads. The row is the class token's, or for a mean-pooled
    model the mean of the patch tokens' rows (``pooled_row``).
    """
    rankings = {"rollout": [], "last layer": []}
    device = next(model.parameters()).device
    with eval_mode(model):
        for start in range(0, len(inputs), batch_size):
            weights = layer_attentions(model, inputs[start:start + batch_size].to(device))  # L x (b, h, n, n)
            k = num_prefix(weights[0].shape[-1], model.grid_size)
            rankings["rollout"].append(pooled_row(attention_rollout(weights), k, model.pool).cpu())  # (b, N)
            rankings["last layer"].append(pooled_row(weights[-1].float().mean(1), k, model.pool).cpu())  # (b, N)
    return {name: torch.cat(parts) for name, parts in rankings.items()}


@torch.no_grad()
def deletion_accuracy(model, inputs, labels, ranking, fraction, patch_size, batch_size=256):
    """Accuracy (0..1) of ``model`` on ``inputs`` after ``delete_patches`` with ``ranking`` and ``fraction``."""
    device, correct = next(model.parameters()).device, 0
    with eval_mode(model):
        for start in range(0, len(inputs), batch_size):
            part = slice(start, start + batch_size)
            deleted = delete_patches(inputs[part], ranking[part], fraction, patch_size).to(device)
            correct += (model(deleted).argmax(-1).cpu() == labels[part].cpu()).sum().item()
    return correct / len(inputs)


def random_ranking(batch, patches, generator=None):
    """A ranking that knows nothing: independent uniform scores, one random order per image. (b, N)."""
    return torch.rand(batch, patches, generator=generator)


def centre_ranking(batch, grid_size, generator=None):
    """A ranking that knows only where objects usually are: patches nearer the image centre score higher. (b, N).

    Patches at the same distance from the centre (a ring) come in a random order, drawn per image from
    ``generator``; a nearer ring always comes first.
    """
    gh, gw = to_pair(grid_size)
    rows, cols = torch.meshgrid(torch.arange(gh), torch.arange(gw), indexing="ij")  # (gh, gw) each
    squared = ((2 * rows + 1 - gh) ** 2 + (2 * cols + 1 - gw) ** 2).flatten()  # (N,) 4 x squared distance, exact
    ring = torch.unique(squared, return_inverse=True)[1]  # (N,) 0 for the ring nearest the centre
    return -ring.float() + 0.5 * torch.rand(batch, gh * gw, generator=generator)  # (b, N)


def norm_ranking(inputs, patch_size):
    """A ranking that knows only the pixels: each patch scores its norm in the normalised input, so the patches
    farthest from the mean colour, whose deletion changes the input most, come first. (b, C, H, W) -> (b, N)."""
    return patchify(inputs, patch_size).float().norm(dim=-1)  # (b, N)


def baseline_rankings(inputs, patch_size, generator=None):
    """The rankings a map must beat, for normalised ``inputs`` (b, C, H, W): -> {name: (b, N)}.

    "random" (``random_ranking``), "centre" (``centre_ranking``) and "patch norm" (``norm_ranking``); ``generator``
    draws the random order and the order within the centre's rings.
    """
    b, grid = len(inputs), patch_grid(inputs.shape[-2:], patch_size)
    return {"random": random_ranking(b, grid[0] * grid[1], generator),
            "centre": centre_ranking(b, grid, generator), "patch norm": norm_ranking(inputs, patch_size)}


def deletion_curves(model, inputs, labels, rankings, fractions, patch_size, batch_size=256):
    """``deletion_accuracy`` of every ranking at every fraction: -> {name: [accuracy per fraction]}.

    rankings: {name: (b, N)}, e.g. ``attention_rankings(model, inputs)`` plus ``{"random": random_ranking(b, N)}``.
    """
    return {name: [deletion_accuracy(model, inputs, labels, ranking, f, patch_size, batch_size) for f in fractions]
            for name, ranking in rankings.items()}


__all__ = ["attention_rankings", "baseline_rankings", "centre_ranking", "delete_patches", "deletion_accuracy",
           "deletion_curves", "norm_ranking", "random_ranking"]
