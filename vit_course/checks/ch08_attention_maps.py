"""Checks of vit_course/interpret.py (chapter 08): attention_rollout and mean_attention_distance."""

# ruff: noqa: B023  (each diagnosis thunk is called by Checker.close in the loop iteration that builds it)

import torch
from torch.overrides import TorchFunctionMode

from .. import interpret as ref
from .core import IN_PLACE, Slip, Variant, check
from .probes import call_naming, works_on

MAPS_KEEP_CLASS_TOKEN = ("the class token's row and column are kept: slice the weights to the patches, attention[:, "
                         ":, k:, k:], with k = num_prefix(n, grid_size)")
MAPS_PREFIX_TWICE = ("the class token's row and column were dropped twice (the weights sliced with [k:, k:], then "
                     "sliced again): slice attention[:, :, k:, k:] once")
MAPS_FIXED_PREFIX = ("the number of prefix tokens dropped is fixed in your code (e.g. `[1:, 1:]`), not read from the "
                     "weights: without a class token (n = gh * gw) there is none; slice attention[:, :, k:, k:] with "
                     "k = num_prefix(n, grid_size), 0 or 1")
MAPS_PER_IMAGE = "average over the batch too: the result is (h,)"
MAPS_NO_VALIDATION = "call the given check_attention(attention) and num_prefix(n, grid_size) first"
MAPS_NO_MEAN = "average over the heads: the rollout is (b, n, n)"
MAPS_KEEP_DTYPE = "convert each layer with .float() first: products of many layers lose precision in float16"
MAPS_NO_EMPTY_CHECK = ("validate the input: an empty list, weights that are not (b, h, n, n) (call "
                       'check_attention(attention, f"attentions[{i}]")) and layers of different n each raise a '
                       "ValueError")


class _SquareSizes(TorchFunctionMode):
    """Inside it, keeps the sizes m of the square (..., m, m) tensors that torch functions and tensor methods return:
    the token rows learner code kept, in the matrices it built."""

    def __init__(self):
        super().__init__()
        self.sizes = set()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if torch.is_tensor(out) and out.ndim >= 2 and out.shape[-1] == out.shape[-2]:
            self.sizes.add(out.shape[-1])
        return out


def square_sizes(fn, *args):
    """The sizes m of the square (..., m, m) tensors ``fn(*args)`` builds before it returns or raises (chapter 08's
    checks: how many of the n tokens learner code kept when it dropped the prefix tokens)."""
    squares = _SquareSizes()
    try:
        with squares:
            fn(*args)
    except Exception:
        pass
    return squares.sizes


def _prefix_cause(fn, attention, grid_arg, patch, prefix):
    """Why learner code raised on weights whose first ``prefix`` tokens precede the patches': the prefix dropped
    twice, a fixed number of tokens dropped, or the prefix kept; or None."""
    n_patches = attention.shape[-1] - prefix
    sizes = square_sizes(fn, attention, grid_arg, patch)  # the patch weights it kept are (b, h, m, m)
    if prefix and n_patches - prefix in sizes:
        return MAPS_PREFIX_TWICE
    if not prefix and (n_patches - 1 in sizes or works_on(fn, _with_class_token(attention), grid_arg, patch)):
        return MAPS_FIXED_PREFIX  # it drops a token the weights do not have (it runs once one is put in front)
    if prefix and works_on(fn, attention[:, :, prefix:, prefix:], grid_arg, patch):
        return MAPS_KEEP_CLASS_TOKEN  # it runs once the class token is gone
    return None


def _with_class_token(attention):
    """(b, h, n, n) weights with a class token put first, rows still summing to 1: (b, h, n + 1, n + 1)."""
    padded = torch.nn.functional.pad(attention, (1, 0, 1, 0), value=1.0)  # (b, h, n + 1, n + 1)
    return padded / padded.sum(-1, keepdim=True)


