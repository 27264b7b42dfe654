"""Chapter 09's exercise: resample_position_embeddings (bicubic on the patch grid, prefix kept, dtype kept): check
and rules (each slip written as the knob of ``_resample`` that produces it)."""

import torch
import torch.nn.functional as F
from einops import rearrange

from .. import patches as ref
from .core import IN_PLACE, Slip, Variant, check
from .probes import call_half

# each exercise's rules, by the key a check passes to Checker.phase (a failure carries it as CheckFailed.rule);
# the statement (the exercise's markdown and stub docstring) is where their words are written
RULES = {
    "resample_position_embeddings": ("output", "dtype", "error"),
}


def _resample(mode="bicubic", align=False, antialias=True, prefix="front", layout="hw", old="given", new="hw",
              dtype=True, check=True):
    """resample_position_embeddings with one slip: each argument says how it lays out, resizes or puts back."""
    def resample_position_embeddings(pos_embed, new_grid, num_prefix_tokens=1, old_grid=None):
        k = num_prefix_tokens
        head, rows = pos_embed[:, :k], pos_embed[:, k:]  # (1, k, D), (1, N, D)
        n, side = rows.shape[1], round(rows.shape[1] ** 0.5)
        if check and old_grid is None and side * side != n:
            raise ValueError(f"{n} patch embeddings do not form a square grid: pass old_grid")
        grid = (side, side) if old_grid is None or old == "ignored" else tuple(old_grid)[::-1 if old == "wh" else 1]
        if check and grid[0] * grid[1] != n:
            raise ValueError(f"old_grid {grid} does not hold {n} patches")
        size = ref.to_pair(new_grid)[::-1 if new == "wh" else 1]
        if layout == "flat":  # along the sequence, not on the grid
            out = F.interpolate(rows.transpose(1, 2).float(), size=size[0] * size[1], mode="linear").transpose(1, 2)
        else:
            image = rows.reshape(1, rows.shape[-1], *grid) if layout == "no_permute" else rearrange(
                rows, "1 (w h) d -> 1 d h w", h=grid[0]) if layout == "read_columns" else rearrange(
                rows, "1 (h w) d -> 1 d h w", h=grid[0])  # (1, D, gh, gw)
            image = F.interpolate(image.float(), size=size, mode=mode, align_corners=align if mode != "nearest"
                                  else None, antialias=antialias and mode in ("bicubic", "bilinear"))
            back = "1 d h w -> 1 (w h) d" if layout == "columns" else "1 d h w -> 1 (h w) d"
            out = rearrange(image, back)  # (1, new_gh*new_gw, D)
        out = out.to(pos_embed.dtype) if dtype else out
        parts = {"front": [head, out], "end": [out, head], "dropped": [out]}[prefix]
        return torch.cat(parts, 1)
    return resample_position_embeddings


def _resample_in_place(pos_embed, new_grid, num_prefix_tokens=1, old_grid=None):
    pos_embed[:, num_prefix_tokens:] -= pos_embed[:, num_prefix_tokens:].mean()  # "centre them first", in place
    return ref.resample_position_embeddings(pos_embed, new_grid, num_prefix_tokens, old_grid)


OLD_IGNORED = ("with a valid old_grid given, lay the patches out on old_grid (h=old_grid[0]) rather than on a square "
               "grid of your own")
SWAPPED = ("rows and columns are swapped (the patches laid out, or flattened back, columns first): both use (h w), "
           "rows first: '1 (h w) d -> 1 d h w' with h=gh, then '1 d h w -> 1 (h w) d'")
