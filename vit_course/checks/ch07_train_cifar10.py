"""Chapter 07's exercises: random_crop_flip (tested by its properties: it is random) and pool_tokens."""

# ruff: noqa: B023  (each diagnosis thunk is called by Checker.close in the loop iteration that builds it)

import torch
import torch.nn.functional as F

from .. import vit as ref
from .core import check
from .gradients import gradient_flow
from .probes import TorchCalls


def _candidates(images, padding):
    """All crops of the zero-padded images, unflipped then flipped: (2, 2p+1, 2p+1, b, C, H, W) and offsets."""
    _, _, h, w = images.shape
    padded = F.pad(images, (padding,) * 4)  # (b, C, H+2p, W+2p)
    side = 2 * padding + 1
    crops = torch.stack([torch.stack([padded[..., dy:dy + h, dx:dx + w] for dx in range(side)])
                         for dy in range(side)])  # (2p+1, 2p+1, b, C, H, W)
    return torch.stack([crops, crops.flip(-1)])


def _match(out, images, padding):
    """Per sample (flip, dy, dx) of the crop it equals, or -1 where none does: (b, 3) long."""
    cands = _candidates(images, padding)  # (2, s, s, b, C, H, W)
    equal = (cands == out).flatten(4).all(-1)  # (2, s, s, b)
    found = torch.full((len(images), 3), -1, dtype=torch.long)
    for i in range(len(images)):
        hits = equal[..., i].nonzero()
        if len(hits):
            found[i] = hits[0]
    return found


def _diagnose(out, images, padding):
    side = 2 * padding + 1
    tests = [
        ("the images are flipped upside down: a horizontal flip reverses the last axis (width), flip(-1)",
         lambda: _candidates(images.flip(-2), padding)),
        ("the padding is not zeros: pad with zeros (F.pad's default), so shifted-in pixels are black",
         lambda: _candidates_reflect(images, padding)),
        ("the image wraps around (torch.roll?): pad with zeros, then crop",
         lambda: torch.stack([torch.stack([torch.stack([images.roll((dy - padding, dx - padding), (-2, -1))
                                                        for dx in range(side)]) for dy in range(side)])])),
    ]
    def matches(cands):  # (b,) bool: the sample equals one of the candidates
        return (cands == out).flatten(-3).all(-1).flatten(0, -2).any(0)

    normal = matches(_candidates(images, padding))
    for hint, make in tests:
        if (normal | matches(make())).all():
            return hint
    return None


def _candidates_reflect(images, padding):
    _, _, h, w = images.shape
    padded = F.pad(images.float(), (padding,) * 4, mode="reflect").to(images.dtype)
    side = 2 * padding + 1
    crops = torch.stack([torch.stack([padded[..., dy:dy + h, dx:dx + w] for dx in range(side)])
                         for dy in range(side)])
    return torch.stack([crops, crops.flip(-1)])


def _randomness(c, found, b, padding, flip):
    """One coin per sample (when flip), and offsets uniform over 0..2p, drawn per sample and per axis."""
    flipped, dy, dx = found.unbind(1)
    c.phase("flip")
    rate = flipped.float().mean().item()
    if not flip:
        c.ok(rate == 0, f"with flip=False {rate:.0%} of the samples were flipped", "only flip when flip=True")
    else:
        c.ok(0.35 < rate < 0.65, f"{rate:.0%} of the samples were flipped, expected about half",
             "no sample (or every sample) was flipped: draw one coin per sample with probability 1/2, not one "
             "for the whole batch" if rate in (0, 1) else None)
    if not padding:
        return
    c.phase("offsets")
    for name, offsets in (("vertical", dy), ("horizontal", dx)):
        low, high = offsets.min().item(), offsets.max().item()
        shift = f"{name} shifts go from {low - padding} to {high - padding}"
        c.ok(len(offsets.unique()) > 1, f"all {b} samples got the same {name} shift",
             "draw an offset for each sample, not one for the whole batch: _randint(2 * padding + 1, (b,), "
             "generator, device)")
        c.ok(low == 0 and high == 2 * padding, f"{shift}, expected -{padding} to {padding}",
             "_randint(high, ...) draws 0..high-1: _randint(2 * padding + 1, ...)"
             if high == 2 * padding - 1 or low == 1 else None)
    c.ok(not torch.equal(dy, dx), "every sample got the same vertical and horizontal shift",
         "draw the two offsets separately: one _randint for dy, another for dx")


