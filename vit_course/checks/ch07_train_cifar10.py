"""Chapter 07's exercises: random_crop_flip (tested by its properties: it is random) and pool_tokens: checks and rules.

random_crop_flip's slips that cut the wrong window are written as that window (``_window``'s ``knob``): the check
names one when every sample is a window the slip could have cut.
"""

# ruff: noqa: B023  (each diagnosis thunk is called by Checker.close in the loop iteration that builds it)

import torch
import torch.nn.functional as F

from .. import batches, vit
from .core import IN_PLACE, Slip, Variant, check
from .gradients import CUT, CUT_AT, gradient_flow
from .probes import TorchCalls

# each exercise's rules, by the key a check passes to Checker.phase (a failure carries it as CheckFailed.rule);
# the statement (the exercise's markdown and stub docstring) is where their words are written
RULES = {
    "random_crop_flip": ("output", "offsets", "flip", "loop", "generator", "error"),
    "pool_tokens": ("output", "error", "gradient"),
}


def _window(images, padding, dy, dx, flipped, knob=None):
    """The crops at offsets dy, dx of the padded images, mirrored where ``flipped``, all at once: dy, dx, flipped (b,)
    give one window per image, (b, C, H, W); (b, k) give k per image, (b, k, C, H, W). ``knob``: the slip that cuts a
    wrong window (None: the statement's)."""
    b, ch, h, w = images.shape
    dy, dx, flipped = dy[..., None], dx[..., None], flipped[..., None]  # (b, [k,] 1)
    span = torch.arange(h), torch.arange(w)
    if knob == "roll":  # no padding: the image wraps around
        source, width = images, w
        rows = (dy - padding + span[0]) % h  # (b, [k,] H)
        cols = torch.where(flipped, span[1].flip(0), span[1])  # (b, [k,] W)
        cols = (dx - padding + cols) % w
    else:
        source = F.pad(images.float(), (padding,) * 4, mode="reflect") if knob == "reflect" else F.pad(
            images.float(), (padding,) * 4, value=1.0 if knob == "value" else 0.0)
        source, width = source.to(images.dtype), w if knob == "flat_w" else w + 2 * padding
        rows = dy + (span[0].flip(0) if knob == "upside" else span[0])  # (b, [k,] H)
        rows = torch.where(flipped, rows, dy + span[0]) if knob == "upside" else rows
        cols = dx + torch.where(flipped & (knob != "upside"), span[1].flip(0), span[1])  # (b, [k,] W)
    index = rows[..., :, None] * width + cols[..., None, :]  # (b, [k,] H, W)
    index = (index.transpose(-1, -2).reshape(index.shape) if knob == "transposed" else index).clamp(
        max=source[0, 0].numel() - 1)
    out = source.flatten(2).gather(2, index.flatten(1)[:, None].expand(b, ch, index[0].numel()))  # (b, C, [k *] H*W)
    return out.view(b, ch, *index.shape[1:]).movedim(1, -3)  # (b, [k,] C, H, W)


def _crop(knob=None, offsets="randint", coins="randint", generator=True, validate=True, loop=False, dtype=True):
    """random_crop_flip with one slip: ``knob`` a wrong window (see _window), the rest how it draws or checks."""
    def random_crop_flip(images, padding=4, flip=True, generator=None):
        if validate and (images.ndim != 4 or padding < 0):
            raise ValueError(f"bad images {tuple(images.shape)} or padding {padding}")
        b, gen, side = len(images), generator if use_generator else None, 2 * padding + 1
        draws = {"randint": lambda: torch.randint(side, (b,), generator=gen),
                 "exclusive": lambda: torch.randint(max(1, side - 1), (b,), generator=gen),
                 "one": lambda: torch.randint(side, (1,), generator=gen).expand(b),
                 "rounded": lambda: (torch.rand(b, generator=gen) * 2 * padding).round().long(),
                 "floor": lambda: (torch.rand(b, generator=gen) * side).floor().long()}
        dy = draws[offsets if offsets != "shared" else "randint"]()
        dx = dy if offsets == "shared" else draws[offsets]()
        coin = {"randint": lambda: torch.randint(2, (b,), generator=gen).bool(),
                "rand": lambda: torch.rand(b, generator=gen) < 0.5,
                "one": lambda: torch.randint(2, (1,), generator=gen).bool().expand(b)}[
            coins if coins in ("one", "rand") else "randint"]()
        coin = coin & (flip or coins == "always")
        if loop:
            return torch.cat([_window(images[i:i + 1], padding, dy[i:i + 1], dx[i:i + 1], coin[i:i + 1], knob)
                              for i in range(b)])
        out = _window(images, padding, dy, dx, coin, knob)
        return out if dtype else out.float()
    use_generator = generator
    random_crop_flip.knob = knob
    return random_crop_flip


