"""The check of vit_course/checks/embeddings.py (chapter 08: position_embedding_similarity, 8.1) catches the usual
mistakes and accepts correct variants written only from the statement.
"""

import pytest
import torch.nn.functional as F
from einops import rearrange

import vit_course
from vit_course import checks
from vit_course.interpret import num_prefix

from .check_helpers import accepts, rejects
from .test_checks_interpret import pair


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
