"""Check of vit_course/embeddings.py (chapter 08): position_embedding_similarity."""

# ruff: noqa: B023  (each diagnosis thunk is called by Checker.close in the loop iteration that builds it)

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn

from .. import embeddings as ref
from .ch08_attention_maps import square_sizes
from .core import IN_PLACE, Slip, Variant, check
from .probes import call_half, call_naming, works_on

SIMILARITY_NOT_ON_GRID = "lay the (N, N) similarities out on the grid: (gh, gw, gh, gw)"
SIMILARITY_KEEP_CLASS_ROW = ("the class token's row is kept: drop the first k = n - gh * gw rows (the given "
                             "num_prefix(n, grid_size) gives k), then compare the patches' rows")
SIMILARITY_PREFIX_TWICE = ("the class token's row was dropped twice (the table sliced with [k:], then its patch rows "
                           "sliced again): drop the first k = num_prefix(n, grid_size) rows once")
SIMILARITY_FIXED_PREFIX = ("the number of prefix rows dropped is fixed in your code (e.g. `[1:]`), not read from the "
                           "table: a table of patches only (n = gh * gw) has none; drop the first k = num_prefix(n, "
                           "grid_size) rows, 0 or 1")
SIMILARITY_2D_AS_3D = ("a plain (n, D) table was indexed as if it were (1, n, D) (`pos_embed[0, k:]` takes its first "
                       "row, `pos_embed[:, k:]` its columns): take [0] of a 3-D table only, then slice the rows")
SIMILARITY_NO_DETACH = "call .detach() on the table first (it may be a model's parameter), so the result can be plotted"
SIMILARITY_NO_FLOAT = "call .float() on the table first: half precision loses the small differences between embeddings"
SIMILARITY_NO_SHAPE_CHECK = ("check the shape: the table must be 2-D (n, D) or 3-D (1, n, D); and n must hold the "
                             "grid (the given num_prefix raises that ValueError)")


@check("position_embedding_similarity")
def position_embedding_similarity(c, fn):
    """position_embedding_similarity(pos_embed (1, n, D) or (n, D), grid_size) -> (gh, gw, gh, gw) cosines."""
    g = torch.Generator().manual_seed(25)
    for shape, grid, prefix in (((1, 17, 8), (4, 4), 1), ((16, 8), (4, 4), 0), ((1, 16, 6), (3, 5), 1),
                                ((1, 6, 12), (2, 3), 0), ((13, 10), (3, 4), 1)):
        pos = torch.randn(shape, generator=g)
        if len(shape) == 3 and prefix:
            pos = nn.Parameter(pos)  # as it comes from a model: requires grad
        grid_arg = grid[0] if grid[0] == grid[1] else grid
        got = call_naming(c, fn, pos, grid_arg, cause=lambda: _prefix_cause(fn, pos, grid_arg, prefix))
        c.ok(not (torch.is_tensor(got) and got.requires_grad), "the result still requires grad", SIMILARITY_NO_DETACH)
        n = grid[0] * grid[1]
        c.close(got, ref.position_embedding_similarity(pos, grid_arg),
                f"similarities of position embeddings {tuple(shape)} on a {grid[0]}x{grid[1]} grid",
                c.named(c.slips("output"), pos, grid_arg),
                shape_hints=[((n, n), SIMILARITY_NOT_ON_GRID),
                             ((n + 1, n + 1), "drop the class token's row first, then lay the similarities out "
                                              "on the grid")])
    _similarity_extras(c, fn, g)


def _prefix_cause(fn, pos, grid_arg, prefix):
    """Why learner code raised on a table whose first ``prefix`` rows precede the patches': the prefix rows dropped
    twice, a fixed number of them dropped, or kept (from the square matrices it built and the tables it runs on);
    or None."""
    if pos.ndim == 2 and works_on(fn, pos[None], grid_arg):
        return SIMILARITY_2D_AS_3D
    n_patches = pos.shape[-2] - prefix
    sizes = square_sizes(fn, pos, grid_arg)  # the similarity matrix it built is (m, m), m the rows it kept
    if prefix and n_patches - prefix in sizes:
        return SIMILARITY_PREFIX_TWICE
    if not prefix and (n_patches - 1 in sizes or works_on(fn, torch.cat([pos[..., :1, :], pos], -2), grid_arg)):
        return SIMILARITY_FIXED_PREFIX  # it drops a row the table does not have (it runs once one is put in front)
    if prefix and works_on(fn, pos[..., prefix:, :], grid_arg):
        return SIMILARITY_KEEP_CLASS_ROW  # it runs once the class token's row is gone
    return None


