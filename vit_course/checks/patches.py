"""Checks for chapter 04: patchify, unpatchify, PatchEmbedding and add_class_token_and_position."""

# ruff: noqa: B023  (each diagnosis thunk is called by Checker.close in the loop iteration that builds it)

import torch
from einops import rearrange

from .. import patches as ref
from .common import only_biases
from .core import check
from .messages import describe

ORDERS = [  # (hint, einops pattern of a wrong patchify)
    ("each patch is flattened channels-first, (c p1 p2): the course flattens it as (p1 p2 c), pixel by pixel "
     "with the channels innermost, 'b c (h p1) (w p2) -> b (h w) (p1 p2 c)' (F.unfold gives (c p1 p2))",
     "b c (h p1) (w p2) -> b (h w) (c p1 p2)"),
    ("the patches run column by column: read them row by row from the top-left, (h w), not (w h)",
     "b c (h p1) (w p2) -> b (w h) (p1 p2 c)"),
    ("the patches run column by column and are flattened channels-first: use 'b c (h p1) (w p2) -> b (h w) "
     "(p1 p2 c)'", "b c (h p1) (w p2) -> b (w h) (c p1 p2)"),
    ("each patch is flattened column by column, (p2 p1 c): flatten it row by row, (p1 p2 c)",
     "b c (h p1) (w p2) -> b (h w) (p2 p1 c)"),
]
RESHAPED = ("the image was only reshaped: a patch's pixels are not next to each other in memory; split the height "
            "and width into (h p1) and (w p2) and bring p1, p2 next to the channels, 'b c (h p1) (w p2) -> b (h w) "
            "(p1 p2 c)'")
PATCH_CASES = ((2, 3, 12, 8, 4), (1, 1, 28, 28, 7), (3, 2, 6, 9, 3), (2, 3, 5, 5, 5), (1, 4, 2, 2, 1))


def _wrong_patchify(images, p, pattern):
    return rearrange(images, pattern, p1=p, p2=p)


