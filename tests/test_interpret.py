"""Checks of the interpretability tools themselves (chapter 08)."""

import itertools
import math

import pytest
import torch

from vit_course import ViT, sincos_position_embedding
from vit_course.embeddings import embedding_filters, position_embedding_similarity
from vit_course.interpret import (
    attention_distances,
    attention_map,
    attention_rollout,
    layer_attentions,
    mean_attention_distance,
    rollout_map,
    run_model,
)


def random_attention(b, h, n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(b, h, n, n, generator=g).softmax(dim=-1)  # (b, h, n, n)


# ---- attention rollout ----

def test_rollout_rows_sum_to_one():
    attentions = [random_attention(2, 3, 10, seed) for seed in range(4)]
    rollout = attention_rollout(attentions)
    assert rollout.shape == (2, 10, 10)
    torch.testing.assert_close(rollout.sum(-1), torch.ones(2, 10))
    assert (rollout >= 0).all()


def test_rollout_of_identity_attention_is_identity():
    eye = torch.eye(7).expand(2, 4, 7, 7)
    torch.testing.assert_close(attention_rollout([eye] * 3), torch.eye(7).expand(2, 7, 7))


def test_rollout_of_one_layer_is_half_attention_plus_identity():
    a = random_attention(2, 3, 6)
    expected = (a.mean(dim=1) + torch.eye(6)) / 2  # heads averaged, then (A + I) / 2
    torch.testing.assert_close(attention_rollout([a]), expected)


def test_rollout_multiplies_last_layer_on_the_left():
    a1, a2 = random_attention(1, 2, 5, 1), random_attention(1, 2, 5, 2)
    r1, r2 = attention_rollout([a1]), attention_rollout([a2])
    torch.testing.assert_close(attention_rollout([a1, a2]), r2 @ r1)
    assert not torch.allclose(r2 @ r1, r1 @ r2)  # the order is observable


def test_rollout_rejects_bad_input():
    with pytest.raises(ValueError, match="empty"):
        attention_rollout([])
    with pytest.raises(ValueError, match="earlier layers"):
        attention_rollout([random_attention(1, 2, 5), random_attention(1, 2, 6)])
    with pytest.raises(ValueError, match=r"\(2, 5, 5\)"):
        attention_rollout([torch.ones(2, 5, 5)])


def test_rollout_map_reads_the_class_token_row():
    a = random_attention(2, 3, 1 + 6)  # class token + a 2x3 grid
    rollout = attention_rollout([a])
    raw = rollout_map([a], (2, 3), normalize=False)
    assert raw.shape == (2, 2, 3)
    torch.testing.assert_close(raw.flatten(1), rollout[:, 0, 1:])
    shown = rollout_map([a], (2, 3), image_size=(8, 12))
    assert shown.shape == (2, 8, 12)
    torch.testing.assert_close(shown.flatten(1).amax(1), torch.ones(2))
    # by default (nearest) each patch's value covers its 4 x 4 pixels: the map is drawn cell by cell
    blocks = rollout_map([a], (2, 3), image_size=(8, 12), normalize=False)
    torch.testing.assert_close(blocks, raw.repeat_interleave(4, 1).repeat_interleave(4, 2))
    cells = attention_map(a, (2, 3), image_size=(8, 12), normalize=False)  # (2, 3 heads, 8, 12)
    per_head = a[:, :, 0, 1:].unflatten(-1, (2, 3))  # (2, 3, 2, 3): each head's class-token row on the grid
    torch.testing.assert_close(cells, per_head.repeat_interleave(4, 2).repeat_interleave(4, 3))
    smooth = rollout_map([a], (2, 3), image_size=(8, 12), normalize=False, mode="bilinear")  # asked for: blended
    assert not torch.allclose(smooth, blocks)


def test_maps_without_class_token_average_the_patch_rows():
    a = random_attention(1, 2, 4)  # a mean-pooled model on a 2x2 grid: no prefix token
    torch.testing.assert_close(attention_map(a, 2, normalize=False).flatten(2), a.mean(dim=2))


def test_maps_of_a_mean_pooled_model_with_class_token_average_the_patch_rows():
    a = random_attention(2, 3, 1 + 4)  # class token + a 2x2 grid, but the head reads the patches' mean
    patch_rows = a[:, :, 1:, 1:].mean(dim=2)  # (b, h, N): the rows the mean-pooled head reads, patch columns
    torch.testing.assert_close(attention_map(a, 2, normalize=False, pool="mean").flatten(2), patch_rows)
    torch.testing.assert_close(rollout_map([a], 2, normalize=False, pool="mean").flatten(1),
                               attention_rollout([a])[:, 1:, 1:].mean(dim=1))
    torch.testing.assert_close(attention_map(a, 2, normalize=False).flatten(2), a[:, :, 0, 1:])  # guessed: cls
    with pytest.raises(ValueError, match="no prefix token"):
        attention_map(random_attention(1, 2, 4), 2, pool="cls")
    with pytest.raises(ValueError, match="'max'"):
        attention_map(a, 2, pool="max")


def test_attention_map_per_head():
    a = random_attention(2, 3, 1 + 4)
    maps = attention_map(a, 2, normalize=False)
    assert maps.shape == (2, 3, 2, 2)
    torch.testing.assert_close(maps.flatten(2), a[:, :, 0, 1:])
    with pytest.raises(ValueError, match="3x3"):
        attention_map(a, 3)


# ---- mean attention distance ----

def test_distance_is_zero_for_attention_on_oneself():
    eye = torch.eye(1 + 9).expand(2, 3, 10, 10)  # class token + 3x3 grid, each token on itself
    torch.testing.assert_close(mean_attention_distance(eye, 3, 4), torch.zeros(3))


def uniform_distance(gh, gw, patch, weight):
    """Mean over queries of sum over keys of weight * distance, computed with plain loops."""
    cells = list(itertools.product(range(gh), range(gw)))
    total = 0.0
    for (qi, qj), (ki, kj) in itertools.product(cells, cells):
        total += weight * patch * math.hypot(qi - ki, qj - kj)
    return total / len(cells)


@pytest.mark.parametrize("prefix", [0, 1])
def test_distance_of_uniform_attention_matches_the_analytic_value(prefix):
    gh, gw, patch = 2, 3, 4
    n = prefix + gh * gw
    uniform = torch.full((1, 2, n, n), 1.0 / n)
    # with a class token the patch weights 1/7 are renormalised to 1/6: the same distance as without one
    expected = uniform_distance(gh, gw, patch, 1.0 / (gh * gw))
    torch.testing.assert_close(mean_attention_distance(uniform, (gh, gw), patch), torch.full((2,), expected))


def test_distance_on_a_2x2_grid_closed_form():
    uniform = torch.full((1, 1, 4, 4), 0.25)
    # from any corner: two neighbours at P, the opposite corner at P * sqrt(2)
    assert mean_attention_distance(uniform, 2, 16).item() == pytest.approx(16 * (2 + math.sqrt(2)) / 4)


def test_distance_scales_linearly_with_patch_size():
    a = random_attention(3, 4, 1 + 16)
    d = mean_attention_distance(a, 4, 1)
    torch.testing.assert_close(mean_attention_distance(a, 4, 7), 7 * d)
    assert (d > 0).all()


def test_distance_of_a_head_looking_at_its_right_neighbour():
    # every query on a 1x4 row attends fully to the patch on its right (the last one to itself)
    a = torch.zeros(1, 1, 4, 4)
    for q in range(4):
        a[0, 0, q, min(q + 1, 3)] = 1.0
    assert mean_attention_distance(a, (1, 4), 8).item() == pytest.approx(8 * 3 / 4)


def test_attention_distances_of_a_model():
    torch.manual_seed(0)
    model = ViT(image_size=16, patch_size=4, in_channels=3, num_classes=5, dim=32, depth=3, num_heads=2)
    images = torch.randn(5, 3, 16, 16)
    distances = attention_distances(model, images, batch_size=2)
    assert distances.shape == (3, 2)
    attentions = layer_attentions(model, images)
    expected = mean_attention_distance(attentions[1], 4, 4)
    torch.testing.assert_close(distances[1], expected)
    # untrained attention is close to uniform: between a neighbour's distance and the grid's diameter
    assert (distances > 4).all() and (distances < 4 * 3 * math.sqrt(2)).all()


def test_attention_distances_of_a_hybrid_model_count_stem_pixels():
    torch.manual_seed(0)
    model = ViT(image_size=16, patch_size=1, in_channels=3, num_classes=5, dim=32, depth=2, num_heads=2,
                stem_channels=(8, 8))
    images = torch.randn(2, 3, 16, 16)
    attentions = layer_attentions(model, images)
    expected = mean_attention_distance(attentions[0], model.grid_size, 4)  # 1 feature-map patch = 4 pixels
    torch.testing.assert_close(attention_distances(model, images)[0], expected)


def test_attention_distances_refuse_an_empty_batch():
    model = ViT(image_size=8, patch_size=4, in_channels=3, num_classes=5, dim=16, depth=1, num_heads=2)
    with pytest.raises(ValueError, match=r"non-empty batch \(b, C, H, W\), got shape \(0, 3, 8, 8\)"):
        attention_distances(model, torch.zeros(0, 3, 8, 8))
    with pytest.raises(ValueError, match=r"of at least one image, got shape \(0, 2, 5, 5\)"):
        mean_attention_distance(torch.zeros(0, 2, 5, 5), 2, 4)  # else the mean of nothing: NaN per head


# ---- position-embedding similarity ----

def test_position_similarity_is_one_on_the_diagonal_and_symmetric():
    pos = torch.randn(1, 1 + 12, 16)  # class token + a 3x4 grid
    sim = position_embedding_similarity(pos, (3, 4))
    assert sim.shape == (3, 4, 3, 4)
    flat = sim.reshape(12, 12)
    torch.testing.assert_close(flat.diagonal(), torch.ones(12))
    torch.testing.assert_close(flat, flat.T)
    # the class-token row was dropped: patch 0 is pos[1]
    cos = torch.nn.functional.cosine_similarity(pos[0, 1], pos[0, 2], dim=0)
    torch.testing.assert_close(sim[0, 0, 0, 1], cos)
    torch.testing.assert_close(position_embedding_similarity(pos[0, 1:], (3, 4)), sim)  # (n, D) works too


def test_sincos_similarity_shows_rows_and_columns():
    gh = gw = 5
    sim = position_embedding_similarity(sincos_position_embedding((gh, gw), 64), (gh, gw))
    for i, j, i2, j2 in itertools.product(range(gh), range(gw), range(gh), range(gw)):
        if i2 != i:  # sharing a row beats not sharing it, at the same column offset
            assert sim[i, j, i, j2] > sim[i, j, i2, j2]
        if j2 != j:  # and the same for columns
            assert sim[i, j, i2, j] > sim[i, j, i2, j2]
    # and similarity falls off with distance along a row
    assert sim[2, 2, 2, 3] > sim[2, 2, 2, 4]


def test_position_similarity_rejects_bad_shapes():
    with pytest.raises(ValueError, match="3x3"):
        position_embedding_similarity(torch.randn(1, 5, 8), 3)
    with pytest.raises(ValueError, match=r"\(2, 5, 8\)"):
        position_embedding_similarity(torch.randn(2, 5, 8), 2)


# ---- patch-embedding filters ----

def test_embedding_filters_recover_planted_components():
    g = torch.Generator().manual_seed(0)
    patch, channels = 3, 2
    basis, _ = torch.linalg.qr(torch.randn(patch * patch * channels, 2, generator=g))  # two orthonormal patterns
    coeffs = torch.randn(200, 2, generator=g) * torch.tensor([5.0, 1.0])  # the first dominates
    weight = coeffs @ basis.T + 3.0  # (D, P*P*C), with an offset PCA must remove
    filters, explained = embedding_filters(weight, patch, channels, k=4)
    assert filters.shape == (4, patch, patch, channels) and explained.shape == (4,)
    first = filters[0].reshape(-1)  # back to (p1 p2 c) order
    assert abs(first @ basis[:, 0]).item() == pytest.approx(1.0, abs=1e-3)
    assert explained[0] > 0.9 and explained[2:].sum() < 1e-6
    assert (explained[:-1] >= explained[1:]).all()


def test_embedding_filters_accept_conv_weights_and_fix_the_sign():
    torch.manual_seed(0)
    weight = torch.randn(32, 4 * 4 * 3)
    with pytest.raises(ValueError, match="k must be at least 1, got 0"):
        embedding_filters(weight, 4, 3, k=0)
    filters, _ = embedding_filters(weight, 4, 3, k=5)
    conv = weight.reshape(32, 4, 4, 3).permute(0, 3, 1, 2)  # (D, C, P, P) in timm's layout
    torch.testing.assert_close(embedding_filters(conv, 4, 3, k=5)[0], filters)
    flipped, _ = embedding_filters(-weight, 4, 3, k=5)
    torch.testing.assert_close(flipped, filters)  # the sign of the weights does not flip the figure
    assert embedding_filters(weight, 4, 3, k=100)[0].shape[0] == 32  # k is capped at min(D, P*P*C)
    with pytest.raises(ValueError, match="patch_size=5"):
        embedding_filters(weight, 5, 3)


def test_uniform_attention_distance_reference():
    from vit_course.interpret import uniform_attention_distance
    assert uniform_attention_distance((2, 3), 4) == pytest.approx(uniform_distance(2, 3, 4, 1 / 6))


def test_run_model_batches_like_one_pass_in_eval_mode_and_restores_the_mode():
    """Logits and attention weights gathered over batches of 3 are those of one eval-mode pass over all 7 images,
    dropout off; the model comes back in training mode, as it went in."""
    torch.manual_seed(0)
    model = ViT(image_size=16, patch_size=4, in_channels=3, num_classes=5, dim=16, depth=2, num_heads=2,
                attn_drop=0.5, drop=0.5).train()
    x = torch.randn(7, 3, 16, 16)
    logits, weights = run_model(model, x, batch_size=3)
    assert model.training
    model.eval()
    with torch.no_grad():
        torch.testing.assert_close(logits, model(x))
        for ours, whole in zip(weights, layer_attentions(model, x), strict=True):
            torch.testing.assert_close(ours, whole)
    assert len(weights) == 2 and weights[0].shape == (7, 2, 17, 17)


def test_attention_tools_name_a_list_of_layers_and_a_grid_that_leaves_several_class_tokens():
    weights = random_attention(2, 2, 17)  # (2, 2, 17, 17): a class token and a 4 x 4 grid
    with pytest.raises(TypeError, match="got a list of 3 .*attentions\\[-1\\]"):
        attention_map([weights] * 3, 4)
    with pytest.raises(ValueError, match="17 tokens do not fit a 3x3 patch grid: that leaves 8 class tokens"):
        attention_map(weights, 3)  # the grid given too small
    assert attention_map(weights, 4).shape == (2, 2, 4, 4)  # (b, heads, gh, gw)
