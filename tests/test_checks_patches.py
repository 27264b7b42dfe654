"""The chapter-04, 05 and 09 checks (patches, embeddings, ViT, parameter count, resampling) catch the usual mistakes."""

import pytest
import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn

import vit_course as ref
from vit_course import checks

from .check_helpers import accepts, rejects

# --- patchify / unpatchify -----------------------------------------------------------------------------------

def patchify_unfold(images, p):
    b, c, height, width = images.shape
    if height % p or width % p:
        raise ValueError(f"{height}x{width} is not divisible by {p}")
    patches = images.unfold(2, p, p).unfold(3, p, p)  # (b, c, gh, gw, p, p)
    return patches.permute(0, 2, 3, 4, 5, 1).reshape(b, -1, p * p * c)


def patchify_silent(images, p):  # no check: tensor.unfold drops the remainder
    b, c = images.shape[:2]
    return images.unfold(2, p, p).unfold(3, p, p).permute(0, 2, 3, 4, 5, 1).reshape(b, -1, p * p * c)


def patchify_F_unfold(images, p):
    ref.grid_size(images.shape[-2:], p)
    return F.unfold(images, p, stride=p).transpose(1, 2)  # (b, N, c*p*p): channels first


@pytest.mark.parametrize("impl, hint", [
    (lambda x, p: ref.patchify(x, p) if x.shape[-1] % p else rearrange(
        x, "b c (h p1) (w p2) -> b (h w) (c p1 p2)", p1=p, p2=p), "channels-first"),
    (patchify_F_unfold, "channels-first"),
    (lambda x, p: rearrange(x, "b c (h p1) (w p2) -> b (w h) (p1 p2 c)", p1=p, p2=p), "column by column"),
    (lambda x, p: F.unfold(x, p, stride=p), "F.unfold's"),
    (patchify_silent, "not divisible"),
])
def test_patchify_rejects(impl, hint):
    rejects(checks.patchify, impl, hint)


@pytest.mark.parametrize("impl", [ref.patchify, patchify_unfold])
def test_patchify_accepts(impl, capsys):
    accepts(checks.patchify, impl, capsys)