def _attention(g, b, h, n):
    return (torch.randn(b, h, n, n, generator=g) * 2).softmax(-1)  # (b, h, n, n), rows sum to 1


@check("attention_rollout")
def attention_rollout(c, fn):
    """attention_rollout(list of (b, h, n, n)) -> (b, n, n): mean over heads, + identity, renormalise, multiply."""
    g = torch.Generator().manual_seed(23)
    for layers, b, h, n in ((3, 2, 3, 5), (1, 1, 2, 4), (4, 3, 1, 7), (2, 2, 4, 3)):
        attentions = [_attention(g, b, h, n) for _ in range(layers)]
        got = c.call(fn, attentions)
        expected = ref.attention_rollout(attentions)
        c.close(got, expected, f"rollout of {layers} layers of {b}x{h}x{n}x{n} weights", c.named(
            c.slips("output"), attentions),
            shape_hints=[((b, h, n, n), MAPS_NO_MEAN)])
    half = [_attention(g, 2, 2, 4).half() for _ in range(2)]
    got = c.call(fn, half)
    if torch.is_tensor(got) and got.dtype != torch.float32:
        c.fail(f"float16 weights gave a {got.dtype} rollout, expected float32", MAPS_KEEP_DTYPE)
    c.close(got, ref.attention_rollout(half), "rollout of float16 weights", atol=1e-3)
    hint = MAPS_NO_EMPTY_CHECK
    c.raises(fn, [], why="an empty list of layers", hint=hint, rule="error")
    c.raises(fn, [_attention(g, 2, 3, 4).mean(1)], why="weights of shape (2, 4, 4), without a head axis", hint=hint)
    c.raises(fn, [_attention(g, 2, 3, 4), _attention(g, 2, 3, 5)], why="layers with 4 and 5 tokens", hint=hint)


@check("mean_attention_distance")
def mean_attention_distance(c, fn):
    """mean_attention_distance(attention (b, h, n, n), grid_size, patch_size) -> (h,) mean pixel distance."""
    g = torch.Generator().manual_seed(24)
    for b, h, grid, patch, prefix in ((2, 3, (4, 4), 4, 1), (1, 2, (3, 5), 2, 0), (3, 4, (2, 3), 7, 1),
                                      (2, 1, (5, 5), 16, 0), (2, 2, (3, 4), (2, 5), 1)):
        n = grid[0] * grid[1] + prefix
        attention = _attention(g, b, h, n)
        grid_arg = grid[0] if grid[0] == grid[1] else grid
        got = call_naming(c, fn, attention, grid_arg, patch,
                          cause=lambda: _prefix_cause(fn, attention, grid_arg, patch, prefix))
        c.close(got, ref.mean_attention_distance(attention, grid_arg, patch), f"mean attention distance of "
                f"{b}x{h}x{n}x{n} weights on a {grid[0]}x{grid[1]} grid of {patch}-pixel patches",
                c.named(c.slips("output"), attention, grid_arg, patch),
                atol=1e-4, shape_hints=[((), "return one distance per head, (h,): average over batch and queries "
                                             "only"), ((b, h), MAPS_PER_IMAGE)])
    hint = MAPS_NO_VALIDATION
    c.raises(fn, _attention(g, 2, 3, 5).mean(1), 2, 4, why="weights of shape (2, 5, 5), without a head axis",
             rule="error", hint=hint)
    c.raises(fn, _attention(g, 2, 3, 5), 3, 4, why="5 tokens cannot hold a 3x3 grid of patches", hint=hint)


# each exercise's rules, by the key a check passes to Checker.phase (a failure carries it as CheckFailed.rule);
# the statement (the exercise's markdown and stub docstring) is where their words are written
RULES = {
    "mean_attention_distance": ("output", "error"),
    "attention_rollout": ("output", "error"),
}


