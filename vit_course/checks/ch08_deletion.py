"""Check of vit_course/faithfulness.py (chapter 08's deletion test): delete_patches."""

# ruff: noqa: B023  (each diagnosis thunk is called by Checker.close in the loop iteration that builds it)

import math

import torch
from einops import rearrange

from .. import faithfulness as ref
from .core import check


def _deleted(images, ranking, fraction, patch_size, lowest=False, order="h w", count=round, batch_wide=False,
             shared=False, first_channel=False):
    """delete_patches with the usual slips, for diagnosis: (b, C, H, W)."""
    b, _, h, w = images.shape
    ranking = ranking[:1].expand(b, -1) if shared else ranking  # image 0's ranking for every image
    gh, gw = h // patch_size, w // patch_size
    k = count(fraction * gh * gw)
    keep = torch.ones(b, gh * gw)
    if batch_wide:  # the top patches of the whole batch, not of each image
        keep.view(-1)[ranking.flatten().topk(k * b, largest=not lowest).indices] = 0.0
    else:
        keep.scatter_(1, ranking.topk(k, dim=1, largest=not lowest).indices, 0.0)
    grid = rearrange(keep, "b (h w) -> b h w", h=gh) if order == "h w" else rearrange(keep, "b (w h) -> b h w", h=gh)
    mask = grid.repeat_interleave(patch_size, 1).repeat_interleave(patch_size, 2)[:, None]  # (b, 1, H, W)
    return torch.cat([images[:, :1] * mask, images[:, 1:]], 1) if first_channel else images * mask


def _pixels(images, ranking, fraction, patch_size, where="grid"):
    """Slips that zero one pixel per deleted patch: the pixel at the patch's grid position (``where="grid"``), the
    pixel numbered like the patch in the flattened image ("flat"), or the patch's top-left pixel ("corner")."""
    b, c, h, w = images.shape
    gh, gw = h // patch_size, w // patch_size
    keep = torch.ones(b, gh * gw).scatter_(1, ranking.topk(round(fraction * gh * gw), dim=1).indices, 0.0)
    mask = torch.ones(b, 1, h, w)
    if where == "grid":
        mask[:, :, :gh, :gw] = rearrange(keep, "b (h w) -> b 1 h w", h=gh)
    elif where == "flat":
        mask.view(b, 1, -1)[:, :, :gh * gw] = keep[:, None]
    elif where == "square":  # a P x P square whose top-left pixel is the patch's (row, column) in the grid
        for i, index in (keep == 0).nonzero().tolist():
            r, col = divmod(index, gw)
            mask[i, :, r:r + patch_size, col:col + patch_size] = 0
    else:
        mask[:, :, ::patch_size, ::patch_size] = rearrange(keep, "b (h w) -> b 1 h w", h=gh)
    return images * mask


@check("delete_patches")
def delete_patches(c, fn):
    """delete_patches(images (b, C, H, W), ranking (b, N), fraction, patch_size) -> the images with the
    round(fraction * N) highest-ranked patches of each image set to zero; the input unchanged."""
    g = torch.Generator().manual_seed(31)
    for b, size, p, fraction in ((3, (8, 12), 4, 0.5), (2, (8, 8), 2, 0.3), (4, (12, 8), 4, 0.25), (2, (8, 8), 4, 1.0),
                                 (2, (8, 8), 2, 0.2), (2, (8, 8), 4, 0.0)):  # 0.3 and 0.2 of 16: 4.8 and 3.2
        images = torch.randn(b, 3, *size, generator=g) + 3.0  # no pixel is 0 by chance
        n = (size[0] // p) * (size[1] // p)
        ranking = torch.randn(b, n, generator=g)
        got = c.call(fn, images, ranking, fraction, p)
        c.ok(got is not images, "your function returned `images` itself", "return a new tensor, e.g. images * mask "
             "(or images.clone() before changing it): a caller who changes the result must not change the input")
        expected = ref.delete_patches(images, ranking, fraction, p)
        c.close(got, expected, f"images after deleting {fraction:.0%} of {n} patches of {p}x{p} in {size}", [
            ("you deleted the patches ranked lowest: delete the highest-ranked ones (topk, largest=True)",
             lambda: _deleted(images, ranking, fraction, p, lowest=True)),
            ("the patch numbers were read column by column: patches are numbered row by row from the top-left, "
             "as patchify numbers them ('b (h w)')", lambda: _deleted(images, ranking, fraction, p, order="w h")),
            ("the patch numbers were used as pixel positions: each deleted patch is a P x P square of pixels, so "
             "scale the (gh, gw) mask up by P on both axes", lambda: _pixels(images, ranking, fraction, p)),
            ("the patch numbers were used as pixel positions: patch i is the P x P square at row i // gw, column "
             "i % gw of the grid, pixels [r*P:(r+1)*P, c*P:(c+1)*P]", lambda: _pixels(images, ranking, fraction, p,
                                                                                   "flat")),
            ("only one pixel of each patch was deleted: a patch is P x P pixels, rows r*P to (r+1)*P - 1 and "
             "columns c*P to (c+1)*P - 1", lambda: _pixels(images, ranking, fraction, p, "corner")),
            ("the patch's grid row and column were used as its pixel position: patch (r, c) covers pixels "
             "[r*P:(r+1)*P, c*P:(c+1)*P]", lambda: _pixels(images, ranking, fraction, p, "square")),
            ("only the first channel was zeroed: a deleted patch is zero in every channel (a (b, 1, H, W) mask "
             "broadcasts over them)", lambda: _deleted(images, ranking, fraction, p, first_channel=True)),
            ("fraction is a fraction of the patches (0.5 = half of them), not a percentage",
             lambda: _deleted(images, ranking, fraction, p, count=lambda v: round(v / 100))),
            ("image 0's ranking was used for every image: each image has its own row of `ranking`",
             lambda: _deleted(images, ranking, fraction, p, shared=True)),
            ("round(fraction * N) patches are deleted, not int(fraction * N): int() rounds down",
             lambda: _deleted(images, ranking, fraction, p, count=int)),
            ("round(fraction * N) patches are deleted, not math.ceil(fraction * N): math.ceil rounds up",
             lambda: _deleted(images, ranking, fraction, p, count=math.ceil)),
            ("the highest-ranked patches of the whole batch were deleted: rank each image's patches on their own "
             "(topk over dim=1)", lambda: _deleted(images, ranking, fraction, p, batch_wide=True)),
            ("a deleted patch is zero in the normalised input (the dataset's mean colour), not another value",
             lambda: torch.where(expected == 0, got[expected == 0].flatten()[0], images)),
        ], shape_hints=[((b, n), "return the images with the patches deleted, not the mask")])
    images = torch.randn(2, 3, 8, 8, generator=g)
    c.raises(fn, images, torch.randn(2, 3, generator=g), 0.5, 4,
             why="a ranking of 3 patches for images of 4 patches of 4x4",
             hint="compare ranking.shape with (batch, number of patches) and raise a ValueError")
    c.raises(fn, images, torch.randn(2, 4, generator=g), 1.5, 4, why="fraction=1.5 is not in [0, 1]",
             hint="check 0 <= fraction <= 1 and raise a ValueError")
