"""Checks of vit_course/interpret.py (chapter 08): attention_rollout and mean_attention_distance."""

# ruff: noqa: B023  (each diagnosis thunk is called by Checker.close in the loop iteration that builds it)

import torch

from .. import interpret as ref
from .. import patches
from .core import check
from .probes import call_naming, works_on


def _attention(g, b, h, n):
    return (torch.randn(b, h, n, n, generator=g) * 2).softmax(-1)  # (b, h, n, n), rows sum to 1


def _rollout(attentions, heads="mean", identity=True, renorm=True, order="last-left", axis=-1):
    rollout = None
    for a in attentions:
        a = {"mean": a.mean(1), "max": a.amax(1), "sum": a.sum(1), "first": a[:, 0]}[heads]  # (b, n, n)
        a = a + torch.eye(a.shape[-1]) if identity is True else a
        a = a / a.sum(axis, keepdim=True) if renorm and identity is True else a
        rollout = a if rollout is None else a @ rollout if order == "last-left" else rollout @ a
    if identity == "end":  # once, after the product
        rollout = rollout + torch.eye(rollout.shape[-1])
        rollout = rollout / rollout.sum(-1, keepdim=True)
    return rollout


@check("attention_rollout")
def attention_rollout(c, fn):
    """attention_rollout(list of (b, h, n, n)) -> (b, n, n): mean over heads, + identity, renormalise, multiply."""
    g = torch.Generator().manual_seed(23)
    for layers, b, h, n in ((3, 2, 3, 5), (1, 1, 2, 4), (4, 3, 1, 7), (2, 2, 4, 3)):
        attentions = [_attention(g, b, h, n) for _ in range(layers)]
        got = c.call(fn, attentions)
        expected = ref.attention_rollout(attentions)
        c.close(got, expected, f"rollout of {layers} layers of {b}x{h}x{n}x{n} weights", [
            ("the identity (the residual path) is not added: A + I, then renormalise the rows",
             lambda: _rollout(attentions, identity=False)),
            ("the rows are not renormalised after adding the identity: divide each row by its sum",
             lambda: _rollout(attentions, renorm=False)),
            ("the layers are multiplied in the wrong order: the last layer goes on the left, R = A_L ... A_1",
             lambda: _rollout(attentions, order="first-left")),
            ("the heads are combined with max: average them, mean over dim 1", lambda: _rollout(attentions, "max")),
            ("the heads are summed: average them, mean over dim 1", lambda: _rollout(attentions, "sum")),
            ("only head 0 is used: average the heads of each layer, a.mean(dim=1)",
             lambda: _rollout(attentions, "first")),
            ("the identity is added once, after the product: add it to every layer, A_l + I, renormalise, then "
             "multiply", lambda: _rollout(attentions, identity="end")),
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
    c.close(got, ref.attention_rollout(half), "rollout of float16 weights", atol=1e-3)
    _rollout_errors(c, fn, g)


def _rollout_errors(c, fn, g):
    hint = ("validate the input: an empty list, weights that are not (b, h, n, n) (call check_attention(attention, "
            "f\"attentions[{i}]\")) and layers of different n each raise a ValueError")
    c.raises(fn, [], why="an empty list of layers", hint=hint)
    c.raises(fn, [_attention(g, 2, 3, 4).mean(1)], why="weights of shape (2, 4, 4), without a head axis", hint=hint)
    c.raises(fn, [_attention(g, 2, 3, 4), _attention(g, 2, 3, 5)], why="layers with 4 and 5 tokens", hint=hint)


def _distance(attention, grid, patch, prefix, renorm=True, pixels=True, swap=False, metric="euclid", axis=-1,
              reduce="keys"):
    gh, gw = grid
    ph, pw = patches.to_pair(patch) if pixels else (1, 1)
    ph, pw = (pw, ph) if swap == "patch" else (ph, ph) if swap == "first" else (ph, pw)
    a = attention[:, :, prefix:, prefix:]  # (b, h, N, N)
    a = a / a.sum(axis, keepdim=True) if renorm else a
    if swap is True:  # patches laid out column by column
        xs, ys = torch.meshgrid(torch.arange(gw), torch.arange(gh), indexing="ij")
    else:
        ys, xs = torch.meshgrid(torch.arange(gh), torch.arange(gw), indexing="ij")
    centres = torch.stack([ys.flatten() * ph, xs.flatten() * pw], -1).float()  # (N, 2)
    distance = torch.cdist(centres, centres, p=1.0 if metric == "manhattan" else 2.0)  # (N, N)
    distance = distance ** 2 if metric == "squared" else distance
    if reduce == "heads":  # the heads averaged too, one number repeated
        return (a * distance).sum(-1).mean().expand(a.shape[1])
    return (a * distance).mean(-1).mean((0, 2)) if reduce == "mean" else (a * distance).sum(-1).mean((0, 2))  # (h,)


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
    ("only the patch's height is used: patch_size is (Ph, Pw), rows are Ph pixels apart, columns Pw",
     dict(swap="first")),
    ("the heads are averaged too: one mean distance per head, averaged over the batch and the queries only",
     dict(reduce="heads")),
    ("the distances are averaged over the keys: weight each by its attention and sum, (a * distance).sum(-1)",
     dict(reduce="mean")),
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
        c.close(got, ref.mean_attention_distance(attention, grid_arg, patch), f"mean attention distance of "
                f"{b}x{h}x{n}x{n} weights on a {grid[0]}x{grid[1]} grid of {patch}-pixel patches",
                [(hint, lambda kw=kw: _distance(attention, grid, patch, prefix, **kw)) for hint, kw in DISTANCE_HINTS],
                atol=1e-4, shape_hints=[((), "return one distance per head, (h,): average over batch and queries "
                                             "only"), ((b, h), "average over the batch too: the result is (h,)")])
    hint = "call the given check_attention(attention) and num_prefix(n, grid_size) first"
    c.raises(fn, _attention(g, 2, 3, 5).mean(1), 2, 4, why="weights of shape (2, 5, 5), without a head axis",
             hint=hint)
    c.raises(fn, _attention(g, 2, 3, 5), 3, 4, why="5 tokens cannot hold a 3x3 grid of patches", hint=hint)