def _crop_in_place(images, padding=4, flip=True, generator=None):
    images.copy_(batches.random_crop_flip(images, padding, flip, generator))
    return images


UNIFORM = ("the offsets are not uniform over 0..2p (rounding a uniform float draws the two ends half as often): draw "
           "them with _randint(2 * padding + 1, (b,), generator, device)")
FLIPPED = ("no sample (or every sample) was flipped: draw one coin per sample with probability 1/2, not one for the "
           "whole batch")
SLIPS = [Slip("random_crop_flip", knob, "output", hint, _crop(knob)) for knob, hint in [  # the wrong windows
    ("upside", "the images are flipped upside down: a horizontal flip reverses the last axis (width), flip(-1)"),
    ("reflect", "the padding is not zeros: pad with zeros (F.pad's default), so shifted-in pixels are black"),
    ("value", "the padding is not zeros: pad with zeros (F.pad's default), so shifted-in pixels are black"),
    ("roll", "the image wraps around (torch.roll?): pad with zeros, then crop"),
    ("transposed", "the index grid is transposed (columns first): build it rows first, (b, H, W), rows[:, :, None] "
                   "* (W + 2 * padding) + cols[:, None, :], then flatten it"),
    ("flat_w", "the flat index uses the unpadded width: a padded row holds W + 2p pixels, index = row * (W + 2 * "
               "padding) + column"),
]] + [
    Slip("random_crop_flip", "float", "output", "keep the images' dtype: F.pad and gather work on uint8 too (or "
         "convert back with .to(images.dtype))", _crop(dtype=False)),
    Slip("random_crop_flip", "per_sample", "loop", "a Python loop (over the samples, or over the offsets): work on "
         "the whole batch at once (a batch of offsets and coins, index tensors built by broadcasting, one gather)",
         _crop(loop=True)),
    Slip("random_crop_flip", "one_coin", "flip", FLIPPED, _crop(coins="one")),
    Slip("random_crop_flip", "identity", "flip", FLIPPED, lambda images, padding=4, flip=True, generator=None: images),
    Slip("random_crop_flip", "always", "flip", "only flip when flip=True", _crop(coins="always")),
    Slip("random_crop_flip", "one_offset", "offsets", "draw an offset for each sample, not one for the whole batch: "
         "_randint(2 * padding + 1, (b,), generator, device)", _crop(offsets="one")),
    Slip("random_crop_flip", "exclusive", "offsets", "_randint(high, ...) draws 0..high-1: _randint(2 * padding + "
         "1, ...)", _crop(offsets="exclusive")),
    Slip("random_crop_flip", "shared", "offsets", "draw the two offsets separately: one _randint for dy, another "
         "for dx", _crop(offsets="shared")),
    Slip("random_crop_flip", "rounded", "offsets", UNIFORM, _crop(offsets="rounded")),
    Slip("random_crop_flip", "hand_rolled", "generator", "draw the offsets with the helper _randint(2 * padding + 1, "
         "(b,), generator, device), as the statement asks, not from torch.rand", _crop(offsets="floor", coins="rand")),
    Slip("random_crop_flip", "no_generator", "generator", "draw every random number with _randint(..., generator, "
         "device), passing the `generator` on, so a seed repeats the augmentation", _crop(generator=False)),
    Slip("random_crop_flip", "no_check", "error", "raise a ValueError when padding < 0", _crop(validate=False)),
    Slip("random_crop_flip", "copy_", "inputs", IN_PLACE, _crop_in_place),
]