# ---- the catalogue: each slip once, with the rule it breaks and the hint it earns; the accepted variants
def distance(slip=None):
    """mean_attention_distance as a learner might write it, with one slip switched on (named as the slip)."""
    def mean_attention_distance(attention, grid_size, patch_size):
        gh, gw = ref.to_pair(grid_size)
        ph, pw = ref.to_pair(patch_size)
        if slip != "no_validation":
            ref.check_attention(attention)
        if slip == "in_place":  # "renormalise the rows first", in the caller's tensor
            attention = attention.mul_(2) / 2
        k = attention.shape[-1] - gh * gw if slip in ("no_validation", "no_grid_check") else ref.num_prefix(
            attention.shape[-1], (gh, gw))
        k = 0 if slip == "keep_class_token" else k
        a = attention[:, :, k:, k:]
        if slip != "no_renorm":
            a = a / a.sum(-2 if slip == "renorm_wrong_axis" else -1, keepdim=True)
        rows, cols = torch.meshgrid(torch.arange(gh), torch.arange(gw), indexing="ij")
        if slip == "column_major":  # patch i put at row i % gh, column i // gh
            rows, cols = torch.arange(gh * gw) % gh, torch.arange(gh * gw) // gh
        ph, pw = (pw, ph) if slip == "patch_swapped" else (ph, pw)
        ph, pw = (1, 1) if slip == "patches" else (ph, ph) if slip == "patch_height" else (ph, pw)
        centres = torch.stack([(rows.flatten() + 0.5) * ph, (cols.flatten() + 0.5) * pw], -1).float()  # (N, 2)
        diff = centres[:, None] - centres[None]  # (N, N, 2)
        d = {"manhattan": diff.abs().sum(-1), "squared": (diff ** 2).sum(-1)}.get(slip, diff.norm(dim=-1))
        per_query = (a * d).mean(-1) if slip == "keys_averaged" else (a * d).sum(-1)  # (b, h, N)
        if slip == "heads_averaged":  # one number repeated
            return per_query.mean().expand(a.shape[1])
        return per_query.mean(2) if slip == "per_image" else per_query.mean((0, 2))
    return mean_attention_distance


def distance_by_loops(attention, grid_size, patch_size):
    """Written from the statement alone: loops over query and key patches, centres from patch_centres."""
    ref.check_attention(attention)
    k = ref.num_prefix(attention.shape[-1], grid_size)
    centres = ref.patch_centres(grid_size, patch_size)  # (N, 2)
    n = len(centres)
    total = torch.zeros(attention.shape[1])
    for i in range(n):
        weights = attention[:, :, k + i, k:]  # (b, h, N): query i's weights on the patches
        weights = weights / weights.sum(-1, keepdim=True)
        d = torch.stack([torch.dist(centres[i], centres[j]) for j in range(n)])  # (N,)
        total += (weights * d).sum(-1).mean(0)  # (h,)
    return total / n


def mean_attention_distance_fixed_prefix(attention, grid_size, patch_size):
    """The class token dropped with [1:, 1:] whatever the weights hold: weights without one lose patch 0."""
    ref.check_attention(attention)
    ref.num_prefix(attention.shape[-1], grid_size)  # the weights must hold the grid; its k is not used
    a = attention[:, :, 1:, 1:].float()  # (b, h, n - 1, n - 1)
    a = a / a.sum(dim=-1, keepdim=True)
    centres = ref.patch_centres(grid_size, patch_size)  # (N, 2)
    return (a * torch.cdist(centres, centres)).sum(dim=-1).mean(dim=(0, 2))  # (h,)


def mean_attention_distance_prefix_dropped_twice(attention, grid_size, patch_size):
    """The prefix sliced off the weights, then off the patch weights again."""
    ref.check_attention(attention)
    k = ref.num_prefix(attention.shape[-1], grid_size)
    patches = attention[:, :, k:, k:].float()  # (b, h, N, N)
    a = patches[:, :, k:, k:]  # (b, h, N - k, N - k): sliced again
    a = a / a.sum(dim=-1, keepdim=True)
    centres = ref.patch_centres(grid_size, patch_size)  # (N, 2)
    return (a * torch.cdist(centres, centres)).sum(dim=-1).mean(dim=(0, 2))  # (h,)