def _wrong_unpatchify(patches, p, size, pattern):
    left, right = pattern.split(" -> ")
    return rearrange(patches, f"{right} -> {left}", p1=p, p2=p, h=size[0] // p, w=size[1] // p)


@check("patchify")
def patchify(c, fn):
    """(b, c, H, W) -> (b, N, P*P*c): patches row by row from the top-left, each flattened (p1 p2 c)."""
    g = torch.Generator().manual_seed(10)
    for b, ch, height, width, p in PATCH_CASES:
        images = torch.randn(b, ch, height, width, generator=g)
        got = c.call(fn, images, p)
        c.close(got, ref.patchify(images, p), f"patches of a {height}x{width} image with patch size {p}",
                [(hint, lambda i=images, p=p, pat=pattern: _wrong_patchify(i, p, pat)) for hint, pattern in ORDERS]
                + [(RESHAPED, lambda i=images, p=p: i.reshape(b, -1, p * p * ch))],
                shape_hints=[((b, ch * p * p, height * width // p // p), "this is F.unfold's (b, c*P*P, N) layout: "
                              "transpose to (b, N, ...) and reorder each patch to (p1 p2 c)")])
    hint = ("check the input first: images.ndim == 4, and both sides divisible by the patch size "
            "(patch_grid(images.shape[-2:], patch_size) raises the right error)")
    c.raises(fn, torch.randn(1, 3, 10, 12, generator=g), 4, hint=hint,
             why="a 10x12 image cannot be cut into 4x4 patches (10 is not divisible by 4)")
    c.raises(fn, torch.randn(3, 8, 8, generator=g), 4, hint=hint, why="images of shape (3, 8, 8) have no batch axis")


@check("unpatchify")
def unpatchify(c, fn):
    """(b, N, P*P*c) -> (b, c, H, W), the inverse of patchify; image_size is H or (H, W)."""
    g = torch.Generator().manual_seed(11)
    for b, ch, height, width, p in PATCH_CASES:
        images = torch.randn(b, ch, height, width, generator=g)
        patches = ref.patchify(images, p)
        size = height if height == width else (height, width)
        got = c.call(fn, patches, p, size)
        c.close(got, images, f"image rebuilt from patches of size {p} (image_size={size})",
                [(hint.replace("patchify", "unpatchify"), lambda q=patches, p=p, pat=pattern:
                  _wrong_unpatchify(q, p, (height, width), pat)) for hint, pattern in ORDERS],
                shape_hints=[((b, height, width, ch), "this is (b, H, W, c): the channels come first, (b, c, H, W)"),
                             ((b, ch, width, height), "height and width are swapped: image_size is (H, W), "
                                                      "height first")])
    c.raises(fn, ref.patchify(torch.randn(2, 3, 8, 8, generator=g), 4), 4, 12, why="4 patches of 4x4 cannot "
             "make a 12x12 image (it has 9)", hint="check the patches' shape against patch_grid(image_size, "
             "patch_size) and raise a ValueError naming both")


@check("PatchEmbedding")
def PatchEmbedding(c, cls):
    """PatchEmbedding(image_size, patch_size, in_channels, dim): patchify, then one Linear `proj` (P*P*C -> dim)."""
    g = torch.Generator().manual_seed(12)
    for size, p, ch, dim, b in ((8, 4, 3, 10, 2), (28, 7, 1, 16, 3), (6, 3, 2, 5, 1)):
        reference = ref.PatchEmbedding(size, p, ch, dim)
        model = c.build(cls, size, p, ch, dim)
        c.load(model, reference, [(only_biases, "the projection has a bias: nn.Linear(P*P*in_channels, dim)"),
                                  ("proj", "the projection is one Linear `proj` (P*P*in_channels -> dim)")])
        images = torch.randn(b, ch, size, size, generator=g)
        proj = reference.proj
        with torch.no_grad():
            got = c.call(model, images, label=f"PatchEmbedding({size}, {p}, {ch}, {dim})")
            c.close(got, reference(images), "patch tokens",
                    [(hint, lambda pat=pattern: proj(_wrong_patchify(images, p, pat))) for hint, pattern in ORDERS],
                    shape_hints=[((b, dim, size // p, size // p), "this is a Conv2d's (b, dim, gh, gw) feature map: "
                                  "flatten it to (b, gh*gw, dim), 'b d h w -> b (h w) d'")])
    _embedding_contract(c, cls, g)


def _embedding_contract(c, cls, g):
    """The attributes later chapters read, and a ValueError for images of another shape than built for."""
    model = c.build(cls, (8, 12), 4, 3, 10)
    shown = "PatchEmbedding((8, 12), 4, 3, 10)"
    for name, expected, hint in (
            ("image_size", (8, 12), "store the size as a pair: self.image_size = to_pair(image_size)"),
            ("patch_size", 4, None), ("in_channels", 3, None),
            ("grid_size", (2, 3), "self.grid_size = patch_grid(image_size, patch_size), (rows, columns)"),
            ("num_patches", 6, "num_patches is rows * columns of the grid")):
        value = getattr(model, name, None)
        value = tuple(value) if isinstance(value, (list, tuple, torch.Size)) else value
        c.ok(value == expected, f"{shown}.{name} should be {expected}, got {describe(value)}",
             hint or f"store it: self.{name} = {name} (later chapters read it)")
    hint = ("check the images in forward: images.ndim == 4 and tuple(images.shape[1:]) == (self.in_channels, "
            "*self.image_size), else raise a ValueError naming both shapes")
    with torch.no_grad():
        c.raises(model, torch.randn(2, 3, 12, 16, generator=g), label=shown, hint=hint,
                 why="images of 12x16 pixels given to a model built for 8x12 (more patches than positions)")
        c.raises(model, torch.randn(2, 1, 8, 12, generator=g), label=shown, hint=hint,
                 why="images with 1 channel given to a model built for 3")


@check("add_class_token_and_position")
def add_class_token_and_position(c, fn):
    """(tokens (b, N, D), cls_token (1, 1, D), pos_embed (1, N+1, D)) -> (b, N+1, D): prepend, then add positions."""
    g = torch.Generator().manual_seed(13)
    for b, n, dim in ((3, 5, 8), (1, 4, 6), (2, 9, 3)):
        tokens, cls_token = torch.randn(b, n, dim, generator=g), torch.randn(1, 1, dim, generator=g)
        pos = torch.randn(1, n + 1, dim, generator=g)
        expand = cls_token.expand(b, -1, -1)
        got = c.call(fn, tokens, cls_token, pos)
        c.close(got, ref.add_class_token_and_position(tokens, cls_token, pos), "tokens with class token and "
                "positions", [
                    ("the class token is appended: prepend it, so it is token 0", lambda: torch.cat([tokens, expand], 1)
                     + pos),
                    ("the position embeddings are missing: add pos_embed after prepending the class token",
                     lambda: torch.cat([expand, tokens], 1)),
                    ("the class token is missing its position: add pos_embed to the whole sequence, class token "
                     "included", lambda: torch.cat([expand, tokens + pos[:, 1:]], 1)),
                    ("the positions are shifted: row 0 of pos_embed belongs to the class token, rows 1..N to the "
                     "patches; prepend the class token first, then add pos_embed", lambda: torch.cat(
                         [expand + pos[:, -1:], tokens + pos[:, :-1]], 1)),
                    ("the class token got no position and the patches got rows 0..N-1: prepend the class token "
                     "first, then add all of pos_embed", lambda: torch.cat([expand, tokens + pos[:, :-1]], 1)),
                ], shape_hints=[((b, n, dim), "the class token was not prepended: concatenate it in front of the "
                                 "patch tokens (expand it to the batch first)"),
                                ((1, n + 1, dim), "expand the class token to the batch: cls_token.expand(b, -1, -1)")])
    tokens, pos = torch.randn(2, 4, 6, generator=g), torch.randn(1, 4, 6, generator=g)
    got = c.call(fn, tokens, None, pos)
    c.close(got, tokens + pos, "tokens for a model without class token (cls_token=None)",
            shape_hints=[((2, 5, 6), "with cls_token=None nothing is prepended: only add the positions")])
    hint = ("compare tokens.shape[1:] with pos_embed.shape[1:] after prepending, and raise a ValueError naming "
            "both shapes")
    c.raises(fn, torch.randn(2, 4, 6, generator=g), torch.randn(1, 1, 6, generator=g),
             torch.randn(1, 4, 6, generator=g), hint=hint, why="pos_embed (1, 4, 6) has no row for the class token")
    c.raises(fn, torch.randn(2, 4, 6, generator=g), torch.randn(1, 1, 6, generator=g),
             torch.randn(1, 1, 6, generator=g), hint=hint, why="pos_embed (1, 1, 6) has one row, not 5 "
             "(broadcasting would add that row to every token)")


