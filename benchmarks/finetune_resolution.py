"""The ViT paper's resolution recipe on CIFAR-10: pre-train cheaply at 16 px, fine-tune at 32 px, against controls.

The paper (and FixRes before it) pre-trains at a low resolution and fine-tunes at a higher one, resampling the
position table to the larger grid. Here the low resolution carries less detail for real: the 32-px images are
averaged down to 16 px (2x2 blocks), so a 4x4 patch grid of 16 tokens replaces the paper-style ViT's 8x8 grid of 64.
- Pre-train: the network and training settings of ``--recipe`` (default ``cifar10-plain-basic``: its epochs, AdamW,
  warmup-cosine, label smoothing), at 16 px, with crop (padding 2) and flip.
- Fine-tune: the position table resampled to 8x8 (``patches.resample_position_embeddings``), ``--finetune-epochs``
  at 32 px with crop (padding 4) and flip, a tenth of the learning rate, cosine to zero, no warmup.
- Controls: *resampled*, the 16-px model tested at 32 px with resampled positions and no fine-tune;
  *continued_low*, the same fine-tuning seconds spent continuing at 16 px (same optimiser settings); and the
  reference, ``cifar10-plain-basic`` trained at 32 px throughout (its shipped accuracy and seconds).
- ``step_seconds``: a training step at 16 and at 32 px timed alternately in this process, to compare the routes'
  compute on one machine.

Writes benchmarks/results/finetune_resolution.json, a seed at a time (pre-training checkpoints every epoch in
--work and resumes); chapter 09 reads it.

    python benchmarks/finetune_resolution.py --seeds 0 1
    python benchmarks/finetune_resolution.py --smoke --out /tmp/ft.json
"""

import argparse
import copy
import functools
import json
from pathlib import Path

import torch
import torch.nn.functional as F
from common import RESULTS, step_times
from machine import machine

from vit_course import DATASETS, ViT, evaluate, fit, load
from vit_course.batches import DeviceLoader, cifar_augment
from vit_course.checkpoint import pretrained_path, read_checkpoint
from vit_course.files import write_json
from vit_course.patches import resample_position_embeddings
from vit_course.recipes import RECIPES
from vit_course.train import param_groups, train_step

OUT = RESULTS / "finetune_resolution.json"
LOW, HIGH = 16, 32


def downsample(images, size):
    """uint8 images (b, C, H, W) -> uint8 (b, C, size, size), each pixel the mean of the block it replaces."""
    out = F.interpolate(images.float(), size=(size, size), mode="area")
    return out.round().clamp(0, 255).to(torch.uint8)


def at_resolution(model, size):
    """The same ViT for ``size`` x ``size`` images: every weight copied, the position table resampled in 2D."""
    bigger = ViT(**dict(model.config, image_size=size))
    state = dict(model.state_dict())
    state["pos_embed"] = resample_position_embeddings(state["pos_embed"], bigger.grid_size, model.num_prefix_tokens)
    bigger.load_state_dict(state)
    return bigger


def loader(images, labels, batch, train=False, seed=0):
    meta = DATASETS["cifar10"]
    padding = images.shape[-1] // 8  # 4 at 32 px, 2 at 16 px: the same share of the image
    augment = functools.partial(cifar_augment, padding=padding) if train else None
    return DeviceLoader(images, labels, batch, shuffle=train, drop_last=train, augment=augment, seed=seed,
                        mean=meta["mean"], std=meta["std"], device="cpu")


def step_seconds(name, rounds=10):
    """{"16": s, "32": s}: median seconds of one training step of the paper-style ViT (its batch) at each
    resolution, the two timed alternately so that the machine's changes hit both."""
    batch, steps = RECIPES[name]["train"]["batch_size"], {}
    for size in (LOW, HIGH):
        torch.manual_seed(0)
        model = ViT(**dict(RECIPES[name]["model"], image_size=size)).train()
        optimizer = torch.optim.AdamW(param_groups(model, 0.05), lr=1e-3)
        x, y = torch.randn(batch, 3, size, size), torch.randint(0, 10, (batch,))
        steps[size] = functools.partial(train_step, model, x, y, optimizer)
    return {str(size): round(seconds, 4) for size, seconds in step_times(steps, rounds).items()}