def mean_attention_distance_prefix_last(attention, grid_size, patch_size):
    """The prefix tokens taken as the last k rows and columns, where they are the first."""
    ref.check_attention(attention)
    n = attention.shape[-1]
    k = ref.num_prefix(n, grid_size)
    a = attention[:, :, :n - k, :n - k].float()  # (b, h, N, N): the class token's column kept, patch N-1's dropped
    a = a / a.sum(dim=-1, keepdim=True)  # (b, h, N, N)
    centres = ref.patch_centres(grid_size, patch_size)  # (N, 2)
    distance = torch.cdist(centres, centres)  # (N, N)
    return (a * distance).sum(dim=-1).mean(dim=(0, 2))  # (h,)


SLIPS = [Slip("mean_attention_distance", name, rule, hint, distance(name)) for name, rule, hint in [
    ("patches", "output", "the distance is in patches, not pixels: multiply the patch-centre coordinates by "
     "patch_size"),
    ("no_renorm", "output", "the weights on the patches are used as they are: once the class token's column is dropped "
     "a row no longer sums to 1, so divide each query's patch weights by their sum"),
    ("renorm_wrong_axis", "output", "the weights are renormalised over the wrong axis: divide each query's (row's) "
     "patch weights by their own sum, a.sum(dim=-1, keepdim=True)"),
    ("squared", "output", "these are squared distances: take the square root, the straight-line distance (torch.cdist "
     "gives it)"),
    ("manhattan", "output", "this is the city-block distance: use the straight-line (Euclidean) distance"),
    ("column_major", "output", "rows and columns of the grid are swapped: patch i sits at row i // gw, column i % gw"),
    ("patch_swapped", "output", "the patch's height and width are swapped: patch_size is (Ph, Pw), rows are Ph pixels "
     "apart, columns Pw"),
    ("keep_class_token", "output", MAPS_KEEP_CLASS_TOKEN),
    ("per_image", "output", MAPS_PER_IMAGE),
    ("patch_height", "output", "only the patch's height is used: patch_size is (Ph, Pw), rows are Ph pixels apart, "
     "columns Pw"),
    ("heads_averaged", "output", "the heads are averaged too: one mean distance per head, averaged over the batch "
     "and the queries only"),
    ("keys_averaged", "output", "the distances are averaged over the keys: weight each by its attention and sum, "
     "(a * distance).sum(-1)"),
    ("no_validation", "error", MAPS_NO_VALIDATION),
    ("in_place", "inputs", IN_PLACE),
    ("no_grid_check", "error", MAPS_NO_VALIDATION),
]] + [Slip("mean_attention_distance", impl.__name__.removeprefix("mean_attention_distance_"), "output", hint, impl)
      for impl, hint in [
          (mean_attention_distance_prefix_last, "the prefix (class) token was taken as the last row and column: it "
           "comes first, so the patches are attention[:, :, k:, k:]"),
          (mean_attention_distance_fixed_prefix, MAPS_FIXED_PREFIX),
          (mean_attention_distance_prefix_dropped_twice, MAPS_PREFIX_TWICE)]]

VARIANTS = [Variant("mean_attention_distance", name, impl) for name, impl in [
    ("reference_mean_attention_distance", ref.mean_attention_distance),
    ("distance", distance()),
    ("distance_by_loops", distance_by_loops),
]]


