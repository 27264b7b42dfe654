"""Chapter 04's exercises: patchify, PatchEmbedding, linear_to_conv_weight, add_class_token_and_position and
sincos_position_embedding: checks, rules, and the catalogue of slips (each a small wrong implementation named after
its mistake) and of accepted variants."""

# ruff: noqa: B023  (each diagnosis thunk is called by Checker.close in the loop iteration that builds it)

import math

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn

from .. import patches as ref
from .core import IN_PLACE, Slip, Variant, check
from .gradients import CUT_AT, gradient_flow
from .messages import describe
from .modules import only_biases, twins

PATCH_CHANNELS_FIRST = ("each patch is flattened channels-first, (c p1 p2): the course flattens it as (p1 p2 c), "
                        "pixel by pixel with the channels innermost (F.unfold gives (c p1 p2))")
PATCH_COLUMNS = "the patches run column by column: number them row by row from the top-left, (h w), not (w h)"
PATCH_COLUMNS_CHANNELS_FIRST = ("the patches run column by column, (w h), and are flattened channels-first, (c p1 p2): "
                                "number them row by row, (h w), and flatten each pixel by pixel, (p1 p2 c)")
PATCH_P2_P1 = "each patch is flattened column by column, (p2 p1 c): flatten it row by row, (p1 p2 c)"
PATCH_STRIDED = ("each side is split as (p1 h): a 'patch' then takes every (H/P)-th pixel, scattered over the "
                 "image. A patch is P neighbouring pixels, so the block index comes first and the pixel inside it "
                 "second, (h p1)")
PATCH_RESHAPED = ("the image was only reshaped: a patch's pixels are not next to each other in memory, so a reshape "
                  "mixes rows of different patches. Split the height and width into blocks and pixels, then move the "
                  "axes (rearrange, or permute before the reshape)")
PATCH_UNFOLD_LAYOUT = ("this is F.unfold's (b, c*P*P, N) layout: the patches must run along axis 1, (b, N, P*P*c), "
                       "each flattened (p1 p2 c)")
PATCH_SIZE_INT = "store the size as a pair (height, width): self.image_size = to_pair(image_size)"
PATCH_PAIR = "store patch_size as given, one int P: self.patch_size = patch_size"
PATCH_NO_GRID = "self.grid_size is the patch grid (rows, columns): patch_grid(image_size, patch_size) gives it"
PATCH_NO_BIAS = "the projection has a bias: nn.Linear(P*P*in_channels, dim)"
PATCH_CONV_PROJ = ("proj = nn.Linear(P*P*in_channels, dim), applied to patchify's patches (the given to_conv reads "
                   "proj.in_features and reshapes its weight)")
PATCH_CONV_MAP = ("this is a Conv2d's (b, dim, gh, gw) feature map: flatten it to (b, gh*gw, dim), 'b d h w -> b (h "
                  "w) d'")
CONV_CHANNELS_FIRST = ("the Linear's features were read channels-first, (c p1 p2), as a plain reshape to (D, C, P, P) "
                       "reads them: patchify flattens each patch as (p1 p2 c), so split the features that way, then "
                       "move the channel axis in front of p1 p2")
CONV_KERNEL_TRANSPOSED = ("each kernel is transposed: p1 is the row inside the patch (the kernel's height, axis 2 of "
                          "the conv weight) and p2 the column (axis 3)")
CONV_CHANNELS_LAST = ("a Conv2d's weight is (out_channels, in_channels, kernel height, kernel width) = (D, C, P, P), "
                      "the channels before the kernel's rows and columns")
CONV_AS_E = ("nn.Linear stores its weight as (out, in) = (D, P*P*C), the paper's E transposed: a patch's features "
             "are the last axis, and D stays the first")
EXPAND = ("one class token (1, 1, D) cannot be glued to a batch of b sequences: expand it to the batch first, "
          "cls_token.expand(b, -1, -1), then concatenate along the token axis (dim=1)")
NO_CLASS_TOKEN = ("cls_token is None for a model without a class token: prepend it only `if cls_token is not None`, "
                  "and then add pos_embed (1, N, D) to the patch tokens alone")
SINCOS_SWAPPED = "sines and cosines are swapped: each half is [sin | cos], the sines first"
SINCOS_XY = ("the halves are swapped: the first half encodes the column x (the position along the width), the "
             "second half the row y")
SINCOS_INDEXING = ("the table runs column by column: row k of the table is patch k in patchify's order, row by row, "
                   "k = r * gw + c (torch.meshgrid(..., indexing='ij') on (rows, columns))")
