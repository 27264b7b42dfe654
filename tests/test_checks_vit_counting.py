"""The check of vit_course/checks/vit_counting.py (chapter 05: count_parameters) catches the usual mistakes and
accepts correct variants.
"""

import pytest
import torch

import vit_course as ref
from vit_course import checks
from vit_course.patches import to_pair

from .check_helpers import accepts, rejects, slip


def given(image_size, in_channels, stem_channels):
    """What the stub's given lines compute: the stem's parameters, then the channels and size patches are cut from."""
    channels, (height, width), stem = in_channels, to_pair(image_size), 0
    for c_out in stem_channels or ():
        stem += 9 * channels * c_out + 2 * c_out
        channels, height, width = c_out, (height + 1) // 2, (width + 1) // 2
    return stem, channels, height, width


def count(cls_token=True, biases=True, norms=True, head_bias=True, stem_slip=None, final_norm=True, patch_bias=True):
    def count_parameters(image_size, patch_size, in_channels, num_classes, dim, depth, num_heads, mlp_ratio=4.0,
                         pool="cls", pos_embed="learned", class_token=None, qkv_bias=True, init_values=None,
                         stem_channels=None, **_):
        k = int(pool == "cls" if class_token is None else class_token) if cls_token else 0
        stem, channels, height, width = given(image_size, in_channels, stem_channels)
        stem = 0 if stem_slip == "no_stem" else stem
        channels = in_channels if stem_slip == "in_channels" else channels
        height, width = to_pair(image_size) if stem_slip == "image_size" else (height, width)
        hidden = int(dim * mlp_ratio)
        n = (height // patch_size) ** 2 if stem_slip == "square" else (height // patch_size) * (width // patch_size)
        block = (4 * dim * dim + 2 * dim * hidden + biases * (2 * dim + qkv_bias * 3 * dim + hidden) + norms * 4 * dim
                 + 2 * dim * bool(init_values))
        return (stem + patch_size ** 2 * channels * dim + biases * patch_bias * dim + k * dim
                + (n + k) * dim * (pos_embed == "learned") + depth * block + norms * final_norm * 2 * dim
                + dim * num_classes
                + head_bias * num_classes)
    return count_parameters


def count_by_layers(image_size, patch_size, in_channels, num_classes, dim, depth, num_heads, mlp_ratio=4.0,
                    pool="cls", pos_embed="learned", class_token=None, qkv_bias=True, init_values=None,
                    stem_channels=None):
    linear = lambda i, o, bias=True: i * o + o * bias  # noqa: E731
    k = int(pool == "cls" if class_token is None else class_token)
    stem, in_channels, height, width = given(image_size, in_channels, stem_channels)
    hidden, n = int(dim * mlp_ratio), (height // patch_size) * (width // patch_size)
    block = (2 * 2 * dim + linear(dim, 3 * dim, qkv_bias) + linear(dim, dim) + linear(dim, hidden)
             + linear(hidden, dim) + (2 * dim if init_values else 0))
    positions = (n + k) * dim if pos_embed == "learned" else 0
    return stem + linear(patch_size ** 2 * in_channels, dim) + k * dim + positions + depth * block + 2 * dim + linear(
        dim, num_classes)


@pytest.mark.parametrize("impl, hint", [
    (count(cls_token=False), "class token"), (count(biases=False), "biases"), (count(norms=False), "LayerNorms"),
    (count(head_bias=False), "head's bias"), (lambda **cfg: float("nan"), "is nan"),
    (lambda **cfg: torch.tensor(5), r"\.item\(\)"),
])
def test_count_parameters_rejects(impl, hint):
    rejects(checks.count_parameters, impl, hint)


@pytest.mark.parametrize("impl, hint", [(count(final_norm=False), "the final LayerNorm"),
                                        (count(patch_bias=False), "the patch projection's bias")])
def test_count_parameters_names_every_slip_that_leaves_out_as_many(impl, hint):
    """The final norm (2D) leaves out as much as the class token with its position row, the patch projection's
    bias (D) as much as the class token alone: the hint names each candidate, not only the first."""
    rejects(checks.count_parameters, impl, f"one of these(.|\\n)*{hint}")


@pytest.mark.parametrize("impl", [ref.count_parameters, count(), count_by_layers])
def test_count_parameters_accepts(impl, capsys):
    accepts(checks.count_parameters, impl, capsys)


def count_float(**cfg):
    return float(ref.count_parameters(**cfg))


@pytest.mark.parametrize("impl, hint", [
    (lambda **cfg: count()(**{**cfg, "pos_embed": "learned"}), "a sin-cos position table is a buffer"),
    (lambda **cfg: count()(**{**cfg, "class_token": True}), "with pool='mean' there is no class token unless"),
    (lambda **cfg: count()(**{**cfg, "class_token": None}), "class_token=True adds a class token"),
    (lambda **cfg: count()(**{**cfg, "qkv_bias": True}), "qkv_bias=False: the qkv layers have no bias"),
    (lambda **cfg: count()(**{**cfg, "init_values": None}), "two LayerScales"),
    (count_float, "the count should be an int, got float"),
])
def test_count_parameters_rejects_more(impl, hint):
    rejects(checks.count_parameters, impl, hint)


# the catalogue of slips (issue 34): each one a statement forbids, with the rule the check must blame
SLIPS = [
    slip("count_parameters", "output", "no_cls", count(cls_token=False), "class token"),
    slip("count_parameters", "int", "float", count_float, "the count should be an int, got float"),
    slip("count_parameters", "formula", "built", lambda **cfg: sum(p.numel() for p in ref.ViT(**cfg).parameters()),
         r"your count called torch \d+ times for ViT-B/16(.|\n)*count by formula"),
    slip("count_parameters", "output", "no_stem", count(stem_slip="no_stem"), "the stem's parameters are not counted"),
    slip("count_parameters", "output", "in_channels_after_stem", count(stem_slip="in_channels"),
         r"use `channels` \(the stem's last width\), not in_channels"),
    slip("count_parameters", "output", "image_size_after_stem", count(stem_slip="image_size"),
         "count N from `height` and `width`, not image_size"),
    slip("count_parameters", "output", "square_n", count(stem_slip="square"), "N counts the patches of a square"),
]