def rollout(slip=None):
    """attention_rollout as a learner might write it, with one slip switched on (named as the slip)."""
    def attention_rollout(attentions):
        if slip != "no_empty_check" and len(attentions) == 0:
            raise ValueError("no layers")
        for i, a in enumerate(attentions):
            if slip != "no_shape_check":
                ref.check_attention(a, f"attentions[{i}]")
            if slip != "no_size_check" and a.shape[-1] != attentions[0].shape[-1]:
                raise ValueError(f"attentions[{i}] has {a.shape[-1]} tokens, attentions[0] {attentions[0].shape[-1]}")
        dtype = attentions[0].dtype if slip == "keep_dtype" else torch.float32
        layers = {"skip_first": attentions[1:], "last_only": attentions[-1:]}.get(slip, attentions)
        result = torch.eye(attentions[0].shape[-1], dtype=dtype)
        for a in layers:
            a = a.mul_(2).to(dtype) / 2 if slip == "in_place" else a.to(dtype)  # in the caller's tensors
            a = {"max": a.amax(1), "sum": a.sum(1), "no_mean": a, "head_0": a[:, 0]}.get(slip, a.mean(1))
            a = a if slip in ("no_identity", "identity_at_the_end") else a + torch.eye(a.shape[-1], dtype=dtype)
            if slip not in ("no_renorm", "identity_at_the_end"):
                a = a / a.sum(-2 if slip == "wrong_axis" else -1, keepdim=True)
            result = result @ a if slip == "first_left" else a @ result
        if slip == "identity_at_the_end":
            result = result + torch.eye(result.shape[-1], dtype=dtype)
            result = result / result.sum(-1, keepdim=True)
        return result
    return attention_rollout


def rollout_halves(attentions):
    """Written from the statement alone: (mean + I) / 2 (rows of the mean already sum to 1), einsum products."""
    if not attentions:
        raise ValueError("attention_rollout needs at least one layer")
    n = attentions[0].shape[-1]
    result = None
    for i, a in enumerate(attentions):
        if a.ndim != 4 or a.shape[-2:] != (n, n):
            raise ValueError(f"attentions[{i}] has shape {tuple(a.shape)}, expected (b, h, {n}, {n})")
        a = 0.5 * a.float().mean(1) + 0.5 * torch.eye(n)  # (b, n, n)
        result = a if result is None else torch.einsum("bij,bjk->bik", a, result)
    return result


SLIPS += [Slip("attention_rollout", name, rule, hint, rollout(name)) for name, rule, hint in [
    ("no_identity", "output", "the identity (the residual path) is not added: A + I, then renormalise the rows"),
    ("no_renorm", "output", "the rows are not renormalised after adding the identity: divide each row by its sum"),
    ("wrong_axis", "output", "the rows are renormalised over the wrong axis: divide each row by its own sum, "
     "a.sum(dim=-1, keepdim=True)"),
    ("first_left", "output", "the layers are multiplied in the wrong order: the last layer goes on the left, R = A_L "
     "... A_1"),
    ("max", "output", "the heads are combined with max: average them, mean over dim 1"),
    ("sum", "output", "the heads are summed: average them, mean over dim 1"),
    ("head_0", "output", "only head 0 is used: average the heads of each layer, a.mean(dim=1)"),
    ("identity_at_the_end", "output", "the identity is added once, after the product: add it to every layer, A_l + I, "
     "renormalise, then multiply"),
    ("no_mean", "output", MAPS_NO_MEAN),
    ("skip_first", "output", "the first layer is left out: multiply through every layer, starting with attentions[0]"),
    ("last_only", "output", "only the last layer is used: multiply through every layer"),
    ("keep_dtype", "output", MAPS_KEEP_DTYPE),
    ("no_empty_check", "error", MAPS_NO_EMPTY_CHECK),
    ("no_shape_check", "error", MAPS_NO_EMPTY_CHECK),
    ("in_place", "inputs", IN_PLACE),
    ("no_size_check", "error", MAPS_NO_EMPTY_CHECK),
]]

VARIANTS += [Variant("attention_rollout", name, impl) for name, impl in [
    ("reference_attention_rollout", ref.attention_rollout),
    ("rollout", rollout()),
    ("rollout_halves", rollout_halves),
]]
