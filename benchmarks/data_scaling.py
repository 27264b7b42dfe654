"""The ViT paper's data claim in miniature: the plain ViT and the small CNN on growing shares of CIFAR-10.

Each model is trained on 10%, 25%, 50% and 100% of the training set (nested fixed subsets: the first images
of one fixed shuffle), for the same number of optimizer steps whatever the share, so a small set is seen
many times; both get the same augmentation (crop with padding 4, flip) and the same AdamW schedule, and are
tested on the full test set. The ViT is the ``cifar10-plain`` recipe's model, the CNN ``baselines.small_cnn``.
Writes benchmarks/results/data_scaling.json (accuracies in the order of ``fractions``, averaged over seeds, and
per seed). Chapter 07 draws it. One run at a time: the script owns the machine while it runs.

    python benchmarks/data_scaling.py                 # 5 epochs' worth of steps of the full set, seed 0
    python benchmarks/data_scaling.py --seeds 0 1
    python benchmarks/data_scaling.py --smoke --out /tmp/scaling.json   # seconds, on a sliver of the data
"""

import argparse
import functools
import json
import statistics
import time
from pathlib import Path

import torch
from common import RESULTS

from vit_course import DATASETS, ViT, evaluate, fit, load
from vit_course.baselines import small_cnn
from vit_course.batches import DeviceLoader, cifar_augment
from vit_course.device import machine
from vit_course.files import write_json
from vit_course.recipes import RECIPES

OUT = RESULTS / "data_scaling.json"
FRACTIONS = (0.1, 0.25, 0.5, 1.0)
BATCH = 128
MODELS = {"vit": lambda: ViT(**RECIPES["cifar10-plain"]["model"]), "cnn": small_cnn}


def train_once(make, images, labels, test, steps, seed):
    """Train a fresh model on (images, labels) for about ``steps`` steps; -> (test accuracy, steps, seconds)."""
    meta = DATASETS["cifar10"]
    train = DeviceLoader(images, labels, BATCH, shuffle=True, drop_last=True, seed=seed, mean=meta["mean"],
                         std=meta["std"], device="cpu", augment=functools.partial(cifar_augment, padding=4))
    epochs = max(1, round(steps / len(train)))  # the whole epochs closest to the step count
    torch.manual_seed(seed)
    model, started = make(), time.perf_counter()
    settings = dict(RECIPES["cifar10-plain"]["train"], epochs=epochs)
    settings.pop("batch_size")
    settings["warmup_epochs"] = epochs * settings["warmup_epochs"] / RECIPES["cifar10-plain"]["train"]["epochs"]
    probe = [next(iter(test))]  # fit evaluates every epoch: one batch there, the full test set once at the end
    fit(model, train, probe, device="cpu", seed=seed, progress=False, **settings)
    accuracy = evaluate(model, test)[1]
    return accuracy, epochs * len(train), time.perf_counter() - started


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5 * (50_000 // BATCH), help="optimizer steps of every run")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--smoke", action="store_true", help="a few steps on 2,560 images, for the tests")
    args = parser.parse_args(argv)
    images, labels = load("cifar10", "train")
    test_images, test_labels = load("cifar10", "test")
    if args.smoke:
        images, labels, test_images, test_labels = images[:2560], labels[:2560], test_images[:256], test_labels[:256]
        args.steps = 2
    meta = DATASETS["cifar10"]
    test = DeviceLoader(test_images, test_labels, 256, mean=meta["mean"], std=meta["std"], device="cpu")
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(0))  # one shuffle: nested subsets
    per_seed = {name: {} for name in MODELS}
    runs = []
    for seed in args.seeds:
        for name, make in MODELS.items():
            accuracies = []
            for fraction in FRACTIONS:
                subset = order[:round(fraction * len(labels))]
                accuracy, steps, seconds = train_once(make, images[subset], labels[subset], test, args.steps, seed)
                accuracies.append(round(accuracy, 4))
                runs.append({"model": name, "seed": seed, "fraction": fraction, "images": len(subset),
                             "steps": steps, "test_accuracy": round(accuracy, 4), "seconds": round(seconds, 1)})
                print(json.dumps(runs[-1]), flush=True)
            per_seed[name][str(seed)] = accuracies
    result = {"fractions": list(FRACTIONS), "steps": args.steps, "seeds": args.seeds, "runs": runs,
              "machine": machine(), "models": {}}
    for name, make in MODELS.items():
        by_fraction = zip(*per_seed[name].values(), strict=True)
        result["models"][name] = {"params": sum(p.numel() for p in make().parameters()),
                                  "test_accuracy": [round(statistics.mean(a), 4) for a in by_fraction],
                                  "per_seed": per_seed[name]}
    write_json(args.out, result)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
