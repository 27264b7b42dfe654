"""Does a change to the training code slow a recipe down? ``fit``'s pace under an earlier commit against this checkout.

    python benchmarks/pace_against.py b988ac5                      # mnist and cifar10, 3 rounds
    python benchmarks/pace_against.py b988ac5 --recipes cifar10 --rounds 5 --steps 40

The package as it was at REV is unpacked (``git archive``) under another name and imported beside this checkout's, so
both run in one process, on the same data, alternately (REV, then the checkout, ``--rounds`` times), and a change
in the machine's speed hits both alike. Each run is the recipe's own ``fit`` (its model, augmentation, optimiser and
loop) on the first ``--steps`` batches of the real training set, one epoch, then an evaluation of 1,000 test images;
the seconds of the whole call are compared. Prints the images a second of each and their ratio per round.
"""

# ruff: noqa: E402
import argparse
import functools
import importlib
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from io import BytesIO
from pathlib import Path

import common
import torch


def old_package(rev, folder):
    """``vit_course`` at ``rev``, unpacked into ``folder`` as the package ``vit_course_at_rev`` -> that module."""
    archive = subprocess.run(["git", "-C", str(common.ROOT), "archive", rev, "vit_course"], capture_output=True,
                             check=True).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(folder, filter="data")
    (Path(folder) / "vit_course").rename(Path(folder) / "vit_course_at_rev")  # its imports are relative
    sys.path.insert(0, str(folder))
    return importlib.import_module("vit_course_at_rev")


def run_fit(package, name, steps, images, labels, test_images, test_labels):
    """One epoch of ``steps`` batches of recipe ``name`` with ``package``'s fit, loaders and augmentation, then an
    evaluation of the test images: -> seconds of the fit call."""
    recipes, batches = importlib.import_module(package + ".recipes"), importlib.import_module(package + ".batches")
    recipe = recipes.RECIPES[name]
    batch = recipe["train"]["batch_size"]
    meta = importlib.import_module(package + ".data").DATASETS[recipe["dataset"]]
    augment = functools.partial(batches.AUGMENT[recipe["dataset"]], **recipe.get("augment") or {})
    common_args = dict(mean=meta["mean"], std=meta["std"], device="cpu")
    train = batches.DeviceLoader(images[:steps * batch], labels[:steps * batch], batch, shuffle=True, drop_last=True,
                                 augment=augment, **common_args)
    test = batches.DeviceLoader(test_images, test_labels, batch, **common_args)
    settings = {**recipe["train"], "epochs": 1, "test_flips": False}
    settings.pop("batch_size")
    settings = {k: v for k, v in settings.items() if k != "eval_every"}  # a setting only the checkout knows
    torch.manual_seed(0)
    model = importlib.import_module(package + ".vit").ViT(**recipe["model"])
    tick = time.perf_counter()
    importlib.import_module(package + ".loop").fit(model, train, test, device="cpu", progress=False, **settings)
    return time.perf_counter() - tick


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("rev", help="the earlier commit, e.g. b988ac5")
    parser.add_argument("--recipes", nargs="+", default=["mnist", "cifar10"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=30, help="training batches per run")
    args = parser.parse_args(argv)
    from vit_course.data import load

    with tempfile.TemporaryDirectory() as folder:
        old_package(args.rev, folder)
        for name in args.recipes:
            dataset = "mnist" if name == "mnist" else "cifar10"
            images, labels = load(dataset, "train")
            test_images, test_labels = load(dataset, "test")
            data = (images, labels, test_images[:1000], test_labels[:1000])
            batch = importlib.import_module("vit_course.recipes").RECIPES[name]["train"]["batch_size"]
            for package in ("vit_course_at_rev", "vit_course"):  # warm-up: first calls allocate and pick kernels
                run_fit(package, name, 3, *data)
            ratios, paces = [], {"vit_course_at_rev": [], "vit_course": []}
            for _ in range(args.rounds):
                seconds = {p: run_fit(p, name, args.steps, *data) for p in paces}
                for p, s in seconds.items():
                    paces[p].append(args.steps * batch / s)
                ratios.append(seconds["vit_course_at_rev"] / seconds["vit_course"])
            print(f"{name}: {args.rev} {statistics.median(paces['vit_course_at_rev']):.0f} images/s, this checkout "
                  f"{statistics.median(paces['vit_course']):.0f} images/s (fit of {args.steps} batches and 1,000 test "
                  f"images); speed-up per round {', '.join(f'{r:.3f}' for r in ratios)}", flush=True)


if __name__ == "__main__":
    main()