def _similarity_extras(c, fn, g):
    """float16 tables give float32 similarities; tables that are not (1, n, D) or (n, D) raise a ValueError."""
    pos, got = call_half(c, fn, (1, 10, 8), g, 3, expect=torch.float32,
                         problem="a float16 table gave {dtype} similarities, expected float32",
                         hint=SIMILARITY_NO_FLOAT)
    c.close(got, ref.position_embedding_similarity(pos, 3), "similarities of a float16 table", atol=1e-5)
    hint = SIMILARITY_NO_SHAPE_CHECK
    c.raises(fn, torch.randn(2, 5, 8, generator=g), 3, why="a table of shape (2, 5, 8): the first axis must be 1",
             rule="error", hint=hint)
    c.raises(fn, torch.randn(1, 1, 10, 8, generator=g), 3, why="a 4-D table of shape (1, 1, 10, 8)", hint=hint)
    c.raises(fn, torch.randn(1, 8, 8, generator=g), 3, why="8 embeddings cannot hold a 3x3 grid", hint=hint)


# each exercise's rules, by the key a check passes to Checker.phase (a failure carries it as CheckFailed.rule);
# the statement (the exercise's markdown and stub docstring) is where their words are written
RULES = {
    "position_embedding_similarity": ("output", "error"),
}


# ---- the catalogue: each slip once, with the rule it breaks and the hint it earns; the accepted variants
def similarity(slip=None):
    """position_embedding_similarity as a learner might write it, with one slip switched on (named as the slip)."""
    def position_embedding_similarity(pos_embed, grid_size):
        gh, gw = ref.to_pair(grid_size)
        if slip != "no_shape_check" and (pos_embed.ndim not in ((2, 3, 4) if slip == "flattens_4d" else (2, 3)) or
                                         (pos_embed.ndim == 3 and pos_embed.shape[0] != 1)):
            raise ValueError(f"pos_embed must be (1, n, D) or (n, D), got {tuple(pos_embed.shape)}")
        if slip == "in_place":  # "scale the table first", in the caller's tensor
            pos_embed.data.mul_(2)
        table = pos_embed.reshape(-1, pos_embed.shape[-1])  # (n, D)
        table = table if slip == "no_detach" else table.detach()
        table = table if slip == "no_float" else table.float()
        k = table.shape[0] - gh * gw if slip == "no_grid_check" else ref.num_prefix(table.shape[0], (gh, gw))
        table = {"keep_class_row": table, "drop_last_rows": table[:gh * gw]}.get(slip, table[k:])  # (N, D)
        if slip != "dot_products":
            table = F.normalize(table, dim=0 if slip == "wrong_axis" else -1)
        sim = table @ table.T  # (N, N)
        if slip == "not_on_grid":
            return sim
        pattern = "(w1 h1) (w2 h2) -> h1 w1 h2 w2" if slip == "columns_first" else "(h1 w1) (h2 w2) -> h1 w1 h2 w2"
        return rearrange(sim, pattern, h1=gh, w1=gw, h2=gh, w2=gw)
    return position_embedding_similarity


def similarity_by_cosine(pos_embed, grid_size):
    """Written from the statement alone: F.cosine_similarity on every pair, then a reshape to the grid."""
    gh, gw = ref.to_pair(grid_size)
    if pos_embed.dim() == 3:
        if pos_embed.size(0) != 1:
            raise ValueError("a 3-D table must be (1, n, D)")
        pos_embed = pos_embed.squeeze(0)
    elif pos_embed.dim() != 2:
        raise ValueError("the table must be (1, n, D) or (n, D)")
    patches = pos_embed.detach().float()[ref.num_prefix(len(pos_embed), (gh, gw)):]  # (N, D)
    sim = F.cosine_similarity(patches[:, None, :], patches[None, :, :], dim=-1)  # (N, N)
    return sim.reshape(gh, gw, gh, gw)


def similarity_fixed_prefix(pos_embed, grid_size):
    """The class token's row dropped with [1:] whatever the table holds: a table of patches only loses patch 0."""
    gh, gw = ref.to_pair(grid_size)
    if pos_embed.ndim == 3:
        if pos_embed.shape[0] != 1:
            raise ValueError(f"pos_embed must be (1, n, D) or (n, D), got shape {tuple(pos_embed.shape)}")
        pos_embed = pos_embed[0]
    if pos_embed.ndim != 2:
        raise ValueError(f"pos_embed must be (1, n, D) or (n, D), got shape {tuple(pos_embed.shape)}")
    ref.num_prefix(pos_embed.shape[0], (gh, gw))  # the table must hold the grid; its k is not used
    unit = F.normalize(pos_embed[1:].detach().float(), dim=-1)  # (n - 1, D)
    return (unit @ unit.T).reshape(gh, gw, gh, gw)


