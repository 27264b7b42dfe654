"""Chapter 08's checks (attention_rollout, mean_attention_distance, position_embedding_similarity,
delete_patches) catch the usual mistakes and accept correct variants."""

import math

import pytest
import torch
import torch.nn.functional as F
from einops import rearrange

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


def similarity(slip=None):
    """position_embedding_similarity as a learner might write it, with one slip switched on."""
    def position_embedding_similarity(pos_embed, grid_size):
        gh, gw = pair(grid_size)
        if slip != "no shape check" and (pos_embed.ndim not in (2, 3) or
                                         (pos_embed.ndim == 3 and pos_embed.shape[0] != 1)):
            raise ValueError(f"pos_embed must be (1, n, D) or (n, D), got {tuple(pos_embed.shape)}")
        if slip == "only 3-D checked" and pos_embed.ndim == 3 and pos_embed.shape[0] != 1:
            raise ValueError("bad table")
        table = pos_embed.reshape(-1, pos_embed.shape[-1])  # (n, D)
        table = table if slip == "no detach" else table.detach()
        table = table if slip == "no float" else table.float()
        k = table.shape[0] - gh * gw if slip == "no grid check" else num_prefix(table.shape[0], (gh, gw))
        table = {"keep class row": table, "drop last rows": table[:gh * gw]}.get(slip, table[k:])  # (N, D)
        if slip != "dot products":
            table = F.normalize(table, dim=0 if slip == "wrong axis" else -1)
        sim = table @ table.T  # (N, N)
        if slip == "not on grid":
            return sim
        pattern = "(w1 h1) (w2 h2) -> h1 w1 h2 w2" if slip == "columns first" else "(h1 w1) (h2 w2) -> h1 w1 h2 w2"
        return rearrange(sim, pattern, h1=gh, w1=gw, h2=gh, w2=gw)
    return position_embedding_similarity


def only_2d_or_3d_tables(pos_embed, grid_size):
    """A slip: a 4-D table is flattened instead of rejected (the statement asks for a ValueError)."""
    if pos_embed.ndim == 3 and pos_embed.shape[0] != 1:
        raise ValueError(f"pos_embed must be (1, n, D), got {tuple(pos_embed.shape)}")
    return similarity()(pos_embed.reshape(-1, pos_embed.shape[-1]), grid_size)


@pytest.mark.parametrize("impl, hint", [
    (similarity("dot products"), "dot products: normalise the embeddings to unit length"),
    (similarity("wrong axis"), "normalised over the wrong axis"),
    (similarity("columns first"), "rows and columns of the grid are swapped"),
    (similarity("not on grid"), "lay the .* similarities out on the grid"),
    (similarity("keep class row"), r"raised (.|\n)*likely cause: the class token's row is kept: drop the first k"),
    (similarity("drop last rows"), r"the last rows were dropped: the class token's row is the first"),
    (similarity("no detach"), r"still requires grad(.|\n)*\.detach\(\)"),
    (similarity("no float"), "a float16 table gave torch.float16 similarities, expected float32"),
    (similarity("no shape check"), r"shape \(2, 5, 8\): the first axis must be 1: expected a ValueError"),
    (only_2d_or_3d_tables, r"a 4-D table of shape \(1, 1, 10, 8\): expected a ValueError"),
    (similarity("no grid check"), "8 embeddings cannot hold a 3x3 grid: expected a ValueError"),
])
def test_similarity_rejects(impl, hint):
    rejects(checks.position_embedding_similarity, impl, hint)


def similarity_by_cosine(pos_embed, grid_size):
    """Written from the statement alone: F.cosine_similarity on every pair, then a reshape to the grid."""
    gh, gw = pair(grid_size)
    if pos_embed.dim() == 3:
        if pos_embed.size(0) != 1:
            raise ValueError("a 3-D table must be (1, n, D)")
        pos_embed = pos_embed.squeeze(0)
    elif pos_embed.dim() != 2:
        raise ValueError("the table must be (1, n, D) or (n, D)")
    patches = pos_embed.detach().float()[num_prefix(len(pos_embed), (gh, gw)):]  # (N, D)
    sim = F.cosine_similarity(patches[:, None, :], patches[None, :, :], dim=-1)  # (N, N)
    return sim.reshape(gh, gw, gh, gw)


@pytest.mark.parametrize("impl", [vit_course.position_embedding_similarity, similarity(), similarity_by_cosine])
def test_similarity_accepts(impl, capsys):
    accepts(checks.position_embedding_similarity, impl, capsys)