def _match(out, images, padding, knob=None):
    """Per sample (flip, dy, dx) of the window (cut as ``knob`` cuts it) it equals, or -1 where none does: (b, 3).
    Every sample is compared with all its k = 2 (2p+1)^2 windows at once; where several match, the unflipped one with
    the largest offsets wins."""
    b, side = len(images), 2 * padding + 1
    candidates = torch.tensor([(f, dy, dx) for f in (1, 0) for dy in range(side) for dx in range(side)])  # (k, 3)
    k = len(candidates)
    flipped, dy, dx = (column.expand(b, k) for column in candidates.unbind(1))  # (b, k) each
    crops = _window(images, padding, dy, dx, flipped.bool(), knob)  # (b, k, C, H, W)
    equal = (crops == out[:, None]).flatten(2).all(2)  # (b, k): sample i is window j
    last = k - 1 - equal.flip(1).int().argmax(1)  # (b,): the last window that matches, in the order above
    return torch.where(equal.any(1)[:, None], candidates[last], -1)


def _randomness(c, found, b, padding, flip):
    """One coin per sample (when flip), and offsets uniform over 0..2p, drawn per sample and per axis."""
    flipped, dy, dx = found.unbind(1)
    c.phase("flip")
    rate = flipped.float().mean().item()
    if not flip:
        c.ok(rate == 0, f"with flip=False {rate:.0%} of the samples were flipped", HINT["always"])
    else:
        c.ok(0.35 < rate < 0.65, f"{rate:.0%} of the samples were flipped, expected about half",
             HINT["one_coin"] if rate in (0, 1) else None)
    if not padding:
        return
    c.phase("offsets")
    side = 2 * padding + 1
    for name, offsets in (("vertical", dy), ("horizontal", dx)):
        low, high = offsets.min().item(), offsets.max().item()
        c.ok(len(offsets.unique()) > 1, f"all {b} samples got the same {name} shift", HINT["one_offset"])
        c.ok(low == 0 and high == 2 * padding, f"{name} shifts go from {low - padding} to {high - padding}, expected "
             f"-{padding} to {padding}", HINT["exclusive"] if high == 2 * padding - 1 or low == 1 else None)
        counts = torch.bincount(offsets, minlength=side).float()  # (2p+1,)
        chi2 = ((counts - b / side) ** 2 / (b / side)).sum().item()  # about 2p for uniform draws; 25: p < 0.001
        c.ok(chi2 < 25, f"the {name} shifts are far from uniform: counts {counts.long().tolist()} over {b} samples",
             UNIFORM)
    c.ok(not torch.equal(dy, dx), "every sample got the same vertical and horizontal shift", HINT["shared"])


