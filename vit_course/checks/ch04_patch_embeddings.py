"""Chapter 04's exercises: patchify, unpatchify, PatchEmbedding and add_class_token_and_position: checks
and rules."""

# ruff: noqa: B023  (each diagnosis thunk is called by Checker.close in the loop iteration that builds it)

import math

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn

from .. import patches as ref
from .core import IN_PLACE, NAME_VALUES, Slip, Variant, check
from .gradients import CUT_AT, gradient_flow
from .messages import describe, known
from .modules import only_biases, twins

PATCH_CHANNELS_FIRST = ("each patch is flattened channels-first, (c p1 p2): the course flattens it as (p1 p2 c), "
                        "pixel by pixel with the channels innermost, 'b c (h p1) (w p2) -> b (h w) (p1 p2 c)' "
                        "(F.unfold gives (c p1 p2))")
PATCH_UNFOLD_DROPS = ("check the input first: images.ndim == 4, and both sides divisible by the patch size "
                      "(patch_grid(images.shape[-2:], patch_size) raises the right error)")
PATCH_NO_CHECK = ("check the patches' shape against patch_grid(image_size, patch_size) (which checks the sides) and "
                  "raise a ValueError")
PATCH_BY_INDEX = ("check `patches.ndim == 3` first: reading the sizes by index (shape[0], shape[1], shape[-1]) lets a "
                  "4-D tensor through")
PATCH_SIZE_INT = "store the size as a pair (height, width): self.image_size = to_pair(image_size)"
PATCH_NO_GRID = "self.grid_size = patch_grid(image_size, patch_size), (rows, columns)"
PATCH_NO_BIAS = "the projection has a bias: nn.Linear(P*P*in_channels, dim)"
PATCH_CONV_PROJ = ("proj = nn.Linear(P*P*in_channels, dim), applied to patchify's patches (the given to_conv reads "
                   "proj.in_features and reshapes its weight)")
PATCH_CONV_MAP = ("this is a Conv2d's (b, dim, gh, gw) feature map: flatten it to (b, gh*gw, dim), 'b d h w -> b (h "
                  "w) d'")
PATCH_FLOORED = "in __init__, get the grid from patch_grid(image_size, patch_size), which raises the ValueError"
PATCH_PATCHEMBEDDING_NO_CHECK = ("check the images in forward: images.ndim == 4 and tuple(images.shape[1:]) == "
                                 "(self.in_channels, *self.image_size), else raise a ValueError")
PATCH_SLICED = ("compare tokens.shape[1:] with pos_embed.shape[1:] after prepending, and raise a ValueError naming "
                "both shapes")
PATCH_UNFOLD_LAYOUT = ("this is F.unfold's (b, c*P*P, N) layout: transpose to (b, N, ...) and reorder each patch "
                       "to (p1 p2 c)")
PATCH_CHANNELS_LAST = "this is (b, H, W, c): the channels come first, (b, c, H, W)"
PATCH_SIDES_SWAPPED = ("height and width are swapped, or the grid was guessed from the number of patches: take it "
                       "from image_size, which is (H, W), height first")
EXPAND = ("one class token (1, 1, D) cannot be glued to a batch of b sequences: expand it to the batch first, "
          "cls_token.expand(b, -1, -1), then concatenate along the token axis (dim=1)")
NO_CLASS_TOKEN = ("cls_token is None for a model without a class token: prepend it only `if cls_token is not None`, "
                  "and then add pos_embed (1, N, D) to the patch tokens alone")
PATCH_CASES = ((2, 3, 12, 8, 4), (1, 1, 28, 28, 7), (3, 2, 6, 9, 3), (2, 3, 5, 5, 5), (1, 4, 2, 2, 1))