def deleting(slip=None):
    """delete_patches as a learner might write it, with one slip switched on."""
    def delete_patches(images, ranking, fraction, patch_size):
        b, _, h, w = images.shape
        gh, gw = h // patch_size, w // patch_size
        if slip != "no ranking check" and ranking.shape != (b, gh * gw):
            raise ValueError(f"ranking {tuple(ranking.shape)} is not (batch, patches) = {(b, gh * gw)}")
        if slip != "no fraction check" and not 0 <= fraction <= 1:
            raise ValueError(f"fraction {fraction} is not in [0, 1]")
        if slip == "same tensor" and fraction == 0:
            return images
        k = {"int": int, "ceil": math.ceil}.get(slip, round)(fraction * gh * gw / (100 if slip == "percent" else 1))
        ranking = ranking[:1].expand(b, -1) if slip == "image 0" else ranking
        out = images if slip == "in place" else images.clone()
        if slip == "batch wide":
            top = ranking.flatten().topk(k * b).indices
            pairs = [(int(i) // (gh * gw), int(i) % (gh * gw)) for i in top]
        else:
            top = ranking.topk(k, dim=1, largest=slip != "lowest").indices  # (b, k)
            pairs = [(i, int(p)) for i in range(b) for p in top[i]]
        fill = -1.0 if slip == "fill" else 0.0
        for i, p in pairs:
            r, c = (p % gh, p // gh) if slip == "column order" else divmod(p, gw)
            if slip == "grid pixel":
                out[i, :, r, c] = fill
            elif slip == "flat pixel":
                out[i, :, p // w, p % w] = fill
            elif slip == "corner pixel":
                out[i, :, r * patch_size, c * patch_size] = fill
            elif slip == "grid square":
                out[i, :, r:r + patch_size, c:c + patch_size] = fill
            elif slip == "first channel":
                out[i, :1, r * patch_size:(r + 1) * patch_size, c * patch_size:(c + 1) * patch_size] = fill
            else:
                out[i, :, r * patch_size:(r + 1) * patch_size, c * patch_size:(c + 1) * patch_size] = fill
        return out
    return delete_patches


@pytest.mark.parametrize("impl, hint", [
    (deleting("lowest"), "ranked lowest"),
    (deleting("column order"), "column by column"),
    (deleting("grid pixel"), "patch numbers were used as pixel positions"),
    (deleting("flat pixel"), "patch numbers were used as pixel positions"),
    (deleting("corner pixel"), "only one pixel of each patch"),
    (deleting("grid square"), "the patch's grid row and column were used as its pixel position"),
    (deleting("first channel"), "only the first channel was zeroed"),
    (deleting("percent"), "not a percentage"),
    (deleting("image 0"), "image 0's ranking was used for every image"),
    (deleting("int"), r"int\(\) rounds down"),
    (deleting("ceil"), r"math.ceil rounds up"),
    (deleting("batch wide"), "whole batch"),
    (deleting("in place"), "in place"),
    (deleting("same tensor"), "returned `images` itself"),
    (deleting("fill"), "dataset's mean colour"),
    (deleting("no ranking check"), "a ranking of 3 patches for images of 4 patches of 4x4: expected a ValueError"),
    (deleting("no fraction check"), r"fraction=1.5 is not in \[0, 1\]: expected a ValueError"),
    (lambda images, ranking, fraction, patch_size: images.clone(), "largest difference"),
])
def test_delete_patches_rejects(impl, hint):
    rejects(checks.delete_patches, impl, hint)


def deleting_with_patchify(images, ranking, fraction, patch_size):
    """Written from the statement alone: patchify, zero the top rows with a boolean index, unpatchify."""
    if ranking.shape != (images.shape[0], (images.shape[2] // patch_size) * (images.shape[3] // patch_size)):
        raise ValueError("ranking must be (b, N)")
    if fraction < 0 or fraction > 1:
        raise ValueError("fraction must be in [0, 1]")
    patches = vit_course.patchify(images, patch_size)  # (b, N, P*P*C), a new tensor
    top = ranking.argsort(dim=1, descending=True)[:, :round(fraction * ranking.shape[1])]  # (b, count)
    patches[torch.arange(len(images))[:, None], top] = 0.0
    return vit_course.unpatchify(patches, patch_size, tuple(images.shape[-2:]))


@pytest.mark.parametrize("impl", [vit_course.delete_patches, deleting(), deleting_with_patchify])
def test_delete_patches_accepts(impl, capsys):
    accepts(checks.delete_patches, impl, capsys)
