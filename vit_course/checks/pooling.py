"""Check for chapter 07's pooling exercise: pool_tokens (the class token, or the mean of the patch tokens)."""

# ruff: noqa: B023  (each diagnosis thunk is called by Checker.close in the loop iteration that builds it)

import torch

from .. import vit as ref
from .core import check
from .gradients import gradient_flow


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
