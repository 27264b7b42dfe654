"""Checks for chapter 08: attention_rollout, mean_attention_distance, position_embedding_similarity."""

# ruff: noqa: B023  (each diagnosis thunk is called by Checker.close in the loop iteration that builds it)

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn

from .core import check


def _attention(g, b, h, n):
    return (torch.randn(b, h, n, n, generator=g) * 2).softmax(-1)  # (b, h, n, n), rows sum to 1


def _rollout(attentions, heads="mean", identity=True, renorm=True, order="last-left"):
    rollout = None
    for a in attentions:
        a = a.mean(1) if heads == "mean" else a.amax(1) if heads == "max" else a.sum(1)  # (b, n, n)
        a = a + torch.eye(a.shape[-1]) if identity else a
        a = a / a.sum(-1, keepdim=True) if renorm else a
        rollout = a if rollout is None else a @ rollout if order == "last-left" else rollout @ a
    return rollout


@check("attention_rollout")
def attention_rollout(c, fn):
    """attention_rollout(list of (b, h, n, n)) -> (b, n, n): mean over heads, + identity, renormalise, multiply."""
    from .. import interpret as ref

    g = torch.Generator().manual_seed(23)
    for layers, b, h, n in ((3, 2, 3, 5), (1, 1, 2, 4), (4, 3, 1, 7), (2, 2, 4, 3)):
        attentions = [_attention(g, b, h, n) for _ in range(layers)]
        got = c.call(fn, attentions)
        c.close(got, ref.attention_rollout(attentions), f"rollout of {layers} layers of {b}x{h}x{n}x{n} weights", [
            ("the identity (the residual path) is not added: A + I, then renormalise the rows",
             lambda: _rollout(attentions, identity=False)),
            ("the rows are not renormalised after adding the identity: divide each row by its sum",
             lambda: _rollout(attentions, renorm=False)),
            ("the layers are multiplied in the wrong order: the last layer goes on the left, R = A_L ... A_1",
             lambda: _rollout(attentions, order="first-left")),
            ("the heads are combined with max: average them, mean over dim 1", lambda: _rollout(attentions, "max")),
            ("the heads are summed: average them, mean over dim 1", lambda: _rollout(attentions, "sum")),
            ("only the last layer is used: multiply through every layer", lambda: _rollout(attentions[-1:])),
        ], shape_hints=[((b, h, n, n), "average over the heads: the rollout is (b, n, n)")])


def _distance(attention, grid, patch, prefix, renorm=False, unit=1.0, swap=False, metric="euclid"):
    gh, gw = grid
    a = attention[:, :, prefix:, prefix:]  # (b, h, N, N)
    a = a / a.sum(-1, keepdim=True) if renorm else a
    ys, xs = torch.meshgrid(torch.arange(gh), torch.arange(gw), indexing="ij")
    centres = torch.stack([ys.flatten(), xs.flatten()], -1).float() * patch / unit  # (N, 2)
    if swap:  # patches laid out column by column
        ys, xs = torch.meshgrid(torch.arange(gw), torch.arange(gh), indexing="ij")
        centres = torch.stack([xs.flatten(), ys.flatten()], -1).float() * patch
    distance = torch.cdist(centres, centres, p=2.0 if metric == "euclid" else 1.0)  # (N, N)
    return (a * distance).sum(-1).mean((0, 2))  # (h,)


@check("mean_attention_distance")
def mean_attention_distance(c, fn):
    """mean_attention_distance(attention (b, h, n, n), grid_size, patch_size) -> (h,) mean pixel distance."""
    from .. import interpret as ref

    g = torch.Generator().manual_seed(24)
    for b, h, grid, patch, prefix in ((2, 3, (4, 4), 4, 1), (1, 2, (3, 5), 2, 0), (3, 4, (2, 3), 7, 1),
                                      (2, 1, (5, 5), 16, 0)):
        n = grid[0] * grid[1] + prefix
        attention = _attention(g, b, h, n)
        grid_arg = grid[0] if grid[0] == grid[1] else grid
        got = c.call(fn, attention, grid_arg, patch)
        c.close(got, ref.mean_attention_distance(attention, grid_arg, patch), f"mean attention distance of "
                f"{b}x{h}x{n}x{n} weights on a {grid[0]}x{grid[1]} grid of {patch}-pixel patches", [
                    ("the distance is in patches, not pixels: multiply the patch-centre coordinates by patch_size",
                     lambda: _distance(attention, grid, patch, prefix, unit=patch)),
                    ("the rows are renormalised after dropping the class token: use the weights as they are",
                     lambda: _distance(attention, grid, patch, prefix, renorm=True)),
                    ("rows and columns of the grid are swapped: patch i sits at row i // gw, column i % gw",
                     lambda: _distance(attention, grid, patch, prefix, swap=True)),
                    ("this is the city-block distance: use the straight-line (Euclidean) distance",
                     lambda: _distance(attention, grid, patch, prefix, metric="manhattan")),
                ], atol=1e-4, shape_hints=[((), "return one distance per head, (h,): average over batch and queries "
                                                "only"), ((b, h), "average over the batch too: the result is (h,)")])


@check("position_embedding_similarity")
def position_embedding_similarity(c, fn):
    """position_embedding_similarity(pos_embed (1, n, D) or (n, D), grid_size) -> (gh, gw, gh, gw) cosines."""
    from .. import interpret as ref

    g = torch.Generator().manual_seed(25)
    for shape, grid, prefix in (((1, 17, 8), (4, 4), 1), ((16, 8), (4, 4), 0), ((1, 16, 6), (3, 5), 1),
                                ((1, 6, 12), (2, 3), 0)):
        pos = torch.randn(shape, generator=g)
        if len(shape) == 3 and prefix:
            pos = nn.Parameter(pos)  # as it comes from a model: requires grad
        grid_arg = grid[0] if grid[0] == grid[1] else grid
        got = c.call(fn, pos, grid_arg)
        table = pos.detach().reshape(-1, shape[-1])[prefix:]  # (N, D)
        gh, gw = grid

        def on_grid(sim):
            return rearrange(sim, "(a b) (c d) -> a b c d", a=gh, b=gw, c=gh, d=gw)

        n = gh * gw
        c.close(got, ref.position_embedding_similarity(pos, grid_arg),
                f"similarities of position embeddings {tuple(shape)} on a {gh}x{gw} grid", [
                    ("these are dot products: normalise the embeddings to unit length first (cosine similarity)",
                     lambda: on_grid(table @ table.T)),
                    ("rows and columns of the grid are swapped: rearrange '(h1 w1) (h2 w2) -> h1 w1 h2 w2'",
                     lambda: rearrange(F.normalize(table, dim=-1) @ F.normalize(table, dim=-1).T,
                                       "(b a) (d c) -> a b c d", a=gh, b=gw, c=gh, d=gw)),
                ], shape_hints=[((n, n), "lay the (N, N) similarities out on the grid: (gh, gw, gh, gw)"),
                                ((n + 1, n + 1), "drop the class token's row first, then lay the similarities out "
                                                 "on the grid")])
