"""Check of vit_course/patches.py's chapter-09 exercise: resample_position_embeddings (bicubic on the patch grid,
prefix kept, dtype kept)."""

# ruff: noqa: B023  (each diagnosis thunk is called by Checker.close in the loop iteration that builds it)

import torch
import torch.nn.functional as F
from einops import rearrange

from .. import patches as ref
from .core import CheckFailed, check
from .probes import call_half


@check("resample_position_embeddings")
def resample_position_embeddings(c, fn):
    """(1, prefix + gh*gw, D) -> (1, prefix + new_gh*new_gw, D): patch embeddings resized bicubically on their grid."""
    g = torch.Generator().manual_seed(14)
    cases = (((1, 17, 8), 6, {}, (4, 4)), ((1, 17, 6), (6, 8), {}, (4, 4)), ((1, 9, 5), 5, dict(num_prefix_tokens=0),
             (3, 3)), ((1, 16, 4), (6, 4), dict(old_grid=(3, 5)), (3, 5)), ((1, 26, 7), 3, {}, (5, 5)))
    for shape, new_grid, kwargs, old in cases:
        pos = torch.randn(shape, generator=g)
        got = c.call(fn, pos, new_grid, **kwargs)
        expected = ref.resample_position_embeddings(pos, new_grid, **kwargs)
        k = kwargs.get("num_prefix_tokens", 1)
        prefix, grid = pos[:, :k], rearrange(pos[:, k:], "1 (h w) d -> 1 d h w", h=old[0])
        new = ref.to_pair(new_grid)

        def resized(mode="bicubic", align=False, antialias=True, flip=False, prefix=prefix, grid=grid, new=new):
            src = grid.transpose(-1, -2) if flip else grid  # the grid read columns first
            out = F.interpolate(src, size=new, mode=mode, align_corners=align, antialias=antialias)
            return torch.cat([prefix, rearrange(out, "1 d h w -> 1 (h w) d")], 1)

        try:  # antialias=False is PyTorch's other bicubic kernel (OpenCV's), a sound resize too: both are accepted
            c.close(got, resized(antialias=False), "resampled position embeddings", atol=1e-5)
            continue
        except CheckFailed:
            pass
        c.close(got, expected, f"position embeddings {shape} resampled to grid {new_grid} ({kwargs or 'defaults'})", [
            *[(hint, lambda kw=kw, aa=aa: resized(**kw, antialias=aa)) for hint, kw in (
                ("this is bilinear interpolation: use mode='bicubic' (as timm does)", dict(mode="bilinear")),
                ("align_corners=True: use align_corners=False, as timm does", dict(align=True)),
                ("rows and columns are swapped: lay the patches out as (h w), rows first", dict(flip=True)),
            ) for aa in (True, False)],
            ("old_grid is (rows, columns): lay the patches out with h=old_grid[0]", lambda: torch.cat([
                prefix, rearrange(F.interpolate(rearrange(pos[:, k:], "1 (h w) d -> 1 d h w", h=old[1]), size=new,
                                                mode="bicubic", align_corners=False, antialias=True),
                                  "1 d h w -> 1 (h w) d")], 1)),
            ("this interpolates along the flat sequence: lay the patch embeddings out on their 2D grid "
             "(1, D, gh, gw) and resize that", lambda: torch.cat([prefix, F.interpolate(
                 pos[:, k:].transpose(1, 2), size=new[0] * new[1], mode="linear").transpose(1, 2)], 1)),
        ], atol=1e-5, shape_hints=[((1, new[0] * new[1], shape[2]), "the class token's embedding was dropped: keep "
                                    "the first num_prefix_tokens rows and concatenate them back in front")])
    _dtype_and_errors(c, fn, g)


def _dtype_and_errors(c, fn, g):
    """float16 embeddings come back float16; a grid that does not fit raises a ValueError."""
    pos, got = call_half(c, fn, (1, 17, 8), g, 6, expect=torch.float16,
                         problem="float16 position embeddings came back as {dtype}",
                         hint="interpolate in float32 (`.float()`: bicubic has no float16 version on every device), "
                              "then convert the result back with .to(pos_embed.dtype)")
    plain = F.interpolate(rearrange(pos[:, 1:].float(), "1 (h w) d -> 1 d h w", h=4), size=(6, 6), mode="bicubic",
                          align_corners=False)  # without antialias (the other bicubic kernel): accepted too
    plain = torch.cat([pos[:, :1], rearrange(plain, "1 d h w -> 1 (h w) d").half()], 1)
    expected = ref.resample_position_embeddings(pos, 6)
    close = torch.is_tensor(got) and got.shape == plain.shape and torch.allclose(got.float(), plain.float(), atol=2e-3)
    c.close(got, plain if close else expected, "float16 position embeddings resampled to grid 6", atol=2e-3,
            rtol=2e-3)
    c.raises(fn, torch.randn(1, 13, 4, generator=g), 4, why="12 patch embeddings (after the class token) do not "
             "form a square grid and no old_grid was given", hint="with old_grid=None, check that the number of "
             "patches is a square and raise a ValueError asking for old_grid")
    c.raises(fn, torch.randn(1, 17, 4, generator=g), 4, old_grid=(3, 5), why="old_grid (3, 5) holds 15 patches, "
             "pos_embed has 16", hint="check old_grid[0] * old_grid[1] against the number of patch rows")
