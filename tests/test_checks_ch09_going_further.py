"""The check of vit_course/checks/patches_resample.py (chapter 09: resample_position_embeddings) catches the usual
mistakes and accepts correct variants.
"""

import pytest
import torch
import torch.nn.functional as F

import vit_course as ref
from vit_course import checks

from .check_helpers import accepts, rejects


def resample(mode="bicubic", keep_prefix=True, antialias=False, align_corners=False, dtype=True, check=True):
    def resample_position_embeddings(pos_embed, new_grid, num_prefix_tokens=1, old_grid=None):
        new = (new_grid, new_grid) if isinstance(new_grid, int) else tuple(new_grid)
        prefix, patches = pos_embed[:, :num_prefix_tokens], pos_embed[:, num_prefix_tokens:]
        if old_grid is None:
            side = int(patches.shape[1] ** 0.5)
            old_grid = (side, side)
        if check and old_grid[0] * old_grid[1] != patches.shape[1]:
            raise ValueError(f"{patches.shape[1]} patches do not fill the grid {old_grid}")
        grid = patches.reshape(1, *old_grid, -1).permute(0, 3, 1, 2).float()  # (1, D, gh, gw)
        grid = F.interpolate(grid, size=new, mode=mode, align_corners=align_corners, antialias=antialias)
        patches = grid.permute(0, 2, 3, 1).reshape(1, new[0] * new[1], -1)
        patches = patches.to(pos_embed.dtype) if dtype else patches
        return torch.cat([prefix, patches], 1) if keep_prefix else patches
    return resample_position_embeddings


@pytest.mark.parametrize("impl, hint", [
    (resample(mode="bilinear"), "bilinear"), (resample(keep_prefix=False), "class token's embedding was dropped"),
    (resample(align_corners=True), "align_corners"),
])
def test_resample_rejects(impl, hint):
    rejects(checks.resample_position_embeddings, impl, hint)


@pytest.mark.parametrize("impl", [ref.resample_position_embeddings, resample(), resample(antialias=True)])
def test_resample_accepts(impl, capsys):
    accepts(checks.resample_position_embeddings, impl, capsys)


def resample_old_grid_swapped(pos_embed, new_grid, num_prefix_tokens=1, old_grid=None):
    old_grid = None if old_grid is None else tuple(old_grid)[::-1]
    return ref.resample_position_embeddings(pos_embed, new_grid, num_prefix_tokens, old_grid)


@pytest.mark.parametrize("impl, hint", [
    (resample(dtype=False), "float16 position embeddings came back as torch.float32"),
    (resample_old_grid_swapped, r"old_grid is \(rows, columns\)"),
    (resample(check=False), "do not form a square grid .*: expected a ValueError, your code raised RuntimeError"),
])
def test_resample_rejects_more(impl, hint):
    rejects(checks.resample_position_embeddings, impl, hint)
