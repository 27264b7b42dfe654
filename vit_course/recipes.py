"""Training recipes (chapters 06-07) and the command behind ``python -m vit_course train NAME``.

A recipe is a model config (``ViT`` keyword arguments) plus training settings (``loop.TrainConfig``, and the
batch size), with a line on why. How each was chosen and what it reaches: ``benchmarks/`` (the commands) and
``benchmarks/results/`` (their numbers); a shipped run's own numbers: ``vit_course/checkpoints/NAME/metrics.json``.
"""

import copy
import functools
import inspect
import json
import platform
import time
from contextlib import nullcontext
from pathlib import Path

import torch

from .augment import mix_batch
from .batches import AUGMENT, loaders
from .checkpoint import read_checkpoint, save_checkpoint
from .data import DATASETS
from .device import amp_settings, pick_device, pick_threads
from .files import write_json
from .loop import TrainConfig, fit, precision
from .train import train_step
from .vit import ViT

# epochs=None: on a CPU the run trains until its time budget is used, its cosine re-planned from the measured pace so
# it ends decayed (loop.learning_rate), so a faster machine trains longer instead of stopping at a cap. A GPU would run
# such a schedule for hundreds of epochs in the same minutes: there it trains gpu_epochs, about what the shipped CPU
# run reached (``plan``). --epochs N means N epochs on any device.
GPUS = ("cuda", "mps")  # the devices on which a budgeted recipe trains its gpu_epochs instead (``plan``)
RECIPES = {
    # A hybrid ViT (the paper's section 3.1): a three-stage conv stem turns a digit into a 4x4 map of 16 tokens,
    # which learns the strokes in the few epochs five minutes allow on the slowest 2-core machine
    # (benchmarks/results/ablate_mnist.json, stem_speed.json).
    "mnist": {
        "dataset": "mnist",
        "model": dict(image_size=28, patch_size=1, in_channels=1, num_classes=10, dim=96, depth=2, num_heads=6,
                      mlp_ratio=2.0, pool="mean", pos_embed="sincos", stem_channels=(16, 32, 64)),
        "train": dict(epochs=None, batch_size=128, lr=2e-3, weight_decay=0.05, warmup_epochs=0.5,
                      label_smoothing=0.1, min_lr=1e-5),
        "augment": dict(max_shift=1),  # keywords for batches.mnist_augment
        "time_budget": 285,  # seconds for the whole command, start-up included (target: 300)
        "reserve": 6,  # seconds kept for writing the results
        "gpu_epochs": 21,  # on CUDA or MPS, instead of the budget: the shipped CPU run reached 20.8
    },
    # The same hybrid for CIFAR-10 (Compact Transformers, Hassani et al. 2021): the conv stem gives a small ViT the
    # locality a plain one needs 100+ epochs to learn; crop and flip (the crop chosen on the validation split, two
    # seeds each: book/recipes.md) and a final evaluation with test-time flips (flip_tta.json). float32 on a CPU.
    "cifar10": {
        "dataset": "cifar10",
        "model": dict(image_size=32, patch_size=1, in_channels=3, num_classes=10, dim=128, depth=2, num_heads=4,
                      mlp_ratio=2.0, pool="mean", pos_embed="sincos", stem_channels=(32, 64, 128)),
        "train": dict(epochs=None, batch_size=64, lr=1.5e-3, weight_decay=0.05, warmup_epochs=0.5,
                      label_smoothing=0.1, min_lr=1e-5, test_flips=True),
        "augment": dict(padding=4),  # keywords for batches.cifar_augment: crop with padding 4, then flip
        "time_budget": 1775,
        "reserve": 10,
        "gpu_epochs": 80,  # the shipped CPU run reached 81.6
    },
    # The paper's own architecture, no conv stem: 4x4 patches, a class token, a learned position table, 6 blocks
    # (benchmarks/results/plain_recipe_speed.json: width 128). It must learn locality from 50,000 images, so it is
    # trained the way small-data ViTs are (DeiT; Lee et al. 2021; Hassani et al. 2021): RandAugment, CutMix or Mixup
    # on every batch, stochastic depth, a long schedule (a run of hours, resumable with --resume) whose weights
    # chapter 08 inspects. The shipped weights were trained under this recipe's earlier name, cifar10-plain-mix.
    "cifar10-plain": {
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
    # The same network with the basic protocol, crop + flip and label smoothing for 64 epochs: chapter 08's contrast
    # (its test loss rises after epoch 38). Its shipped weights were trained when this recipe was named cifar10-plain.
    "cifar10-plain-basic": {
        "dataset": "cifar10",
        "model": dict(image_size=32, patch_size=4, in_channels=3, num_classes=10, dim=128, depth=6, num_heads=4,
                      mlp_ratio=2.0, pool="cls", pos_embed="learned"),
        "train": dict(epochs=64, batch_size=128, lr=2e-3, weight_decay=0.05, warmup_epochs=5,
                      label_smoothing=0.1, min_lr=1e-5),
        "augment": dict(padding=4),
        "time_budget": None,
        "reserve": 0,
    },
    # For a GPU such as Colab's T4, sized from FLOP counts (what it reaches: benchmarks/results/gpu_check.json).
    "cifar10-gpu": {
        "dataset": "cifar10",
        "model": dict(image_size=32, patch_size=2, in_channels=3, num_classes=10, dim=192, depth=6, num_heads=6,
                      mlp_ratio=2.0, pool="mean", pos_embed="sincos", stem_channels=(64,), drop_path=0.1),
        "train": dict(epochs=100, batch_size=256, lr=1e-3, weight_decay=0.05, warmup_epochs=5,
                      label_smoothing=0.1, min_lr=1e-5),
        "time_budget": None,
        "reserve": 0,
    },
    # For one GPU, designed to be fast: the class of the small ViTs that reach 93-94 % on CIFAR-10 (Compact
    # Transformers' CCT-7/3x2, Hassani et al. 2021): a two-stage conv stem turns 32 x 32 pixels into 8 x 8 = 64 tokens
    # for 7 blocks of width 256; RandAugment and CutMix/Mixup on the device (nothing read back from it), label
    # smoothing, test-time flips, an evaluation every 10 epochs. On CUDA ``fit`` compiles the whole step. The plan, 200
    # epochs, is sized from the step's count, 1.54 GFLOP an image forward and backward (77 TFLOP an epoch): at the
    # 30-150 TFLOP/s an H100 reaches on such small matrices, 2-9 minutes; on Colab's T4 (float16 with a GradScaler,
    # 8-15 TFLOP/s) 17-32 minutes, within a Colab hour. Estimates, not yet measured: the next GPU check runs it.
    "cifar10-fast": {
        "dataset": "cifar10",
        "model": dict(image_size=32, patch_size=1, in_channels=3, num_classes=10, dim=256, depth=7, num_heads=4,
                      mlp_ratio=2.0, pool="mean", pos_embed="learned", stem_channels=(64, 128), drop_path=0.1),
        "train": dict(epochs=200, batch_size=256, lr=1e-3, weight_decay=0.05, warmup_epochs=10,
                      label_smoothing=0.1, min_lr=1e-5, test_flips=True, eval_every=10),
        "augment": dict(padding=4, rand_ops=2, magnitude=9, rand_prob=0.5),
        "mix": dict(cutmix=1.0, mixup=0.8, switch=0.5),
        "time_budget": None,
        "reserve": 0,
    },
}
# The control of cifar10-plain: everything the same but CutMix (Mixup on every batch), to see what CutMix does
# to the heads' locality (chapter 08).
RECIPES["cifar10-plain-mixup"] = {**copy.deepcopy(RECIPES["cifar10-plain"]), "mix": dict(cutmix=0.0, mixup=0.8)}


def train_recipe(name, *, epochs=None, out=None, device=None, seed=0, time_budget=None, subset=None,
                 progress=True, started=None, threads=None, resume=False):
    """Train recipe ``name`` and write OUT/model.pt, OUT/metrics.json, OUT/curves.png; -> metrics dict.

    epochs, time_budget: how long, as ``plan`` decides from them and the device; a budget is seconds for the whole
        command (0: none), and the training gets what is left after loading the data, minus the recipe's reserve
        for writing the files.
    subset: train on the first ``subset`` images only and test on as many (for quick tests).
    started: ``time.perf_counter()`` at the command's start (default: now).
    threads: CPU threads (default: ``device.pick_threads()``).
    resume: continue the run in OUT/checkpoint.pt (written after every epoch) with the same schedule; a
        checkpoint of another recipe, config or settings is refused with both named.
    """
    if name not in RECIPES:
        raise ValueError(f"unknown recipe {name!r}; choose one of {', '.join(RECIPES)}")
    started = time.perf_counter() if started is None else started
    recipe, out = RECIPES[name], Path(out if out is not None else Path("runs") / name)
    device = pick_device(device)
    epochs, budget = plan(name, device, epochs, time_budget)
    info = run_info(name, epochs=epochs, seed=seed)  # what the checkpoints store, to resume only this run
    settings = {**recipe["train"], "epochs": epochs}
    batch_size = settings.pop("batch_size")
    if resume:
        check_resumable(out / "checkpoint.pt", recipe["model"], info)
    if progress:
        print(describe_plan(name, device, epochs, budget))
    if device.type == "cpu":
        torch.set_num_threads(pick_threads(threads))
    torch.manual_seed(seed)
    model = ViT(**recipe["model"])  # the weights depend on the seed only
    train, val, test = _recipe_loaders(recipe, batch_size, device, seed, subset)
    fit_budget = None if budget is None else budget - (time.perf_counter() - started) - recipe["reserve"]
    if fit_budget is not None and fit_budget <= 0:
        raise ValueError(f"time budget of {budget} s is used up before training starts")
    config = TrainConfig(**settings, time_budget=fit_budget, seed=seed)
    history = fit(model, train, val, config, test_loader=test, device=device, checkpoint=out / "checkpoint.pt",
                  resume=resume, progress=progress, run_info=info)
    metrics = {
        "recipe": name, "dataset": recipe["dataset"], **_accuracies(history, settings),
        "test_loss": history["test"]["loss"], "val_accuracy": history["val_acc"][-1], "epochs": history["epoch"][-1],
        "planned_epochs": settings["epochs"],
        "train_seconds": round(history["seconds"][-1], 1), "params": sum(p.numel() for p in model.parameters()),
        "device": str(device), "precision": precision(config.amp, device), "threads": torch.get_num_threads(),
        "torch": str(torch.__version__),  # a str subclass, which weights_only loading refuses
        "python": platform.python_version(), "seed": seed, "batch_size": batch_size, "time_budget": budget,
    }  # what the machine was and how busy: the lab records it beside its runs (benchmarks/machine.py)
    save_checkpoint(out / "model.pt", model.cpu(), history=history, metrics=metrics, **info)
    (out / "checkpoint.pt").unlink(missing_ok=True)  # the resumable one (with optimizer state) is done
    from .plots import plot_curves  # imported here: the figure module loads slowly and only this step needs it

    plot_curves(history, out / "curves.png", title=f"{name}: {metrics['test_accuracy']:.2%} test accuracy")
    metrics["wall_seconds"] = round(time.perf_counter() - started, 1)
    write_json(out / "metrics.json", metrics)
    return metrics


def run_info(name, *, epochs=None, seed=0):
    """What a run of recipe ``name`` stores beside its weights, to be resumed or shipped only as that recipe:
    -> {"recipe": name, "settings": its training settings, batch size, augmentation, mixing and seed}."""
    recipe = RECIPES[name]
    settings = {**recipe["train"], **({"epochs": _positive(epochs)} if epochs is not None else {})}
    batch_size = settings.pop("batch_size")
    return {"recipe": name, "settings": {**settings, "batch_size": batch_size, "augment": recipe.get("augment"),
                                         **({"mix": recipe["mix"]} if recipe.get("mix") else {}), "seed": seed}}


def _accuracies(history, settings):
    """The run's test accuracy (the test set read once, at the end), the recipe's prediction (with test_flips, each
    image's class probabilities averaged with its mirror image's), and the accuracy on the images as they are."""
    test = history["test"]
    return {"test_accuracy": test.get("flip_acc", test["acc"]), "test_accuracy_one_view": test["acc"],
            "test_flips": settings.get("test_flips", False)}


def _recipe_loaders(recipe, batch_size, device, seed, subset):
    """(train, validation, test) loaders with the recipe's augmentation; ``subset``: only the first images of each."""
    augment = recipe.get("augment")  # None: the dataset's standard augmentation
    augment = functools.partial(AUGMENT[recipe["dataset"]], **augment) if augment else True
    mix = recipe.get("mix")  # None: no CutMix or Mixup
    classes = recipe["model"]["num_classes"]
    mix = functools.partial(mix_batch, num_classes=classes, **mix) if mix else None
    train, val, test = loaders(recipe["dataset"], batch_size, device=device, seed=seed, augment=augment, mix=mix)
    if subset is not None:
        for loader in (train, val, test):
            loader.images, loader.labels = loader.images[:subset], loader.labels[:subset]
    return train, val, test


def plan(name, device, epochs=None, time_budget=None):
    """How long recipe ``name`` trains on ``device``: -> (epochs or None, time budget in seconds or None).

    ``epochs`` given (--epochs N): N epochs on any device, under a budget only if ``time_budget`` is given too.
    Otherwise a CPU follows the recipe (its epochs, or as many as its budget holds); a GPU (CUDA, MPS) trains a
    budgeted recipe's ``gpu_epochs`` instead of its budget. ``time_budget``: seconds (0: none) replacing the
    recipe's; a run without epochs must have one to end.
    """
    recipe = RECIPES[name]
    budget = None if time_budget in (0, float("inf")) else time_budget
    if epochs is not None:
        return _positive(epochs), budget
    if device.type in GPUS and recipe.get("gpu_epochs"):
        return recipe["gpu_epochs"], budget
    budget = recipe["time_budget"] if time_budget is None else budget
    if budget is None and recipe["train"]["epochs"] is None:
        raise ValueError(f"recipe {name!r} trains until its time budget is used: without a budget "
                         f"(--time-budget 0) give the epochs (--epochs N)")
    return recipe["train"]["epochs"], budget


def describe_plan(name, device, epochs, budget):
    """The run's first line: the recipe, the device, how long (``plan``) and in what precision."""
    recipe = RECIPES[name]
    if epochs is None:
        length = f"as many epochs as {budget:.0f} s hold (the recipe's CPU budget, start-up included)"
    else:
        gpu_plan = epochs == recipe.get("gpu_epochs") and device.type in GPUS
        length = f"{epochs} epochs" + (f" (its GPU plan, about what its {recipe['time_budget']} s budget reaches on "
                                       f"a 2-core CPU)" if gpu_plan else "")
        length += f", or {budget:.0f} s if that comes first" if budget is not None else ""
    return f"{name} on {device}: {length}; {precision('auto', device)} precision"


def estimate_seconds(name, device=None, epochs=None, steps=10):
    """About how many seconds recipe ``name`` trains on ``device`` (``plan``'s epochs): ``steps`` training steps
    of its model on random images are timed, after two that pay for the start-up, and scaled to the plan's steps.
    Loading, augmentation and the evaluations come on top. A budgeted plan takes its budget."""
    recipe, device = RECIPES[name], pick_device(device)
    epochs, budget = plan(name, device, epochs)
    if epochs is None:
        return float(budget)
    data, batch_size = DATASETS[recipe["dataset"]], recipe["train"]["batch_size"]
    torch.manual_seed(0)
    model = ViT(**recipe["model"]).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=recipe["train"]["lr"])
    autocast, scaler = amp_settings("auto", device)
    images = torch.randn(batch_size, *data["shape"], device=device)  # (b, C, H, W)
    labels = torch.randint(len(data["classes"]), (batch_size,), device=device)  # (b,)
    loss = None
    for i in range(2 + steps):
        if i == 2:  # reading the loss waits for the device: the clock starts on an idle one
            float(loss)  # the second step's
            tick = time.perf_counter()
        with autocast or nullcontext():
            loss = train_step(model, images, labels, optimizer, recipe["train"]["label_smoothing"], scaler)
    float(loss)  # ... and stops when the last step is done, not merely queued
    per_step = (time.perf_counter() - tick) / steps
    return per_step * epochs * (data["sizes"]["train"] // batch_size)


def _positive(epochs):
    if epochs < 1:
        raise ValueError(f"epochs must be >= 1, got {epochs}")
    return epochs


def full_config(config):
    """A ViT config with every default filled in, so two configs compare by what they build."""
    defaults = {k: p.default for k, p in inspect.signature(ViT).parameters.items()}
    return {**defaults, **config}


def _without_native_amp(settings):
    """A checkpoint's settings, less ``amp="native"``: the cifar10 recipe's setting until float32 became the CPU's
    rule (the bf16 it could choose was timed no faster for the present model), so such a run resumes in float32."""
    if settings is None:
        return None
    return {key: value for key, value in settings.items() if (key, value) != ("amp", "native")}


def check_resumable(path, config, info):
    """Refuse to resume ``path`` unless it is a run of the same recipe, model config and settings (``info``: the
    ``run_info`` of this run)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"nothing to resume: no {path} (a run writes it after every epoch and removes it "
                                f"when it finishes)")
    differ, theirs, ours = differences(read_checkpoint(path), config, info)
    if differ:
        raise ValueError(f"cannot resume {path}: its {', '.join(differ)} differ from this run's. Checkpoint: "
                         + "; ".join(f"{k} {theirs[k]!r}" for k in differ) + ". This run: "
                         + "; ".join(f"{k} {ours[k]!r}" for k in differ))


def differences(stored, config, info):
    """-> (keys among recipe, config, settings where checkpoint dict ``stored`` and a run of ``config`` and ``info``
    differ, the checkpoint's values, the run's values)."""
    theirs = {"recipe": stored.get("recipe"), "config": full_config(stored["config"]),
              "settings": _without_native_amp(stored.get("settings"))}
    ours = {"recipe": info["recipe"], "config": full_config(config), "settings": info["settings"]}
    plain = functools.partial(json.dumps, sort_keys=True, default=list)  # tuples and lists compare equal
    return [key for key in ours if plain(ours[key]) != plain(theirs[key])], theirs, ours


__all__ = ["RECIPES", "check_resumable", "describe_plan", "differences", "estimate_seconds", "full_config", "plan",
           "run_info", "train_recipe"]
