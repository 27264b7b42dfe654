"""Checks for chapters 04 and 09: patchify, unpatchify, PatchEmbedding, the class-token/position step,
resample_position_embeddings."""

# ruff: noqa: B023  (each diagnosis thunk is called by Checker.close in the loop iteration that builds it)

import torch
import torch.nn.functional as F
from einops import rearrange

from .. import patches as ref
from .core import CheckFailed, check

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
                [(hint, lambda i=images, p=p, pat=pattern: _wrong_patchify(i, p, pat)) for hint, pattern in ORDERS],
                shape_hints=[((b, ch * p * p, height * width // p // p), "this is F.unfold's (b, c*P*P, N) layout: "
                              "transpose to (b, N, ...) and reorder each patch to (p1 p2 c)")])
    images = torch.randn(1, 3, 10, 12, generator=g)
    try:
        out = fn(images, 4)
    except NotImplementedError:
        raise
    except Exception:
        c.tests += 1
    else:
        c.fail(f"a 10x12 image with patch size 4 returned {tuple(getattr(out, 'shape', ()))} instead of an error",
               "10 is not divisible by 4: check that both sides are divisible by the patch size and raise a "
               "ValueError that names them")


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
                shape_hints=[((b, height, width, ch), "this is (b, H, W, c): the channels come first, (b, c, H, W)")])


@check("PatchEmbedding")
def PatchEmbedding(c, cls):
    """PatchEmbedding(image_size, patch_size, in_channels, dim): patchify, then one Linear `proj` (P*P*C -> dim)."""
    g = torch.Generator().manual_seed(12)
    for size, p, ch, dim, b in ((8, 4, 3, 10, 2), (28, 7, 1, 16, 3), (6, 3, 2, 5, 1)):
        reference = ref.PatchEmbedding(size, p, ch, dim)
        model = c.build(cls, size, p, ch, dim)
        c.load(model, reference, [("proj", "the projection is one Linear `proj` (P*P*in_channels -> dim)")])
        images = torch.randn(b, ch, size, size, generator=g)
        proj = reference.proj
        with torch.no_grad():
            got = c.call(model, images, label=f"PatchEmbedding({size}, {p}, {ch}, {dim})")
            c.close(got, reference(images), "patch tokens",
                    [(hint, lambda pat=pattern: proj(_wrong_patchify(images, p, pat))) for hint, pattern in ORDERS],
                    shape_hints=[((b, dim, size // p, size // p), "this is a Conv2d's (b, dim, gh, gw) feature map: "
                                  "flatten it to (b, gh*gw, dim), 'b d h w -> b (h w) d'")])


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
                ], shape_hints=[((b, n, dim), "the class token was not prepended: concatenate it in front of the "
                                 "patch tokens (expand it to the batch first)"),
                                ((1, n + 1, dim), "expand the class token to the batch: cls_token.expand(b, -1, -1)")])
    tokens, pos = torch.randn(2, 4, 6, generator=g), torch.randn(1, 4, 6, generator=g)
    got = c.call(fn, tokens, None, pos)
    c.close(got, tokens + pos, "tokens for a model without class token (cls_token=None)",
            shape_hints=[((2, 5, 6), "with cls_token=None nothing is prepended: only add the positions")])


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

        try:  # antialiasing only matters when shrinking: both are accepted
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
            ("this interpolates along the flat sequence: lay the patch embeddings out on their 2D grid "
             "(1, D, gh, gw) and resize that", lambda: torch.cat([prefix, F.interpolate(
                 pos[:, k:].transpose(1, 2), size=new[0] * new[1], mode="linear").transpose(1, 2)], 1)),
        ], atol=1e-5, shape_hints=[((1, new[0] * new[1], shape[2]), "the class token's embedding was dropped: keep "
                                    "the first num_prefix_tokens rows and concatenate them back in front")])
