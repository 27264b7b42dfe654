"""The command line: ``train`` writes the promised files; ``grade`` is handed on to its module."""

import json
import sys
import time
import types

import pytest
import torch

import vit_course.loop
from vit_course import ViT, recipes
from vit_course.__main__ import ROLES, build_parser, main
from vit_course.batches import AUGMENT
from vit_course.checkpoint import load_checkpoint, save_checkpoint
from vit_course.loop import amp_settings
from vit_course.recipes import RECIPES, check_resumable, full_config

from .markers import data_or_skip, needs_data


@needs_data
def test_train_writes_model_metrics_and_curves(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", "mnist", "--epochs", "1", "--subset", "256", "--out", str(out), "--seed", "3",
                 "--device", "cpu", "--no-progress"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["curves.png", "metrics.json", "model.pt"]
    metrics = json.loads((out / "metrics.json").read_text())
    for key in ("test_accuracy", "train_seconds", "epochs", "params", "device", "recipe", "torch", "seed"):
        assert key in metrics, key
    assert 0.0 <= metrics["test_accuracy"] <= 1.0 and metrics["epochs"] == 1 and metrics["seed"] == 3
    assert metrics["device"] == "cpu" and metrics["recipe"] == "mnist" and metrics["torch"] == torch.__version__
    model, state = load_checkpoint(out / "model.pt")
    assert state["config"] == full_config(RECIPES["mnist"]["model"])  # the recipe, every default filled in
    assert metrics["params"] == sum(p.numel() for p in model.parameters())
    assert state["metrics"]["test_accuracy"] == metrics["test_accuracy"]
    assert "optimizer" not in state  # the shipped file stays small
    assert (out / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "test accuracy" in capsys.readouterr().out


@needs_data
def test_the_gpu_recipe_runs_on_the_cpu_too(tmp_path):
    """The Colab recipe cannot be timed here, but it must run: one step of 256 images on the CPU (smoke)."""
    out = tmp_path / "gpu"
    assert main(["train", "cifar10-gpu", "--epochs", "1", "--subset", "256", "--out", str(out), "--device", "cpu",
                 "--no-progress", "--threads", "2"]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["recipe"] == "cifar10-gpu" and metrics["epochs"] == 1 and metrics["device"] == "cpu"
    model, state = load_checkpoint(out / "model.pt")
    assert state["config"] == full_config(RECIPES["cifar10-gpu"]["model"])
    assert model.grid_size == (8, 8)  # the stem halves the 32 pixels, patches of 2 halve them again


@needs_data
def test_the_cifar10_recipe_records_its_precision_and_its_prediction_with_flips(tmp_path, monkeypatch):

    flips = vit_course.loop.evaluate_flips  # its accuracy with flips made unmistakable
    monkeypatch.setattr(vit_course.loop, "evaluate_flips",
                        lambda model, batches: (*flips(model, batches)[:2], 0.123457))
    out = tmp_path / "run"
    assert main(["train", "cifar10", "--epochs", "1", "--subset", "256", "--out", str(out), "--device", "cpu",
                 "--no-progress", "--threads", "2"]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["precision"] == "fp32" and metrics["threads"] == 2  # float32 on any CPU: no timed trial
    for key in ("test_accuracy", "train_seconds", "epochs", "device", "threads", "torch", "python"):
        assert key in metrics, key  # what a reader of the results needs
    assert not {"machine", "cpu_load_before", "cpu_load_after"} & set(metrics)  # the lab records those (benchmarks/)
    _, state = load_checkpoint(out / "model.pt")
    assert state["settings"]["test_flips"] and "amp" not in state["settings"]
    # the headline is the recipe's prediction (each image with its mirror), the one-view accuracy beside it
    assert metrics["test_flips"] and metrics["test_accuracy"] == state["history"]["test"]["flip_acc"] == 0.123457
    assert metrics["test_accuracy_one_view"] == state["history"]["test"]["acc"] != 0.123457  # the test set, read once
    assert "test_acc" not in state["history"] and len(state["history"]["val_acc"]) == 1  # curves: validation


def test_mixed_precision_is_chosen_on_cuda_only(monkeypatch):

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    autocast, scaler = amp_settings("auto", torch.device("cuda"))
    assert autocast.fast_dtype == torch.bfloat16 and scaler is None  # bf16 needs no loss scaling
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 5))
    autocast, scaler = amp_settings("auto", torch.device("cuda"))
    assert autocast.fast_dtype == torch.float16 and scaler is not None  # fp16 (a T4): a GradScaler
    assert amp_settings("auto", torch.device("cpu")) == (None, None)


def test_grade_is_dispatched_lazily(monkeypatch):
    seen = []
    fake = types.ModuleType("vit_course.grade")
    fake.main = lambda argv: seen.append(argv) or 7
    monkeypatch.setitem(sys.modules, "vit_course.grade", fake)
    assert main(["grade", "--help", "x"]) == 7
    assert seen == [["--help", "x"]]


@pytest.mark.parametrize("command", ["notebooks", "results"])
def test_the_maintainers_tools_are_not_the_learners_commands(command, capsys):
    """Student notebooks and the README's tables are written by tools/ in the repository (python -m tools.NAME)."""
    with pytest.raises(SystemExit):
        main([command])
    assert "invalid choice" in capsys.readouterr().err


def test_bad_arguments_are_rejected(capsys):
    with pytest.raises(SystemExit):
        main(["train", "imagenet"])
    assert "imagenet" in capsys.readouterr().err
    for flag, value, expected in [("--epochs", "0", "must be 1 or more, got 0"), ("--threads", "-1", "must be 1 or "
                                  "more, got -1"), ("--time-budget", "-5", "must be 0 or more, got -5"),
                                  ("--epochs", "x", "invalid int value: 'x'")]:
        with pytest.raises(SystemExit):  # before any data is loaded: argparse's one line
            main(["train", "mnist", flag, value])
        assert f"argument {flag}: {expected}" in capsys.readouterr().err
    assert build_parser().parse_args(["train", "mnist", "--time-budget", "0"]).time_budget == 0  # 0: no budget
    with pytest.raises(SystemExit):
        main([])


def test_the_recipe_choices_are_the_recipes(monkeypatch):

    for name in RECIPES:
        assert build_parser().parse_args(["train", name]).recipe == name
    monkeypatch.setitem(RECIPES, "a-new-recipe", RECIPES["mnist"])  # a recipe added is a choice, nothing typed twice
    assert build_parser().parse_args(["train", "a-new-recipe"]).recipe == "a-new-recipe"


def test_recipes_are_complete():
    for name, recipe in RECIPES.items():
        assert {"dataset", "model", "train", "time_budget", "reserve"} <= set(recipe), name
        assert {"epochs", "batch_size", "lr", "weight_decay", "warmup_epochs", "label_smoothing"} <= set(
            recipe["train"]), name
        assert recipe["train"]["epochs"] or recipe["time_budget"], f"{name}: no epochs and no budget never ends"


def test_the_budget_recipes_fill_their_budget_and_refuse_to_run_without_one():
    """mnist and cifar10 have no epoch cap (a faster machine trains longer); without a budget they need --epochs."""
    for name in ("mnist", "cifar10"):
        assert RECIPES[name]["train"]["epochs"] is None and RECIPES[name]["time_budget"] > 0
        with pytest.raises(ValueError, match=r"--time-budget 0\) give the epochs"):
            recipes.train_recipe(name, time_budget=0, device="cpu", progress=False)


def test_a_gpu_trains_the_budget_recipes_for_fixed_epochs_and_epochs_mean_epochs_everywhere(monkeypatch):
    """On a CPU mnist fills its budget; on CUDA or MPS it trains its gpu_epochs, since a GPU would run the budget's
    schedule for hundreds of epochs; --epochs N is N epochs on any device, under a budget only if one is given."""
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 5))  # a T4, as on Colab
    cpu, cuda, mps = torch.device("cpu"), torch.device("cuda"), torch.device("mps")
    for name in ("mnist", "cifar10"):
        budget, gpu_epochs = RECIPES[name]["time_budget"], RECIPES[name]["gpu_epochs"]
        assert recipes.plan(name, cpu) == (None, budget)
        assert recipes.plan(name, cuda) == recipes.plan(name, mps) == (gpu_epochs, None)
        for device in (cpu, cuda):
            assert recipes.plan(name, device, epochs=3) == (3, None)
            assert recipes.plan(name, device, epochs=3, time_budget=60) == (3, 60)
        assert f"{gpu_epochs} epochs" in recipes.describe_plan(name, cuda, gpu_epochs, None)
        assert "fp16" in recipes.describe_plan(name, cuda, gpu_epochs, None)
        assert f"{budget} s" in recipes.describe_plan(name, cpu, None, budget)
    assert recipes.plan("cifar10-gpu", cuda) == recipes.plan("cifar10-gpu", cpu) == (100, None)
    with pytest.raises(ValueError, match="at least|>= 1"):
        recipes.plan("mnist", cpu, epochs=0)


