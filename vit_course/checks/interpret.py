"""Checks for chapter 08's interpretation tools: attention_rollout, mean_attention_distance,
position_embedding_similarity."""

# ruff: noqa: B023  (each diagnosis thunk is called by Checker.close in the loop iteration that builds it)

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn

from ..patches import to_pair
from .common import call_half, reference
from .core import CheckFailed, check, is_stub


def _attention(g, b, h, n):
    return (torch.randn(b, h, n, n, generator=g) * 2).softmax(-1)  # (b, h, n, n), rows sum to 1


def call_naming(c, fn, *args, cause):
    """``c.call(fn, *args)``; when the learner's code raises, ``cause()`` may name why (a hint, or None), and that
    hint replaces the generic one."""
    try:
        return c.call(fn, *args)
    except CheckFailed as failure:
        error = failure.__context__  # what the learner's code raised, if it raised
        if error is None or isinstance(error, CheckFailed) or (isinstance(error, NotImplementedError)
                                                               and is_stub(error)):
            raise
        hint = cause()
        if hint is None:
            raise
        c.fail(str(failure).removeprefix(f"{c.name}: ").split("\n  likely cause:")[0], hint)


def works_on(fn, *args):
    """A cause finder for ``call_naming``: True when ``fn(*args)`` runs without an error."""
    try:
        fn(*args)
    except Exception:
        return False
    return True


def _rollout(attentions, heads="mean", identity=True, renorm=True, order="last-left", axis=-1):
    rollout = None
    for a in attentions:
        a = a.mean(1) if heads == "mean" else a.amax(1) if heads == "max" else a.sum(1)  # (b, n, n)
        a = a + torch.eye(a.shape[-1]) if identity else a
        a = a / a.sum(axis, keepdim=True) if renorm else a
        rollout = a if rollout is None else a @ rollout if order == "last-left" else rollout @ a
    return rollout


@check("attention_rollout")
def attention_rollout(c, fn):
    """attention_rollout(list of (b, h, n, n)) -> (b, n, n): mean over heads, + identity, renormalise, multiply."""
    g = torch.Generator().manual_seed(23)
    for layers, b, h, n in ((3, 2, 3, 5), (1, 1, 2, 4), (4, 3, 1, 7), (2, 2, 4, 3)):
        attentions = [_attention(g, b, h, n) for _ in range(layers)]
        got = c.call(fn, attentions)
        expected = reference("attention_rollout")(attentions)
        c.close(got, expected, f"rollout of {layers} layers of {b}x{h}x{n}x{n} weights", [
            ("the identity (the residual path) is not added: A + I, then renormalise the rows",
             lambda: _rollout(attentions, identity=False)),
            ("the rows are not renormalised after adding the identity: divide each row by its sum",
             lambda: _rollout(attentions, renorm=False)),
            ("the layers are multiplied in the wrong order: the last layer goes on the left, R = A_L ... A_1",
             lambda: _rollout(attentions, order="first-left")),
            ("the heads are combined with max: average them, mean over dim 1", lambda: _rollout(attentions, "max")),
            ("the heads are summed: average them, mean over dim 1", lambda: _rollout(attentions, "sum")),
            ("only the last layer is used: multiply through every layer", lambda: _rollout(attentions[-1:])),
            ("the first layer is left out: multiply through every layer, starting with attentions[0]",
             lambda: _rollout(attentions[1:])),
            ("the rows are renormalised over the wrong axis: divide each row by its own sum, "
             "a.sum(dim=-1, keepdim=True)", lambda: _rollout(attentions, axis=-2)),
        ], shape_hints=[((b, h, n, n), "average over the heads: the rollout is (b, n, n)")])
    half = [_attention(g, 2, 2, 4).half() for _ in range(2)]
    got = c.call(fn, half)
    if torch.is_tensor(got) and got.dtype != torch.float32:
        c.fail(f"float16 weights gave a {got.dtype} rollout, expected float32",
               "convert each layer with .float() first: products of many layers lose precision in float16")
    c.close(got, reference("attention_rollout")(half), "rollout of float16 weights", atol=1e-3)
    _rollout_errors(c, fn, g)


def _rollout_errors(c, fn, g):
    hint = ("validate the input: an empty list, weights that are not (b, h, n, n) (call check_attention(attention, "
            "f\"attentions[{i}]\")) and layers of different n each raise a ValueError")
    c.raises(fn, [], why="an empty list of layers", hint=hint)
    c.raises(fn, [_attention(g, 2, 3, 4).mean(1)], why="weights of shape (2, 4, 4), without a head axis", hint=hint)
    c.raises(fn, [_attention(g, 2, 3, 4), _attention(g, 2, 3, 5)], why="layers with 4 and 5 tokens", hint=hint)