SINCOS_EXPONENT = ("the frequencies are spaced with the wrong exponent: omega_j = 1 / temperature ** "
                   "(j / (dim/4 - 1)), j = 0 .. dim/4 - 1, so they run from exactly 1 down to exactly 1/temperature")
SINCOS_RECIPROCAL = ("the frequencies grow: omega_j = 1 / temperature ** (j / (dim/4 - 1)) falls from 1 to "
                     "1/temperature (temperature ** (...) without the reciprocal grows to temperature)")
SINCOS_INTERLEAVED = ("sines and cosines are interleaved (sin, cos, sin, cos, ...): the contract puts them in four "
                      "blocks of dim/4 columns, [sin x | cos x | sin y | cos y]")
SINCOS_SINES_FIRST = ("the blocks are in the wrong order: the contract is [sin x | cos x | sin y | cos y] (the grid "
                      "column x's sines and cosines in the first half, the grid row y's in the second), not the sines "
                      "of both first, [sin x | sin y | cos x | cos y]")
SINCOS_TEMPERATURE = "temperature is ignored: the lowest frequency is 1/temperature, not always 1/10000"
SINCOS_BATCH = "return the table (gh*gw, dim) without a batch axis: the caller adds it, table[None]"
SINCOS_START_STEP = "row and column i sit at position start + step * i: use start and step, not i alone"
PATCH_CASES = ((2, 3, 12, 8, 4), (1, 1, 28, 28, 7), (3, 2, 6, 9, 3), (2, 3, 5, 5, 5), (1, 4, 2, 2, 1))


@check("patchify")
def patchify(c, fn):
    """(b, c, H, W) -> (b, N, P*P*c): patches row by row from the top-left, each flattened (p1 p2 c); gradients
    reach the images."""
    g = torch.Generator().manual_seed(10)
    for b, ch, height, width, p in PATCH_CASES:
        images = torch.randn(b, ch, height, width, generator=g)
        got = c.call(fn, images, p)
        c.close(got, ref.patchify(images, p), f"patches of a {height}x{width} image with patch size {p}",
                c.named(c.slips("output"), images, p))
    c.phase("gradient")
    images = torch.randn(2, 3, 8, 12, generator=g)
    gradient_flow(c, fn, lambda t: c.call(fn, t["images"], 4), lambda t: ref.patchify(t["images"], 4),
                  dict(images=images))


@check("PatchEmbedding")
def PatchEmbedding(c, cls):
    """PatchEmbedding(image_size, patch_size, in_channels, dim): keeps image_size as a pair, patch_size,
    in_channels, grid_size and num_patches; one Linear `proj` (P*P*C -> dim) on the patches; gradients reach the
    images and proj."""
    g = torch.Generator().manual_seed(12)
    for size, p, ch, dim, b in ((8, 4, 3, 10, 2), (28, 7, 1, 16, 3), ((6, 9), 3, 2, 5, 1)):
        reference = ref.PatchEmbedding(size, p, ch, dim)
        c.phase("attributes")
        model = c.build(cls, size, p, ch, dim)
        shown = f"PatchEmbedding({size}, {p}, {ch}, {dim})"
        _attributes(c, model, shown, ref.to_pair(size), p, ch, reference.grid_size)
        c.load(model, reference, [(only_biases, PATCH_NO_BIAS),
                                  ("proj", "the projection is one Linear `proj` (P*P*in_channels -> dim)")])
        c.phase("output")
        images = torch.randn(b, ch, *ref.to_pair(size), generator=g)
        with torch.no_grad():
            got = c.call(model, images, label=shown)
            c.close(got, reference(images), "patch tokens", twins(c.slips("output"), reference, (size, p, ch, dim),
                                                                  images),
                    shape_hints=[((b, dim, *reference.grid_size), PATCH_CONV_MAP)])  # a Conv2d's map (no twin)
        c.phase("names")
        c.ok(isinstance(getattr(model, "proj", None), nn.Linear), f"{shown}.proj should be an nn.Linear, got "
             f"{describe(getattr(model, 'proj', None))}", PATCH_CONV_PROJ)
        c.phase("gradient")
        gradient_flow(c, cls, lambda t: c.call(model, t["images"], label=shown), lambda t: reference(t["images"]),
                      dict(images=images), model, reference)


