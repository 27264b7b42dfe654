"""Training recipes (chapters 06-07) and the command behind ``python -m vit_course train NAME``.

A recipe is a model config (``ViT`` keyword arguments) plus training settings, with a one-line reason. How
each was chosen and what it reaches: ``benchmarks/`` (the commands) and ``benchmarks/results/`` (their
numbers); a shipped run's own numbers are in ``vit_course/checkpoints/NAME/metrics.json``.
"""

import functools
import inspect
import json
import os
import platform
import time
from pathlib import Path

import torch

from .augment import mix_batch
from .batches import AUGMENT, loaders
from .checkpoint import read_checkpoint, save_checkpoint
from .device import ThreadWatch, machine, pick_device, pick_threads
from .files import write_json
from .loop import fit
from .precision import resolve_amp
from .vit import ViT

# epochs=None: the run trains until its time budget is used, its cosine re-planned from the measured pace so it
# ends decayed (loop.fit), so a faster machine trains longer instead of stopping at a cap; --epochs N fixes them.
RECIPES = {
    # A hybrid ViT (the paper's section 3.1): a conv stem turns the digit into a 4x4 map of tokens (28 -> 14 -> 7 ->
    # 4), which learns the strokes in the few epochs five minutes allow. With 120 s on the AMD EPYC (about the epochs
    # the slowest 2-core machine fits in its budget) the two-stage stem (32, 64), 49 tokens, fitted 1.77 epochs and
    # ended at 99.04%; three stages (16, 32, 64) fitted 3.9-5.2 epochs and ended at 99.32%, 99.45%, 99.37% (seeds
    # 0-2), level with (32, 64, 96) (99.42/99.36/99.29%, 2.6-3.0 epochs): the cheaper stem is kept, as it fits more
    # epochs on a slower machine. A training step costs a third of the two-stage one's (37 against 118 ms,
    # benchmarks/stem_speed.py). Shifts of 1 pixel: 2 pixels ended 0.1 below (99.32% against 99.42%, stem (32, 64,
    # 96)). With the two-stage stem at a fixed 2 epochs, lr 4e-3 or 6e-3, batch 64, no shifts, warmup 0.2 and their
    # combinations ended at 98.93-99.18% against the recipe's 99.03%, and the strided stem fitted 2.01 epochs in 120 s
    # against 1.77 but ended at 98.62% (benchmarks/results/ablate_mnist.json): none adopted.
    "mnist": {
        "dataset": "mnist",
        "model": dict(image_size=28, patch_size=1, in_channels=1, num_classes=10, dim=96, depth=2, num_heads=6,
                      mlp_ratio=2.0, pool="mean", pos_embed="sincos", stem_channels=(16, 32, 64)),
        "train": dict(epochs=None, batch_size=128, lr=2e-3, weight_decay=0.05, warmup_epochs=0.5,
                      label_smoothing=0.1, min_lr=1e-5),
        "augment": dict(max_shift=1),  # keywords for batches.mnist_augment
        "time_budget": 285,  # seconds for the whole command, start-up included (target: 300)
        "reserve": 6,  # seconds kept for writing the results
    },
    # The same hybrid idea for CIFAR-10 (Compact Transformers, Hassani et al. 2021): the conv stem gives the
    # locality a plain ViT needs 100+ epochs to learn. Flips only: half an hour is too short for crops to pay.
    # amp="native": bf16 autocast on a CPU with bf16 instructions where a timed step says it is faster
    # (precision.bf16_pays): 1.23x on an AMD EPYC, so more epochs fit; 0.54x on an Intel Xeon without AMX, which
    # trains in float32. The MNIST model is too narrow for bf16 kernels to pay (0.67x and 0.43x: slower). All from
    # benchmarks/train_throughput.py --bf16 --record; three seeds each way on the AMD, with the earlier stem (64, 128),
    # in benchmarks/results/targets_cifar10-stem64-*.json.
    # Stem (32, 64, 128): three stages make a 4x4 map, 16 tokens, where two stages made an 8x8 map of 64. The
    # transformer's steps cost a quarter as much, a step about half (50 against 112 ms, benchmarks/stem_speed.py). In
    # float32 with the budget scaled to the slower AVX2 machine's pace (840 s on the AMD EPYC) it fitted 17.35 epochs
    # and reached 82.11% (80.79% one view) where stem (32, 128) fitted 9.08 and reached 77.82% (one view), and (64,
    # 128) 6.74 epochs, 75.83% (benchmarks/results/ablate_cifar10.json). Fewer, coarser tokens: the paper's hybrids
    # also feed the transformer a CNN's late, small feature map.
    # Chosen with the two-stage stem: batch 64 at lr 1.5e-3, not 128 at 2e-3: the model underfits in so few
    # epochs, and twice the updates per epoch helped at the slower machine's pace (800 s on an Intel Xeon,
    # float32: 78.90% against 77.66%, 9.6 epochs against 9.0). Max-pooling, not stride-2 convs (stem_pool): those
    # fitted 12.5 epochs and ended level (77.63%). At a fixed 10 epochs (float32) batch 32 at lr 1e-3, weight
    # decay 0.01, no label smoothing and lr 2.5e-3 all ended within 0.7 points of the recipe's 79.26%
    # (78.61-79.58%, one seed each): short of epochs, not settings.
    # test_flips: the final evaluation averages each test image's class probabilities with its mirror image's (one
    # more pass over the test set, inside the budget). On trained checkpoints it added 0.48 to 0.67 points at 10,
    # 19 and 21 epochs (benchmarks/results/flip_tta.json); metrics.json keeps the one-view accuracy beside it.
    "cifar10": {
        "dataset": "cifar10",
        "model": dict(image_size=32, patch_size=1, in_channels=3, num_classes=10, dim=128, depth=2, num_heads=4,
                      mlp_ratio=2.0, pool="mean", pos_embed="sincos", stem_channels=(32, 64, 128)),
        "train": dict(epochs=None, batch_size=64, lr=1.5e-3, weight_decay=0.05, warmup_epochs=0.5,
                      label_smoothing=0.1, min_lr=1e-5, amp="native", test_flips=True),
        "augment": dict(padding=0),  # keywords for batches.cifar_augment: no crop, flips only
        "time_budget": 1775,
        "reserve": 10,
    },
    # The paper's own architecture, no conv stem: 4x4 patches (an 8x8 grid), a class token, a learned position
    # table, 6 pre-norm blocks. It must learn locality from data, so it trains for a fixed number of epochs (a
    # long run, resumable with --resume) whose weights chapter 08 inspects. Width 128: a step at width 192 costs
    # about 1.6 times as much (benchmarks/plain_recipe.py --speed), and a plain ViT short of epochs gains more
    # from epochs than from width. The standard crop and flip: over 64 epochs the model sees each image many times.
    "cifar10-plain": {
        "dataset": "cifar10",
        "model": dict(image_size=32, patch_size=4, in_channels=3, num_classes=10, dim=128, depth=6, num_heads=4,
                      mlp_ratio=2.0, pool="cls", pos_embed="learned"),
        "train": dict(epochs=64, batch_size=128, lr=2e-3, weight_decay=0.05, warmup_epochs=5,
                      label_smoothing=0.1, min_lr=1e-5),
        "augment": dict(padding=4),
        "time_budget": None,
        "reserve": 0,
    },
    # The paper's architecture trained the way small-data ViTs are trained (DeiT; Lee et al. 2021; Hassani et al.
    # 2021): RandAugment, CutMix or Mixup on every batch (labels mixed alike), stochastic depth, a long schedule.
    # The same network as cifar10-plain, whose test loss rose after about epoch 45 of 64 without them.
    "cifar10-plain-mix": {
        "dataset": "cifar10",
        "model": dict(image_size=32, patch_size=4, in_channels=3, num_classes=10, dim=128, depth=6, num_heads=4,
                      mlp_ratio=2.0, pool="cls", pos_embed="learned", drop_path=0.1),
        "train": dict(epochs=150, batch_size=128, lr=2e-3, weight_decay=0.05, warmup_epochs=5,
                      label_smoothing=0.1, min_lr=1e-5),
        "augment": dict(padding=4, rand_ops=2, magnitude=9, rand_prob=0.5),
        "mix": dict(cutmix=1.0, mixup=0.8, switch=0.5),  # keywords for augment.mix_batch
        "time_budget": None,
        "reserve": 0,
    },
    # For a GPU such as Colab's T4, sized from FLOP counts (0.70 GFLOP per image and step, ~10 s per epoch
    # expected there); it cannot run here, so no accuracy is claimed for it.
    "cifar10-gpu": {
        "dataset": "cifar10",
        "model": dict(image_size=32, patch_size=2, in_channels=3, num_classes=10, dim=192, depth=6, num_heads=6,
                      mlp_ratio=2.0, pool="mean", pos_embed="sincos", stem_channels=(64,), drop_path=0.1),
        "train": dict(epochs=100, batch_size=256, lr=1e-3, weight_decay=0.05, warmup_epochs=5,
                      label_smoothing=0.1, min_lr=1e-5),
        "time_budget": None,
        "reserve": 0,
    },
}