def test_the_first_line_of_a_run_says_its_plan(tmp_path, capsys):
    with data_or_skip():  # MNIST, from VIT_COURSE_DATA, the cache folder or a download
        recipes.train_recipe("mnist", epochs=1, subset=128, out=tmp_path, device="cpu", progress=True)
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("mnist on cpu: 1 epochs") and "fp32" in first, first


def test_estimate_seconds_times_the_recipes_steps():
    """A few timed steps scaled to the plan: more epochs, proportionally more seconds; a budgeted plan is its budget."""
    assert recipes.estimate_seconds("mnist", "cpu") == RECIPES["mnist"]["time_budget"]
    one = recipes.estimate_seconds("mnist", "cpu", epochs=1, steps=2)
    steps = recipes.DATASETS["mnist"]["sizes"]["train"] // RECIPES["mnist"]["train"]["batch_size"]
    assert 0 < one < 10 * steps, one  # well under 10 s a step on any CPU


def test_train_recipe_names_an_unknown_recipe_and_the_known_ones():
    with pytest.raises(ValueError, match=f"unknown recipe 'imagenet'; choose one of {', '.join(RECIPES)}$"):
        recipes.train_recipe("imagenet", progress=False)


def test_a_budget_used_up_before_training_starts_is_refused(monkeypatch):
    monkeypatch.setattr(recipes, "_recipe_loaders", lambda *args: (None, None, None))  # no data to load
    long_ago = time.perf_counter() - 100  # loading took 100 s of a 60 s budget
    with pytest.raises(ValueError, match="time budget of 60 s is used up before training starts"):
        recipes.train_recipe("mnist", time_budget=60, started=long_ago, device="cpu", threads=torch.get_num_threads(),
                             progress=False)