def _attributes(c, model, shown, image_size, patch_size, in_channels, grid):
    c.attributes(model, shown, [
        ("image_size", image_size, PATCH_SIZE_INT),
        ("patch_size", patch_size, PATCH_PAIR),
        ("in_channels", in_channels, None),
        ("grid_size", grid, PATCH_NO_GRID),
        ("num_patches", grid[0] * grid[1], "num_patches is rows * columns of the grid")])


def conv_tokens(weight, bias, images, patch_size):
    """Tokens (b, N, D) of a Conv2d(kernel = stride = P) with ``weight`` (D, C, P, P), flattened row by row."""
    return rearrange(F.conv2d(images, weight, bias, stride=patch_size), "b d h w -> b (h w) d")


@check("linear_to_conv_weight")
def linear_to_conv_weight(c, fn):
    """(weight (D, P*P*C), P, C) -> the Conv2d weight (D, C, P, P) with which Conv2d(kernel = stride = P) gives
    the Linear's tokens on patchify's patches, for every image."""
    g = torch.Generator().manual_seed(14)
    for dim, p, ch in ((12, 2, 3), (5, 4, 3), (7, 3, 2), (6, 2, 1)):  # first D = P*P*C: a transposed E fits it
        weight, bias = torch.randn(dim, p * p * ch, generator=g), torch.randn(dim, generator=g)
        images = torch.randn(2, ch, 3 * p, 2 * p, generator=g)
        what = f"the Conv2d weight for a Linear weight of shape {tuple(weight.shape)}"
        got = c.tensor(c.call(fn, weight, p, ch), what, (dim, ch, p, p), weight.dtype, [
                           (s.impl(weight, p, ch).shape, s) for s in c.slips("output") if _shape_of(s, weight, p, ch)])
        linear = F.linear(ref.patchify(images, p), weight, bias)  # (2, N, D)
        c.close(conv_tokens(got, bias, images, p), linear,
                f"tokens of Conv2d(kernel = stride = {p}) with your weight against the Linear on patchify's patches "
                f"(D = {dim}, C = {ch})",
                [(s, lambda s=s: conv_tokens(s.impl(weight, p, ch), bias, images, p)) for s in c.slips("output")])


def _shape_of(slip, *args):
    """True if the slip's weight has another shape than (D, C, P, P) on these inputs (then its shape names it)."""
    try:
        weight, p, ch = args
        return tuple(slip.impl(*args).shape) != (weight.shape[0], ch, p, p)
    except Exception:
        return False


@check("add_class_token_and_position")
def add_class_token_and_position(c, fn):
    """(tokens (b, N, D), cls_token (1, 1, D) or None, pos_embed (1, N+1, D)) -> (b, N+1, D): prepend the class
    token to every sequence, then add the positions (without a class token, (1, N, D) added to the tokens); gradients
    reach all three."""
    g = torch.Generator().manual_seed(13)
    for b, n, dim in ((3, 5, 8), (1, 4, 6), (2, 9, 3)):
        tokens, cls_token = torch.randn(b, n, dim, generator=g), torch.randn(1, 1, dim, generator=g)
        pos = torch.randn(1, n + 1, dim, generator=g)
        c.phase("output")
        got = c.call(fn, tokens, cls_token, pos, errors=[("Sizes of tensors must match except in dimension", EXPAND)])
        c.close(got, ref.add_class_token_and_position(tokens, cls_token, pos), "tokens with class token and "
                "positions", c.named(c.slips("output"), tokens, cls_token, pos), shape_hints=[
                    ((b, n, dim), "the class token was not prepended: concatenate it in front of the patch tokens "
                     "(expand it to the batch first)")])
        c.phase("gradient")
        gradient_flow(c, fn, lambda t: c.call(fn, t["tokens"], t["cls_token"], t["pos_embed"]),
                      lambda t: ref.add_class_token_and_position(t["tokens"], t["cls_token"], t["pos_embed"]),
                      dict(tokens=tokens, cls_token=cls_token, pos_embed=pos))
    c.phase("no-class-token")
    tokens, pos = torch.randn(2, 4, 6, generator=g), torch.randn(1, 4, 6, generator=g)
    got = c.call(fn, tokens, None, pos, errors=[("'NoneType' object has no attribute", NO_CLASS_TOKEN)])
    c.close(got, tokens + pos, "tokens for a model without class token (cls_token=None)",
            shape_hints=[((2, 5, 6), "with cls_token=None nothing is prepended: only add the positions")])