def one_seed(name, seed, data, epochs, finetune_epochs, work):
    """Pre-train at 16 px (resumable), then the fine-tune and its controls; -> the seed's result row."""
    (low_train, low_test), (high_train, high_test) = data
    recipe = RECIPES[name]
    settings = {k: v for k, v in recipe["train"].items() if k != "batch_size"}
    torch.manual_seed(seed)
    model = ViT(**dict(recipe["model"], image_size=LOW))
    probe = [next(iter(low_test))]  # fit evaluates every epoch: one batch, the whole test set once at the end
    history = fit(model, low_train, probe, device="cpu", checkpoint=work / f"pretrain-seed{seed}.pt", resume=True,
                  progress=False, **dict(settings, epochs=epochs, seed=seed))
    accuracy, seconds = {"low": evaluate(model, low_test)[1]}, {"pretrain": history["seconds"][-1]}
    bigger = at_resolution(model, HIGH)
    accuracy["resampled"] = evaluate(bigger, high_test)[1]
    tune = dict(settings, lr=0.1 * settings["lr"], min_lr=0.0, warmup_epochs=0, seed=seed)
    history = fit(bigger, high_train, [next(iter(high_test))], device="cpu", progress=False,
                  **dict(tune, epochs=finetune_epochs))
    accuracy["finetuned"], seconds["finetune"] = evaluate(bigger, high_test)[1], history["seconds"][-1]
    continued = copy.deepcopy(model)  # the 16-px model, given the fine-tune's seconds at 16 px
    history = fit(continued, low_train, probe, device="cpu", progress=False,
                  **dict(tune, epochs=None, time_budget=seconds["finetune"]))
    accuracy["continued_low"], seconds["continued_low"] = evaluate(continued, low_test)[1], history["seconds"][-1]
    return {"seed": seed, "pretrain_epochs": epochs, "finetune_epochs": finetune_epochs,
            "continued_low_epochs": history["epoch"][-1], "accuracy": {k: round(v, 4) for k, v in accuracy.items()},
            "seconds": {k: round(v, 1) for k, v in seconds.items()}}


def reference(name):
    """Recipe ``name`` trained at 32 px throughout, as shipped: its accuracy, seconds, epochs and machine."""
    metrics = read_checkpoint(pretrained_path(name))["metrics"]
    return {"name": name, "accuracy": round(metrics["test_accuracy"], 4),
            "seconds": round(metrics["train_seconds"], 1), "epochs": metrics["epochs"],
            "machine": metrics.get("machine")}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--recipe", default="cifar10-plain-basic", help="the network, settings and shipped reference")
    parser.add_argument("--epochs", type=int, help="pre-training epochs at 16 px (default: the recipe's)")
    parser.add_argument("--finetune-epochs", type=int, default=5)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--work", type=Path, default=Path("runs/finetune_resolution"))
    parser.add_argument("--smoke", action="store_true", help="seconds, on a sliver of the data, for the tests")
    args = parser.parse_args(argv)
    recipe = RECIPES.get(args.recipe, {"mix": None})
    if "mix" in recipe or recipe["model"].get("stem_channels"):
        raise ValueError(f"--recipe {args.recipe!r}: needs a plain ViT recipe without CutMix/Mixup, "
                         f"e.g. cifar10-plain-basic")
    args.epochs = args.epochs or RECIPES[args.recipe]["train"]["epochs"]
    images, labels = load("cifar10", "train")
    test_images, test_labels = load("cifar10", "test")
    if args.smoke:
        images, labels, test_images, test_labels = images[:256], labels[:256], test_images[:128], test_labels[:128]
        args.epochs, args.finetune_epochs = 2, 1
    stored = json.loads(args.out.read_text()) if args.out.exists() else {}
    header = {"recipe": args.recipe, "low_resolution": LOW, "resolution": HIGH, "pretrain_epochs": args.epochs,
              "finetune_epochs": args.finetune_epochs}
    if stored and any(stored.get(k) != v for k, v in header.items()):
        raise ValueError(f"{args.out} holds runs of other settings: { {k: stored.get(k) for k in header} }; "
                         "pass another --out")
    runs = stored.get("runs", [])
    for seed in args.seeds:
        if any(run["seed"] == seed for run in runs):
            continue
        data = [(loader(downsample(images, size) if size == LOW else images, labels, 128, train=True, seed=seed),
                 loader(downsample(test_images, size) if size == LOW else test_images, test_labels, 500))
                for size in (LOW, HIGH)]
        runs.append(one_seed(args.recipe, seed, data, args.epochs, args.finetune_epochs, args.work))
        write_json(args.out, {**header, "seeds": sorted(run["seed"] for run in runs), "runs": runs,
                              "reference": reference(args.recipe),
                              "step_seconds": step_seconds(args.recipe), "machine": machine()})
        print(json.dumps(runs[-1]), flush=True)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