def _distance(attention, grid, patch, prefix, renorm=True, pixels=True, swap=False, metric="euclid", axis=-1):
    gh, gw = grid
    ph, pw = to_pair(patch) if pixels else (1, 1)
    ph, pw = (pw, ph) if swap == "patch" else (ph, pw)
    a = attention[:, :, prefix:, prefix:]  # (b, h, N, N)
    a = a / a.sum(axis, keepdim=True) if renorm else a
    if swap is True:  # patches laid out column by column
        xs, ys = torch.meshgrid(torch.arange(gw), torch.arange(gh), indexing="ij")
    else:
        ys, xs = torch.meshgrid(torch.arange(gh), torch.arange(gw), indexing="ij")
    centres = torch.stack([ys.flatten() * ph, xs.flatten() * pw], -1).float()  # (N, 2)
    distance = torch.cdist(centres, centres, p=1.0 if metric == "manhattan" else 2.0)  # (N, N)
    distance = distance ** 2 if metric == "squared" else distance
    return (a * distance).sum(-1).mean((0, 2))  # (h,)


DISTANCE_HINTS = (
    ("the distance is in patches, not pixels: multiply the patch-centre coordinates by patch_size", dict(pixels=False)),
    ("the weights on the patches are used as they are: once the class token's column is dropped a row no longer "
     "sums to 1, so divide each query's patch weights by their sum", dict(renorm=False)),
    ("rows and columns of the grid are swapped: patch i sits at row i // gw, column i % gw", dict(swap=True)),
    ("this is the city-block distance: use the straight-line (Euclidean) distance", dict(metric="manhattan")),
    ("these are squared distances: take the square root, the straight-line distance (torch.cdist gives it)",
     dict(metric="squared")),
    ("the weights are renormalised over the wrong axis: divide each query's (row's) patch weights by their own sum, "
     "a.sum(dim=-1, keepdim=True)", dict(axis=-2)),
    ("the patch's height and width are swapped: patch_size is (Ph, Pw), rows are Ph pixels apart, columns Pw",
     dict(swap="patch")),
)


@check("mean_attention_distance")
def mean_attention_distance(c, fn):
    """mean_attention_distance(attention (b, h, n, n), grid_size, patch_size) -> (h,) mean pixel distance."""
    g = torch.Generator().manual_seed(24)
    for b, h, grid, patch, prefix in ((2, 3, (4, 4), 4, 1), (1, 2, (3, 5), 2, 0), (3, 4, (2, 3), 7, 1),
                                      (2, 1, (5, 5), 16, 0), (2, 2, (3, 4), (2, 5), 1)):
        n = grid[0] * grid[1] + prefix
        attention = _attention(g, b, h, n)
        grid_arg = grid[0] if grid[0] == grid[1] else grid
        got = call_naming(c, fn, attention, grid_arg, patch, cause=lambda: prefix and works_on(
            fn, attention[:, :, prefix:, prefix:], grid_arg, patch) and "the class token's row and column are kept: "
            "slice the weights to the patches, attention[:, :, k:, k:], with k = num_prefix(n, grid_size)" or None)
        c.close(got, reference("mean_attention_distance")(attention, grid_arg, patch), f"mean attention distance of "
                f"{b}x{h}x{n}x{n} weights on a {grid[0]}x{grid[1]} grid of {patch}-pixel patches",
                [(hint, lambda kw=kw: _distance(attention, grid, patch, prefix, **kw)) for hint, kw in DISTANCE_HINTS],
                atol=1e-4, shape_hints=[((), "return one distance per head, (h,): average over batch and queries "
                                             "only"), ((b, h), "average over the batch too: the result is (h,)")])
    hint = "call the given check_attention(attention) and num_prefix(n, grid_size) first"
    c.raises(fn, _attention(g, 2, 3, 5).mean(1), 2, 4, why="weights of shape (2, 5, 5), without a head axis",
             hint=hint)
    c.raises(fn, _attention(g, 2, 3, 5), 3, 4, why="5 tokens cannot hold a 3x3 grid of patches", hint=hint)


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
        c.close(got, reference("position_embedding_similarity")(pos, grid_arg),
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
    c.close(got, reference("position_embedding_similarity")(pos, 3), "similarities of a float16 table", atol=1e-5)
    hint = ("check the shape: the table must be 2-D (n, D) or 3-D (1, n, D); and n must hold the grid (the given "
            "num_prefix raises that ValueError)")
    c.raises(fn, torch.randn(2, 10, 8, generator=g), 3, why="a table of shape (2, 10, 8): the first axis must be 1",
             hint=hint)
    c.raises(fn, torch.randn(1, 1, 10, 8, generator=g), 3, why="a 4-D table of shape (1, 1, 10, 8)", hint=hint)
    c.raises(fn, torch.randn(1, 8, 8, generator=g), 3, why="8 embeddings cannot hold a 3x3 grid", hint=hint)