def similarity_prefix_dropped_twice(pos_embed, grid_size):
    """The prefix rows sliced off the table, then off its patch rows again."""
    gh, gw = ref.to_pair(grid_size)
    if pos_embed.ndim == 3:
        if pos_embed.shape[0] != 1:
            raise ValueError(f"pos_embed must be (1, n, D) or (n, D), got shape {tuple(pos_embed.shape)}")
        pos_embed = pos_embed[0]
    if pos_embed.ndim != 2:
        raise ValueError(f"pos_embed must be (1, n, D) or (n, D), got shape {tuple(pos_embed.shape)}")
    k = ref.num_prefix(pos_embed.shape[0], (gh, gw))
    patches = pos_embed[k:]  # (N, D)
    unit = F.normalize(patches[k:].detach().float(), dim=-1)  # (N - k, D): sliced again
    similarity = unit @ unit.T  # (N - k, N - k)
    return rearrange(similarity, "(h1 w1) (h2 w2) -> h1 w1 h2 w2", h1=gh, w1=gw, h2=gh, w2=gw)


def similarity_2d_as_3d(pos_embed, grid_size):
    """Every table indexed as (1, n, D): a plain (n, D) table gives its first row."""
    gh, gw = ref.to_pair(grid_size)
    if pos_embed.ndim not in (2, 3) or (pos_embed.ndim == 3 and pos_embed.shape[0] != 1):
        raise ValueError(f"pos_embed must be (1, n, D) or (n, D), got shape {tuple(pos_embed.shape)}")
    k = ref.num_prefix(pos_embed.shape[-2], (gh, gw))
    unit = F.normalize(pos_embed[0, k:].detach().float(), dim=-1)  # (N, D) of a 3-D table; (D - k,) of a 2-D one
    similarity = torch.einsum("id,jd->ij", unit, unit)  # (N, N)
    return rearrange(similarity, "(h1 w1) (h2 w2) -> h1 w1 h2 w2", h1=gh, w1=gw, h2=gh, w2=gw)


SLIPS = [Slip("position_embedding_similarity", name, rule, hint, similarity(name)) for name, rule, hint in [
    ("dot_products", "output", "these are dot products: normalise the embeddings to unit length first (cosine "
     "similarity)"),
    ("wrong_axis", "output", "the embeddings are normalised over the wrong axis: each embedding (row) to unit length, "
     "F.normalize(table, dim=-1)"),
    ("columns_first", "output", "rows and columns of the grid are swapped: rearrange '(h1 w1) (h2 w2) -> h1 w1 h2 "
     "w2'"),
    ("not_on_grid", "output", SIMILARITY_NOT_ON_GRID),
    ("keep_class_row", "output", SIMILARITY_KEEP_CLASS_ROW),
    ("drop_last_rows", "output", "the last rows were dropped: the class token's row is the first, so keep the rows "
     "from k = n - gh * gw on"),
    ("no_detach", "output", SIMILARITY_NO_DETACH),
    ("no_float", "output", SIMILARITY_NO_FLOAT),
    ("no_shape_check", "error", SIMILARITY_NO_SHAPE_CHECK),
    ("flattens_4d", "error", SIMILARITY_NO_SHAPE_CHECK),  # a 4-D table flattened instead of rejected
    ("in_place", "inputs", IN_PLACE),
    ("no_grid_check", "error", SIMILARITY_NO_SHAPE_CHECK),
]] + [Slip("position_embedding_similarity", impl.__name__.removeprefix("similarity_"), "output", hint, impl)
      for impl, hint in [(similarity_fixed_prefix, SIMILARITY_FIXED_PREFIX),
                         (similarity_prefix_dropped_twice, SIMILARITY_PREFIX_TWICE),
                         (similarity_2d_as_3d, SIMILARITY_2D_AS_3D)]]

VARIANTS = [Variant("position_embedding_similarity", name, impl) for name, impl in [
    ("reference_position_embedding_similarity", ref.position_embedding_similarity),
    ("similarity", similarity()),
    ("similarity_by_cosine", similarity_by_cosine),
]]
