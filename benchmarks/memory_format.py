"""Training-step speed of a recipe's hybrid ViT with its conv stem in channels-last (NHWC) or NCHW memory.

vit_course's ConvStem keeps its weights and activations channels-last; the NCHW variant undoes that. Both
are timed alternately in one process so machine noise hits them alike. Prints per-variant median time per
image over rounds and the ratio.

    python benchmarks/memory_format.py [cifar10|mnist] [--rounds 6] [--steps 3] [--threads N]
"""

import argparse
import statistics
import time

import common  # noqa: F401 (this checkout's vit_course)
import torch

from vit_course import ViT
from vit_course.recipes import RECIPES
from vit_course.train import param_groups, train_step


def variant(config, batch_size, channels_last):
    torch.manual_seed(0)
    model = ViT(**config).train()
    if not channels_last:  # undo the stem's layout: NCHW weights, NCHW activations
        stem = model.stem
        stem.to(memory_format=torch.contiguous_format)
        stem.forward = lambda images: stem.layers(images.contiguous())
    optimizer = torch.optim.AdamW(param_groups(model, 0.05), lr=1e-3)
    size, channels = config["image_size"], config["in_channels"]
    x, y = torch.randn(batch_size, channels, size, size), torch.randint(0, config["num_classes"], (batch_size,))
    return model, optimizer, x, y


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recipe", nargs="?", default="cifar10", choices=["cifar10", "mnist"])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    recipe = RECIPES[args.recipe]
    batch_size = recipe["train"]["batch_size"]
    layouts = [("NCHW", False), ("channels-last", True)]
    variants = {name: variant(recipe["model"], batch_size, cl) for name, cl in layouts}
    times = {name: [] for name in variants}
    for _ in range(args.rounds):
        for name, (model, optimizer, x, y) in variants.items():
            train_step(model, x, y, optimizer)  # warm-up: the first step of a round pays for allocations
            start = time.perf_counter()
            for _ in range(args.steps):
                train_step(model, x, y, optimizer)
            times[name].append((time.perf_counter() - start) / args.steps / batch_size * 1e6)
    print(f"{args.recipe} recipe, batch {batch_size}, {torch.get_num_threads()} threads, {args.rounds} rounds")
    for name, ts in times.items():
        print(f"  {name:14s} median {statistics.median(ts):6.0f} us/image  (range {min(ts):.0f}-{max(ts):.0f})")
    ratios = [a / b for a, b in zip(times["NCHW"], times["channels-last"], strict=True)]
    print(f"  NCHW / channels-last per round: median {statistics.median(ratios):.2f}x "
          f"(range {min(ratios):.2f}-{max(ratios):.2f})")


if __name__ == "__main__":
    main()
