"""Chapter 04's checks (patchify, unpatchify, PatchEmbedding, add_class_token_and_position) catch the usual
mistakes and accept correct variants."""

import math

import pytest
import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn

import vit_course as ref
from vit_course import checks

from .check_helpers import accepts, rejects, slip

patch_grid = getattr(ref.patches, "patch_grid", None) or ref.patches.grid_size  # renamed from grid_size


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
    patch_grid(images.shape[-2:], p)
    return F.unfold(images, p, stride=p).transpose(1, 2)  # (b, N, c*p*p): channels first


@pytest.mark.parametrize("impl", [ref.patchify, patchify_unfold])
def test_patchify_accepts(impl, capsys):
    accepts(checks.patchify, impl, capsys)


def unpatchify_reshape(patches, p, size):
    height, width = (size, size) if isinstance(size, int) else size
    b, n, d = patches.shape
    if height % p or width % p or n != (height // p) * (width // p) or d % (p * p):
        raise ValueError(f"patches {tuple(patches.shape)} do not make a {height}x{width} image")
    grid = patches.reshape(b, height // p, width // p, p, p, d // (p * p))  # (b, gh, gw, p1, p2, c)
    return grid.permute(0, 5, 1, 3, 2, 4).reshape(b, -1, height, width)


def unpatchify_columns(patches, p, size):
    height, width = (size, size) if isinstance(size, int) else size
    return rearrange(patches, "b (w h) (p1 p2 c) -> b c (h p1) (w p2)", p1=p, p2=p, h=height // p)


def unpatchify_no_grid(patches, p, size):
    return rearrange(patches, "b (h w) (p1 p2 c) -> b c (h p1) (w p2)", p1=p, p2=p)  # h and w left to einops


@pytest.mark.parametrize("impl", [ref.unpatchify, unpatchify_reshape])
def test_unpatchify_accepts(impl, capsys):
    accepts(checks.unpatchify, impl, capsys)


class PatchEmbeddingConv(nn.Module):
    """timm's way: a Conv2d with kernel = stride = P, called proj (exercise 4.3 asks an nn.Linear, so its check rejects
    it; ViT's check loads it)."""

    def __init__(self, image_size, patch_size, in_channels, dim):
        super().__init__()
        self.image_size, self.patch_size, self.in_channels = ref.patches.to_pair(image_size), patch_size, in_channels
        self.grid_size = patch_grid(image_size, patch_size)
        self.num_patches = self.grid_size[0] * self.grid_size[1]
        self.proj = nn.Conv2d(in_channels, dim, patch_size, stride=patch_size)

    def forward(self, images):
        if tuple(images.shape[1:]) != (self.in_channels, *self.image_size):
            raise ValueError(f"images {tuple(images.shape)} do not fit {self.image_size}")
        return self.proj(images).flatten(2).transpose(1, 2)  # (b, N, dim)


class PatchEmbeddingChannelsFirst(ref.PatchEmbedding):
    def forward(self, images):
        p = self.patch_size
        return self.proj(rearrange(images, "b c (h p1) (w p2) -> b (h w) (c p1 p2)", p1=p, p2=p))


class PatchEmbeddingMap(PatchEmbeddingConv):
    def forward(self, images):
        return self.proj(images)


@pytest.mark.parametrize("impl", [ref.PatchEmbedding])
def test_patch_embedding_accepts(impl, capsys):
    accepts(checks.PatchEmbedding, impl, capsys)


def embed_ok(tokens, cls_token, pos_embed):
    if cls_token is not None:
        tokens = torch.cat((cls_token.repeat(len(tokens), 1, 1), tokens), dim=1)
    if pos_embed.shape[1] != tokens.shape[1]:
        raise ValueError(f"pos_embed {tuple(pos_embed.shape)} does not fit tokens {tuple(tokens.shape)}")
    return tokens + pos_embed


def embed_inplace(tokens, cls_token, pos_embed):
    if cls_token is None:
        tokens += pos_embed
        return tokens
    return embed_ok(tokens, cls_token, pos_embed)


@pytest.mark.parametrize("impl", [ref.add_class_token_and_position, embed_ok])
def test_class_token_accepts(impl, capsys):
    accepts(checks.add_class_token_and_position, impl, capsys)


def unpatchify_no_check(patches, p, size):
    height, width = (size, size) if isinstance(size, int) else size
    return rearrange(patches, "b (h w) (p1 p2 c) -> b c (h p1) (w p2)", p1=p, p2=p, h=height // p)


def unpatchify_square_guess(patches, p, size):
    """Ignores image_size: a grid of isqrt(N) rows, right for square images only."""
    return rearrange(patches, "b (h w) (p1 p2 c) -> b c (h p1) (w p2)", p1=p, p2=p, h=math.isqrt(patches.shape[1]))


class PatchEmbeddingNoBias(ref.PatchEmbedding):
    def __init__(self, image_size, patch_size, in_channels, dim):
        super().__init__(image_size, patch_size, in_channels, dim)
        self.proj = nn.Linear(patch_size * patch_size * in_channels, dim, bias=False)


class PatchEmbeddingNoShapeCheck(ref.PatchEmbedding):
    def forward(self, images):
        return self.proj(ref.patchify(images, self.patch_size))  # a 12x16 image silently gives 12 tokens


class PatchEmbeddingSizeAsInt(ref.PatchEmbedding):
    def __init__(self, image_size, patch_size, in_channels, dim):
        super().__init__(image_size, patch_size, in_channels, dim)
        self.image_size = image_size


class PatchEmbeddingNoGrid(PatchEmbeddingNoShapeCheck):
    def __init__(self, image_size, patch_size, in_channels, dim):
        super().__init__(image_size, patch_size, in_channels, dim)
        del self.grid_size


def test_patch_embedding_rejects_an_image_size_that_is_not_a_pair():
    rejects(checks.PatchEmbedding, type("PatchEmbedding", (PatchEmbeddingSizeAsInt,), {}), "image_size")


def embed_no_check(tokens, cls_token, pos_embed):
    if cls_token is not None:
        tokens = torch.cat([cls_token.expand(len(tokens), -1, -1), tokens], 1)
    return tokens + pos_embed


def patchify_detached(images, p):
    return ref.patchify(images.detach(), p)


def patchify_in_place(images, p):
    images -= images.mean()  # "centre the pixels first"
    return ref.patchify(images, p)


def unpatchify_pair_only(patches, p, size):
    height, width = size  # an int image_size cannot be unpacked
    return ref.unpatchify(patches, p, (height, width))


def unpatchify_checks(ndim=True, length=True, width=True):
    def unpatchify(patches, p, size):
        gh, gw = patch_grid(size, p)
        if ndim and patches.ndim != 3:
            raise ValueError(f"patches {tuple(patches.shape)} are not (b, N, P*P*c)")
        if length and patches.shape[-2] != gh * gw:  # counted from the end: a missing batch axis slips through
            raise ValueError(f"{patches.shape[-2]} patches do not make a {gh}x{gw} grid")
        if width and patches.shape[-1] % (p * p):
            raise ValueError(f"patches of width {patches.shape[-1]} are not P*P*c values")
        return rearrange(patches, "b (h w) (p1 p2 c) -> b c (h p1) (w p2)", p1=p, p2=p, h=gh, w=gw)
    return unpatchify


def unpatchify_by_index(patches, p, size):
    """The sizes read by index, shape[0], shape[1], shape[-1], with no check of ndim: a 4-D tensor slips through."""
    gh, gw = patch_grid(size, p)
    b, n, width = patches.shape[0], patches.shape[1], patches.shape[-1]
    if n != gh * gw or width % (p * p):
        raise ValueError(f"patches {tuple(patches.shape)} do not make a {size} image")
    return patches.reshape(b, gh, gw, p, p, width // (p * p)).permute(0, 5, 1, 3, 2, 4).reshape(
        b, width // (p * p), gh * p, gw * p)


def unpatchify_detached(patches, p, size):
    return ref.unpatchify(patches, p, size).detach()


def unpatchify_resize(patches, p, size):
    gh, gw = patch_grid(size, p)
    b, n, d = patches.shape
    if n != gh * gw or d % (p * p):
        raise ValueError(f"patches {tuple(patches.shape)} do not make a {size} image")
    grid = patches.resize_(b, gh, gw, p, p, d // (p * p))  # resize_ reshapes the caller's tensor too
    return grid.permute(0, 5, 1, 3, 2, 4).reshape(b, d // (p * p), gh * p, gw * p)


class PatchEmbeddingSlip(ref.PatchEmbedding):
    """The reference PatchEmbedding with one slip."""

    slip = None

    def __init__(self, image_size, patch_size, in_channels, dim):
        if self.slip == "patch_pair":
            patch_size = ref.patches.to_pair(patch_size)
        if self.slip == "floored":
            nn.Module.__init__(self)
            self.image_size, self.patch_size = ref.patches.to_pair(image_size), patch_size
            self.in_channels = in_channels
            self.grid_size = (self.image_size[0] // patch_size, self.image_size[1] // patch_size)
            self.num_patches = self.grid_size[0] * self.grid_size[1]
            self.proj = nn.Linear(patch_size * patch_size * in_channels, dim)
            return
        super().__init__(image_size, patch_size, in_channels, dim)

    def forward(self, images):
        if self.slip == "in_place":
            images /= images.abs().max()
        if self.slip == "weight_data":
            return F.linear(ref.patchify(images, self.patch_size), self.proj.weight.data, self.proj.bias)
        patches = ref.patchify(images, self.patch_size)
        return self.proj(patches.detach() if self.slip == "detached" else patches)


def patch_embedding(slip):
    return type("PatchEmbedding", (PatchEmbeddingSlip,), {"slip": slip})


def embed_slip(slip):
    def add_class_token_and_position(tokens, cls_token, pos_embed):
        if slip == "no_none" or cls_token is not None:
            if slip == "no_expand":
                tokens = torch.cat([cls_token, tokens], dim=1)
            else:
                token = cls_token.detach() if slip == "cls_detached" else cls_token
                tokens = torch.cat([token.expand(len(tokens), -1, -1), tokens], dim=1)
        if slip == "sliced" and pos_embed.shape[1] > tokens.shape[1]:
            pos_embed = pos_embed[:, :tokens.shape[1]]  # "use the rows we need": hides a table made for another size
        if tokens.shape[1:] != pos_embed.shape[1:]:
            raise ValueError("position embeddings don't fit" if slip == "vague" else
                             f"pos_embed {tuple(pos_embed.shape)} does not fit tokens {tuple(tokens.shape)}")
        return tokens + (pos_embed.data if slip == "pos_data" else pos_embed)
    return add_class_token_and_position


# the catalogue of slips (issue 34): each one a statement forbids, with the rule the check must blame
SLIPS = [
    slip("patchify", "output", "channels_first", patchify_F_unfold, "channels-first"),
    slip("patchify", "output", "columns", lambda x, p: rearrange(x, "b c (h p1) (w p2) -> b (w h) (p1 p2 c)", p1=p,
                                                                  p2=p), "column by column"),
    slip("patchify", "error-sides", "unfold_drops", patchify_silent, r"10 is not divisible by 4\): expected a "
         r"ValueError, your code returned"),
    slip("patchify", "error-ndim", "no_ndim", lambda x, p: ref.patchify(x, p) if x.ndim == 4 else torch.zeros(1),
         "no batch axis: expected a ValueError"),
    slip("patchify", "gradient", "detach", patchify_detached, r"carries no gradient(.|\n)*images.detach\(\)"),
    slip("patchify", "inputs", "centred", patchify_in_place, "changed its input `images` in place"),
    slip("unpatchify", "output", "columns", unpatchify_columns, "column by column"),
    slip("unpatchify", "image-size", "int", unpatchify_pair_only,
         r"cannot unpack non-iterable int object(.|\n)*height, width = size(.|\n)*to_pair\(size\)"),
    slip("unpatchify", "error-sides", "no_check", unpatchify_no_check, "10 is not divisible by 4"),
    slip("unpatchify", "error-ndim", "no_ndim", unpatchify_checks(ndim=False), r"patches of shape \(4, 48\) have no "
         r"batch axis: expected a ValueError"),
    slip("unpatchify", "error-length", "no_length", unpatchify_checks(length=False), r"cannot make a 12x12 image "
         r"\(it has 9\): expected a ValueError"),
    slip("unpatchify", "error-width", "no_width", unpatchify_checks(width=False),
         r"width 40 .*: expected a ValueError"),
    slip("unpatchify", "error-ndim", "by_index", unpatchify_by_index, r"patches of shape \(2, 4, 1, 48\) are 4-D: "
         r"expected a ValueError(.|\n)*check `patches.ndim == 3` first"),
    slip("unpatchify", "gradient", "detach", unpatchify_detached, "carries no gradient"),
    slip("unpatchify", "inputs", "resize_", unpatchify_resize, "changed its input `patches` in place"),
    slip("PatchEmbedding", "attributes", "size_int", type("PatchEmbedding", (PatchEmbeddingSizeAsInt,), {}),
         r"image_size should be \(8, 8\), got 8(.|\n)*to_pair"),
    slip("PatchEmbedding", "attributes", "patch_pair", patch_embedding("patch_pair"),
         r"raised TypeError(.|\n)*at line \d+ of your code(.|\n)*the error comes from the course's `patch_grid`(.|\n)*"
         r"likely cause: a pair where one int is expected: patch_size is a single int P"),
    slip("PatchEmbedding", "attributes", "no_grid", PatchEmbeddingNoGrid, r"grid_size should be \(2, 2\), got None"),
    slip("PatchEmbedding", "names", "no_bias", PatchEmbeddingNoBias, "the projection has a bias"),
    slip("PatchEmbedding", "names", "conv_proj", PatchEmbeddingConv, r"proj should be an nn.Linear, got Conv2d"),
    slip("PatchEmbedding", "output", "channels_first", PatchEmbeddingChannelsFirst, "channels-first"),
    slip("PatchEmbedding", "output", "conv_map", PatchEmbeddingMap, "Conv2d's"),
    slip("PatchEmbedding", "error-init", "floored", patch_embedding("floored"), r"30 is not divisible by 4\): building "
         r"the model must fail(.|\n)*expected a ValueError, your code returned"),
    slip("PatchEmbedding", "error-shape", "no_check", PatchEmbeddingNoShapeCheck, "images of 12x16 pixels"),
    slip("PatchEmbedding", "gradient", "detached", patch_embedding("detached"), "no gradient reaches `images`"),
    slip("PatchEmbedding", "gradient", "weight_data", patch_embedding("weight_data"),
         r"no gradient reaches `proj.weight`(.|\n)*self.proj.weight.data"),
    slip("PatchEmbedding", "inputs", "normalised", patch_embedding("in_place"), "changed its input `images` in place"),
    slip("add_class_token_and_position", "output", "appended",
         lambda t, c, p: torch.cat([t, c.expand(len(t), -1, -1)], 1) + p, "appended"),
    slip("add_class_token_and_position", "output", "no_expand", embed_slip("no_expand"),
         r"Sizes of tensors must match(.|\n)*expand it to the batch first, cls_token.expand\(b, -1, -1\)"),
    slip("add_class_token_and_position", "no-class-token", "no_none", embed_slip("no_none"),
         r"'NoneType' object has no attribute 'expand'(.|\n)*prepend it only `if cls_token is not None`"),
    slip("add_class_token_and_position", "error", "sliced", embed_slip("sliced"),
         r"pos_embed \(1, 7, 6\) has 7 rows for 5 tokens .*: expected a ValueError, your code returned"),
    slip("add_class_token_and_position", "error", "vague", embed_slip("vague"),
         r"your ValueError says \"position embeddings don't fit\", which does not name \(1, 4, 6\) and "
         r"\(2, 4, 6\) or \(2, 5, 6\)"),
    slip("add_class_token_and_position", "error", "no_check", embed_no_check, "no row for the class token"),
    slip("add_class_token_and_position", "gradient", "cls_detached", embed_slip("cls_detached"),
         r"no gradient reaches `cls_token`(.|\n)*cls_token.detach\(\)"),
    slip("add_class_token_and_position", "gradient", "pos_data", embed_slip("pos_data"),
         r"no gradient reaches `pos_embed`(.|\n)*pos_embed.data"),
    slip("add_class_token_and_position", "inputs", "plus_equals", embed_inplace, "changed its input `tokens` in place"),
]


# folded from the parametrized tests: each rejected under the rule the check blames
SLIPS += [
    slip("patchify", "output", "patchify_rejects_0",
         lambda x, p: ref.patchify(x, p) if x.shape[-1] % p else rearrange(
        x, "b c (h p1) (w p2) -> b (h w) (c p1 p2)", p1=p, p2=p),
         "channels-first"),
    slip("patchify", "output", "patchify_rejects_3", lambda x, p: F.unfold(x, p, stride=p), "F.unfold's"),
    slip("unpatchify", "output", "unpatchify_rejects_1", unpatchify_no_grid,
         r"Could not infer sizes(.|\n)*likely cause: einops splits an axis in two only when"),
    slip("unpatchify", "output", "unpatchify_rejects_2",
         lambda q, p, s: unpatchify_reshape(q, p, s).permute(0, 2, 3, 1),
         r"\(b, H, W, c\)"),
    slip("add_class_token_and_position", "output", "class_token_rejects_1",
         lambda t, c, p: torch.cat([c.expand(len(t), -1, -1), t], 1),
         "position embeddings are missing"),
    slip("add_class_token_and_position", "output", "class_token_rejects_2", lambda t, c, p: torch.cat([c, t], 1) + p,
         "raised RuntimeError"),
    slip("add_class_token_and_position", "no-class-token", "class_token_rejects_3",
         lambda t, c, p: torch.cat([c.expand(len(t), -1, -1), t], 1) + p,
         "raised AttributeError"),
    slip("patchify", "error-sides", "patchify_rejects_more_0",
         lambda x, p: rearrange(x, "b c (h p1) (w p2) -> b (h w) (p1 p2 c)", p1=p, p2=p),
         "10 is not divisible by 4\\): "
     "expected a ValueError, your code raised EinopsError"),
    slip("patchify", "output", "patchify_rejects_more_2",
         lambda x, p: ref.patchify(x, p) if x.shape[-1] % p else x.reshape(len(x), -1, p * p * x.shape[1]),
         "the image was only reshaped"),
    slip("unpatchify", "output", "unpatchify_rejects_more_0",
         lambda q, p, s: unpatchify_reshape(q, p, s if isinstance(s, int) else s[::-1]),
         "height and width are swapped"),
    slip("unpatchify", "output", "unpatchify_rejects_more_1", unpatchify_square_guess,
         "or the grid was guessed from the number of patches"),
    slip("add_class_token_and_position", "output", "class_token_rejects_more_0",
         lambda t, c, p: t + p if c is None else torch.cat([c.expand(len(t), -1, -1) + p[:, -1:], t + p[:, :-1]], 1),
         "the positions are shifted"),
    slip("add_class_token_and_position", "output", "class_token_rejects_more_1",
         lambda t, c, p: t + p if c is None else torch.cat([c.expand(len(t), -1, -1), t + p[:, :-1]], 1),
         "the class token got no position and the patches got rows 0..N-1"),
    slip("add_class_token_and_position", "error", "class_token_rejects_more_3",
         lambda t, c, p: embed_ok(t, c, p) if p.shape[1] != 1 else embed_no_check(t, c, p),
         r"pos_embed \(1, 1, 6\) has one row, not 5 \(broadcasting would add that row to every token\): expected a "
     r"ValueError, your code returned tensor\(2, 5, 6\)"),
]