KEEP = "keep the first num_prefix_tokens rows as they are and concatenate them back in front of the resized grid"
SLIPS = [Slip("resample_position_embeddings", name, "output", hint, _resample(**knobs)) for name, hint, knobs in [
    ("bilinear", "this is bilinear interpolation: use mode='bicubic' (as timm does)", dict(mode="bilinear")),
    ("nearest", "this is nearest-neighbour interpolation: use mode='bicubic' (as timm does)", dict(mode="nearest")),
    ("align", "align_corners=True: use align_corners=False, as timm does", dict(align=True)),
    ("no_antialias", "antialias=False: pass antialias=True, as the statement (and timm) do; it selects PIL's bicubic "
                     "kernel, the one the chapter's numbers come from", dict(antialias=False)),
    ("old_wh", "old_grid is (rows, columns): lay the patches out with h=old_grid[0]", dict(old="wh")),
    ("old_ignored", OLD_IGNORED, dict(old="ignored", check=False)),
    ("new_wh", "new_grid is (rows, columns): interpolate to size=(new_gh, new_gw), in that order", dict(new="wh")),
    ("no_permute", "the grid was reshaped without moving the features first: .reshape(1, D, gh, gw) mixes features "
                   "and patches; lay it out with rearrange(rows, '1 (h w) d -> 1 d h w', h=gh) (or reshape to "
                   "(1, gh, gw, D), then permute)", dict(layout="no_permute")),
    ("read_columns", SWAPPED, dict(layout="read_columns")),
    ("columns", SWAPPED, dict(layout="columns")),
    ("flat", "this interpolates along the flat sequence: lay the patch embeddings out on their 2D grid (1, D, gh, gw) "
             "and resize that", dict(layout="flat")),
    ("dropped", "the class token's embedding was dropped: " + KEEP, dict(prefix="dropped")),
    ("appended", "the class token's embedding is put back at the end: " + KEEP, dict(prefix="end")),
]]
SLIPS += [
    Slip("resample_position_embeddings", "float32", "dtype", "interpolate in float32 (`.float()`: bicubic has no "
         "float16 version on every device), then convert the result back with .to(pos_embed.dtype)",
         _resample(dtype=False)),
    Slip("resample_position_embeddings", "no_check", "error", "with old_grid=None, check that the number of patches is "
         "a square and raise a ValueError asking for old_grid", _resample(check=False)),
    Slip("resample_position_embeddings", "centred", "inputs", IN_PLACE, _resample_in_place),
]
HINT = {s.name: s for s in SLIPS}  # the slips the check names directly


@check("resample_position_embeddings")
def resample_position_embeddings(c, fn):
    """(1, prefix + gh*gw, D) -> (1, prefix + new_gh*new_gw, D): patch embeddings resized bicubically (antialias=True,
    as timm) on their grid, the prefix rows kept in front, the dtype kept; ValueErrors for a grid that does not fit."""
    g = torch.Generator().manual_seed(14)
    slips = c.slips("output")
    cases = (((1, 17, 8), 6, {}), ((1, 17, 6), (6, 8), {}), ((1, 9, 5), 5, dict(num_prefix_tokens=0)),
             ((1, 16, 4), (6, 4), dict(old_grid=(3, 5))), ((1, 26, 7), 3, {}), ((1, 13, 3), (2, 5), dict(
                 old_grid=(4, 3))))
    c.phase("output")
    for shape, new_grid, kwargs in cases:
        pos = torch.randn(shape, generator=g)
        got = c.call(fn, pos, new_grid, errors=[("", OLD_IGNORED)] if "old_grid" in kwargs else (), **kwargs)
        c.close(got, ref.resample_position_embeddings(pos, new_grid, **kwargs), f"position embeddings {shape} "
                f"resampled to grid {new_grid} ({kwargs or 'defaults'})", c.named(slips, pos, new_grid, **kwargs),
                atol=1e-5)
    c.phase("dtype")
    pos, got = call_half(c, fn, (1, 17, 8), g, 6, expect=torch.float16, hint=HINT["float32"],
                         problem="float16 position embeddings came back as {dtype}")
    c.close(got, ref.resample_position_embeddings(pos, 6), "float16 position embeddings resampled to grid 6",
            atol=2e-3, rtol=2e-3)
    c.raises(fn, torch.randn(1, 13, 4, generator=g), 4, why="12 patch embeddings (after the class token) do not "
             "form a square grid and no old_grid was given", hint=HINT["no_check"], rule="error")
    c.raises(fn, torch.randn(1, 17, 4, generator=g), 4, old_grid=(3, 5), why="old_grid (3, 5) holds 15 patches, "
             "pos_embed has 16", hint="check old_grid[0] * old_grid[1] against the number of patch rows")


VARIANTS = [Variant("resample_position_embeddings", "reference", ref.resample_position_embeddings),
            Variant("resample_position_embeddings", "plain", _resample()),
            Variant("resample_position_embeddings", "in_float32", lambda pos, new_grid, num_prefix_tokens=1,
                    old_grid=None: ref.resample_position_embeddings(pos.float(), new_grid, num_prefix_tokens,
                                                                    old_grid).to(pos.dtype))]
