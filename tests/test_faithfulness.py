"""Chapter 08's numbers: the deletion test, and how much a position table or a patch embedding has learned."""

import pytest
import torch

from vit_course import ViT, patchify, sincos_position_embedding
from vit_course.embeddings import (
    grid_neighbours,
    neighbour_share,
    position_rank_correlation,
    spearman,
    top_variance_share,
)
from vit_course.faithfulness import (
    attention_rankings,
    baseline_rankings,
    centre_ranking,
    delete_patches,
    deletion_accuracy,
    deletion_curves,
    norm_ranking,
    random_ranking,
)
from vit_course.interpret import attention_rollout, layer_attentions


def spearman_by_hand(x, y):
    """An independent Spearman: average ranks by sorting in plain Python, then Pearson on the ranks."""
    def ranks(values):
        order = sorted(range(len(values)), key=lambda i: values[i])
        out, i = [0.0] * len(values), 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
                j += 1
            for m in range(i, j + 1):
                out[order[m]] = (i + j) / 2 + 1
            i = j + 1
        return out
    rx, ry = ranks(list(x)), ranks(list(y))
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    return cov / (sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry)) ** 0.5


def test_spearman_with_ties_matches_an_independent_computation():
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 5, (60,), generator=g).float()  # many ties
    y = x + torch.randn(60, generator=g)
    assert spearman(x, y) == pytest.approx(spearman_by_hand(x.tolist(), y.tolist()), abs=1e-9)
    assert spearman(torch.arange(10.0), torch.arange(10.0) ** 3) == pytest.approx(1.0)
    assert spearman(torch.arange(10.0), -torch.arange(10.0)) == pytest.approx(-1.0)


def test_grid_neighbours_are_the_8_surrounding_cells():
    near = grid_neighbours((3, 4))
    assert near.shape == (12, 12) and not near.diagonal().any() and torch.equal(near, near.T)
    assert near[5].sum() == 8 and near[0].sum() == 3  # an inner cell, a corner
    assert near[0, 5] and not near[0, 2]  # (0,0)-(1,1) diagonal neighbours; (0,0)-(0,2) two apart


def test_a_table_that_knows_the_grid_scores_high_and_noise_scores_low():
    grid = (8, 8)
    knows = torch.cat([torch.zeros(1, 64), sincos_position_embedding(grid, 64)])  # class-token row first
    noise = torch.randn(65, 64, generator=torch.Generator().manual_seed(1))
    assert neighbour_share(knows, grid) == 1.0 and position_rank_correlation(knows, grid) > 0.8
    assert neighbour_share(noise, grid) < 0.4 and abs(position_rank_correlation(noise, grid)) < 0.1


def test_top_variance_share():
    g = torch.Generator().manual_seed(2)
    rank_one = torch.randn(32, 1, generator=g) @ torch.randn(1, 48, generator=g)  # (D, P*P*C): one direction
    assert top_variance_share(rank_one + 5.0, 4, 3, k=1) == pytest.approx(1.0, abs=1e-4)  # centring removes the 5
    noise = torch.randn(500, 48, generator=g)
    assert top_variance_share(noise, 4, 3, k=8) < 0.4  # spread evenly: about 8/48 each way


def test_delete_patches_zeroes_the_top_ranked_patches_only():
    g = torch.Generator().manual_seed(3)
    images, ranking = torch.randn(3, 3, 8, 12, generator=g), torch.randn(3, 6, generator=g)  # a 2 x 3 grid
    before = images.clone()
    out = delete_patches(images, ranking, 0.5, 4)
    assert torch.equal(images, before)  # the input is untouched
    zeroed = (patchify(out, 4) == 0).all(-1)  # (3, 6)
    expected = torch.zeros(3, 6, dtype=torch.bool).scatter_(1, ranking.topk(3, dim=1).indices, True)
    assert torch.equal(zeroed, expected)
    kept = ~expected
    assert torch.equal(patchify(out, 4)[kept], patchify(images, 4)[kept])
    assert torch.equal(delete_patches(images, ranking, 0.0, 4), images)
    assert (delete_patches(images, ranking, 1.0, 4) == 0).all()
    with pytest.raises(ValueError, match=r"\(3, 6\).*\(3, 5\)"):
        delete_patches(images, ranking[:, :5], 0.5, 4)
    with pytest.raises(ValueError, match="1.5"):
        delete_patches(images, ranking, 1.5, 4)


def test_delete_patches_builds_its_mask_beside_the_images():
    """Images on the model's device and a ranking left on the CPU (as attention_rankings returns it); the meta
    device stands in for a GPU: a mask built on the ranking's device fails to multiply."""
    out = delete_patches(torch.empty(2, 3, 8, 8, device="meta"), torch.randn(2, 4), 0.5, 4)
    assert out.device.type == "meta" and out.shape == (2, 3, 8, 8)


