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
        pos_embed: (1, n, D) or (n, D), n = k + gh * gw; the first k (class-token) rows are dropped
        grid_size: (gh, gw) or an int for a square grid
    Returns:
        (gh, gw, gh, gw) float32, detached from the graph: entry [i1, j1, i2, j2] is the similarity of patch
        (i1, j1) with patch (i2, j2)
    Raises:
        ValueError for a table that is not (1, n, D) or (n, D), or whose n cannot hold the grid
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


def grid_neighbours(grid_size):
    """(N, N) bool: True where two patches are among each other's 8 surrounding cells on the grid."""
    gh, gw = to_pair(grid_size)
    rows, cols = torch.meshgrid(torch.arange(gh), torch.arange(gw), indexing="ij")
    rows, cols = rows.flatten(), cols.flatten()  # (N,) each
    dr, dc = (rows[:, None] - rows[None]).abs(), (cols[:, None] - cols[None]).abs()  # (N, N)
    return (dr <= 1) & (dc <= 1) & ((dr + dc) > 0)


def _similarity_matrix(pos_embed, grid_size):
    """(N, N) float32 on the CPU: ``position_embedding_similarity`` of a table on any device, patch by patch."""
    return position_embedding_similarity(pos_embed.detach().float().cpu(), grid_size).flatten(2).flatten(0, 1)


def neighbour_share(pos_embed, grid_size):
    """For what share of the patches is the most similar *other* position one of its 8 grid neighbours?

    A learned table that has recovered the image's rows and columns scores near 1; random rows score the share of
    neighbours among the other N - 1 patches (on an 8 x 8 grid 6.6 of 63 on average, about 10%). pos_embed (1, n, D)
    or (n, D), on any device, class-token rows dropped as in ``position_embedding_similarity``.
    """
    sim = _similarity_matrix(pos_embed, grid_size)  # (N, N)
    sim.fill_diagonal_(-float("inf"))  # a patch is not its own neighbour
    nearest = sim.argmax(dim=1)  # (N,)
    return grid_neighbours(grid_size)[torch.arange(len(nearest)), nearest].float().mean().item()


def rank(values):
    """Ranks 1..n of a 1-D tensor, ties given their average rank (as Spearman's correlation needs)."""
    order = values.argsort()
    sorted_values = values[order]
    ranks = torch.empty_like(values, dtype=torch.float64)
    ranks[order] = torch.arange(1, len(values) + 1, dtype=torch.float64)
    _, group, counts = torch.unique_consecutive(sorted_values, return_inverse=True, return_counts=True)
    sums = torch.zeros(len(counts), dtype=torch.float64).index_add_(0, group, ranks[order])  # per tie group
    ranks[order] = (sums / counts)[group]
    return ranks


def spearman(x, y):
    """Spearman's rank correlation of two 1-D tensors of equal length (ties averaged)."""
    rx, ry = rank(x.flatten().double()), rank(y.flatten().double())
    rx, ry = rx - rx.mean(), ry - ry.mean()
    return (rx @ ry / (rx.norm() * ry.norm()).clamp_min(1e-12)).item()


def position_rank_correlation(pos_embed, grid_size):
    """Spearman correlation, over all pairs of distinct patches, between the cosine similarity of their position
    embeddings and their closeness on the grid (minus the Euclidean distance between grid cells)."""
    gh, gw = to_pair(grid_size)
    sim = _similarity_matrix(pos_embed, (gh, gw))  # (N, N)
    rows, cols = torch.meshgrid(torch.arange(gh), torch.arange(gw), indexing="ij")
    cells = torch.stack([rows.flatten(), cols.flatten()], dim=1).float()  # (N, 2)
    pairs = torch.triu_indices(len(cells), len(cells), offset=1)  # (2, N(N-1)/2): each distinct pair once
    closeness = -torch.cdist(cells, cells)[pairs[0], pairs[1]]
    return spearman(sim[pairs[0], pairs[1]], closeness)


def top_variance_share(weight, patch_size, in_channels, k=8):
    """Share of the patch-embedding filters' variance that their top ``k`` principal components hold."""
    return embedding_filters(weight, patch_size, in_channels, k)[1].sum().item()