@check("random_crop_flip")
def random_crop_flip(c, fn):
    """random_crop_flip(images, padding=4, flip=True, generator=None): a random crop of the zero-padded
    image per sample (offsets uniform in 0..2p, drawn per sample and axis with _randint), flipped left-right with
    probability 1/2 (one coin per sample); same shape and dtype; no Python loop; the generator repeats it;
    ValueErrors for images that are not 4-D and a negative padding."""
    g = torch.Generator().manual_seed(22)
    b = 400
    cases = ((torch.randn(b, 2, 6, 7, generator=g) + 10, 2, True),
             (torch.randint(1, 256, (b, 1, 5, 5), generator=g, dtype=torch.uint8), 1, True),
             (torch.randn(b, 3, 4, 6, generator=g) + 10, 3, False),
             (torch.randn(b, 2, 4, 4, generator=g) + 10, 0, True))
    for images, padding, flip in cases:
        kwargs = {} if flip else {"flip": False}
        c.phase("output")
        with TorchCalls() as calls:
            out = c.call(fn, images, padding, **kwargs)
        what = f"output for images {tuple(images.shape)} {images.dtype}, padding={padding}, flip={flip}"
        if torch.is_tensor(out) and out.dtype != images.dtype:
            c.fail(f"{what} has dtype {out.dtype}, expected {images.dtype}", HINT["float"])
        c.tensor(out, what, images.shape, images.dtype)
        found = _match(out, images, padding)
        lost = (found[:, 0] < 0).nonzero().flatten()
        if len(lost):
            hint = next((s for s in SLIPS if getattr(s.impl, "knob", None) and (
                _match(out[lost], images[lost], padding, s.impl.knob)[:, 0] >= 0).all()), None)
            c.fail(f"{len(lost)} of {b} samples (e.g. sample {lost[0].item()}) are not a {images.shape[-2]}x"
                   f"{images.shape[-1]} crop of the zero-padded image, flipped or not ({what})", hint)
        c.passed()
        c.phase("loop")
        c.ok(calls.count < b // 4, f"your code called torch {calls.count} times for {b} images", HINT["per_sample"])
        _randomness(c, found, b, padding, flip)
        c.phase("generator")
        c.ok(not padding or "randint" in calls.names, "the offsets were not drawn with _randint (torch.randint)",
             HINT["hand_rolled"])
    images = torch.randn(64, 3, 5, 5, generator=g) + 10
    first = c.call(fn, images, 2, generator=torch.Generator().manual_seed(7))
    second = c.call(fn, images, 2, generator=torch.Generator().manual_seed(7))
    c.ok(torch.equal(first, second), "two calls with generators seeded alike gave different outputs",
         HINT["no_generator"])
    c.raises(fn, torch.randn(3, 5, 5, generator=g), 2, why="images of shape (3, 5, 5) have no batch axis",
             hint="check images.ndim == 4 first and raise a ValueError naming the shape", rule="error")
    c.raises(fn, images, -1, why="padding=-1 is negative", hint=HINT["no_check"])


# ---- pool_tokens
SLIPS += [Slip("pool_tokens", name, "output", hint, impl) for name, hint, impl in [  # (name, hint, wrong pool_tokens)
    ("mean_all", "the mean includes the class token: average the patch tokens only, x[:, num_prefix_tokens:]",
     lambda x, pool="cls", k=1: x[:, 0] if pool == "cls" else x.mean(1)),
    ("last", "this is the last token, not the class token: the class token is token 0",
     lambda x, pool="cls", k=1: x[:, -1] if pool == "cls" else x[:, k:].mean(1)),
    ("mean_for_cls", "this is the mean of the tokens: for pool='cls' read the class token, x[:, 0]",
     lambda x, pool="cls", k=1: x[:, k:].mean(1)),
    ("cls_for_mean", "this is the class token: for pool='mean' average the patch tokens",
     lambda x, pool="cls", k=1: x[:, 0]),
    ("skip_one", "the mean leaves out one token whatever num_prefix_tokens is: use x[:, num_prefix_tokens:]",
     lambda x, pool="cls", k=1: x[:, 0] if pool == "cls" else x[:, 1:].mean(1)),
    ("features", "you averaged over the features: average over the tokens, dim=1",
     lambda x, pool="cls", k=1: x[:, 0] if pool == "cls" else x[:, k:].mean(2)),
    ("batch_axis", "you averaged over the batch axis (dim=0): average over the tokens, dim=1",
     lambda x, pool="cls", k=1: x[:, 0] if pool == "cls" else x[:, k:].mean(0)),
    ("keepdim", "keep one vector per image, (b, D): drop the token axis (x[:, 0], .mean(dim=1) without keepdim)",
     lambda x, pool="cls", k=1: x[:, :1] if pool == "cls" else x[:, k:].mean(1, keepdim=True)),
    ("sum", "this is the sum of the patch tokens: average them, .mean(dim=1)",
     lambda x, pool="cls", k=1: x[:, 0] if pool == "cls" else x[:, k:].sum(1)),
    ("squeeze", "squeeze() also drops the batch axis when b = 1: index the token, x[:, 0], or take .mean(dim=1)",
     lambda x, pool="cls", k=1: x[:, :1].squeeze() if pool == "cls" else x[:, k:].mean(1)),
]]


def _pool_mean_by(mean):
    """pool_tokens that averages with a helper of the learner's, ``mean`` (the check reads the helper's lines too)."""
    def pool_tokens(x, pool="cls", num_prefix_tokens=1):
        return vit.pool_tokens(x, pool, num_prefix_tokens) if pool == "cls" else mean(x[:, num_prefix_tokens:])
    return pool_tokens


def _pool_unchecked(x, pool="cls", num_prefix_tokens=1):
    return x[:, 0] if pool == "cls" else x[:, num_prefix_tokens:].mean(1)


def _pool_in_place(x, pool="cls", num_prefix_tokens=1):
    x -= x.mean()  # "centre the tokens first", in the caller's tensor
    return vit.pool_tokens(x, pool, num_prefix_tokens)


def _pool_einsum(x, pool="cls", num_prefix_tokens=1):
    if pool not in ("cls", "mean") or (pool == "cls" and num_prefix_tokens == 0):
        raise ValueError(f"cannot pool {pool!r} with {num_prefix_tokens} class tokens")
    if pool == "cls":
        return x[:, 0]
    patches = x[:, num_prefix_tokens:]  # (b, N, D)
    return torch.einsum("bnd->bd", patches) / patches.shape[1]


SLIPS += [Slip("pool_tokens", "no_cls_check", "error", "raise a ValueError when pool == 'cls' and "
               "num_prefix_tokens < 1", _pool_unchecked),
          Slip("pool_tokens", "detached", "gradient", CUT, lambda x, pool="cls", k=1: vit.pool_tokens(
              x.detach(), pool, k)),
          Slip("pool_tokens", "detached_mean", "gradient", CUT_AT, _pool_mean_by(lambda t: t.detach().mean(1))),
          Slip("pool_tokens", "no_pool_check", "error", "end with `raise ValueError(...)` naming the pool you got",
               lambda x, pool="cls", k=1: vit.pool_tokens(x, "mean" if pool == "max" else pool, k)),
          Slip("pool_tokens", "centred", "inputs", IN_PLACE, _pool_in_place)]
HINT = {s.name: s for s in SLIPS}  # the slips the check names directly
assert len(HINT) == len(SLIPS), "each slip of the record has its own name"


@check("pool_tokens")
def pool_tokens(c, fn):
    """pool_tokens(x (b, n, D), pool, num_prefix_tokens) -> (b, D): the class token, or the mean of the patch tokens;
    gradients reach x; ValueErrors for pool='cls' without a class token and for any other pool."""
    g = torch.Generator().manual_seed(23)
    slips = c.slips("output")
    for b, n, d, prefix in ((2, 5, 3, 1), (3, 7, 4, 1), (2, 6, 5, 0), (1, 9, 2, 1)):
        x = torch.randn(b, n, d, generator=g)
        for pool in ("cls", "mean") if prefix else ("mean",):
            got = c.call(fn, x, pool, prefix)
            c.close(got, vit.pool_tokens(x, pool, prefix), f"pool_tokens(x, {pool!r}, {prefix})",
                    c.named(slips, x, pool, prefix))
            if (b, n) == (2, 5):
                gradient_flow(c, fn, lambda t: c.call(fn, t["x"], pool, prefix),
                              lambda t: vit.pool_tokens(t["x"], pool, prefix), dict(x=x))
    x = torch.randn(2, 5, 3, generator=g)
    c.raises(fn, x, "cls", 0, why="pool='cls' with num_prefix_tokens=0: there is no class token to read",
             hint=HINT["no_cls_check"], rule="error")
    c.raises(fn, x, "max", 1, why="pool='max' is neither 'cls' nor 'mean'",
             hint=HINT["no_pool_check"])


def _crop_index(images, padding=4, flip=True, generator=None):
    """The statement's plan with advanced indexing instead of one gather (slower on a CPU, the same crops)."""
    if images.ndim != 4 or padding < 0:
        raise ValueError(f"expected 4-D images and padding >= 0, got {tuple(images.shape)} and {padding}")
    b, ch, h, w = images.shape
    padded = F.pad(images, (padding,) * 4)  # (b, C, H+2p, W+2p)
    dy, dx = (batches._randint(2 * padding + 1, (b,), generator, images.device) for _ in range(2))
    cols = torch.arange(w).expand(b, w)  # (b, W)
    if flip:
        cols = torch.where(batches._randint(2, (b,), generator, images.device).bool()[:, None], cols.flip(-1), cols)
    rows, cols = dy[:, None] + torch.arange(h), dx[:, None] + cols  # (b, H), (b, W)
    return padded[torch.arange(b)[:, None, None, None], torch.arange(ch)[None, :, None, None], rows[:, None, :, None],
                  cols[:, None, None, :]]


VARIANTS = [
    Variant("random_crop_flip", "reference", batches.random_crop_flip), Variant("random_crop_flip", "plain", _crop()),
    Variant("random_crop_flip", "indexing", _crop_index),
    Variant("pool_tokens", "reference", vit.pool_tokens), Variant("pool_tokens", "einsum", _pool_einsum),
]
