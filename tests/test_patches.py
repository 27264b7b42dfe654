"""Patches, patch embeddings and position embeddings."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from vit_course import (
    PatchEmbedding,
    add_class_token_and_position,
    patchify,
    resample_position_embeddings,
    sincos_position_embedding,
    unpatchify,
)


def test_patchify_order_and_shape():
    img = torch.arange(2 * 3 * 4 * 6.0).reshape(2, 3, 4, 6)
    p = patchify(img, 2)
    assert p.shape == (2, 6, 12)
    # patch 1 is the second patch of the top row: rows 0-1, columns 2-3, flattened (p1 p2 c)
    assert torch.equal(p[0, 1], img[0, :, 0:2, 2:4].permute(1, 2, 0).reshape(-1))
    # patch 3 starts the second row of patches
    assert torch.equal(p[1, 3], img[1, :, 2:4, 0:2].permute(1, 2, 0).reshape(-1))
    assert torch.equal(unpatchify(p, 2, (4, 6)), img)


def test_patchify_matches_unfold():
    torch.manual_seed(0)
    img = torch.randn(2, 3, 28, 21)
    ref = F.unfold(img, kernel_size=7, stride=7)  # (b, c*P*P, N), flattened (c p1 p2)
    ref = ref.reshape(2, 3, 7, 7, -1).permute(0, 4, 2, 3, 1).reshape(2, 12, -1)
    assert torch.equal(patchify(img, 7), ref)
    assert torch.equal(unpatchify(patchify(img, 7), 7, (28, 21)), img)


def test_patchify_bad_sizes():
    with pytest.raises(ValueError, match="30x32.*16x16"):
        patchify(torch.zeros(1, 3, 30, 32), 16)
    with pytest.raises(ValueError, match="\\(3, 30\\)"):
        patchify(torch.zeros(3, 30), 3)
    with pytest.raises(ValueError, match="\\(1, 5, 12\\)"):
        unpatchify(torch.zeros(1, 5, 12), 2, 4)


def test_patch_embedding_equals_conv2d():
    torch.manual_seed(1)
    embed = PatchEmbedding((28, 20), 4, 3, 16)
    img = torch.randn(2, 3, 28, 20)
    conv = embed.to_conv()
    conv_tokens = conv(img).flatten(2).transpose(1, 2)  # (b, D, gh, gw) -> (b, N, D)
    assert torch.allclose(embed(img), conv_tokens, atol=1e-5)
    back = PatchEmbedding.from_conv(conv, (28, 20))
    assert torch.allclose(back(img), embed(img), atol=1e-6)
    for other in (nn.Conv2d(3, 16, 4, stride=4, padding=1), nn.Conv2d(3, 16, 4, stride=4, dilation=2),
                  nn.Conv2d(3, 16, 4, stride=4, groups=1, bias=False)):  # each a different map, or no bias to copy
        with pytest.raises(ValueError, match="plain patch conv"):
            PatchEmbedding.from_conv(other, (28, 20))
    assert isinstance(PatchEmbedding.from_conv(nn.Conv2d(3, 16, 4, stride=4, padding="valid"), (28, 20)),
                      PatchEmbedding)


def test_patch_embedding_bad_input():
    embed = PatchEmbedding(32, 4, 3, 16)
    with pytest.raises(ValueError, match="3, 32, 32.*\\(2, 1, 32, 32\\)"):
        embed(torch.zeros(2, 1, 32, 32))
    with pytest.raises(ValueError, match="30x30"):
        PatchEmbedding(30, 4, 3, 16)


def test_class_token_and_position():
    tokens, cls, pos = torch.randn(2, 4, 8), torch.randn(1, 1, 8), torch.randn(1, 5, 8)
    out = add_class_token_and_position(tokens, cls, pos)
    assert torch.allclose(out[:, 0], (cls[:, 0] + pos[:, 0]).expand(2, 8))
    assert torch.allclose(out[:, 1:], tokens + pos[:, 1:])
    with pytest.raises(ValueError, match="\\(1, 4, 8\\)"):
        add_class_token_and_position(tokens, cls, torch.randn(1, 4, 8))


def test_resample_is_identity_at_same_grid_and_keeps_class_token():
    torch.manual_seed(2)
    pos = torch.randn(1, 1 + 49, 16)
    assert torch.allclose(resample_position_embeddings(pos, 7), pos, atol=1e-5)
    bigger = resample_position_embeddings(pos, (10, 12))
    assert bigger.shape == (1, 1 + 120, 16) and torch.equal(bigger[:, 0], pos[:, 0])
    # a smooth (linear) pattern stays linear under bicubic resampling up to the borders
    ramp = torch.linspace(0, 1, 7).repeat(7)[None, :, None].expand(1, 49, 2)
    up = resample_position_embeddings(torch.cat([torch.zeros(1, 1, 2), ramp], 1), 14)[0, 1:, 0].reshape(14, 14)
    assert (up[:, 2:-2].diff(dim=1) > 0).all()
    with pytest.raises(ValueError, match="50"):
        resample_position_embeddings(torch.randn(1, 51, 4), 8)


def test_sincos_rows_and_columns():
    pe = sincos_position_embedding((4, 5), 32).reshape(4, 5, 32)
    q = pe.shape[-1] // 4
    assert torch.allclose(pe[0, :, :2 * q], pe[3, :, :2 * q])  # column features ignore the row
    assert torch.allclose(pe[:, 0, 2 * q:], pe[:, 4, 2 * q:])  # row features ignore the column
    assert not torch.allclose(pe[0, 0], pe[0, 1])
    with pytest.raises(ValueError, match="30"):
        sincos_position_embedding(4, 30)


def test_sincos_values_follow_big_visions_formula_element_by_element():
    """big_vision's posemb_sincos_2d, which Beyer et al. (2022) use, written out one number at a time: row r of the
    table is patch (i, j) = divmod(r, gw); quarter q of its features is sin(j w), cos(j w), sin(i w), cos(i w)
    with w = 10000 ** (-f / (D/4 - 1)) for feature f of the quarter."""
    gh, gw, dim = 3, 4, 16
    table = sincos_position_embedding((gh, gw), dim)
    quarter = dim // 4
    for r in range(gh * gw):
        i, j = divmod(r, gw)
        for f in range(quarter):
            w = 10000.0 ** (-f / (quarter - 1))
            expected = [math.sin(j * w), math.cos(j * w), math.sin(i * w), math.cos(i * w)]
            got = [table[r, q * quarter + f].item() for q in range(4)]
            assert got == pytest.approx(expected, abs=1e-6), (r, f)


def test_sincos_start_and_step_place_a_coarse_grid_inside_a_fine_one():
    fine = sincos_position_embedding(8, 32).reshape(8, 8, 32)
    coarse = sincos_position_embedding(4, 32, start=1.0, step=2).reshape(4, 4, 32)
    assert torch.allclose(coarse, fine[1::2, 1::2], atol=1e-6)  # positions 1, 3, 5, 7 of the fine grid