@check("sincos_position_embedding")
def sincos_position_embedding(c, fn):
    """(grid (gh, gw) or an int, dim) -> (gh*gw, dim): table row k is patch k (row by row), features [sin x | cos x |
    sin y | cos y] at frequencies 1 / temperature ** (j / (dim/4 - 1)); ``temperature`` used; grid row and column i
    at position start + step * i."""
    for grid, dim, kwargs in (((3, 4), 8, {}), ((4, 4), 16, {}), (5, 12, {}), ((2, 5), 8, dict(temperature=100.0))):
        c.phase("output")
        got = c.call(fn, grid, dim, **kwargs)
        c.close(got, ref.sincos_position_embedding(grid, dim, **kwargs),
                f"sin-cos table of a {grid} grid, dim {dim}" + (f", temperature {kwargs['temperature']}" if kwargs
                                                                 else ""),
                c.named(c.slips("output"), grid, dim, **kwargs))
    c.phase("positions")
    got = c.call(fn, (2, 3), 8, start=0.5, step=2.0)
    c.close(got, ref.sincos_position_embedding((2, 3), 8, start=0.5, step=2.0), "sin-cos table of a (2, 3) grid, dim "
            "8, start 0.5, step 2", c.named(c.slips("positions"), (2, 3), 8, start=0.5, step=2.0))


# each exercise's rules, by the key a check passes to Checker.phase (a failure carries it as CheckFailed.rule);
# the statement (the exercise's markdown and stub docstring) is where their words are written
RULES = {
    "patchify": ("output", "gradient"),
    "PatchEmbedding": ("attributes", "names", "output", "gradient"),
    "linear_to_conv_weight": ("output",),
    "add_class_token_and_position": ("output", "no-class-token", "gradient"),
    "sincos_position_embedding": ("output", "positions"),
}


# ---- the catalogue: each slip once, a small wrong implementation named after its mistake; the accepted variants
# patchify

def patchify_channels_first(images, p):
    return F.unfold(images, p, stride=p).transpose(1, 2)  # (b, N, c*p*p): F.unfold's order


def patchify_columns(images, p):
    return rearrange(images, "b c (h p1) (w p2) -> b (w h) (p1 p2 c)", p1=p, p2=p)


def patchify_columns_channels_first(images, p):
    return rearrange(images, "b c (h p1) (w p2) -> b (w h) (c p1 p2)", p1=p, p2=p)


def patchify_p2_p1(images, p):
    return rearrange(images, "b c (h p1) (w p2) -> b (h w) (p2 p1 c)", p1=p, p2=p)


def patchify_strided(images, p):
    return rearrange(images, "b c (p1 h) (p2 w) -> b (h w) (p1 p2 c)", p1=p, p2=p)


def patchify_reshaped(images, p):
    return images.reshape(images.shape[0], -1, p * p * images.shape[1])


def patchify_unfold_layout(images, p):
    return F.unfold(images, p, stride=p)  # (b, c*p*p, N)


def patchify_detached(images, p):
    return rearrange(images.detach(), "b c (h p1) (w p2) -> b (h w) (p1 p2 c)", p1=p, p2=p)


def patchify_centred_in_place(images, p):
    images -= images.mean()  # "centre the pixels first", on the caller's images
    return rearrange(images, "b c (h p1) (w p2) -> b (h w) (p1 p2 c)", p1=p, p2=p)


def patchify_tensor_unfold(images, p):
    b, c = images.shape[:2]
    patches = images.unfold(2, p, p).unfold(3, p, p)  # (b, c, gh, gw, p1, p2)
    return patches.permute(0, 2, 3, 4, 5, 1).reshape(b, -1, p * p * c)


