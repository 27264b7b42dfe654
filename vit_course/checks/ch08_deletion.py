"""Check of vit_course/faithfulness.py (chapter 08's deletion test): delete_patches."""

# ruff: noqa: B023  (each diagnosis thunk is called by Checker.close in the loop iteration that builds it)

import math

import torch
from einops import rearrange

from .. import faithfulness as ref
from .. import patches
from .core import IN_PLACE, Slip, Variant, check

DELETE_SAME_TENSOR = ("return a new tensor, e.g. images * mask (or images.clone() before changing it): a caller who "
                      "changes the result must not change the input")
DELETE_PERCENT = "fraction is a fraction of the patches (0.5 = half of them), not a percentage"
DELETE_FILL = "a deleted patch is zero in the normalised input (the dataset's mean colour), not another value"
DELETE_NO_RANKING_CHECK = "compare ranking.shape with (batch, number of patches) and raise a ValueError"
DELETE_NO_FRACTION_CHECK = "check 0 <= fraction <= 1 and raise a ValueError"


@check("delete_patches")
def delete_patches(c, fn):
    """delete_patches(images (b, C, H, W), ranking (b, N), fraction, patch_size) -> the images with the
    round(fraction * N) highest-ranked patches of each image set to zero; the input unchanged."""
    g = torch.Generator().manual_seed(31)
    for b, size, p, fraction in ((3, (8, 12), 4, 0.5), (2, (8, 8), 2, 0.3), (4, (12, 8), 4, 0.25), (2, (8, 8), 4, 1.0),
                                 (2, (8, 8), 2, 0.2), (2, (8, 8), 4, 0.0), (3, (8, 8), 4, 0.625)):
        # 0.3 and 0.2 of 16: 4.8 and 3.2; 0.625 of 4: 2.5, which round() takes to the even 2
        images = torch.randn(b, 3, *size, generator=g) + 3.0  # no pixel is 0 by chance
        n = (size[0] // p) * (size[1] // p)
        ranking = torch.randn(b, n, generator=g)
        got = c.call(fn, images, ranking, fraction, p)
        c.ok(got is not images, "your function returned `images` itself", DELETE_SAME_TENSOR)
        expected = ref.delete_patches(images, ranking, fraction, p)
        # the record's slips, then a fill of any value (the "fill" slip fills with -1 only)
        c.close(got, expected, f"images after deleting round({fraction:g} * {n}) = {round(fraction * n)} of {n} "
                f"patches of {p}x{p} in {size}", c.named(
            c.slips("output"), images, ranking, fraction, p)
            + [(DELETE_FILL, lambda: torch.where(expected == 0, got[expected == 0].flatten()[0], images))],
            shape_hints=[((b, n), "return the images with the patches deleted, not the mask")])
    images = torch.randn(2, 3, 8, 8, generator=g)
    c.raises(fn, images, torch.randn(2, 3, generator=g), 0.5, 4, rule="error",
             why="a ranking of 3 patches for images of 4 patches of 4x4", hint=DELETE_NO_RANKING_CHECK)
    c.raises(fn, images, torch.randn(2, 4, generator=g), 1.5, 4, why="fraction=1.5 is not in [0, 1]",
             hint=DELETE_NO_FRACTION_CHECK)


# each exercise's rules, by the key a check passes to Checker.phase (a failure carries it as CheckFailed.rule);
# the statement (the exercise's markdown and stub docstring) is where their words are written
RULES = {
    "delete_patches": ("output", "error"),
}


# ---- the catalogue: each slip once, with the rule it breaks and the hint it earns; the accepted variants
def deleting(slip=None):
    """delete_patches as a learner might write it, with one slip switched on (named as the slip)."""
    def delete_patches(images, ranking, fraction, patch_size):
        b, _, h, w = images.shape
        gh, gw = h // patch_size, w // patch_size
        if slip != "no_ranking_check" and ranking.shape != (b, gh * gw):
            raise ValueError(f"ranking {tuple(ranking.shape)} is not (batch, patches) = {(b, gh * gw)}")
        if slip != "no_fraction_check" and not 0 <= fraction <= 1:
            raise ValueError(f"fraction {fraction} is not in [0, 1]")
        if slip == "same_tensor" and fraction == 0:
            return images
        k = {"int": int, "ceil": math.ceil}.get(slip, round)(fraction * gh * gw / (100 if slip == "percent" else 1))
        ranking = ranking[:1].expand(b, -1) if slip == "image_0" else ranking
        out = images if slip == "in_place" else images.clone()
        if slip == "batch_wide":
            top = ranking.flatten().topk(k * b).indices
            pairs = [(int(i) // (gh * gw), int(i) % (gh * gw)) for i in top]
        else:
            top = ranking.topk(k, dim=1, largest=slip != "lowest").indices  # (b, k)
            pairs = [(i, int(p)) for i in range(b) for p in top[i]]
        fill = -1.0 if slip == "fill" else 0.0
        for i, p in pairs:
            r, c = (p % gh, p // gh) if slip == "column_order" else divmod(p, gw)
            rows, cols = {  # where each slip writes; the statement's: the patch's P x P square
                "grid_pixel": (r, c), "flat_pixel": (p // w, p % w), "corner_pixel": (r * patch_size, c * patch_size),
                "grid_square": (slice(r, r + patch_size), slice(c, c + patch_size)),
            }.get(slip, (slice(r * patch_size, (r + 1) * patch_size), slice(c * patch_size, (c + 1) * patch_size)))
            out[i, slice(1) if slip == "first_channel" else slice(None), rows, cols] = fill
        return out
    return delete_patches


def deleting_with_patchify(images, ranking, fraction, patch_size):
    """Written from the statement alone: patchify, zero the top rows with a boolean index, unpatchify."""
    if ranking.shape != (images.shape[0], (images.shape[2] // patch_size) * (images.shape[3] // patch_size)):
        raise ValueError("ranking must be (b, N)")
    if fraction < 0 or fraction > 1:
        raise ValueError("fraction must be in [0, 1]")
    rows = ref.patchify(images, patch_size)  # (b, N, P*P*C), a new tensor
    top = ranking.argsort(dim=1, descending=True)[:, :round(fraction * ranking.shape[1])]  # (b, count)
    rows[torch.arange(len(images))[:, None], top] = 0.0
    return patches.unpatchify(rows, patch_size, tuple(images.shape[-2:]))


def delete_patches_tiled_mask(images, ranking, fraction, patch_size):
    """The (gh, gw) mask blown up with `repeat` (which tiles the whole grid) where `repeat_interleave` is needed."""
    gh, gw = patches.patch_grid(images.shape[-2:], patch_size)
    if ranking.shape != (images.shape[0], gh * gw):
        raise ValueError(f"ranking must be {(images.shape[0], gh * gw)}, got {tuple(ranking.shape)}")
    if not 0 <= fraction <= 1:
        raise ValueError(f"fraction must be in [0, 1], got {fraction}")
    keep = torch.ones(ranking.shape, dtype=images.dtype)  # (b, N)
    keep.scatter_(1, ranking.topk(round(fraction * gh * gw), dim=1).indices, 0.0)
    mask = rearrange(keep, "b (h w) -> b 1 h w", h=gh).repeat(1, 1, patch_size, patch_size)  # (b, 1, H, W), tiled
    return images * mask  # (b, C, H, W)


def delete_patches_round_half_up(images, ranking, fraction, patch_size):
    """The count rounded half up, int(x + 0.5), where round() takes a half to the even neighbour (round(2.5) == 2)."""
    gh, gw = patches.patch_grid(images.shape[-2:], patch_size)
    if ranking.shape != (images.shape[0], gh * gw):
        raise ValueError(f"ranking must be {(images.shape[0], gh * gw)}, got {tuple(ranking.shape)}")
    if not 0 <= fraction <= 1:
        raise ValueError(f"fraction must be in [0, 1], got {fraction}")
    keep = torch.ones(ranking.shape, dtype=images.dtype)  # (b, N)
    keep.scatter_(1, ranking.topk(int(fraction * gh * gw + 0.5), dim=1).indices, 0.0)
    mask = rearrange(keep, "b (h w) -> b 1 h w", h=gh).repeat_interleave(patch_size, -2)  # (b, 1, H, gw)
    return images * mask.repeat_interleave(patch_size, -1)  # (b, C, H, W)


SLIPS = [  # first: on 2.5 math.ceil deletes 3 as well, but a ceil fails on 3.2 before, a half up only on .5
    Slip("delete_patches", "round_half_up", "output", "round(fraction * N) patches are deleted, and Python's round "
         "takes a half to the even neighbour (round(2.5) == 2, round(3.5) == 4); int(x + 0.5) or math.floor(x + 0.5) "
         "rounds it up: call round() itself", delete_patches_round_half_up),
] + [Slip("delete_patches", name, rule, hint, deleting(name)) for name, rule, hint in [
    ("lowest", "output", "you deleted the patches ranked lowest: delete the highest-ranked ones (topk, largest=True)"),
    ("column_order", "output", "the patch numbers were read column by column: patches are numbered row by row from "
     "the top-left, as patchify numbers them ('b (h w)')"),
    ("grid_pixel", "output", "the patch numbers were used as pixel positions: each deleted patch is a P x P square of "
     "pixels, so scale the (gh, gw) mask up by P on both axes"),
    ("flat_pixel", "output", "the patch numbers were used as pixel positions: patch i is the P x P square at row i // "
     "gw, column i % gw of the grid, pixels [r*P:(r+1)*P, c*P:(c+1)*P]"),
    ("corner_pixel", "output", "only one pixel of each patch was deleted: a patch is P x P pixels, rows r*P to "
     "(r+1)*P - 1 and columns c*P to (c+1)*P - 1"),
    ("grid_square", "output", "the patch's grid row and column were used as its pixel position: patch (r, c) covers "
     "pixels [r*P:(r+1)*P, c*P:(c+1)*P]"),
    ("first_channel", "output", "only the first channel was zeroed: a deleted patch is zero in every channel (a (b, 1, "
     "H, W) mask broadcasts over them)"),
    ("percent", "output", DELETE_PERCENT),
    ("image_0", "output", "image 0's ranking was used for every image: each image has its own row of `ranking`"),
    ("int", "output", "round(fraction * N) patches are deleted, not int(fraction * N): int() rounds down"),
    ("ceil", "output", "round(fraction * N) patches are deleted, not math.ceil(fraction * N): math.ceil rounds up"),
    ("batch_wide", "output", "the highest-ranked patches of the whole batch were deleted: rank each image's patches on "
     "their own (topk over dim=1)"),
    ("in_place", "inputs", IN_PLACE),
    ("same_tensor", "output", DELETE_SAME_TENSOR),
    ("fill", "output", DELETE_FILL),
    ("no_ranking_check", "error", DELETE_NO_RANKING_CHECK),
    ("no_fraction_check", "error", DELETE_NO_FRACTION_CHECK),
]] + [Slip("delete_patches", "unchanged", "output", DELETE_PERCENT, lambda images, ranking, fraction, patch_size:
           images.clone())] + [
    Slip("delete_patches", "tiled_mask", "output", "the mask was tiled: `repeat` (torch's, or einops' "
         "'h w -> (p h) (q w)') copies the whole (gh, gw) grid P times side by side; blow each cell up to a P x P "
         "square, `repeat_interleave(P, dim)` on both axes (or einops 'h w -> (h p) (w q)')",
         delete_patches_tiled_mask),
]

VARIANTS = [Variant("delete_patches", name, impl) for name, impl in [
    ("reference_delete_patches", ref.delete_patches),
    ("deleting", deleting()),
    ("deleting_with_patchify", deleting_with_patchify),
]]
