"""The chapter-07 pooling check: class token vs mean of the patch tokens."""

import pytest
import torch

from vit_course import checks, pool_tokens
from vit_course.checks import CheckFailed

from .check_helpers import slip


def test_reference_and_variants_pass(capsys):
    checks.pool_tokens(pool_tokens)

    def einsum_mean(x, pool="cls", num_prefix_tokens=1):
        if pool not in ("cls", "mean") or (pool == "cls" and num_prefix_tokens == 0):
            raise ValueError(f"cannot pool {pool!r} with {num_prefix_tokens} class tokens")
        if pool == "cls":
            return x.select(1, 0)
        patches = x[:, num_prefix_tokens:]
        return torch.einsum("bnd->bd", patches) / patches.shape[1]

    checks.pool_tokens(einsum_mean)
    assert capsys.readouterr().out.count("✔ pool_tokens: passed") == 2


@pytest.mark.parametrize("wrong,hint", [
    (lambda x, pool="cls", k=1: x[:, 0] if pool == "cls" else x.mean(1), "includes the class token"),
    (lambda x, pool="cls", k=1: x[:, -1] if pool == "cls" else x[:, k:].mean(1), "last token"),
    (lambda x, pool="cls", k=1: x[:, 0] if pool == "cls" else x[:, 1:].mean(1), "whatever num_prefix_tokens"),
    (lambda x, pool="cls", k=1: x[:, k:].mean(1), "read the class token"),
    (lambda x, pool="cls", k=1: x[:, 0] if pool == "cls" else x[:, k:].mean(2), "over the tokens"),
    (lambda x, pool="cls", k=1: x[:, :1] if pool == "cls" else x[:, k:].mean(1, keepdim=True), "token axis"),
])
def test_mistakes_are_named(wrong, hint):
    with pytest.raises(CheckFailed, match=hint):
        checks.pool_tokens(wrong)


def test_reference_rejects_bad_pool():
    with pytest.raises(ValueError, match="'max'"):
        pool_tokens(torch.zeros(1, 3, 2), "max")
    with pytest.raises(ValueError, match="class token"):
        pool_tokens(torch.zeros(1, 3, 2), "cls", 0)


def no_checks(x, pool="cls", num_prefix_tokens=1):
    return x[:, 0] if pool == "cls" else x[:, num_prefix_tokens:].mean(1)


def test_missing_value_errors_are_named():
    with pytest.raises(CheckFailed, match="pool='cls' with num_prefix_tokens=0: there is no class token to read: "
                                          r"expected a ValueError, your code returned tensor\(2, 3\)"):
        checks.pool_tokens(no_checks)
    with pytest.raises(CheckFailed, match="pool='max' is neither 'cls' nor 'mean': expected a ValueError"):
        checks.pool_tokens(lambda x, pool="cls", k=1: pool_tokens(x, "mean" if pool == "max" else pool, k))


# --- the catalogue of slips (issue 34), with the rule the check must blame -----------------------------------

def pool_in_place(x, pool="cls", num_prefix_tokens=1):
    x -= x.mean(1, keepdim=True)  # "centre the tokens", in the caller's tensor
    return pool_tokens(x, pool, num_prefix_tokens)


SLIPS = [
    slip("pool_tokens", "output", "with_class_token",
         lambda x, pool="cls", k=1: x[:, 0] if pool == "cls" else x.mean(1), "includes the class token"),
    slip("pool_tokens", "output", "last_token",
         lambda x, pool="cls", k=1: x[:, -1] if pool == "cls" else x[:, k:].mean(1), "last token"),
    slip("pool_tokens", "error", "no_checks", no_checks, "there is no class token to read: expected a ValueError"),
    slip("pool_tokens", "gradient", "detach", lambda x, pool="cls", k=1: pool_tokens(x.detach(), pool, k),
         "carries no gradient"),
    slip("pool_tokens", "inputs", "centred", pool_in_place, "changed its input `x` in place"),
]
