"""Chapter 04's exercises: patchify, unpatchify, PatchEmbedding and add_class_token_and_position: checks
and rules."""

# ruff: noqa: B023  (each diagnosis thunk is called by Checker.close in the loop iteration that builds it)

import torch
from einops import rearrange
from torch import nn

from .. import patches as ref
from .core import check
from .gradients import gradient_flow
from .messages import describe
from .modules import only_biases

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
EXPAND = ("one class token (1, 1, D) cannot be glued to a batch of b sequences: expand it to the batch first, "
          "cls_token.expand(b, -1, -1), then concatenate along the token axis (dim=1)")
NO_CLASS_TOKEN = ("cls_token is None for a model without a class token: prepend it only `if cls_token is not None`, "
                  "and then add pos_embed (1, N, D) to the patch tokens alone")
PATCH_CASES = ((2, 3, 12, 8, 4), (1, 1, 28, 28, 7), (3, 2, 6, 9, 3), (2, 3, 5, 5, 5), (1, 4, 2, 2, 1))


def _wrong_patchify(images, p, pattern):
    return rearrange(images, pattern, p1=p, p2=p)


def _wrong_unpatchify(patches, p, size, pattern):
    left, right = pattern.split(" -> ")
    return rearrange(patches, f"{right} -> {left}", p1=p, p2=p, h=size[0] // p, w=size[1] // p)


@check("patchify")
def patchify(c, fn):
    """(b, c, H, W) -> (b, N, P*P*c): patches row by row from the top-left, each flattened (p1 p2 c); gradients
    reach the images; ValueErrors for images that are not 4-D or whose sides P does not divide."""
    g = torch.Generator().manual_seed(10)
    for b, ch, height, width, p in PATCH_CASES:
        images = torch.randn(b, ch, height, width, generator=g)
        got = c.call(fn, images, p)
        c.close(got, ref.patchify(images, p), f"patches of a {height}x{width} image with patch size {p}",
                [(hint, lambda i=images, p=p, pat=pattern: _wrong_patchify(i, p, pat)) for hint, pattern in ORDERS]
                + [(RESHAPED, lambda i=images, p=p: i.reshape(b, -1, p * p * ch))],
                shape_hints=[((b, ch * p * p, height * width // p // p), "this is F.unfold's (b, c*P*P, N) layout: "
                              "transpose to (b, N, ...) and reorder each patch to (p1 p2 c)")])
    images = torch.randn(2, 3, 8, 12, generator=g)
    gradient_flow(c, fn, lambda t: c.call(fn, t["images"], 4), lambda t: ref.patchify(t["images"], 4),
                  dict(images=images))
    hint = ("check the input first: images.ndim == 4, and both sides divisible by the patch size "
            "(patch_grid(images.shape[-2:], patch_size) raises the right error)")
    c.raises(fn, torch.randn(1, 3, 10, 12, generator=g), 4, hint=hint, rule="error-sides",
             why="a 10x12 image cannot be cut into 4x4 patches (10 is not divisible by 4)")
    c.raises(fn, torch.randn(3, 8, 8, generator=g), 4, hint=hint, why="images of shape (3, 8, 8) have no batch axis",
             rule="error-ndim")


@check("unpatchify")
def unpatchify(c, fn):
    """(b, N, P*P*c) -> (b, c, H, W), the inverse of patchify; image_size is H or (H, W); gradients reach the
    patches; ValueErrors for sides P does not divide, patches that are not 3-D, of the wrong length or of a width
    that is not a multiple of P*P."""
    g = torch.Generator().manual_seed(11)
    for b, ch, height, width, p in PATCH_CASES:
        images = torch.randn(b, ch, height, width, generator=g)
        patches = ref.patchify(images, p)
        size = height if height == width else (height, width)
        c.phase("image-size" if isinstance(size, int) else "output")
        got = c.call(fn, patches, p, size)
        c.close(got, images, f"image rebuilt from patches of size {p} (image_size={size})",
                [(hint.replace("patchify", "unpatchify"), lambda q=patches, p=p, pat=pattern:
                  _wrong_unpatchify(q, p, (height, width), pat)) for hint, pattern in ORDERS],
                shape_hints=[((b, height, width, ch), "this is (b, H, W, c): the channels come first, (b, c, H, W)"),
                             ((b, ch, width, height), "height and width are swapped, or the grid was guessed "
                              "from the number of patches: take it from image_size, which is (H, W), height first")])
    c.phase("output")
    images = torch.randn(2, 3, 8, 12, generator=g)
    c.close(c.call(fn, ref.patchify(images, 4), 4, images.shape[-2:]), images, "image rebuilt with image_size="
            "images.shape[-2:] (a torch.Size)")
    gradient_flow(c, fn, lambda t: c.call(fn, t["patches"], 4, (8, 12)), lambda t: ref.unpatchify(t["patches"], 4,
                  (8, 12)), dict(patches=ref.patchify(images, 4)))
    _unpatchify_errors(c, fn, g)


def _unpatchify_errors(c, fn, g):
    """A ValueError for each input the statement rules out."""
    hint = ("check the patches' shape against patch_grid(image_size, patch_size) (which checks the sides) and "
            "raise a ValueError")
    patches = ref.patchify(torch.randn(2, 3, 8, 8, generator=g), 4)  # (2, 4, 48)
    c.raises(fn, ref.patchify(torch.randn(1, 3, 10, 10, generator=g), 5), 4, 10, hint=hint, rule="error-sides",
             why="a 10x10 image cannot be cut into 4x4 patches (10 is not divisible by 4)")
    c.raises(fn, patches[0], 4, 8, hint=hint, rule="error-ndim", why="patches of shape (4, 48) have no batch axis")
    c.raises(fn, patches[None], 4, 8, hint=hint, rule="error-ndim", why="patches of shape (1, 2, 4, 48) are 4-D")
    c.raises(fn, patches[:, :, None], 4, 8, rule="error-ndim", why="patches of shape (2, 4, 1, 48) are 4-D",
             hint="check `patches.ndim == 3` first: reading the sizes by index (shape[0], shape[1], shape[-1]) "
             "lets a 4-D tensor through")
    c.raises(fn, patches, 4, 12, hint=hint, rule="error-length", why="4 patches of 4x4 cannot make a 12x12 image "
             "(it has 9)")
    c.raises(fn, torch.randn(2, 4, 40, generator=g), 4, 8, hint=hint, rule="error-width",
             why="patches of width 40 are not P*P*c values for P = 4 (40 is not a multiple of 16)")


@check("PatchEmbedding")
def PatchEmbedding(c, cls):
    """PatchEmbedding(image_size, patch_size, in_channels, dim): keeps image_size as a pair, patch_size,
    in_channels, grid_size and num_patches; one Linear `proj` (P*P*C -> dim) on the patches; gradients reach the
    images and proj; ValueErrors in __init__ for sides P does not divide, and in forward for images of another
    shape than built for."""
    g = torch.Generator().manual_seed(12)
    for size, p, ch, dim, b in ((8, 4, 3, 10, 2), (28, 7, 1, 16, 3), (6, 3, 2, 5, 1)):
        reference = ref.PatchEmbedding(size, p, ch, dim)
        c.phase("attributes")  # what __init__ raises belongs to the attributes it is storing
        model = c.build(cls, size, p, ch, dim)
        shown = f"PatchEmbedding({size}, {p}, {ch}, {dim})"
        _attributes(c, model, shown, (size, size), p, ch, (size // p, size // p))
        c.load(model, reference, [(only_biases, "the projection has a bias: nn.Linear(P*P*in_channels, dim)"),
                                  ("proj", "the projection is one Linear `proj` (P*P*in_channels -> dim)")])
        c.phase("output")
        images = torch.randn(b, ch, size, size, generator=g)
        proj = reference.proj
        with torch.no_grad():
            got = c.call(model, images, label=shown)
            c.close(got, reference(images), "patch tokens",
                    [(hint, lambda pat=pattern: proj(_wrong_patchify(images, p, pat))) for hint, pattern in ORDERS],
                    shape_hints=[((b, dim, size // p, size // p), "this is a Conv2d's (b, dim, gh, gw) feature map: "
                                  "flatten it to (b, gh*gw, dim), 'b d h w -> b (h w) d'")])
        c.phase("names")
        c.ok(isinstance(getattr(model, "proj", None), nn.Linear), f"{shown}.proj should be an nn.Linear, got "
             f"{describe(getattr(model, 'proj', None))}", "proj = nn.Linear(P*P*in_channels, dim), applied to "
             "patchify's patches (the given to_conv reads proj.in_features and reshapes its weight)")
        c.phase("output")
        gradient_flow(c, cls, lambda t: c.call(model, t["images"], label=shown), lambda t: reference(t["images"]),
                      dict(images=images), model, reference)
    model = c.build(cls, (8, 12), 4, 3, 10)
    _attributes(c, model, "PatchEmbedding((8, 12), 4, 3, 10)", (8, 12), 4, 3, (2, 3))
    _embedding_errors(c, cls, model, g)


def _attributes(c, model, shown, image_size, patch_size, in_channels, grid):
    c.attributes(model, shown, [
        ("image_size", image_size, "store the size as a pair (height, width): self.image_size = to_pair(image_size)"),
        ("patch_size", patch_size, "store patch_size as given, one int P: self.patch_size = patch_size"),
        ("in_channels", in_channels, None),
        ("grid_size", grid, "self.grid_size = patch_grid(image_size, patch_size), (rows, columns)"),
        ("num_patches", grid[0] * grid[1], "num_patches is rows * columns of the grid")])


def _embedding_errors(c, cls, model, g):
    """ValueErrors: a size P does not divide (in __init__), images of another shape than built for (in forward)."""
    c.raises(cls, 30, 4, 3, 10, label="PatchEmbedding", rule="error-init", why="a 30x30 image cannot be cut into 4x4 "
             "patches (30 is not divisible by 4): building the model must fail, not floor the grid to 7x7",
             hint="in __init__, get the grid from patch_grid(image_size, patch_size), which raises the ValueError")
    shown = "PatchEmbedding((8, 12), 4, 3, 10)"
    hint = ("check the images in forward: images.ndim == 4 and tuple(images.shape[1:]) == (self.in_channels, "
            "*self.image_size), else raise a ValueError")
    with torch.no_grad():
        c.raises(model, torch.randn(2, 3, 12, 16, generator=g), label=shown, hint=hint, rule="error-shape",
                 why="images of 12x16 pixels given to a model built for 8x12 (more patches than positions)")
        c.raises(model, torch.randn(2, 1, 8, 12, generator=g), label=shown, hint=hint,
                 why="images with 1 channel given to a model built for 3")
        c.raises(model, torch.randn(3, 8, 12, generator=g), label=shown, hint=hint,
                 why="images of shape (3, 8, 12) have no batch axis")


@check("add_class_token_and_position")
def add_class_token_and_position(c, fn):
    """(tokens (b, N, D), cls_token (1, 1, D) or None, pos_embed (1, N+1, D)) -> (b, N+1, D): prepend the class
    token to every sequence, then add the positions; gradients reach all three; a ValueError naming both shapes when
    pos_embed does not fit the sequence."""
    g = torch.Generator().manual_seed(13)
    for b, n, dim in ((3, 5, 8), (1, 4, 6), (2, 9, 3)):
        tokens, cls_token = torch.randn(b, n, dim, generator=g), torch.randn(1, 1, dim, generator=g)
        pos = torch.randn(1, n + 1, dim, generator=g)
        expand = cls_token.expand(b, -1, -1)
        got = c.call(fn, tokens, cls_token, pos, errors=[("Sizes of tensors must match except in dimension", EXPAND)])
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
        gradient_flow(c, fn, lambda t: c.call(fn, t["tokens"], t["cls_token"], t["pos_embed"]),
                      lambda t: ref.add_class_token_and_position(t["tokens"], t["cls_token"], t["pos_embed"]),
                      dict(tokens=tokens, cls_token=cls_token, pos_embed=pos))
    c.phase("no-class-token")
    tokens, pos = torch.randn(2, 4, 6, generator=g), torch.randn(1, 4, 6, generator=g)
    got = c.call(fn, tokens, None, pos, errors=[("'NoneType' object has no attribute", NO_CLASS_TOKEN)])
    c.close(got, tokens + pos, "tokens for a model without class token (cls_token=None)",
            shape_hints=[((2, 5, 6), "with cls_token=None nothing is prepended: only add the positions")])
    hint = ("compare tokens.shape[1:] with pos_embed.shape[1:] after prepending, and raise a ValueError naming "
            "both shapes")
    tokens, cls_token = torch.randn(2, 4, 6, generator=g), torch.randn(1, 1, 6, generator=g)
    for rows, why in ((4, "pos_embed (1, 4, 6) has no row for the class token"),
                      (1, "pos_embed (1, 1, 6) has one row, not 5 (broadcasting would add that row to every token)"),
                      (7, "pos_embed (1, 7, 6) has 7 rows for 5 tokens (slicing it would hide the mismatch)")):
        c.raises(fn, tokens, cls_token, torch.randn(1, rows, 6, generator=g), hint=hint, why=why, rule="error",
                 shapes=[(1, rows, 6), [(2, 4, 6), (2, 5, 6)]])


# each exercise's rules: the key a check passes to Checker.phase (a failure carries it as CheckFailed.rule)
# and the words that state it in the exercise's statement
RULES = {
    "patchify": {
        "output": "patches row by row from the top-left, each flattened in `(p1 p2 c)` order",
        "error-ndim": "raise `ValueError` when `images` is not 4-dimensional",
        "error-sides": "when $H$ or $W$ is not divisible by $P$",
        "gradient": "**Gradients** flow back to `images`",
    },
    "unpatchify": {
        "output": "`unpatchify(patchify(x, P), P, x.shape[-2:])` equal to `x`",
        "image-size": "either an int $H$ (square images) or a pair $(H, W)$",
        "error-sides": "`ValueError` when the sides aren't divisible by $P$",
        "error-ndim": "not 3-dimensional",
        "error-length": "its length is not $(H/P)(W/P)$",
        "error-width": "its width is not a multiple of $P^2$",
        "gradient": "**Gradients** flow back to `patches`",
    },
    "PatchEmbedding": {
        "attributes": "stores `image_size` as a pair (use `to_pair`), `patch_size` (one int $P$) and `in_channels`, "
                      "the grid `grid_size` (rows, columns) and `num_patches` $N$",
        "names": "creates `proj = nn.Linear(P*P*in_channels, dim)`",
        "output": "returns tokens $(b, N, D)$",
        "error-init": "It raises `ValueError` when $P$ does not divide both sides",
        "error-shape": "raises `ValueError` when the images don't have the shape the module was built for",
        "gradient": "Gradients flow back to the images and to `proj`",
    },
    "add_class_token_and_position": {
        "output": "the class token in front of every sequence, then the position embeddings added",
        "no-class-token": "or `None` for a model without one",
        "error": "`ValueError` when `pos_embed` doesn't fit the token sequence (too few rows, too many, or one row "
                 "that would broadcast), naming both shapes",
        "gradient": "**Gradients** flow back to `tokens`, `cls_token` and `pos_embed`",
    },
}