@check("random_crop_flip")
def random_crop_flip(c, fn):
    """random_crop_flip(images, padding=4, flip=True, generator=None): a random crop of the zero-padded
    image per sample (offsets uniform in 0..2p, drawn per sample and axis), flipped left-right with probability 1/2
    (one coin per sample); same shape and dtype; no Python loop; the generator repeats it;
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
        c.tensor(out, what, images.shape, images.dtype)
        found = _match(out, images, padding)
        lost = (found[:, 0] < 0).nonzero().flatten()
        if len(lost):
            hint = _diagnose(out, images, padding)
            if hint is None and torch.equal(out, images) and padding:
                hint = "the images came back unchanged"
            c.fail(f"{len(lost)} of {b} samples (e.g. sample {lost[0].item()}) are not a {images.shape[-2]}x"
                   f"{images.shape[-1]} crop of the zero-padded image, flipped or not ({what})", hint)
        c.tests += 1
        c.phase("loop")
        c.ok(calls.count < b // 4, f"your code called torch {calls.count} times for {b} images",
             "a Python loop (over the samples, or over the offsets): work on the whole batch at once (a batch "
             "of offsets and coins, index tensors built by broadcasting, one gather)")
        _randomness(c, found, b, padding, flip)
    c.phase("generator")
    images = torch.randn(64, 3, 5, 5, generator=g) + 10
    first = c.call(fn, images, 2, generator=torch.Generator().manual_seed(7))
    second = c.call(fn, images, 2, generator=torch.Generator().manual_seed(7))
    c.ok(torch.equal(first, second), "two calls with generators seeded alike gave different outputs",
         "draw every random number with _randint(..., generator, device), passing the `generator` on, so a "
         "seed repeats the augmentation")
    c.raises(fn, torch.randn(3, 5, 5, generator=g), 2, why="images of shape (3, 5, 5) have no batch axis",
             hint="check images.ndim == 4 first and raise a ValueError naming the shape", rule="error")
    c.raises(fn, images, -1, why="padding=-1 is negative", hint="raise a ValueError when padding < 0")


@check("pool_tokens")
def pool_tokens(c, fn):
    """pool_tokens(x (b, n, D), pool, num_prefix_tokens) -> (b, D): the class token, or the mean of the patch tokens;
    gradients reach x; ValueErrors for pool='cls' without a class token and for any other pool."""
    g = torch.Generator().manual_seed(23)
    for b, n, d, prefix in ((2, 5, 3, 1), (3, 7, 4, 1), (2, 6, 5, 0), (1, 9, 2, 2)):
        x = torch.randn(b, n, d, generator=g)
        for pool in ("cls", "mean") if prefix else ("mean",):
            got = c.call(fn, x, pool, prefix)
            mistakes = [
                ("the mean includes the class token: average the patch tokens only, x[:, num_prefix_tokens:]",
                 lambda: x.mean(1)),
                ("this is the last token, not the class token: the class token is token 0", lambda: x[:, -1]),
                ("this is the mean of the tokens: for pool='cls' read the class token, x[:, 0]",
                 lambda: x[:, prefix:].mean(1)),
                ("this is the class token: for pool='mean' average the patch tokens", lambda: x[:, 0]),
                ("the mean leaves out one token whatever num_prefix_tokens is: use x[:, num_prefix_tokens:]",
                 lambda: x[:, 1:].mean(1)),
            ]
            c.close(got, ref.pool_tokens(x, pool, prefix), f"pool_tokens(x, {pool!r}, {prefix})", mistakes,
                    shape_hints=[((b, n - prefix), "you averaged over the features: average over the tokens, dim=1"),
                                 ((b, 1, d), "drop the token axis: .mean(dim=1), not keepdim")])
            if (b, n) == (2, 5):
                gradient_flow(c, fn, lambda t: c.call(fn, t["x"], pool, prefix),
                              lambda t: ref.pool_tokens(t["x"], pool, prefix), dict(x=x))
    x = torch.randn(2, 5, 3, generator=g)
    c.raises(fn, x, "cls", 0, why="pool='cls' with num_prefix_tokens=0: there is no class token to read",
             hint="raise a ValueError when pool == 'cls' and num_prefix_tokens < 1", rule="error")
    c.raises(fn, x, "max", 1, why="pool='max' is neither 'cls' nor 'mean'",
             hint="end with `raise ValueError(...)` naming the pool you got")


# each exercise's rules: the key a check passes to Checker.phase (a failure carries it as CheckFailed.rule)
# and the words that state it in the exercise's statement
RULES = {
    "random_crop_flip": {
        "output": "Sample $i$ is the $H \\times W$ window of its zero-padded image",
        "offsets": "both uniform in $0..2p$ and drawn independently per sample",
        "flip": "mirrored left-right with probability $1/2$ (one coin per sample)",
        "loop": "No Python loop",
        "generator": "Draw the random numbers with the helper",
        "error": "raise `ValueError` for images that are not 4-D or a negative padding",
    },
    "pool_tokens": {
        "output": "for `\"cls\"` the class token's state, token 0; for `\"mean\"` the average of the patch tokens",
        "error": "Raise `ValueError` for `pool=\"cls\"` without a class token, and for any other `pool`",
        "gradient": "Gradients flow back to `x`",
    },
}