def unpatchify_reshape(patches, p, size):
    height, width = (size, size) if isinstance(size, int) else size
    b, _, d = patches.shape
    grid = patches.reshape(b, height // p, width // p, p, p, d // (p * p))  # (b, gh, gw, p1, p2, c)
    return grid.permute(0, 5, 1, 3, 2, 4).reshape(b, -1, height, width)


def unpatchify_columns(patches, p, size):
    height, width = (size, size) if isinstance(size, int) else size
    return rearrange(patches, "b (w h) (p1 p2 c) -> b c (h p1) (w p2)", p1=p, p2=p, h=height // p)


@pytest.mark.parametrize("impl, hint", [
    (unpatchify_columns, "column by column"),
    (lambda q, p, s: unpatchify_reshape(q, p, s).permute(0, 2, 3, 1), r"\(b, H, W, c\)"),
])
def test_unpatchify_rejects(impl, hint):
    rejects(checks.unpatchify, impl, hint)


@pytest.mark.parametrize("impl", [ref.unpatchify, unpatchify_reshape])
def test_unpatchify_accepts(impl, capsys):
    accepts(checks.unpatchify, impl, capsys)


# --- PatchEmbedding ------------------------------------------------------------------------------------------

class PatchEmbeddingConv(nn.Module):
    """timm's way: a Conv2d with kernel = stride = P, called proj (a correct alternative)."""

    def __init__(self, image_size, patch_size, in_channels, dim):
        super().__init__()
        self.proj = nn.Conv2d(in_channels, dim, patch_size, stride=patch_size)

    def forward(self, images):
        return self.proj(images).flatten(2).transpose(1, 2)  # (b, N, dim)


class PatchEmbeddingChannelsFirst(ref.PatchEmbedding):
    def forward(self, images):
        p = self.patch_size
        return self.proj(rearrange(images, "b c (h p1) (w p2) -> b (h w) (c p1 p2)", p1=p, p2=p))


class PatchEmbeddingMap(PatchEmbeddingConv):
    def forward(self, images):
        return self.proj(images)


@pytest.mark.parametrize("impl, hint", [(PatchEmbeddingChannelsFirst, "channels-first"),
                                        (PatchEmbeddingMap, "Conv2d's")])
def test_patch_embedding_rejects(impl, hint):
    rejects(checks.PatchEmbedding, impl, hint)


@pytest.mark.parametrize("impl", [ref.PatchEmbedding, PatchEmbeddingConv])
def test_patch_embedding_accepts(impl, capsys):
    accepts(checks.PatchEmbedding, impl, capsys)


# --- add_class_token_and_position ----------------------------------------------------------------------------

def embed_ok(tokens, cls_token, pos_embed):
    if cls_token is not None:
        tokens = torch.cat((cls_token.repeat(len(tokens), 1, 1), tokens), dim=1)
    return tokens + pos_embed


def embed_inplace(tokens, cls_token, pos_embed):
    if cls_token is None:
        tokens += pos_embed
        return tokens
    return embed_ok(tokens, cls_token, pos_embed)


@pytest.mark.parametrize("impl, hint", [
    (lambda t, c, p: torch.cat([t, c.expand(len(t), -1, -1)], 1) + p, "appended"),
    (lambda t, c, p: torch.cat([c.expand(len(t), -1, -1), t], 1), "position embeddings are missing"),
    (lambda t, c, p: torch.cat([c, t], 1) + p, "raised RuntimeError"),
    (lambda t, c, p: torch.cat([c.expand(len(t), -1, -1), t], 1) + p, "raised AttributeError"),
    (embed_inplace, "changed its input `tokens` in place"),
])
def test_class_token_rejects(impl, hint):
    rejects(checks.add_class_token_and_position, impl, hint)


@pytest.mark.parametrize("impl", [ref.add_class_token_and_position, embed_ok])
def test_class_token_accepts(impl, capsys):
    accepts(checks.add_class_token_and_position, impl, capsys)


# --- ViT -----------------------------------------------------------------------------------------------------

class ViTParts(nn.Module):
    """A ViT from the learner's parts: Conv2d patch embedding, own loop (a correct alternative)."""

    def __init__(self, image_size, patch_size, in_channels, num_classes, dim, depth, num_heads, mlp_ratio=4.0,
                 mistake=None):
        super().__init__()
        n = (image_size // patch_size) ** 2
        self.patch_embed = PatchEmbeddingConv(image_size, patch_size, in_channels, dim)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, n + 1, dim))
        self.blocks = nn.ModuleList(ref.EncoderBlock(dim, num_heads, mlp_ratio) for _ in range(depth))
        self.norm, self.head = nn.LayerNorm(dim, eps=1e-6), nn.Linear(dim, num_classes)
        self.mistake = mistake

    def forward(self, images):
        x = self.patch_embed(images)  # (b, N, D)
        if self.mistake == "append":
            x = torch.cat([x, self.cls_token.expand(len(x), -1, -1)], 1) + self.pos_embed
        else:
            x = torch.cat([self.cls_token.expand(len(x), -1, -1), x], 1)
            x = x if self.mistake == "nopos" else x + self.pos_embed
        for blk in self.blocks:
            x = blk(x)
        x = x if self.mistake == "nonorm" else self.norm(x)
        return self.head(x[:, 1:].mean(1) if self.mistake == "mean" else x[:, 0])


def vit_with(mistake):
    return type("ViT", (ViTParts,), {"__init__": lambda self, *a, **k: ViTParts.__init__(self, *a, **k,
                                                                                          mistake=mistake)})


@pytest.mark.parametrize("mistake, hint", [("append", "appended"), ("nopos", "position embeddings are missing"),
                                           ("nonorm", "final LayerNorm"), ("mean", "mean of the patch tokens")])
def test_vit_rejects(mistake, hint):
    rejects(checks.ViT, vit_with(mistake), hint)


@pytest.mark.parametrize("impl", [ref.ViT, ViTParts])
def test_vit_accepts(impl, capsys):
    accepts(checks.ViT, impl, capsys)


# --- count_parameters ----------------------------------------------------------------------------------------

def count(cls_token=True, biases=True, norms=True, head_bias=True):
    def count_parameters(image_size, patch_size, in_channels, num_classes, dim, depth, num_heads, mlp_ratio=4.0,
                         **_):
        hidden, n = int(dim * mlp_ratio), (image_size // patch_size) ** 2
        block = 4 * dim * dim + 2 * dim * hidden + biases * (5 * dim + hidden) + norms * 4 * dim
        return (patch_size ** 2 * in_channels * dim + biases * dim + cls_token * dim + (n + cls_token) * dim
                + depth * block + norms * 2 * dim + dim * num_classes + head_bias * num_classes)
    return count_parameters


def count_by_layers(image_size, patch_size, in_channels, num_classes, dim, depth, num_heads, mlp_ratio=4.0):
    linear = lambda i, o: i * o + o  # noqa: E731
    hidden, n = int(dim * mlp_ratio), (image_size // patch_size) ** 2
    block = 2 * 2 * dim + linear(dim, 3 * dim) + linear(dim, dim) + linear(dim, hidden) + linear(hidden, dim)
    return linear(patch_size ** 2 * in_channels, dim) + dim + (n + 1) * dim + depth * block + 2 * dim + linear(
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


# --- resample_position_embeddings ----------------------------------------------------------------------------

def resample(mode="bicubic", keep_prefix=True, antialias=False, align_corners=False):
    def resample_position_embeddings(pos_embed, new_grid, num_prefix_tokens=1, old_grid=None):
        new = (new_grid, new_grid) if isinstance(new_grid, int) else tuple(new_grid)
        prefix, patches = pos_embed[:, :num_prefix_tokens], pos_embed[:, num_prefix_tokens:]
        if old_grid is None:
            side = int(patches.shape[1] ** 0.5)
            old_grid = (side, side)
        grid = patches.reshape(1, *old_grid, -1).permute(0, 3, 1, 2)  # (1, D, gh, gw)
        grid = F.interpolate(grid, size=new, mode=mode, align_corners=align_corners, antialias=antialias)
        patches = grid.permute(0, 2, 3, 1).reshape(1, new[0] * new[1], -1)
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
