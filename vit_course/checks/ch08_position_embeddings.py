"""Check of vit_course/embeddings.py (chapter 08): position_embedding_similarity."""

# ruff: noqa: B023  (each diagnosis thunk is called by Checker.close in the loop iteration that builds it)

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn

from .. import embeddings as ref
from .core import check
from .probes import call_half, call_naming, works_on


def _cosines(table):
    unit = F.normalize(table, dim=-1)  # (m, D)
    return unit @ unit.T  # (m, m)


def _similarity_hints(pos, grid, prefix):
    """(hint, thunk) pairs: the similarities that the usual slips give for the table ``pos``."""
    gh, gw = grid
    rows = pos.detach().reshape(-1, pos.shape[-1])  # (n, D)
    table = rows[prefix:]  # (N, D)

    def on_grid(sim, pattern="(h1 w1) (h2 w2) -> h1 w1 h2 w2"):
        return rearrange(sim, pattern, h1=gh, w1=gw, h2=gh, w2=gw)

    return [
        ("these are dot products: normalise the embeddings to unit length first (cosine similarity)",
         lambda: on_grid(table @ table.T)),
        ("the last rows were dropped: the class token's row is the first, so keep the rows from k = n - gh * gw on",
         lambda: on_grid(_cosines(rows[:gh * gw]))),
        ("rows and columns of the grid are swapped: rearrange '(h1 w1) (h2 w2) -> h1 w1 h2 w2'",
         lambda: on_grid(_cosines(table), "(w1 h1) (w2 h2) -> h1 w1 h2 w2")),
        ("the embeddings are normalised over the wrong axis: each embedding (row) to unit length, "
         "F.normalize(table, dim=-1)", lambda: on_grid(F.normalize(table, dim=0) @ F.normalize(table, dim=0).T)),
    ]


@check("position_embedding_similarity")
def position_embedding_similarity(c, fn):
    """position_embedding_similarity(pos_embed (1, n, D) or (n, D), grid_size) -> (gh, gw, gh, gw) cosines."""
    g = torch.Generator().manual_seed(25)
    for shape, grid, prefix in (((1, 17, 8), (4, 4), 1), ((16, 8), (4, 4), 0), ((1, 16, 6), (3, 5), 1),
                                ((1, 6, 12), (2, 3), 0)):
        pos = torch.randn(shape, generator=g)
        if len(shape) == 3 and prefix:
            pos = nn.Parameter(pos)  # as it comes from a model: requires grad
        grid_arg = grid[0] if grid[0] == grid[1] else grid
        got = call_naming(c, fn, pos, grid_arg, cause=lambda: prefix and works_on(
            fn, pos[..., prefix:, :], grid_arg) and "the class token's row is kept: drop the first k = n - gh * gw "
            "rows (the given num_prefix(n, grid_size) gives k), then compare the patches' rows" or None)
        c.ok(not (torch.is_tensor(got) and got.requires_grad), "the result still requires grad",
             "call .detach() on the table first (it may be a model's parameter), so the result can be plotted")
        n = grid[0] * grid[1]
        c.close(got, ref.position_embedding_similarity(pos, grid_arg),
                f"similarities of position embeddings {tuple(shape)} on a {grid[0]}x{grid[1]} grid",
                _similarity_hints(pos, grid, prefix),
                shape_hints=[((n, n), "lay the (N, N) similarities out on the grid: (gh, gw, gh, gw)"),
                             ((n + 1, n + 1), "drop the class token's row first, then lay the similarities out "
                                              "on the grid")])
    _similarity_extras(c, fn, g)


def _similarity_extras(c, fn, g):
    """float16 tables give float32 similarities; tables that are not (1, n, D) or (n, D) raise a ValueError."""
    pos, got = call_half(c, fn, (1, 10, 8), g, 3, expect=torch.float32,
                         problem="a float16 table gave {dtype} similarities, expected float32",
                         hint="call .float() on the table first: half precision loses the small differences "
                              "between embeddings")
    c.close(got, ref.position_embedding_similarity(pos, 3), "similarities of a float16 table", atol=1e-5)
    hint = ("check the shape: the table must be 2-D (n, D) or 3-D (1, n, D); and n must hold the grid (the given "
            "num_prefix raises that ValueError)")
    c.raises(fn, torch.randn(2, 5, 8, generator=g), 3, why="a table of shape (2, 5, 8): the first axis must be 1",
             hint=hint)
    c.raises(fn, torch.randn(1, 1, 10, 8, generator=g), 3, why="a 4-D table of shape (1, 1, 10, 8)", hint=hint)
    c.raises(fn, torch.randn(1, 8, 8, generator=g), 3, why="8 embeddings cannot hold a 3x3 grid", hint=hint)
