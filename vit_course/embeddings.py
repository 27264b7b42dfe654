"""What the embeddings learn (chapter 08): position-embedding similarity and the patch-embedding filters, the
tools behind the left and centre panels of the ViT paper's Figure 7.
"""

import torch
import torch.nn.functional as F
from einops import rearrange

from .interpret import num_prefix
from .patches import to_pair


def position_embedding_similarity(pos_embed, grid_size):
    """Cosine similarity of every patch's position embedding with every other's, on the patch grid.

    Args:
        pos_embed: (1, n, D) or (n, D); when n > gh * gw the leading (class-token) rows are dropped
        grid_size: (gh, gw) or int
    Returns:
        (gh, gw, gh, gw): [i, j] is the map of patch (i, j)'s similarity to every patch
    """
    if pos_embed.ndim == 3:
        if pos_embed.shape[0] != 1:
            raise ValueError(f"pos_embed must be (1, n, D) or (n, D), got shape {tuple(pos_embed.shape)}")
        pos_embed = pos_embed[0]
    if pos_embed.ndim != 2:
        raise ValueError(f"pos_embed must be (1, n, D) or (n, D), got shape {tuple(pos_embed.shape)}")
    gh, gw = to_pair(grid_size)
    k = num_prefix(pos_embed.shape[0], (gh, gw))
    unit = F.normalize(pos_embed[k:].detach().float(), dim=-1)  # (N, D), unit length
    similarity = unit @ unit.T  # (N, N) cosine similarities
    return rearrange(similarity, "(h1 w1) (h2 w2) -> h1 w1 h2 w2", h1=gh, w1=gw, h2=gh, w2=gw)


def embedding_filters(weight, patch_size, in_channels, k=28):
    """The top principal components of the patch-embedding filters, as small images.

    Each of the D rows of the projection is a filter over a flattened P x P x C patch; the
    principal components of those D filters are the patterns the embedding is most sensitive to
    (the ViT paper's Figure 7, left). Signs are fixed so each component's largest entry is positive.

    Args:
        weight: the patch projection's Linear weight (D, P*P*C) in (p1 p2 c) order
            (a Conv2d weight (D, C, P, P) is accepted too)
        patch_size: P; in_channels: C
        k: how many components (at most min(D, P*P*C))
    Returns:
        filters (k, P, P, C), explained (k,) share of the variance each explains
    """
    weight = weight.detach().float().cpu()
    if weight.ndim == 4:
        weight = rearrange(weight, "d c p1 p2 -> d (p1 p2 c)")
    if weight.ndim != 2 or weight.shape[1] != patch_size * patch_size * in_channels:
        raise ValueError(f"weight {tuple(weight.shape)} does not match patch_size={patch_size} and "
                         f"in_channels={in_channels}: expected (D, {patch_size * patch_size * in_channels})")
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    k = min(k, *weight.shape)
    centred = weight - weight.mean(dim=0, keepdim=True)  # (D, P*P*C): PCA over the D filters
    _, s, vh = torch.linalg.svd(centred, full_matrices=False)  # vh (r, P*P*C): components, strongest first
    explained = s**2 / (s**2).sum().clamp_min(1e-12)  # (r,)
    components = vh[:k]  # (k, P*P*C)
    peak = components.gather(1, components.abs().argmax(dim=1, keepdim=True))  # (k, 1)
    components = components * peak.sign()  # SVD's sign is arbitrary: fix it so figures are reproducible
    filters = rearrange(components, "k (p1 p2 c) -> k p1 p2 c", p1=patch_size, p2=patch_size)
    return filters, explained[:k]
