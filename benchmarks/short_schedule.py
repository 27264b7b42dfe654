"""Two tricks for short runs, measured on a recipe at a fixed number of epochs: weight EMA and progressive
resolution (cifar10 only: the first epochs on 16 x 16 images, the rest at 32 x 32).

The loop is ``fit``'s (AdamW, the recipe's warmup-cosine per step, label smoothing, its augmentation) written
out, because ``fit`` has neither trick. It keeps exponential moving averages of the weights (and BatchNorm
statistics) at each --ema decay and tests them at the end beside the model itself. With --low L the first L
epochs see each batch average-pooled to 16 x 16 px: the stem then leaves a grid of tokens half as wide, whose
sin-cos positions are taken at the centres of the image regions they cover (so position (0, 0) of the low grid
sits between positions (0, 0) and (1, 1) of the full one). With the two-stage stem (32, 128) of the stored runs
(grids of 4 x 4 and 8 x 8), a 16 px step cost about a third of a 32 px one, so ``--low 10 --high 7`` took about
as long as ``--high 10``; the seconds of each phase are recorded to check.
Fixed epochs make the accuracy independent of the machine's speed; the seconds are not. It trains in float32
whatever the recipe's ``amp`` (the record says ``precision``), as the slowest machine, with no native bfloat16, does.

    python benchmarks/short_schedule.py --high 10 --ema 0.998 0.9995 --record
    python benchmarks/short_schedule.py --low 10 --high 7 --ema 0.998 0.9995 --record
    python benchmarks/short_schedule.py --recipe mnist --high 2 --ema 0.99 0.998 --record
"""

import argparse
import copy
import functools
import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from common import RESULTS
from machine import machine

from vit_course import ViT
from vit_course.batches import AUGMENT, loaders
from vit_course.files import append_run
from vit_course.patches import patchify, sincos_position_embedding
from vit_course.recipes import RECIPES
from vit_course.train import evaluate, param_groups, warmup_cosine
from vit_course.vit import pool_tokens


def low_res_forward(model, images, factor):
    """The hybrid ``model`` on images average-pooled by ``factor``: (b, C, H, W) -> logits (b, classes)."""
    small = F.avg_pool2d(images, factor)  # (b, C, H/f, W/f)
    grid = model.grid_size[0] // factor
    tokens = model.patch_embed.proj(patchify(model.stem(small), 1))  # (b, grid*grid, D)
    # each token at the centre of the full grid's cells it covers, in the full grid's units
    table = sincos_position_embedding(grid, tokens.shape[-1], start=(factor - 1) / 2, step=factor)  # (grid*grid, D)
    tokens = tokens + table.to(tokens)
    for block in model.blocks:
        tokens = block(tokens)
    return model.head(pool_tokens(model.norm(tokens), "mean", 0))


def scores(model, test_loader):
    """``evaluate`` as a dict: -> {"test_loss": ..., "test_accuracy": ...}."""
    loss, accuracy = evaluate(model, test_loader)
    return {"test_loss": loss, "test_accuracy": accuracy}


def train(low, high, decays, seed=0, subset=None, factor=2, name="cifar10"):
    """Train recipe ``name``'s model for ``low`` epochs at 1/factor resolution then ``high`` at full resolution;
    -> dict of the test loss and accuracy (of the model, and of each EMA) and each phase's seconds."""
    recipe = RECIPES[name]
    settings = recipe["train"]
    torch.manual_seed(seed)
    model = ViT(**recipe["model"])
    if low and model.grid_size[0] % factor:
        raise ValueError(f"{name}'s grid of {model.grid_size[0]} tokens a side cannot be pooled by {factor}: no --low")
    augment = functools.partial(AUGMENT[recipe["dataset"]], **recipe["augment"])
    # validation=0: the whole training set, as the recorded runs trained (their numbers are on the test set)
    train_loader, _, test_loader = loaders(recipe["dataset"], settings["batch_size"], seed=seed, augment=augment,
                                           validation=0)
    if subset is not None:
        for loader in (train_loader, test_loader):
            loader.images, loader.labels = loader.images[:subset], loader.labels[:subset]
    optimizer = torch.optim.AdamW(param_groups(model, settings["weight_decay"]), lr=settings["lr"])
    per_epoch = len(train_loader)
    low_steps, total = round(low * per_epoch), round((low + high) * per_epoch)
    warmup = round(settings["warmup_epochs"] * per_epoch)
    live = model.state_dict()  # references to the tensors that the optimizer and BatchNorm update in place
    averages = {decay: {k: v.detach().clone() for k, v in live.items() if v.is_floating_point()} for decay in decays}
    step, seconds = 0, [0.0, 0.0]
    while step < total:
        for x, y in train_loader:
            tick = time.perf_counter()
            for group in optimizer.param_groups:
                group["lr"] = warmup_cosine(step, total, warmup, settings["lr"], settings["min_lr"])
            model.train()
            logits = low_res_forward(model, x, factor) if step < low_steps else model(x)  # (b, classes)
            loss = F.cross_entropy(logits, y, label_smoothing=settings["label_smoothing"])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            with torch.no_grad():
                for decay, average in averages.items():
                    for key, value in average.items():
                        value.mul_(decay).add_(live[key], alpha=1 - decay)
            seconds[step >= low_steps] += time.perf_counter() - tick
            step += 1
            if step == total:
                break
    result = {"recipe": name, "low_epochs": low, "high_epochs": high, "seed": seed, "steps": step, "precision": "fp32",
              "low_size": recipe["model"]["image_size"] // factor if low else None,
              "low_seconds": round(seconds[0], 3), "high_seconds": round(seconds[1], 3),
              "settings": {section: recipe[section] for section in ("model", "train", "augment")},
              **scores(model, test_loader), "ema": {}}
    for decay, average in averages.items():  # {decay: {"test_loss": ..., "test_accuracy": ...}}
        averaged = copy.deepcopy(model)
        averaged.load_state_dict({**averaged.state_dict(), **average})
        result["ema"][str(decay)] = scores(averaged, test_loader)
    return result


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default="cifar10", choices=["cifar10", "mnist"])
    parser.add_argument("--low", type=float, default=0.0, help="epochs at 16 x 16 px first")
    parser.add_argument("--high", type=float, default=10.0, help="then epochs at 32 x 32 px")
    parser.add_argument("--ema", type=float, nargs="*", default=[], help="EMA decays to test at the end")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--subset", type=int, default=None, help="only the first images (for quick tests)")
    parser.add_argument("--record", action="store_true", help="append to RESULTS/short_schedule_RECIPE.json")
    parser.add_argument("--results", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.low < 0 or args.high <= 0 or any(not 0 <= d < 1 for d in args.ema):
        parser.error(f"need --low >= 0, --high > 0 and decays in [0, 1): got {args.low}, {args.high}, {args.ema}")
    run = {**train(args.low, args.high, args.ema, args.seed, args.subset, name=args.recipe),
           "threads": torch.get_num_threads(), "machine": machine()}
    print(json.dumps(run), flush=True)
    if args.record:
        path = args.results / f"short_schedule_{args.recipe}.json"
        append_run(path, run, recipe=args.recipe)
    return run


if __name__ == "__main__":
    main()
