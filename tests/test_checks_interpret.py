"""The checks of vit_course/checks/interpret.py (chapter 08: attention_rollout (8.3), mean_attention_distance (8.2))
catch the usual mistakes and accept correct variants written only from the statements.
"""

import pytest
import torch

import vit_course
from vit_course import checks
from vit_course.interpret import check_attention, num_prefix

from .check_helpers import accepts, rejects


def pair(size):
    return (size, size) if isinstance(size, int) else tuple(size)


def distance(slip=None):
    """mean_attention_distance as a learner might write it, with one slip switched on."""
    def mean_attention_distance(attention, grid_size, patch_size):
        gh, gw = pair(grid_size)
        ph, pw = pair(patch_size)
        if slip != "no validation":
            check_attention(attention)
        k = attention.shape[-1] - gh * gw if slip in ("no validation", "no grid check") else num_prefix(
            attention.shape[-1], (gh, gw))
        k = 0 if slip == "keep class token" else k
        a = attention[:, :, k:, k:]
        if slip != "no renorm":
            a = a / a.sum(-2 if slip == "renorm wrong axis" else -1, keepdim=True)
        rows, cols = torch.meshgrid(torch.arange(gh), torch.arange(gw), indexing="ij")
        if slip == "column major":  # patch i put at row i % gh, column i // gh
            rows, cols = torch.arange(gh * gw) % gh, torch.arange(gh * gw) // gh
        ph, pw = (pw, ph) if slip == "patch swapped" else (ph, pw)
        ph, pw = (1, 1) if slip == "patches" else (ph, pw)
        centres = torch.stack([(rows.flatten() + 0.5) * ph, (cols.flatten() + 0.5) * pw], -1).float()  # (N, 2)
        diff = centres[:, None] - centres[None]  # (N, N, 2)
        d = {"manhattan": diff.abs().sum(-1), "squared": (diff ** 2).sum(-1)}.get(slip, diff.norm(dim=-1))
        per_query = (a * d).sum(-1)  # (b, h, N)
        return per_query.mean(2) if slip == "per image" else per_query.mean((0, 2))
    return mean_attention_distance


@pytest.mark.parametrize("impl, hint", [
    (distance("patches"), "in patches, not pixels"),
    (distance("no renorm"), "divide each query's patch weights by their sum"),
    (distance("renorm wrong axis"), r"renormalised over the wrong axis(.|\n)*keepdim"),
    (distance("squared"), "squared distances"),
    (distance("manhattan"), "city-block"),
    (distance("column major"), "rows and columns of the grid are swapped"),
    (distance("patch swapped"), r"height and width are swapped: patch_size is \(Ph, Pw\)"),
    (distance("keep class token"), r"raised (.|\n)*likely cause: the class token's row and column are kept"),
    (distance("per image"), "average over the batch too"),
    (distance("no validation"), r"without a head axis: expected a ValueError"),
    (distance("no grid check"), r"5 tokens cannot hold a 3x3 grid of patches: expected a ValueError"),
])
def test_distance_rejects(impl, hint):
    rejects(checks.mean_attention_distance, impl, hint)


def distance_by_loops(attention, grid_size, patch_size):
    """Written from the statement alone: loops over query and key patches, centres from patch_centres."""
    check_attention(attention)
    k = num_prefix(attention.shape[-1], grid_size)
    centres = vit_course.interpret.patch_centres(grid_size, patch_size)  # (N, 2)
    n = len(centres)
    total = torch.zeros(attention.shape[1])
    for i in range(n):
        weights = attention[:, :, k + i, k:]  # (b, h, N): query i's weights on the patches
        weights = weights / weights.sum(-1, keepdim=True)
        d = torch.stack([torch.dist(centres[i], centres[j]) for j in range(n)])  # (N,)
        total += (weights * d).sum(-1).mean(0)  # (h,)
    return total / n


@pytest.mark.parametrize("impl", [vit_course.mean_attention_distance, distance(), distance_by_loops])
def test_distance_accepts(impl, capsys):
    accepts(checks.mean_attention_distance, impl, capsys)


def rollout(slip=None):
    """attention_rollout as a learner might write it, with one slip switched on."""
    def attention_rollout(attentions):
        if slip != "no empty check" and len(attentions) == 0:
            raise ValueError("no layers")
        for i, a in enumerate(attentions):
            if slip != "no shape check":
                check_attention(a, f"attentions[{i}]")
            if slip != "no size check" and a.shape[-1] != attentions[0].shape[-1]:
                raise ValueError(f"attentions[{i}] has {a.shape[-1]} tokens, attentions[0] {attentions[0].shape[-1]}")
        dtype = attentions[0].dtype if slip == "keep dtype" else torch.float32
        layers = attentions[1:] if slip == "skip first" else attentions
        result = torch.eye(attentions[0].shape[-1], dtype=dtype)
        for a in layers:
            a = a.to(dtype)
            a = {"max": a.amax(1), "sum": a.sum(1), "no mean": a, "head 0": a[:, 0]}.get(slip, a.mean(1))
            a = a if slip in ("no identity", "identity at the end") else a + torch.eye(a.shape[-1], dtype=dtype)
            if slip not in ("no renorm", "identity at the end"):
                a = a / a.sum(-2 if slip == "wrong axis" else -1, keepdim=True)
            result = result @ a if slip == "first left" else a @ result
        if slip == "identity at the end":
            result = result + torch.eye(result.shape[-1], dtype=dtype)
            result = result / result.sum(-1, keepdim=True)
        return result
    return attention_rollout


@pytest.mark.parametrize("impl, hint", [
    (rollout("no identity"), "the identity .* is not added"),
    (rollout("no renorm"), "the rows are not renormalised"),
    (rollout("wrong axis"), "renormalised over the wrong axis"),
    (rollout("first left"), "multiplied in the wrong order"),
    (rollout("max"), "combined with max"),
    (rollout("sum"), "the heads are summed"),
    (rollout("head 0"), "only head 0 is used"),
    (rollout("identity at the end"), "the identity is added once, after the product"),
    (rollout("no mean"), r"average over the heads: the rollout is \(b, n, n\)"),
    (rollout("skip first"), "the first layer is left out"),
    (lambda attentions: rollout()(attentions[-1:]), "only the last layer is used"),
    (rollout("keep dtype"), "float16 weights gave a torch.float16 rollout, expected float32"),
    (rollout("no empty check"), "an empty list of layers: expected a ValueError"),
    (rollout("no shape check"), r"weights of shape \(2, 4, 4\), without a head axis: expected a ValueError"),
    (rollout("no size check"), "layers with 4 and 5 tokens: expected a ValueError"),
])
def test_rollout_rejects(impl, hint):
    rejects(checks.attention_rollout, impl, hint)


def rollout_halves(attentions):
    """Written from the statement alone: (mean + I) / 2 (rows of the mean already sum to 1), einsum products."""
    if not attentions:
        raise ValueError("attention_rollout needs at least one layer")
    n = attentions[0].shape[-1]
    result = None
    for i, a in enumerate(attentions):
        if a.ndim != 4 or a.shape[-2:] != (n, n):
            raise ValueError(f"attentions[{i}] has shape {tuple(a.shape)}, expected (b, h, {n}, {n})")
        a = 0.5 * a.float().mean(1) + 0.5 * torch.eye(n)  # (b, n, n)
        result = a if result is None else torch.einsum("bij,bjk->bik", a, result)
    return result


@pytest.mark.parametrize("impl", [vit_course.attention_rollout, rollout(), rollout_halves])
def test_rollout_accepts(impl, capsys):
    accepts(checks.attention_rollout, impl, capsys)