def train_recipe(name, *, epochs=None, out=None, device=None, seed=0, time_budget=None, subset=None,
                 progress=True, started=None, threads=None, resume=False):
    """Train recipe ``name`` and write OUT/model.pt, OUT/metrics.json, OUT/curves.png; -> metrics dict.

    time_budget: seconds for the whole command (default: the recipe's; 0: none); the training gets what is
        left after loading the data, minus the recipe's reserve for writing the files.
    subset: train on the first ``subset`` images only and test on as many (for quick tests).
    started: ``time.perf_counter()`` at the command's start (default: now).
    threads: CPU threads (default: ``pick_threads()``, revisited while training by a ``ThreadWatch``).
    resume: continue the run in OUT/checkpoint.pt (written after every epoch) with the same schedule; a
        checkpoint of another recipe, config or settings is refused with both named.
    """
    if name not in RECIPES:
        raise ValueError(f"unknown recipe {name!r}; choose one of {', '.join(RECIPES)}")
    started = time.perf_counter() if started is None else started
    recipe, out = RECIPES[name], Path(out if out is not None else Path("runs") / name)
    settings = {**recipe["train"], **({"epochs": _positive(epochs)} if epochs is not None else {})}
    batch_size = settings.pop("batch_size")
    run_info = {"recipe": name, "settings": {**settings, "batch_size": batch_size, "augment": recipe.get("augment"),
                                             **({"mix": recipe["mix"]} if recipe.get("mix") else {}), "seed": seed}}
    budget = _budget(name, time_budget, settings["epochs"])
    if resume:
        check_resumable(out / "checkpoint.pt", recipe["model"], run_info)
    device, load_before = pick_device(device), _load_average()
    watch = None
    if device.type == "cpu":
        torch.set_num_threads(pick_threads(threads))
        watch = ThreadWatch() if threads is None else None
    torch.manual_seed(seed)
    model = ViT(**recipe["model"])  # the weights depend on the seed only
    train, test = _recipe_loaders(recipe, batch_size, device, seed, subset)
    # "native": the step timed both ways here, once (its seconds count against the budget), not again in fit
    precision, trial = resolve_amp(settings.get("amp", "auto"), device, model, test, progress)
    fit_budget = None if budget is None else budget - (time.perf_counter() - started) - recipe["reserve"]
    if fit_budget is not None and fit_budget <= 0:
        raise ValueError(f"time budget of {budget} s is used up before training starts")
    history = fit(model, train, test, device=device, time_budget=fit_budget, checkpoint=out / "checkpoint.pt",
                  seed=seed, progress=progress, resume=resume, on_step=watch, run_info=run_info,
                  **{**settings, "amp": precision or "off"})
    metrics = {
        "recipe": name, "dataset": recipe["dataset"], **_accuracies(history, settings),
        "test_loss": history["test_loss"][-1], "epochs": history["epoch"][-1], "planned_epochs": settings["epochs"],
        "train_seconds": round(history["seconds"][-1], 1), "params": sum(p.numel() for p in model.parameters()),
        "device": str(device), "precision": precision or "fp32", "bf16_trial": trial,
        "threads": torch.get_num_threads(),
        "thread_changes": watch.changes if watch is not None else [],  # (seconds, threads) the watch set
        "torch": str(torch.__version__),  # a str subclass, which weights_only loading refuses
        "python": platform.python_version(), "seed": seed, "batch_size": batch_size, "time_budget": budget,
        "cpu_load_before": load_before, "cpu_load_after": _load_average(), "machine": machine(),
    }
    save_checkpoint(out / "model.pt", model.cpu(), history=history, metrics=metrics, **run_info)
    (out / "checkpoint.pt").unlink(missing_ok=True)  # the resumable one (with optimizer state) is done
    from .plots import plot_curves  # imported here: the figure module loads slowly and only this step needs it

    plot_curves(history, out / "curves.png", title=f"{name}: {metrics['test_accuracy']:.2%} test accuracy")
    metrics["wall_seconds"] = round(time.perf_counter() - started, 1)
    write_json(out / "metrics.json", metrics)
    return metrics