def patchify_reshape_permute(images, p):
    b, c, height, width = images.shape
    grid = images.reshape(b, c, height // p, p, width // p, p)  # (b, c, h, p1, w, p2)
    return grid.permute(0, 2, 4, 3, 5, 1).reshape(b, -1, p * p * c)


SLIPS = [Slip("patchify", name, rule, hint, impl) for name, rule, hint, impl in [
    ("channels_first", "output", PATCH_CHANNELS_FIRST, patchify_channels_first),
    ("columns", "output", PATCH_COLUMNS, patchify_columns),
    ("columns_channels_first", "output", PATCH_COLUMNS_CHANNELS_FIRST, patchify_columns_channels_first),
    ("p2_p1", "output", PATCH_P2_P1, patchify_p2_p1),
    ("strided", "output", PATCH_STRIDED, patchify_strided),
    ("reshaped", "output", PATCH_RESHAPED, patchify_reshaped),
    ("unfold_layout", "output", PATCH_UNFOLD_LAYOUT, patchify_unfold_layout),
    ("detached", "gradient", CUT_AT, patchify_detached),
    ("centred_in_place", "inputs", IN_PLACE, patchify_centred_in_place),
]]


# PatchEmbedding: a correct one, as a learner writes it, and its slips, each the class with one mistake

class PatchEmbeddingPlain(nn.Module):
    def __init__(self, image_size, patch_size, in_channels, dim):
        super().__init__()
        self.image_size, self.patch_size, self.in_channels = ref.to_pair(image_size), patch_size, in_channels
        self.grid_size = (self.image_size[0] // patch_size, self.image_size[1] // patch_size)
        self.num_patches = self.grid_size[0] * self.grid_size[1]
        self.proj = nn.Linear(patch_size * patch_size * in_channels, dim)

    def forward(self, images):
        return self.proj(ref.patchify(images, self.patch_size))  # (b, N, D)


class PatchEmbeddingSizeInt(PatchEmbeddingPlain):
    def __init__(self, image_size, patch_size, in_channels, dim):
        super().__init__(image_size, patch_size, in_channels, dim)
        self.image_size = image_size  # 8, not (8, 8)


class PatchEmbeddingPatchPair(PatchEmbeddingPlain):
    def __init__(self, image_size, patch_size, in_channels, dim):
        super().__init__(image_size, patch_size, in_channels, dim)
        self.patch_size = ref.to_pair(patch_size)  # (4, 4), not 4


class PatchEmbeddingNoGrid(PatchEmbeddingPlain):
    def __init__(self, image_size, patch_size, in_channels, dim):
        super().__init__(image_size, patch_size, in_channels, dim)
        del self.grid_size


class PatchEmbeddingNoBias(PatchEmbeddingPlain):
    def __init__(self, image_size, patch_size, in_channels, dim):
        super().__init__(image_size, patch_size, in_channels, dim)
        self.proj = nn.Linear(patch_size * patch_size * in_channels, dim, bias=False)


class PatchEmbeddingConv(nn.Module):
    """timm's way: a Conv2d with kernel = stride = P, called proj (exercise 4.2 asks an nn.Linear, so its check rejects
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


class PatchEmbeddingConvMap(PatchEmbeddingConv):
    def forward(self, images):
        return self.proj(images)  # (b, D, gh, gw): not flattened to tokens


class PatchEmbeddingDetached(PatchEmbeddingPlain):
    def forward(self, images):
        return self.proj(ref.patchify(images, self.patch_size).detach())


class PatchEmbeddingWeightData(PatchEmbeddingPlain):
    def forward(self, images):
        return F.linear(ref.patchify(images, self.patch_size), self.proj.weight.data, self.proj.bias)


class PatchEmbeddingNormalisedInPlace(PatchEmbeddingPlain):
    def forward(self, images):
        images /= images.abs().max()  # on the caller's images
        return self.proj(ref.patchify(images, self.patch_size))


class PatchEmbeddingChannelsFirst(PatchEmbeddingPlain):
    def forward(self, images):
        return self.proj(patchify_channels_first(images, self.patch_size))


class PatchEmbeddingColumns(PatchEmbeddingPlain):
    def forward(self, images):
        return self.proj(patchify_columns(images, self.patch_size))


class PatchEmbeddingColumnsChannelsFirst(PatchEmbeddingPlain):
    def forward(self, images):
        return self.proj(patchify_columns_channels_first(images, self.patch_size))


class PatchEmbeddingP2P1(PatchEmbeddingPlain):
    def forward(self, images):
        return self.proj(patchify_p2_p1(images, self.patch_size))


SLIPS += [Slip("PatchEmbedding", name, rule, hint, impl) for name, rule, hint, impl in [
    ("size_int", "attributes", PATCH_SIZE_INT, PatchEmbeddingSizeInt),
    ("patch_pair", "attributes", PATCH_PAIR, PatchEmbeddingPatchPair),
    ("no_grid", "attributes", PATCH_NO_GRID, PatchEmbeddingNoGrid),
    ("no_bias", "names", PATCH_NO_BIAS, PatchEmbeddingNoBias),
    ("conv_proj", "names", PATCH_CONV_PROJ, PatchEmbeddingConv),
    ("conv_map", "output", PATCH_CONV_MAP, PatchEmbeddingConvMap),
    ("detached", "gradient", CUT_AT, PatchEmbeddingDetached),
    ("weight_data", "gradient", CUT_AT, PatchEmbeddingWeightData),
    ("normalised_in_place", "inputs", IN_PLACE, PatchEmbeddingNormalisedInPlace),
    ("channels_first", "output", PATCH_CHANNELS_FIRST, PatchEmbeddingChannelsFirst),
    ("columns", "output", PATCH_COLUMNS, PatchEmbeddingColumns),
    ("columns_channels_first", "output", PATCH_COLUMNS_CHANNELS_FIRST, PatchEmbeddingColumnsChannelsFirst),
    ("p2_p1", "output", PATCH_P2_P1, PatchEmbeddingP2P1),
]]


# linear_to_conv_weight

def linear_to_conv_channels_first(weight, p, c):
    return rearrange(weight, "d (c p1 p2) -> d c p1 p2", p1=p, p2=p, c=c)


def linear_to_conv_reshape_only(weight, p, c):
    return weight.reshape(weight.shape[0], c, p, p)  # reads the features as (c p1 p2)


def linear_to_conv_kernel_transposed(weight, p, c):
    return rearrange(weight, "d (p1 p2 c) -> d c p2 p1", p1=p, p2=p, c=c)


def linear_to_conv_no_permute(weight, p, c):
    return weight.reshape(weight.shape[0], p, p, c)  # (D, P, P, C): the channels last


def linear_to_conv_as_e(weight, p, c):
    return rearrange(weight, "(p1 p2 c) d -> d c p1 p2", p1=p, p2=p, c=c)  # reads weight as E (P*P*C, D)


def linear_to_conv_resize_(weight, p, c):
    grid = weight.resize_(weight.shape[0], p, p, c)  # resize_ reshapes the caller's weight too
    return grid.permute(0, 3, 1, 2)


def linear_to_conv_reshape_permute(weight, p, c):
    return weight.reshape(weight.shape[0], p, p, c).permute(0, 3, 1, 2)  # (D, C, P, P)


SLIPS += [Slip("linear_to_conv_weight", name, rule, hint, impl) for name, rule, hint, impl in [
    ("channels_first", "output", CONV_CHANNELS_FIRST, linear_to_conv_channels_first),
    ("reshape_only", "output", CONV_CHANNELS_FIRST, linear_to_conv_reshape_only),
    ("kernel_transposed", "output", CONV_KERNEL_TRANSPOSED, linear_to_conv_kernel_transposed),
    ("no_permute", "output", CONV_CHANNELS_LAST, linear_to_conv_no_permute),
    ("as_e", "output", CONV_AS_E, linear_to_conv_as_e),
    ("resize_", "inputs", IN_PLACE, linear_to_conv_resize_),
]]


# add_class_token_and_position

def embed_appended(tokens, cls_token, pos_embed):
    return torch.cat([tokens, cls_token.expand(len(tokens), -1, -1)], dim=1) + pos_embed  # class token last


def embed_not_expanded(tokens, cls_token, pos_embed):
    return torch.cat([cls_token, tokens], dim=1) + pos_embed  # one class token for a batch of b


def embed_none_ignored(tokens, cls_token, pos_embed):
    return torch.cat([cls_token.expand(len(tokens), -1, -1), tokens], dim=1) + pos_embed  # fails for None


def embed_no_position(tokens, cls_token, pos_embed):
    return torch.cat([cls_token.expand(len(tokens), -1, -1), tokens], dim=1)


def embed_shifted(tokens, cls_token, pos_embed):
    if cls_token is None:
        return tokens + pos_embed
    return torch.cat([cls_token.expand(len(tokens), -1, -1) + pos_embed[:, -1:], tokens + pos_embed[:, :-1]], dim=1)


def embed_cls_no_position(tokens, cls_token, pos_embed):
    if cls_token is None:
        return tokens + pos_embed
    return torch.cat([cls_token.expand(len(tokens), -1, -1), tokens + pos_embed[:, :-1]], dim=1)


def embed_cls_missing_position(tokens, cls_token, pos_embed):
    if cls_token is None:
        return tokens + pos_embed
    return torch.cat([cls_token.expand(len(tokens), -1, -1), tokens + pos_embed[:, 1:]], dim=1)


def embed_cls_detached(tokens, cls_token, pos_embed):
    if cls_token is not None:
        tokens = torch.cat([cls_token.detach().expand(len(tokens), -1, -1), tokens], dim=1)
    return tokens + pos_embed


def embed_pos_data(tokens, cls_token, pos_embed):
    if cls_token is not None:
        tokens = torch.cat([cls_token.expand(len(tokens), -1, -1), tokens], dim=1)
    return tokens + pos_embed.data


def embed_plus_equals(tokens, cls_token, pos_embed):
    if cls_token is not None:
        tokens = torch.cat([cls_token.expand(len(tokens), -1, -1), tokens], dim=1)
    tokens += pos_embed  # without a class token, the caller's tokens
    return tokens


def embed_repeat(tokens, cls_token, pos_embed):
    if cls_token is not None:
        tokens = torch.cat((cls_token.repeat(len(tokens), 1, 1), tokens), dim=1)
    return tokens + pos_embed


SLIPS += [Slip("add_class_token_and_position", name, rule, hint, impl) for name, rule, hint, impl in [
    ("appended", "output", "the class token is appended: prepend it, so it is token 0", embed_appended),
    ("not_expanded", "output", EXPAND, embed_not_expanded),
    ("none_ignored", "no-class-token", NO_CLASS_TOKEN, embed_none_ignored),
    ("no_position", "output", "the position embeddings are missing: add pos_embed after prepending the class token",
     embed_no_position),
    ("shifted", "output", "the positions are shifted: row 0 of pos_embed belongs to the class token, rows 1..N to the "
     "patches; prepend the class token first, then add pos_embed", embed_shifted),
    ("cls_no_position", "output", "the class token got no position and the patches got rows 0..N-1: prepend the class "
     "token first, then add all of pos_embed", embed_cls_no_position),
    ("cls_missing_position", "output", "the class token is missing its position: add pos_embed to the whole "
     "sequence, class token included", embed_cls_missing_position),
    ("cls_detached", "gradient", CUT_AT, embed_cls_detached),
    ("pos_data", "gradient", CUT_AT, embed_pos_data),
    ("plus_equals", "inputs", IN_PLACE, embed_plus_equals),
]]


# sincos_position_embedding: each slip whole, the reference's steps with one of them wrong

def _positions(grid, start=0.0, step=1.0):
    """(y, x): the row and column position of each patch, row by row, (gh*gw,) each."""
    gh, gw = ref.to_pair(grid)
    y, x = torch.meshgrid(start + step * torch.arange(gh, dtype=torch.float32),
                          start + step * torch.arange(gw, dtype=torch.float32), indexing="ij")
    return y.flatten(), x.flatten()


def _omega(dim, temperature=10000.0):
    return 1.0 / temperature ** (torch.arange(dim // 4) / (dim // 4 - 1))  # (dim/4,): 1 down to 1/temperature


def sincos_swapped(grid, dim, temperature=10000.0, start=0.0, step=1.0):
    y, x = _positions(grid, start, step)
    x, y = x[:, None] * _omega(dim, temperature), y[:, None] * _omega(dim, temperature)
    return torch.cat([x.cos(), x.sin(), y.cos(), y.sin()], dim=1)


def sincos_rows_first_half(grid, dim, temperature=10000.0, start=0.0, step=1.0):
    y, x = _positions(grid, start, step)
    x, y = x[:, None] * _omega(dim, temperature), y[:, None] * _omega(dim, temperature)
    return torch.cat([y.sin(), y.cos(), x.sin(), x.cos()], dim=1)


def sincos_meshgrid_xy(grid, dim, temperature=10000.0, start=0.0, step=1.0):
    gh, gw = ref.to_pair(grid)
    y, x = torch.meshgrid(start + step * torch.arange(gh, dtype=torch.float32),
                          start + step * torch.arange(gw, dtype=torch.float32), indexing="xy")  # (gw, gh)
    x, y = x.flatten()[:, None] * _omega(dim, temperature), y.flatten()[:, None] * _omega(dim, temperature)
    return torch.cat([x.sin(), x.cos(), y.sin(), y.cos()], dim=1)


def sincos_exponent_over_quarter(grid, dim, temperature=10000.0, start=0.0, step=1.0):
    y, x = _positions(grid, start, step)
    omega = 1.0 / temperature ** (torch.arange(dim // 4) / (dim // 4))  # the 1-D Transformer's spacing: j / (dim/4)
    x, y = x[:, None] * omega, y[:, None] * omega
    return torch.cat([x.sin(), x.cos(), y.sin(), y.cos()], dim=1)


def sincos_no_reciprocal(grid, dim, temperature=10000.0, start=0.0, step=1.0):
    y, x = _positions(grid, start, step)
    omega = temperature ** (torch.arange(dim // 4) / (dim // 4 - 1))  # 1 up to temperature
    x, y = x[:, None] * omega, y[:, None] * omega
    return torch.cat([x.sin(), x.cos(), y.sin(), y.cos()], dim=1)


def sincos_interleaved(grid, dim, temperature=10000.0, start=0.0, step=1.0):
    y, x = _positions(grid, start, step)
    x, y = x[:, None] * _omega(dim, temperature), y[:, None] * _omega(dim, temperature)
    return torch.cat([torch.stack([x.sin(), x.cos()], -1).flatten(1), torch.stack([y.sin(), y.cos()], -1).flatten(1)],
                     dim=1)


def sincos_sines_first(grid, dim, temperature=10000.0, start=0.0, step=1.0):
    y, x = _positions(grid, start, step)
    x, y = x[:, None] * _omega(dim, temperature), y[:, None] * _omega(dim, temperature)
    return torch.cat([x.sin(), y.sin(), x.cos(), y.cos()], dim=1)  # both sines, then both cosines


def sincos_fixed_temperature(grid, dim, temperature=10000.0, start=0.0, step=1.0):
    y, x = _positions(grid, start, step)
    x, y = x[:, None] * _omega(dim), y[:, None] * _omega(dim)  # always 10000
    return torch.cat([x.sin(), x.cos(), y.sin(), y.cos()], dim=1)


def sincos_batch_axis(grid, dim, temperature=10000.0, start=0.0, step=1.0):
    return ref.sincos_position_embedding(grid, dim, temperature, start, step)[None]  # (1, gh*gw, dim)


def sincos_index_positions(grid, dim, temperature=10000.0, start=0.0, step=1.0):
    y, x = _positions(grid)  # rows and columns at 0, 1, 2, ...: start and step ignored
    x, y = x[:, None] * _omega(dim, temperature), y[:, None] * _omega(dim, temperature)
    return torch.cat([x.sin(), x.cos(), y.sin(), y.cos()], dim=1)


def sincos_loops(grid, dim, temperature=10000.0, start=0.0, step=1.0):
    gh, gw = ref.to_pair(grid)
    quarter = dim // 4
    table = torch.zeros(gh * gw, dim)
    for r in range(gh):
        for col in range(gw):
            for j in range(quarter):
                omega = temperature ** (-j / (quarter - 1))
                x, y = (start + step * col) * omega, (start + step * r) * omega
                table[r * gw + col, j::quarter] = torch.tensor([math.sin(x), math.cos(x), math.sin(y), math.cos(y)])
    return table


SLIPS += [Slip("sincos_position_embedding", name, rule, hint, impl) for name, rule, hint, impl in [
    ("swapped", "output", SINCOS_SWAPPED, sincos_swapped),
    ("rows_first_half", "output", SINCOS_XY, sincos_rows_first_half),
    ("meshgrid_xy", "output", SINCOS_INDEXING, sincos_meshgrid_xy),
    ("exponent_over_quarter", "output", SINCOS_EXPONENT, sincos_exponent_over_quarter),
    ("no_reciprocal", "output", SINCOS_RECIPROCAL, sincos_no_reciprocal),
    ("interleaved", "output", SINCOS_INTERLEAVED, sincos_interleaved),
    ("sines_first", "output", SINCOS_SINES_FIRST, sincos_sines_first),
    ("fixed_temperature", "output", SINCOS_TEMPERATURE, sincos_fixed_temperature),
    ("batch_axis", "output", SINCOS_BATCH, sincos_batch_axis),
    ("index_positions", "positions", SINCOS_START_STEP, sincos_index_positions),
]]


VARIANTS = [Variant(exercise, name, impl) for exercise, name, impl in [
    ("patchify", "reference_patchify", ref.patchify),
    ("patchify", "patchify_tensor_unfold", patchify_tensor_unfold),
    ("patchify", "patchify_reshape_permute", patchify_reshape_permute),
    ("PatchEmbedding", "reference_patchembedding", ref.PatchEmbedding),
    ("PatchEmbedding", "patchembedding_plain", PatchEmbeddingPlain),
    ("linear_to_conv_weight", "reference_linear_to_conv_weight", ref.linear_to_conv_weight),
    ("linear_to_conv_weight", "reshape_permute", linear_to_conv_reshape_permute),
    ("add_class_token_and_position", "reference_add_class_token_and_position", ref.add_class_token_and_position),
    ("add_class_token_and_position", "embed_repeat", embed_repeat),
    ("sincos_position_embedding", "reference_sincos", ref.sincos_position_embedding),
    ("sincos_position_embedding", "sincos_loops", sincos_loops),
]]