def test_recipe_augmentation_reaches_the_loader(monkeypatch):
    """The recipes' augmentation reaches the loader: CIFAR-10 crops with padding 4 and flips (the crop chosen on
    the validation split), as the GPU recipe does; MNIST shifts by up to 1 pixel (the standard: 2)."""
    class Captured(Exception):
        pass

    def spy(name, batch_size, *, augment, **kwargs):
        raise Captured(augment)

    monkeypatch.setattr(recipes, "loaders", spy)
    monkeypatch.setattr(recipes, "pick_threads", lambda threads=None: torch.get_num_threads())
    for name, channels, shift in [("cifar10", 3, 4), ("cifar10-gpu", 3, 4), ("mnist", 1, 1)]:
        with pytest.raises(Captured) as caught:
            recipes.train_recipe(name, device="cpu", progress=False)
        augment = caught.value.args[0]
        dataset = recipes.RECIPES[name]["dataset"]
        augment = AUGMENT[dataset] if augment is True else augment  # True: the dataset's own
        images = torch.full((2000, channels, 28, 28), 255, dtype=torch.uint8)
        out = augment(images, torch.Generator().manual_seed(0))  # (2000, C, 28, 28)
        zero_rows = (out == 0).all(dim=3).all(dim=1).sum(dim=1)  # (2000,) rows of zero padding per image
        assert zero_rows.max().item() == shift, (name, zero_rows.max().item())


def test_resume_refuses_another_runs_checkpoint(tmp_path):
    path = tmp_path / "checkpoint.pt"
    with pytest.raises(FileNotFoundError, match="nothing to resume"):
        check_resumable(path, RECIPES["mnist"]["model"], {"recipe": "mnist", "settings": {"lr": 1e-3}})
    config = RECIPES["mnist"]["model"]
    settings = {"epochs": 3, "lr": 2e-3, "seed": 0}
    save_checkpoint(path, ViT(**config), recipe="mnist", settings=settings)
    check_resumable(path, dict(config, stem_channels=list(config["stem_channels"])),  # lists equal tuples
                    {"recipe": "mnist", "settings": dict(settings)})
    with pytest.raises(ValueError, match=r"recipe, config differ.*'mnist'.*'cifar10-plain'"):
        check_resumable(path, RECIPES["cifar10-plain"]["model"], {"recipe": "cifar10-plain", "settings": settings})
    with pytest.raises(ValueError, match=r"settings differ.*'seed': 0.*'seed': 1"):
        check_resumable(path, config, {"recipe": "mnist", "settings": {**settings, "seed": 1}})


def test_train_help_says_what_every_recipe_is_for(capsys):
    assert set(ROLES) == set(RECIPES), "a recipe without a line in `train --help`, or a line without a recipe"
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    out = capsys.readouterr().out
    assert all(f"{name}: " in out and ROLES[name] in out for name in RECIPES)