def _accuracies(history, settings):
    """The run's test accuracy, the recipe's prediction (with test_flips, each image's class probabilities averaged
    with its mirror image's), and the accuracy on the images as they are."""
    return {"test_accuracy": history.get("flip_acc", history["test_acc"][-1]),
            "test_accuracy_one_view": history["test_acc"][-1], "test_flips": settings.get("test_flips", False)}


def _recipe_loaders(recipe, batch_size, device, seed, subset):
    """(train, test) loaders with the recipe's augmentation; ``subset``: only the first images of each."""
    augment = recipe.get("augment")  # None: the dataset's standard augmentation
    augment = functools.partial(AUGMENT[recipe["dataset"]], **augment) if augment else True
    mix = recipe.get("mix")  # None: no CutMix or Mixup
    classes = recipe["model"]["num_classes"]
    mix = functools.partial(mix_batch, num_classes=classes, **mix) if mix else None
    train, test = loaders(recipe["dataset"], batch_size, device=device, seed=seed, augment=augment, mix=mix)
    if subset is not None:
        for loader in (train, test):
            loader.images, loader.labels = loader.images[:subset], loader.labels[:subset]
    return train, test


def _budget(name, time_budget, epochs):
    """The run's budget in seconds (None: none); a recipe without epochs must have one to end."""
    budget = RECIPES[name]["time_budget"] if time_budget is None else time_budget
    budget = None if budget in (0, float("inf")) else budget
    if budget is None and epochs is None:
        raise ValueError(f"recipe {name!r} trains until its time budget is used: without a budget "
                         f"(--time-budget 0) give the epochs (--epochs N)")
    return budget


