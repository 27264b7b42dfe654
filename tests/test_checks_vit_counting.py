"""The check of vit_course/checks/vit_counting.py (chapter 05: count_parameters) catches the usual mistakes and
accepts correct variants.
"""

import pytest
import torch

import vit_course as ref
from vit_course import checks

from .check_helpers import accepts, rejects, slip


def count(cls_token=True, biases=True, norms=True, head_bias=True):
    def count_parameters(image_size, patch_size, in_channels, num_classes, dim, depth, num_heads, mlp_ratio=4.0,
                         pool="cls", pos_embed="learned", class_token=None, qkv_bias=True, init_values=None, **_):
        k = int(pool == "cls" if class_token is None else class_token) if cls_token else 0
        hidden, n = int(dim * mlp_ratio), (image_size // patch_size) ** 2
        block = (4 * dim * dim + 2 * dim * hidden + biases * (2 * dim + qkv_bias * 3 * dim + hidden) + norms * 4 * dim
                 + 2 * dim * bool(init_values))
        return (patch_size ** 2 * in_channels * dim + biases * dim + k * dim + (n + k) * dim * (pos_embed == "learned")
                + depth * block + norms * 2 * dim + dim * num_classes + head_bias * num_classes)
    return count_parameters


def count_by_layers(image_size, patch_size, in_channels, num_classes, dim, depth, num_heads, mlp_ratio=4.0,
                    pool="cls", pos_embed="learned", class_token=None, qkv_bias=True, init_values=None):
    linear = lambda i, o, bias=True: i * o + o * bias  # noqa: E731
    k = int(pool == "cls" if class_token is None else class_token)
    hidden, n = int(dim * mlp_ratio), (image_size // patch_size) ** 2
    block = (2 * 2 * dim + linear(dim, 3 * dim, qkv_bias) + linear(dim, dim) + linear(dim, hidden)
             + linear(hidden, dim) + (2 * dim if init_values else 0))
    positions = (n + k) * dim if pos_embed == "learned" else 0
    return linear(patch_size ** 2 * in_channels, dim) + k * dim + positions + depth * block + 2 * dim + linear(
        dim, num_classes)


@pytest.mark.parametrize("impl, hint", [
    (count(cls_token=False), "class token"), (count(biases=False), "biases"), (count(norms=False), "LayerNorms"),
    (count(head_bias=False), "head's bias"), (lambda **cfg: float("nan"), "is nan"),
    (lambda **cfg: torch.tensor(5), r"\.item\(\)"),
])
def test_count_parameters_rejects(impl, hint):
    rejects(checks.count_parameters, impl, hint)


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
]
