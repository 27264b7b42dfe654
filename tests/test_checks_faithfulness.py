"""The check of vit_course/checks/faithfulness.py (chapter 08: delete_patches, 8.4) catches the usual mistakes and
accepts correct variants written only from the statement.
"""

import math

import pytest
import torch

import vit_course
from vit_course import checks

from .check_helpers import accepts, rejects


def deleting(slip=None):
    """delete_patches as a learner might write it, with one slip switched on."""
    def delete_patches(images, ranking, fraction, patch_size):
        b, _, h, w = images.shape
        gh, gw = h // patch_size, w // patch_size
        if slip != "no ranking check" and ranking.shape != (b, gh * gw):
            raise ValueError(f"ranking {tuple(ranking.shape)} is not (batch, patches) = {(b, gh * gw)}")
        if slip != "no fraction check" and not 0 <= fraction <= 1:
            raise ValueError(f"fraction {fraction} is not in [0, 1]")
        if slip == "same tensor" and fraction == 0:
            return images
        k = {"int": int, "ceil": math.ceil}.get(slip, round)(fraction * gh * gw / (100 if slip == "percent" else 1))
        ranking = ranking[:1].expand(b, -1) if slip == "image 0" else ranking
        out = images if slip == "in place" else images.clone()
        if slip == "batch wide":
            top = ranking.flatten().topk(k * b).indices
            pairs = [(int(i) // (gh * gw), int(i) % (gh * gw)) for i in top]
        else:
            top = ranking.topk(k, dim=1, largest=slip != "lowest").indices  # (b, k)
            pairs = [(i, int(p)) for i in range(b) for p in top[i]]
        fill = -1.0 if slip == "fill" else 0.0
        for i, p in pairs:
            r, c = (p % gh, p // gh) if slip == "column order" else divmod(p, gw)
            if slip == "grid pixel":
                out[i, :, r, c] = fill
            elif slip == "flat pixel":
                out[i, :, p // w, p % w] = fill
            elif slip == "corner pixel":
                out[i, :, r * patch_size, c * patch_size] = fill
            elif slip == "grid square":
                out[i, :, r:r + patch_size, c:c + patch_size] = fill
            elif slip == "first channel":
                out[i, :1, r * patch_size:(r + 1) * patch_size, c * patch_size:(c + 1) * patch_size] = fill
            else:
                out[i, :, r * patch_size:(r + 1) * patch_size, c * patch_size:(c + 1) * patch_size] = fill
        return out
    return delete_patches


@pytest.mark.parametrize("impl, hint", [
    (deleting("lowest"), "ranked lowest"),
    (deleting("column order"), "column by column"),
    (deleting("grid pixel"), "patch numbers were used as pixel positions"),
    (deleting("flat pixel"), "patch numbers were used as pixel positions"),
    (deleting("corner pixel"), "only one pixel of each patch"),
    (deleting("grid square"), "the patch's grid row and column were used as its pixel position"),
    (deleting("first channel"), "only the first channel was zeroed"),
    (deleting("percent"), "not a percentage"),
    (deleting("image 0"), "image 0's ranking was used for every image"),
    (deleting("int"), r"int\(\) rounds down"),
    (deleting("ceil"), r"math.ceil rounds up"),
    (deleting("batch wide"), "whole batch"),
    (deleting("in place"), "in place"),
    (deleting("same tensor"), "returned `images` itself"),
    (deleting("fill"), "dataset's mean colour"),
    (deleting("no ranking check"), "a ranking of 3 patches for images of 4 patches of 4x4: expected a ValueError"),
    (deleting("no fraction check"), r"fraction=1.5 is not in \[0, 1\]: expected a ValueError"),
    (lambda images, ranking, fraction, patch_size: images.clone(), "largest difference"),
])
def test_delete_patches_rejects(impl, hint):
    rejects(checks.delete_patches, impl, hint)


def deleting_with_patchify(images, ranking, fraction, patch_size):
    """Written from the statement alone: patchify, zero the top rows with a boolean index, unpatchify."""
    if ranking.shape != (images.shape[0], (images.shape[2] // patch_size) * (images.shape[3] // patch_size)):
        raise ValueError("ranking must be (b, N)")
    if fraction < 0 or fraction > 1:
        raise ValueError("fraction must be in [0, 1]")
    patches = vit_course.patchify(images, patch_size)  # (b, N, P*P*C), a new tensor
    top = ranking.argsort(dim=1, descending=True)[:, :round(fraction * ranking.shape[1])]  # (b, count)
    patches[torch.arange(len(images))[:, None], top] = 0.0
    return vit_course.unpatchify(patches, patch_size, tuple(images.shape[-2:]))


@pytest.mark.parametrize("impl", [vit_course.delete_patches, deleting(), deleting_with_patchify])
def test_delete_patches_accepts(impl, capsys):
    accepts(checks.delete_patches, impl, capsys)
