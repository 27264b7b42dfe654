"""The paper's findings, measured on a paper-style ViT checkpoint as chapter 08 measures them.

For a finished model (model.pt) or a run in progress (checkpoint.pt, written after every epoch): test accuracy on
all 10,000 test images; on the first 512 test images, how often a position's nearest other position (cosine
similarity of the learned table) is a grid neighbour, and the Spearman correlation of similarity with closeness;
every head's mean attention distance (patch tokens only, rows renormalised) as a share of uniform attention's;
the top-8 variance share of the patch-embedding filters against the same network at initialisation (seed 0); and
accuracy with the top quarter of patches by rollout deleted against a random quarter. ``--record`` appends the
result to benchmarks/results/plain_findings.json, so a long run can be followed epoch by epoch.

    python benchmarks/plain_findings.py training/cifar10-plain-mix/checkpoint.pt [--record]
"""

import argparse
import json
from pathlib import Path

import torch
from common import RESULTS, distance_ratios

from vit_course import DATASETS, ViT, normalize
from vit_course.batches import DeviceLoader
from vit_course.checkpoint import read_checkpoint
from vit_course.data import load
from vit_course.embeddings import neighbour_share, position_rank_correlation, top_variance_share
from vit_course.faithfulness import attention_rankings, deletion_accuracy, random_ranking
from vit_course.files import append_run
from vit_course.interpret import pixels_per_token, uniform_attention_distance
from vit_course.train import evaluate


def findings(model, config, first=512):
    """-> dict of the measurements above for ``model`` (eval mode, CPU) built from ``config``."""
    meta = DATASETS["cifar10"]
    images, labels = load("cifar10", "test")
    test = DeviceLoader(images, labels, 500, mean=meta["mean"], std=meta["std"], device="cpu")
    _, accuracy = evaluate(model, test)
    inputs, labels = normalize(images[:first], meta["mean"], meta["std"]), labels[:first]
    grid, P = model.grid_size, model.patch_embed.patch_size
    uniform = uniform_attention_distance(grid, pixels_per_token(model))
    ratios = distance_ratios(model, inputs)  # (L, h)
    torch.manual_seed(0)
    untrained = ViT(**config)
    rankings = attention_rankings(model, inputs)
    patches = grid[0] * grid[1]
    return {
        "test_accuracy": round(accuracy, 4),
        "neighbour_share": round(neighbour_share(model.pos_embed, grid), 4),
        "spearman": round(position_rank_correlation(model.pos_embed, grid), 4),
        "uniform_distance_px": round(uniform, 3),
        "distance_ratio": [[round(r, 3) for r in row] for row in ratios.tolist()],  # layers x heads
        "min_ratio_layers_1_2": round(ratios[:2].min().item(), 3),
        "layer_means_ratio": [round(r, 3) for r in ratios.mean(1).tolist()],
        "filter_share": round(top_variance_share(model.patch_embed.proj.weight, P, 3), 4),
        "filter_share_init": round(top_variance_share(untrained.patch_embed.proj.weight, P, 3), 4),
        "deleted_quarter": {
            "rollout": round(deletion_accuracy(model, inputs, labels, rankings["rollout"], 0.25, P), 4),
            "last layer": round(deletion_accuracy(model, inputs, labels, rankings["last layer"], 0.25, P), 4),
            "random": round(
                deletion_accuracy(
                    model, inputs, labels, random_ranking(first, patches, torch.Generator().manual_seed(0)), 0.25, P
                ),
                4,
            ),
        },
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint", type=Path, help="a model.pt or a run's checkpoint.pt")
    parser.add_argument("--record", action="store_true", help="append to RESULTS/plain_findings.json")
    args = parser.parse_args(argv)
    state = read_checkpoint(args.checkpoint)
    model = ViT(**state["config"])
    model.load_state_dict(state["model"])
    model.eval()
    history = state.get("history", {})
    result = {
        "checkpoint": str(args.checkpoint),
        "recipe": state.get("recipe"),
        "epoch": history["epoch"][-1] if history.get("epoch") else None,
        **findings(model, state["config"]),
    }
    print(json.dumps(result))
    if args.record:
        append_run(RESULTS / "plain_findings.json", result, recipe=result["recipe"])
    return result


if __name__ == "__main__":
    main()