@check("patchify")
def patchify(c, fn):
    """(b, c, H, W) -> (b, N, P*P*c): patches row by row from the top-left, each flattened (p1 p2 c); gradients
    reach the images; ValueErrors for images that are not 4-D or whose sides P does not divide."""
    g = torch.Generator().manual_seed(10)
    for b, ch, height, width, p in PATCH_CASES:
        images = torch.randn(b, ch, height, width, generator=g)
        got = c.call(fn, images, p)
        c.close(got, ref.patchify(images, p), f"patches of a {height}x{width} image with patch size {p}",
                c.named(c.slips("output"), images, p),
                shape_hints=[((b, ch * p * p, height * width // p // p), PATCH_UNFOLD_LAYOUT)])
    images = torch.randn(2, 3, 8, 12, generator=g)
    gradient_flow(c, fn, lambda t: c.call(fn, t["images"], 4), lambda t: ref.patchify(t["images"], 4),
                  dict(images=images))
    c.raises(fn, torch.randn(1, 3, 10, 12, generator=g), 4, hint=PATCH_UNFOLD_DROPS, rule="error-sides",
             why="a 10x12 image cannot be cut into 4x4 patches (10 is not divisible by 4)")
    c.raises(fn, torch.randn(3, 8, 8, generator=g), 4, hint=PATCH_UNFOLD_DROPS, rule="error-ndim",
             why="images of shape (3, 8, 8) have no batch axis")


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
                c.named(c.slips("output"), patches, p, size), shape_hints=[
                    ((b, height, width, ch), PATCH_CHANNELS_LAST), ((b, ch, width, height), PATCH_SIDES_SWAPPED)])
    c.phase("output")
    images = torch.randn(2, 3, 8, 12, generator=g)
    c.close(c.call(fn, ref.patchify(images, 4), 4, images.shape[-2:]), images, "image rebuilt with image_size="
            "images.shape[-2:] (a torch.Size)")
    gradient_flow(c, fn, lambda t: c.call(fn, t["patches"], 4, (8, 12)), lambda t: ref.unpatchify(t["patches"], 4,
                  (8, 12)), dict(patches=ref.patchify(images, 4)))
    _unpatchify_errors(c, fn, g)


def _unpatchify_errors(c, fn, g):
    """A ValueError for each input the statement rules out."""
    hint = PATCH_NO_CHECK
    patches = ref.patchify(torch.randn(2, 3, 8, 8, generator=g), 4)  # (2, 4, 48)
    c.raises(fn, ref.patchify(torch.randn(1, 3, 10, 10, generator=g), 5), 4, 10, hint=hint, rule="error-sides",
             why="a 10x10 image cannot be cut into 4x4 patches (10 is not divisible by 4)")
    c.raises(fn, patches[0], 4, 8, hint=hint, rule="error-ndim", why="patches of shape (4, 48) have no batch axis")
    c.raises(fn, patches[None], 4, 8, hint=hint, rule="error-ndim", why="patches of shape (1, 2, 4, 48) are 4-D")
    c.raises(fn, patches[:, :, None], 4, 8, rule="error-ndim", why="patches of shape (2, 4, 1, 48) are 4-D",
             hint=PATCH_BY_INDEX)
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
        c.load(model, reference, [(only_biases, PATCH_NO_BIAS),
                                  ("proj", "the projection is one Linear `proj` (P*P*in_channels -> dim)")])
        c.phase("output")
        images = torch.randn(b, ch, size, size, generator=g)
        with torch.no_grad():
            got = c.call(model, images, label=shown)
            c.close(got, reference(images), "patch tokens",
                    twins(c.slips("output"), reference, (size, p, ch, dim), images),
                    shape_hints=[((b, dim, size // p, size // p), PATCH_CONV_MAP)])
        c.phase("names")
        c.ok(isinstance(getattr(model, "proj", None), nn.Linear), f"{shown}.proj should be an nn.Linear, got "
             f"{describe(getattr(model, 'proj', None))}", PATCH_CONV_PROJ)
        c.phase("output")
        gradient_flow(c, cls, lambda t: c.call(model, t["images"], label=shown), lambda t: reference(t["images"]),
                      dict(images=images), model, reference)
    model = c.build(cls, (8, 12), 4, 3, 10)
    _attributes(c, model, "PatchEmbedding((8, 12), 4, 3, 10)", (8, 12), 4, 3, (2, 3))
    _embedding_errors(c, cls, model, g)


def _attributes(c, model, shown, image_size, patch_size, in_channels, grid):
    c.attributes(model, shown, [
        ("image_size", image_size, PATCH_SIZE_INT),
        ("patch_size", patch_size, "store patch_size as given, one int P: self.patch_size = patch_size"),
        ("in_channels", in_channels, None),
        ("grid_size", grid, PATCH_NO_GRID),
        ("num_patches", grid[0] * grid[1], "num_patches is rows * columns of the grid")])


def _embedding_errors(c, cls, model, g):
    """ValueErrors: a size P does not divide (in __init__), images of another shape than built for (in forward)."""
    c.raises(cls, 30, 4, 3, 10, label="PatchEmbedding", rule="error-init", why="a 30x30 image cannot be cut into 4x4 "
             "patches (30 is not divisible by 4): building the model must fail, not floor the grid to 7x7",
             hint=PATCH_FLOORED)
    shown = "PatchEmbedding((8, 12), 4, 3, 10)"
    hint = PATCH_PATCHEMBEDDING_NO_CHECK
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
        got = c.call(fn, tokens, cls_token, pos, errors=[("Sizes of tensors must match except in dimension", EXPAND)])
        c.close(got, ref.add_class_token_and_position(tokens, cls_token, pos), "tokens with class token and "
                "positions", c.named(c.slips("output"), tokens, cls_token, pos), shape_hints=[
                    ((b, n, dim), "the class token was not prepended: concatenate it in front of the patch tokens "
                     "(expand it to the batch first)"),
                    ((1, n + 1, dim), "expand the class token to the batch: cls_token.expand(b, -1, -1)")])
        gradient_flow(c, fn, lambda t: c.call(fn, t["tokens"], t["cls_token"], t["pos_embed"]),
                      lambda t: ref.add_class_token_and_position(t["tokens"], t["cls_token"], t["pos_embed"]),
                      dict(tokens=tokens, cls_token=cls_token, pos_embed=pos))
    c.phase("no-class-token")
    tokens, pos = torch.randn(2, 4, 6, generator=g), torch.randn(1, 4, 6, generator=g)
    got = c.call(fn, tokens, None, pos, errors=[("'NoneType' object has no attribute", NO_CLASS_TOKEN)])
    c.close(got, tokens + pos, "tokens for a model without class token (cls_token=None)",
            shape_hints=[((2, 5, 6), "with cls_token=None nothing is prepended: only add the positions")])
    tokens, cls_token = torch.randn(2, 4, 6, generator=g), torch.randn(1, 1, 6, generator=g)
    for rows, why in ((4, "pos_embed (1, 4, 6) has no row for the class token"),
                      (1, "pos_embed (1, 1, 6) has one row, not 5 (broadcasting would add that row to every token)"),
                      (7, "pos_embed (1, 7, 6) has 7 rows for 5 tokens (slicing it would hide the mismatch)")):
        c.raises(fn, tokens, cls_token, torch.randn(1, rows, 6, generator=g), hint=PATCH_SLICED, why=why, rule="error",
                 shapes=[(1, rows, 6), [(2, 4, 6), (2, 5, 6)]])


# each exercise's rules, by the key a check passes to Checker.phase (a failure carries it as CheckFailed.rule);
# the statement (the exercise's markdown and stub docstring) is where their words are written
RULES = {
    "patchify": ("output", "error-ndim", "error-sides", "gradient"),
    "unpatchify": ("output", "image-size", "error-sides", "error-ndim", "error-length", "error-width", "gradient"),
    "PatchEmbedding": ("attributes", "names", "output", "error-init", "error-shape", "gradient"),
    "add_class_token_and_position": ("output", "no-class-token", "error", "gradient"),
}


# ---- the catalogue: each slip once, with the rule it breaks and the hint it earns; the accepted variants


def patchify_unfold(check=True):
    """patchify with tensor.unfold; without ``check`` nothing checks the sides and unfold drops the remainder."""
    def patchify(images, p):
        b, c, height, width = images.shape
        if check and (height % p or width % p):
            raise ValueError(f"{height}x{width} is not divisible by {p}")
        patches = images.unfold(2, p, p).unfold(3, p, p)  # (b, c, gh, gw, p, p)
        return patches.permute(0, 2, 3, 4, 5, 1).reshape(b, -1, p * p * c)
    return patchify


def patchify_F_unfold(images, p):
    ref.patch_grid(images.shape[-2:], p)
    return F.unfold(images, p, stride=p).transpose(1, 2)  # (b, N, c*p*p): channels first


def unpatchify_reshape(patches, p, size):
    height, width = (size, size) if isinstance(size, int) else size
    b, n, d = patches.shape
    if height % p or width % p or n != (height // p) * (width // p) or d % (p * p):
        raise ValueError(f"patches {tuple(patches.shape)} do not make a {height}x{width} image")
    grid = patches.reshape(b, height // p, width // p, p, p, d // (p * p))  # (b, gh, gw, p1, p2, c)
    return grid.permute(0, 5, 1, 3, 2, 4).reshape(b, -1, height, width)


def _ordered(pattern, inverse=False):
    """patchify with the einops ``pattern`` (a wrong order), or with ``inverse`` the unpatchify that undoes it."""
    def patchify(images, p):
        return rearrange(images, pattern, p1=p, p2=p)

    def unpatchify(patches, p, size):
        left, right = pattern.split(" -> ")
        height, width = ref.to_pair(size)
        return rearrange(patches, f"{right} -> {left}", p1=p, p2=p, h=height // p, w=width // p)
    return unpatchify if inverse else patchify


class PatchEmbeddingConv(nn.Module):
    """timm's way: a Conv2d with kernel = stride = P, called proj (exercise 4.3 asks an nn.Linear, so its check rejects
    it; ViT's check loads it)."""

    def __init__(self, image_size, patch_size, in_channels, dim):
        super().__init__()
        self.image_size, self.patch_size, self.in_channels = ref.to_pair(image_size), patch_size, in_channels
        self.grid_size = ref.patch_grid(image_size, patch_size)
        self.num_patches = self.grid_size[0] * self.grid_size[1]
        self.proj = nn.Conv2d(in_channels, dim, patch_size, stride=patch_size)

    def forward(self, images):
        if tuple(images.shape[1:]) != (self.in_channels, *self.image_size):
            raise ValueError(f"images {tuple(images.shape)} do not fit {self.image_size}")
        return self.proj(images).flatten(2).transpose(1, 2)  # (b, N, dim)


class PatchEmbeddingMap(PatchEmbeddingConv):
    def forward(self, images):
        return self.proj(images)


def embed_ok(tokens, cls_token, pos_embed):
    if cls_token is not None:
        tokens = torch.cat((cls_token.repeat(len(tokens), 1, 1), tokens), dim=1)
    if pos_embed.shape[1] != tokens.shape[1]:
        raise ValueError(f"pos_embed {tuple(pos_embed.shape)} does not fit tokens {tuple(tokens.shape)}")
    return tokens + pos_embed


def unpatchify_square_guess(patches, p, size):
    """Ignores image_size: a grid of isqrt(N) rows, right for square images only."""
    return rearrange(patches, "b (h w) (p1 p2 c) -> b c (h p1) (w p2)", p1=p, p2=p, h=math.isqrt(patches.shape[1]))


def patchify_in_place(images, p):
    images -= images.mean()  # "centre the pixels first"
    return ref.patchify(images, p)


def unpatchify_pair_only(patches, p, size):
    height, width = size  # an int image_size cannot be unpacked
    return ref.unpatchify(patches, p, (height, width))


def unpatchify_checks(sides=True, ndim=True, length=True, width=True):
    """unpatchify with some of its checks left out (without ``sides``, the grid floored)."""
    def unpatchify(patches, p, size):
        gh, gw = ref.patch_grid(size, p) if sides else (side // p for side in ref.to_pair(size))
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
    gh, gw = ref.patch_grid(size, p)
    b, n, width = patches.shape[0], patches.shape[1], patches.shape[-1]
    if n != gh * gw or width % (p * p):
        raise ValueError(f"patches {tuple(patches.shape)} do not make a {size} image")
    return patches.reshape(b, gh, gw, p, p, width // (p * p)).permute(0, 5, 1, 3, 2, 4).reshape(
        b, width // (p * p), gh * p, gw * p)


def unpatchify_resize(patches, p, size):
    gh, gw = ref.patch_grid(size, p)
    b, n, d = patches.shape
    if n != gh * gw or d % (p * p):
        raise ValueError(f"patches {tuple(patches.shape)} do not make a {size} image")
    grid = patches.resize_(b, gh, gw, p, p, d // (p * p))  # resize_ reshapes the caller's tensor too
    return grid.permute(0, 5, 1, 3, 2, 4).reshape(b, d // (p * p), gh * p, gw * p)


class PatchEmbeddingSlip(ref.PatchEmbedding):
    """The reference PatchEmbedding with one slip, ``slip``, or patches in the wrong order ``pattern`` (einops); its
    forward checks nothing (the slip "no_check": a 12x16 image silently gives 12 tokens)."""

    slip = pattern = None

    def __init__(self, image_size, patch_size, in_channels, dim):
        if self.slip == "patch_pair":
            patch_size = ref.to_pair(patch_size)
        if self.slip == "floored":  # the sides floored to multiples of P (30 // 4: a 7x7 grid), no error
            image_size = tuple(side // patch_size * patch_size for side in ref.to_pair(image_size))
        super().__init__(image_size, patch_size, in_channels, dim)
        if self.slip == "no_bias":
            self.proj = nn.Linear(patch_size * patch_size * in_channels, dim, bias=False)
        if self.slip == "size_int":
            self.image_size = image_size
        if self.slip == "no_grid":
            del self.grid_size

    def forward(self, images):
        if self.slip == "in_place":
            images /= images.abs().max()
        if self.slip == "weight_data":
            return F.linear(ref.patchify(images, self.patch_size), self.proj.weight.data, self.proj.bias)
        patches = (_ordered(self.pattern) if self.pattern else ref.patchify)(images, self.patch_size)
        return self.proj(patches.detach() if self.slip == "detached" else patches)


def patch_embedding(slip=None, pattern=None):
    return type("PatchEmbedding", (PatchEmbeddingSlip,), {"slip": slip, "pattern": pattern})


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
        if slip != "no_check" and tokens.shape[1:] != pos_embed.shape[1:]:
            raise ValueError("position embeddings don't fit" if slip == "vague" else
                             f"pos_embed {tuple(pos_embed.shape)} does not fit tokens {tuple(tokens.shape)}")
        if slip == "plus_equals":
            tokens += pos_embed  # without a class token, the caller's tokens
            return tokens
        return tokens + (pos_embed.data if slip == "pos_data" else pos_embed)
    return add_class_token_and_position


ORDERS = [  # (name, hint, einops pattern of a wrong patchify): slips of patchify, of unpatchify (the inverse) and of
    # PatchEmbedding (its patches projected); patchify's channels-first one is F.unfold's, patchify_F_unfold
    ("channels_first", PATCH_CHANNELS_FIRST, "b c (h p1) (w p2) -> b (h w) (c p1 p2)"),
    ("columns", "the patches run column by column: read them row by row from the top-left, (h w), not (w h)",
     "b c (h p1) (w p2) -> b (w h) (p1 p2 c)"),
    ("columns_channels_first", "the patches run column by column and are flattened channels-first: use 'b c (h p1) "
     "(w p2) -> b (h w) (p1 p2 c)'", "b c (h p1) (w p2) -> b (w h) (c p1 p2)"),
    ("p2_p1", "each patch is flattened column by column, (p2 p1 c): flatten it row by row, (p1 p2 c)",
     "b c (h p1) (w p2) -> b (h w) (p2 p1 c)"),
]
SLIPS = [Slip("patchify", name, rule, hint, impl) for name, rule, hint, impl in [
    ("channels_first", "output", PATCH_CHANNELS_FIRST, patchify_F_unfold),
    ("unfold_drops", "error-sides", PATCH_UNFOLD_DROPS, patchify_unfold(check=False)),
    ("no_ndim", "error-ndim", PATCH_UNFOLD_DROPS, lambda x, p: ref.patchify(x, p) if x.ndim == 4 else torch.zeros(1)),
    ("detach", "gradient", CUT_AT, lambda x, p: ref.patchify(x.detach(), p)),
    ("centred", "inputs", IN_PLACE, patchify_in_place),
    ("channels_first_square", "output", PATCH_CHANNELS_FIRST,
     lambda x, p: ref.patchify(x, p) if x.shape[-1] % p else rearrange(
        x, "b c (h p1) (w p2) -> b (h w) (c p1 p2)", p1=p, p2=p)),
    ("unfold", "output", PATCH_UNFOLD_LAYOUT, lambda x, p: F.unfold(x, p, stride=p)),
    ("no_check_sides", "error-sides", PATCH_UNFOLD_DROPS,
     lambda x, p: rearrange(x, "b c (h p1) (w p2) -> b (h w) (p1 p2 c)", p1=p, p2=p)),
    ("reshaped", "output", "the image was only reshaped: a patch's pixels are not next to each other in memory; "
     "split the height and width into (h p1) and (w p2) and bring p1, p2 next to the channels, 'b c (h p1) (w p2) -> "
     "b (h w) (p1 p2 c)'",
     lambda x, p: ref.patchify(x, p) if x.shape[-1] % p else x.reshape(len(x), -1, p * p * x.shape[1])),
]] + [Slip("patchify", name, "output", hint, _ordered(pattern)) for name, hint, pattern in ORDERS[1:]]
SLIPS += [Slip("unpatchify", name, rule, hint, impl) for name, rule, hint, impl in [
    ("int", "image-size", known('cannot unpack non-iterable int object'), unpatchify_pair_only),
    ("no_check", "error-sides", PATCH_NO_CHECK, unpatchify_checks(sides=False, ndim=False, length=False, width=False)),
    ("no_ndim", "error-ndim", PATCH_NO_CHECK, unpatchify_checks(ndim=False)),
    ("no_length", "error-length", PATCH_NO_CHECK, unpatchify_checks(length=False)),
    ("no_width", "error-width", PATCH_NO_CHECK, unpatchify_checks(width=False)),
    ("by_index", "error-ndim", PATCH_BY_INDEX, unpatchify_by_index),
    ("detach", "gradient", CUT_AT, lambda q, p, s: ref.unpatchify(q, p, s).detach()),
    ("resize_", "inputs", IN_PLACE, unpatchify_resize),
    ("no_grid", "output", known('Could not infer sizes for'),  # h and w left to einops
     lambda q, p, s: rearrange(q, "b (h w) (p1 p2 c) -> b c (h p1) (w p2)", p1=p, p2=p)),
    ("channels_last", "output", PATCH_CHANNELS_LAST,
     lambda q, p, s: unpatchify_reshape(q, p, s).permute(0, 2, 3, 1)),
    ("sides_swapped", "output", PATCH_SIDES_SWAPPED,
     lambda q, p, s: unpatchify_reshape(q, p, s if isinstance(s, int) else s[::-1])),
    ("square_guess", "output", PATCH_SIDES_SWAPPED, unpatchify_square_guess),
]] + [Slip("unpatchify", name, "output", hint, _ordered(pattern, inverse=True)) for name, hint, pattern in ORDERS]
SLIPS += [Slip("PatchEmbedding", name, rule, hint, impl) for name, rule, hint, impl in [
    ("size_int", "attributes", PATCH_SIZE_INT, patch_embedding("size_int")),
    ("patch_pair", "attributes", known("not supported between instances of 'tuple' and 'int'"),
     patch_embedding("patch_pair")),
    ("no_grid", "attributes", PATCH_NO_GRID, patch_embedding("no_grid")),
    ("no_bias", "names", PATCH_NO_BIAS, patch_embedding("no_bias")),
    ("conv_proj", "names", PATCH_CONV_PROJ, PatchEmbeddingConv),
    ("conv_map", "output", PATCH_CONV_MAP, PatchEmbeddingMap),
    ("floored", "error-init", PATCH_FLOORED, patch_embedding("floored")),
    ("no_check", "error-shape", PATCH_PATCHEMBEDDING_NO_CHECK, patch_embedding("no_check")),
    ("detached", "gradient", CUT_AT, patch_embedding("detached")),
    ("weight_data", "gradient", CUT_AT, patch_embedding("weight_data")),
    ("normalised", "inputs", IN_PLACE, patch_embedding("in_place")),
]] + [Slip("PatchEmbedding", name, "output", hint, patch_embedding(pattern=pattern)) for name, hint, pattern in ORDERS]
SLIPS += [Slip("add_class_token_and_position", name, rule, hint, impl) for name, rule, hint, impl in [
    ("appended", "output", "the class token is appended: prepend it, so it is token 0",
     lambda t, c, p: torch.cat([t, c.expand(len(t), -1, -1)], 1) + p),
    ("no_expand", "output", EXPAND, embed_slip("no_expand")),
    ("no_none", "no-class-token", NO_CLASS_TOKEN, embed_slip("no_none")),
    ("sliced", "error", PATCH_SLICED, embed_slip("sliced")),
    ("vague", "error", NAME_VALUES, embed_slip("vague")),
    ("no_check", "error", PATCH_SLICED, embed_slip("no_check")),
    ("cls_detached", "gradient", CUT_AT, embed_slip("cls_detached")),
    ("pos_data", "gradient", CUT_AT, embed_slip("pos_data")),
    ("plus_equals", "inputs", IN_PLACE, embed_slip("plus_equals")),
    ("no_position", "output", "the position embeddings are missing: add pos_embed after prepending the class token",
     lambda t, c, p: torch.cat([c.expand(len(t), -1, -1), t], 1)),
    ("not_expanded", "output", EXPAND, lambda t, c, p: torch.cat([c, t], 1) + p),
    ("none_ignored", "no-class-token", NO_CLASS_TOKEN,
     lambda t, c, p: torch.cat([c.expand(len(t), -1, -1), t], 1) + p),
    ("shifted", "output", "the positions are shifted: row 0 of pos_embed belongs to the class token, rows 1..N to the "
     "patches; prepend the class token first, then add pos_embed",
     lambda t, c, p: t + p if c is None else torch.cat([c.expand(len(t), -1, -1) + p[:, -1:], t + p[:, :-1]], 1)),
    ("cls_no_position", "output", "the class token got no position and the patches got rows 0..N-1: prepend the class "
     "token first, then add all of pos_embed",
     lambda t, c, p: t + p if c is None else torch.cat([c.expand(len(t), -1, -1), t + p[:, :-1]], 1)),
    ("cls_missing_position", "output", "the class token is missing its position: add pos_embed to the whole "
     "sequence, class token included", lambda t, c, p: torch.cat([c.expand(len(t), -1, -1), t + p[:, 1:]], 1)),
    ("no_check_one_row", "error", PATCH_SLICED,
     lambda t, c, p: embed_slip("no_check" if p.shape[1] == 1 else None)(t, c, p)),
]]


VARIANTS = [Variant(exercise, name, impl) for exercise, name, impl in [
    ("patchify", "reference_patchify", ref.patchify),
    ("patchify", "patchify_unfold", patchify_unfold()),
    ("unpatchify", "reference_unpatchify", ref.unpatchify),
    ("unpatchify", "unpatchify_reshape", unpatchify_reshape),
    ("PatchEmbedding", "reference_patchembedding", ref.PatchEmbedding),
    ("add_class_token_and_position", "reference_add_class_token_and_position", ref.add_class_token_and_position),
    ("add_class_token_and_position", "embed_ok", embed_ok),
]]
