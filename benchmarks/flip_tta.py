"""Test-time flips, measured: a trained CIFAR-10 model's test accuracy on the images as they are, and with each
image's class probabilities averaged with those of its mirror image (one more forward pass per test image).

The cifar10 recipe trains on flipped images, so a mirrored test image is a view the model knows, and two views
disagree where the model is unsure. This measured the gain on checkpoints that ``python -m vit_course train`` or
``benchmarks/ablate.py`` wrote, before the cifar10 recipe's final evaluation took it up (``test_flips``, through the
same ``vit_course.train.evaluate_flips``). It adds nothing to training time; the final evaluation costs three
times as much (the images as they are, then both views: a few seconds on a 2-core CPU).

    python benchmarks/flip_tta.py vit_course/checkpoints/cifar10/model.pt runs/ablate/cifar10-10ep/model.pt --record
"""

import argparse
import json
from pathlib import Path

import torch
from common import RESULTS
from machine import machine

from vit_course.batches import loaders
from vit_course.checkpoint import load_checkpoint
from vit_course.files import append_run
from vit_course.train import evaluate_flips


def measure(path, subset=None):
    """One checkpoint: -> dict of its path, recipe, epochs and both accuracies."""
    model, checkpoint = load_checkpoint(path)
    recipe = checkpoint.get("recipe")
    if checkpoint["config"].get("in_channels") != 3 or checkpoint["config"].get("num_classes") != 10:
        raise ValueError(f"{path} is not a CIFAR-10 model (config {checkpoint['config']}); a mirrored digit is "
                         "another symbol, so flips are for CIFAR-10 only")
    *_, test = loaders("cifar10", 256, augment=False)
    if subset is not None:
        test.images, test.labels = test.images[:subset], test.labels[:subset]
    _, plain, flipped = evaluate_flips(model, test)
    return {"checkpoint": str(path), "recipe": recipe, "epochs": checkpoint["metrics"].get("epochs"),
            "seed": checkpoint["metrics"].get("seed"), "test_accuracy": plain, "flip_accuracy": flipped,
            "gain": round(flipped - plain, 6)}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoints", nargs="+", type=Path)
    parser.add_argument("--subset", type=int, default=None, help="only the first test images (for quick tests)")
    parser.add_argument("--record", action="store_true", help="append each to RESULTS/flip_tta.json")
    parser.add_argument("--results", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    runs = []
    for path in args.checkpoints:
        run = {**measure(path, args.subset), "threads": torch.get_num_threads(), "machine": machine()}
        print(json.dumps(run), flush=True)
        if args.record:
            append_run(args.results / "flip_tta.json", run, recipe="cifar10")
        runs.append(run)
    return runs


if __name__ == "__main__":
    main()
