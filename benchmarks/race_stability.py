"""Do chapter 07's one-minute trainings stay finite on a GPU, and at which learning rate?

    python benchmarks/race_stability.py --lr 2e-3 1e-3 --seeds 0 1 2 3         # on a machine with a CUDA GPU
    python benchmarks/race_stability.py --models mean --amp bf16 off --seconds 60

Each run is one of chapter 07's trainings as its cells 30 and 47 make it (the race's settings: AdamW, warmup 0.1
epoch, label smoothing 0.1, crop and flip, ``epochs=None`` under a time budget, accuracy on 2,000 validation
images), with the model, learning rate, precision and seed of the command line. The runs go in parallel, one
process each (``--parallel``), so a grid of them takes about ``--seconds`` per wave. Prints one line per run: the
epochs and accuracy it reached, or the step where its loss stopped being finite. Records nothing: the GPU check
(``gpu_check.py``) is what the results page shows; this script is how its chapter 07 failure was looked into.
"""

# ruff: noqa: E402 (common puts this checkout on the path first)
import argparse
import concurrent.futures
import itertools
import json
import subprocess
import sys

import common

MODELS = ("plain", "hybrid", "cnn", "mean")  # the race's three contenders, and section 8's mean-pooled twin


def one_run(model_name, lr, amp, seed, seconds):
    """Train one of chapter 07's models as the chapter does -> a dict of what it reached, or where it diverged."""
    import torch

    from vit_course import DATASETS, DeviceLoader, ViT, load, pick_device, split_validation
    from vit_course.baselines import small_cnn
    from vit_course.batches import random_crop_flip
    from vit_course.loop import fit
    from vit_course.recipes import RECIPES

    device = pick_device()
    plain = RECIPES["cifar10-plain-basic"]["model"]
    make = {"plain": lambda: ViT(**plain), "hybrid": lambda: ViT(**RECIPES["cifar10"]["model"]), "cnn": small_cnn,
            "mean": lambda: ViT(**dict(plain, pool="mean", class_token=False))}[model_name]
    (train_images, train_labels), (val_images, val_labels) = split_validation(*load("cifar10", split="train"), 5000)
    mean, std = DATASETS["cifar10"]["mean"], DATASETS["cifar10"]["std"]
    train = DeviceLoader(train_images, train_labels, 128, shuffle=True, drop_last=True, mean=mean, std=std,
                         augment=lambda batch, g: random_crop_flip(batch, 4, True, g), device=device, seed=seed)
    val = DeviceLoader(val_images[:2000], val_labels[:2000], 256, mean=mean, std=std, device=device)
    torch.manual_seed(seed)
    run = {"model": model_name, "lr": lr, "amp": amp, "seed": seed, "device": device.type}
    try:
        history = fit(make(), train, val, epochs=None, lr=lr, weight_decay=0.05, warmup_epochs=0.1,
                      label_smoothing=0.1, amp=amp, time_budget=seconds, seed=seed, device=device, progress=False)
    except FloatingPointError as error:  # fit stops at the first loss that is not finite
        return run | {"diverged": str(error)}
    return run | {"epochs": round(history["epoch"][-1], 2), "accuracy": history["val_acc"][-1]}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", choices=MODELS, default=["mean"])
    parser.add_argument("--lr", nargs="+", type=float, default=[2e-3, 1e-3])
    parser.add_argument("--amp", nargs="+", choices=["auto", "bf16", "fp16", "off"], default=["auto"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3])
    parser.add_argument("--seconds", type=float, default=60, help="each run's time budget (chapter 07: 60 on a GPU)")
    parser.add_argument("--parallel", type=int, default=8, help="runs at once, one process each")
    parser.add_argument("--one", nargs=4, metavar=("MODEL", "LR", "AMP", "SEED"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:  # a child process: one run, its result as a JSON line
        model_name, lr, amp, seed = args.one
        print(json.dumps(one_run(model_name, float(lr), amp, int(seed), args.seconds)), flush=True)
        return 0
    grid = list(itertools.product(args.models, args.lr, args.amp, args.seeds))

    def child(point):
        command = [sys.executable, __file__, "--seconds", str(args.seconds), "--one", *map(str, point)]
        done = subprocess.run(command, capture_output=True, text=True, cwd=common.ROOT)
        lines = done.stdout.strip().splitlines()
        return json.loads(lines[-1]) if done.returncode == 0 and lines else {"error": done.stderr.strip()[-500:]}

    print(f"{len(grid)} runs of {args.seconds:g} s, {args.parallel} at a time", flush=True)
    with concurrent.futures.ThreadPoolExecutor(args.parallel) as pool:
        for point, run in zip(grid, pool.map(child, grid), strict=True):
            shown = " ".join(f"{k} {v}" for k, v in zip(("model", "lr", "amp", "seed"), point, strict=True))
            result = run.get("diverged") or run.get("error") or f"{run['epochs']} epochs, {run['accuracy']:.1%}"
            print(f"{shown} ({run.get('device', '?')}): {result}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