def _positive(epochs):
    if epochs < 1:
        raise ValueError(f"epochs must be >= 1, got {epochs}")
    return epochs


def _load_average():
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else None


def full_config(config):
    """A ViT config with every default filled in, so two configs compare by what they build."""
    defaults = {k: p.default for k, p in inspect.signature(ViT).parameters.items()}
    return {**defaults, **config}


def check_resumable(path, config, run_info):
    """Refuse to resume ``path`` unless it is a run of the same recipe, model config and settings."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"nothing to resume: no {path} (a run writes it after every epoch and removes it "
                                f"when it finishes)")
    stored = read_checkpoint(path)
    theirs = {"recipe": stored.get("recipe"), "config": full_config(stored["config"]),
              "settings": stored.get("settings")}
    ours = {"recipe": run_info["recipe"], "config": full_config(config), "settings": run_info["settings"]}
    plain = functools.partial(json.dumps, sort_keys=True, default=list)  # tuples and lists compare equal
    differ = [key for key in ours if plain(ours[key]) != plain(theirs[key])]
    if differ:
        raise ValueError(f"cannot resume {path}: its {', '.join(differ)} differ from this run's. Checkpoint: "
                         + "; ".join(f"{k} {theirs[k]!r}" for k in differ) + ". This run: "
                         + "; ".join(f"{k} {ours[k]!r}" for k in differ))


__all__ = ["RECIPES", "check_resumable", "full_config", "train_recipe"]
