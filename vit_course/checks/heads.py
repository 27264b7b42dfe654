"""Checks for chapter 02's first exercises: split_heads and merge_heads."""

# ruff: noqa: B023  (each diagnosis thunk is called by Checker.close in the loop iteration that builds it)

import torch
from einops import rearrange

from .. import attention as ref
from .common import INTERLEAVED, NO_TRANSPOSE
from .core import check
from .gradients import gradient_flow

SPLIT_CASES = ((2, 5, 12, 3), (1, 1, 6, 2), (3, 7, 15, 5), (2, 4, 8, 1), (2, 3, 8, 8))
MERGED_NO_TRANSPOSE = ("your heads look merged without a transpose: `.reshape(b, n, h * d)` on the (b, h, n, d) "
                       "tensor mixes tokens and heads; first bring the tokens in front of the heads, "
                       "x.transpose(1, 2) gives (b, n, h, d), then flatten the last two axes")
MERGED_INTERLEAVED = ("your heads' features are interleaved (every h-th feature belongs to one head): put each "
                      "head's d features side by side as one block, the pattern 'b h n d -> b n (h d)'")


@check("split_heads")
def split_heads(c, fn):
    """(b, n, h*d) -> (b, h, n, d): head i owns the i-th contiguous block of d features; gradients reach x; a
    ValueError naming both numbers when the width is not divisible by the heads."""
    g = torch.Generator().manual_seed(3)
    for b, n, width, h in SPLIT_CASES:
        x = torch.randn(b, n, width, generator=g)
        d = width // h
        got = c.call(fn, x, h)
        shape_hints = [((b, n, h, d), "this is (b, n, h, d): move the head axis in front of the tokens "
                                      "(transpose(1, 2)), the result is (b, h, n, d)")]
        if d != h:
            shape_hints.append(((b, d, n, h), "num_heads was used as the width of a head: the pattern's h is "
                                              "num_heads, and einops works out d = width // num_heads"))
        c.close(got, ref.split_heads(x, h), f"split into {h} heads", [
            (NO_TRANSPOSE, lambda x=x, h=h, d=d: x.reshape(b, h, n, d)),
            (INTERLEAVED, lambda x=x, h=h: rearrange(x, "b n (d h) -> b h n d", h=h))], shape_hints=shape_hints)
    gradient_flow(c, fn, lambda t: c.call(fn, t["x"], 3), lambda t: ref.split_heads(t["x"], 3),
                  dict(x=torch.randn(2, 4, 12, generator=g)))
    c.raises(fn, torch.randn(2, 3, 10, generator=g), 4, why="a width of 10 is not divisible by 4 heads",
             names=(10, 4), hint="check `x.shape[-1] % num_heads` first and raise a ValueError naming both numbers",
             rule="error")


@check("merge_heads")
def merge_heads(c, fn):
    """(b, h, n, d) -> (b, n, h*d), the inverse of split_heads; gradients reach x."""
    g = torch.Generator().manual_seed(4)
    for b, n, width, h in SPLIT_CASES:
        d = width // h
        x = torch.randn(b, h, n, d, generator=g)
        got = c.call(fn, x)
        c.close(got, ref.merge_heads(x), "merged heads", [
            (MERGED_NO_TRANSPOSE, lambda x=x: x.reshape(b, n, width)),
            (MERGED_INTERLEAVED, lambda x=x: rearrange(x, "b h n d -> b n (d h)"))],
            shape_hints=[((b, n, h, d), "this is still (b, n, h, d): flatten heads and features into h*d"),
                         ((b, h, n * d), "this flattens tokens and features together: transpose heads and tokens "
                                         "first, (b, h, n, d) -> (b, n, h, d), then flatten the last two")])
        c.close(ref.split_heads(got, h), x, "split_heads(merge_heads(x)), which should give x back")
    gradient_flow(c, fn, lambda t: c.call(fn, t["x"]), lambda t: ref.merge_heads(t["x"]),
                  dict(x=torch.randn(2, 3, 4, 5, generator=g)))