def test_centre_ranking_puts_the_rings_around_the_centre_first():
    ranking = centre_ranking(5, (8, 8), torch.Generator().manual_seed(4))  # (5, 64)
    assert ranking.shape == (5, 64)
    central = {27, 28, 35, 36}  # (3, 3), (3, 4), (4, 3), (4, 4): the four patches around the centre
    next_ring = {19, 20, 26, 29, 34, 37, 43, 44}  # one step out along a row or a column
    for row in ranking:
        order = row.argsort(descending=True).tolist()
        assert set(order[:4]) == central and set(order[4:12]) == next_ring
        assert set(order[12:16]) == {18, 21, 42, 45}  # (2, 2), (2, 5), (5, 2), (5, 5): one step out diagonally
        assert set(order[-4:]) == {0, 7, 56, 63}  # the corners come last
    assert not torch.equal(ranking[0].argsort(), ranking[1].argsort())  # ties broken per image
    odd = centre_ranking(1, (3, 5))[0]  # (15,): an odd grid has one centre patch, (1, 2), and 4 at one step
    assert odd.argmax() == 7 and set(odd.argsort(descending=True)[1:5].tolist()) == {2, 6, 8, 12}


def test_norm_ranking_scores_each_patch_by_its_distance_from_the_mean_colour():
    g = torch.Generator().manual_seed(5)
    inputs = 0.1 * torch.randn(2, 3, 8, 12, generator=g)  # (2, 3, 8, 12): a 2 x 3 grid of 4 x 4 patches
    inputs[0, :, 4:8, 8:12] += 3.0  # image 0's last patch (row 1, column 2) is far from the mean
    inputs[1, 1, 0:4, 4:8] -= 3.0  # image 1's patch 1 (row 0, column 1), in one channel
    ranking = norm_ranking(inputs, 4)  # (2, 6)
    assert ranking.argmax(1).tolist() == [5, 1]
    by_hand = [[inputs[i, :, 4 * r:4 * r + 4, 4 * c:4 * c + 4].norm() for r in range(2) for c in range(3)]
               for i in range(2)]
    torch.testing.assert_close(ranking, torch.tensor(by_hand))
    rankings = baseline_rankings(inputs, 4, torch.Generator().manual_seed(6))
    assert set(rankings) == {"random", "centre", "patch norm"}
    assert all(r.shape == (2, 6) for r in rankings.values()) and torch.equal(rankings["patch norm"], ranking)


def test_rankings_and_deletion_on_a_small_vit():
    torch.manual_seed(0)
    model = ViT(image_size=16, patch_size=4, in_channels=3, num_classes=4, dim=32, depth=2, num_heads=2).eval()
    inputs, labels = torch.randn(10, 3, 16, 16), torch.randint(0, 4, (10,))
    rankings = attention_rankings(model, inputs, batch_size=4)
    assert set(rankings) == {"rollout", "last layer"} and rankings["rollout"].shape == (10, 16)
    weights = layer_attentions(model, inputs)  # the class token's rows: its own rollout row, its last-layer row
    torch.testing.assert_close(rankings["rollout"], attention_rollout(weights)[:, 0, 1:])
    torch.testing.assert_close(rankings["last layer"], weights[-1].mean(1)[:, 0, 1:])
    with torch.no_grad():
        predicted = model(inputs).argmax(-1)
        zeros = model(torch.zeros_like(inputs)).argmax(-1)  # every patch deleted: the prediction on the mean image
    assert deletion_accuracy(model, inputs, predicted, rankings["rollout"], 0.0, 4) == 1.0
    everything = deletion_accuracy(model, inputs, predicted, rankings["rollout"], 1.0, 4)
    assert everything == pytest.approx((zeros == predicted).float().mean().item())
    ranking = random_ranking(10, 16, torch.Generator().manual_seed(1))
    for fraction in (0.25, 0.5):  # the same as deleting by hand, in batches that do not divide the 10 images
        with torch.no_grad():
            by_hand = (model(delete_patches(inputs, ranking, fraction, 4)).argmax(-1) == labels).float().mean().item()
        assert deletion_accuracy(model, inputs, labels, ranking, fraction, 4, batch_size=3) == pytest.approx(by_hand)
    curves = deletion_curves(model, inputs, predicted, {"random": random_ranking(10, 16)}, [0.0, 1.0], 4)
    assert curves["random"][0] == 1.0 and len(curves["random"]) == 2


def test_rankings_of_a_mean_pooled_model_read_the_mean_of_the_patch_rows():
    torch.manual_seed(0)
    model = ViT(image_size=16, patch_size=4, in_channels=3, num_classes=4, dim=32, depth=2, num_heads=2,
                pool="mean", pos_embed="sincos").eval()
    inputs = torch.randn(3, 3, 16, 16)
    weights = layer_attentions(model, inputs)
    rankings = attention_rankings(model, inputs)
    torch.testing.assert_close(rankings["last layer"], weights[-1].mean(1).mean(1))  # (3, 16)
    torch.testing.assert_close(rankings["rollout"], attention_rollout(weights).mean(1))
    model = ViT(image_size=16, patch_size=4, in_channels=3, num_classes=4, dim=32, depth=2, num_heads=2,
                pool="mean", class_token=True).eval()  # a class token the head does not read
    weights = layer_attentions(model, inputs)
    rankings = attention_rankings(model, inputs)
    torch.testing.assert_close(rankings["last layer"], weights[-1].mean(1)[:, 1:, 1:].mean(1))  # (3, 16)
    torch.testing.assert_close(rankings["rollout"], attention_rollout(weights)[:, 1:, 1:].mean(1))
