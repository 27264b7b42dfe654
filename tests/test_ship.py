"""tools/ship.py: a finished run becomes a shipped checkpoint only as the recipe it trained, and keeps its old name."""

import copy
import json

import pytest
import torch

from tools.ship import ship
from vit_course import ViT, load_checkpoint, recipes
from vit_course.checkpoint import pretrained_path, read_checkpoint, save_checkpoint

HISTORY = {"epoch": [1, 2], "train_loss": [1.0, 0.5], "test_loss": [0.9, 0.6], "test_acc": [0.7, 0.8], "lr": [1, 0]}


def finished_run(folder, name, **changes):
    """A run of recipe ``name`` as train_recipe leaves it (model.pt, metrics.json), with ``changes`` to its
    stored run_info."""
    torch.manual_seed(0)
    model = ViT(**recipes.RECIPES[name]["model"])
    info = {**recipes.run_info(name), **changes}
    metrics = {"recipe": name, "test_accuracy": 0.8, "epochs": 2}
    save_checkpoint(folder / "model.pt", model, history=HISTORY, metrics=metrics, **info)
    (folder / "metrics.json").write_text(json.dumps(metrics))
    return model


def test_a_renamed_recipe_ships_under_its_new_name_and_keeps_the_old(tmp_path, monkeypatch):
    monkeypatch.setitem(recipes.RECIPES, "mnist-renamed", copy.deepcopy(recipes.RECIPES["mnist"]))
    model = finished_run(tmp_path, "mnist")
    out = ship(tmp_path, "mnist-renamed", checkpoints=tmp_path / "shipped")
    shipped, state = load_checkpoint(out / "model.pt")
    assert state["recipe"] == "mnist-renamed" and state["trained_as"] == "mnist" and state["history"] == HISTORY
    weights = zip(shipped.state_dict().values(), model.state_dict().values(), strict=True)
    assert all(torch.equal(a, b) for a, b in weights)
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics == {"recipe": "mnist-renamed", "trained_as": "mnist", "test_accuracy": 0.8, "epochs": 2}
    assert (out / "curves.png").stat().st_size > 1000
    back = ship(out, "mnist", checkpoints=tmp_path / "again")  # shipped again under the name it trained as
    assert "trained_as" not in read_checkpoint(back / "model.pt")
    assert "trained_as" not in json.loads((back / "metrics.json").read_text())


@pytest.mark.parametrize(("target", "changes", "named"), [
    ("cifar10", {}, "config, settings"),  # another network
    ("mnist", {"settings": {**recipes.run_info("mnist")["settings"], "seed": 1}}, "settings"),  # another seed
    ("mnist", {"settings": {**recipes.run_info("mnist")["settings"], "lr": 1e-3}}, "settings"),
])
def test_a_run_of_anything_else_is_refused_with_what_differs(tmp_path, target, changes, named):
    finished_run(tmp_path, "mnist", **changes)
    with pytest.raises(ValueError, match=f"did not train recipe '{target}': its {named} differ"):
        ship(tmp_path, target, checkpoints=tmp_path / "shipped")
    assert not (tmp_path / "shipped").exists()  # nothing half-written


def test_a_resumable_checkpoint_is_not_a_finished_run(tmp_path):
    finished_run(tmp_path, "mnist")
    state = read_checkpoint(tmp_path / "model.pt")
    torch.save({**state, "optimizer": {"state": {}}}, tmp_path / "model.pt")
    with pytest.raises(ValueError, match="optimizer state"):
        ship(tmp_path, "mnist", checkpoints=tmp_path / "shipped")


@pytest.mark.parametrize("name", ["mnist", "cifar10", "cifar10-plain", "cifar10-plain-basic"])
def test_each_shipped_metrics_json_holds_the_checkpoints_own_metrics(name):
    """The README and the book read metrics.json; the chapters read the metrics inside model.pt: the same run's.
    metrics.json adds the whole command's wall_seconds, a renamed recipe's trained_as (its old name, which the
    checkpoint still calls its recipe), and, for a run the lab trained (benchmarks/targets.py), the machine and its
    load (benchmarks/machine.py's ``recorded`` writes them into metrics.json only)."""
    stored = read_checkpoint(pretrained_path(name))["metrics"]
    written = json.loads((pretrained_path(name).parent / "metrics.json").read_text())
    assert written["recipe"] == name and written.get("trained_as", name) == stored["recipe"]
    lab = {"machine", "cpu_load_before", "cpu_load_after"}  # inside model.pt too for runs trained before the lab moved
    extra = {"wall_seconds", "trained_as", "recipe"} | lab
    assert {k: v for k, v in written.items() if k not in extra} == {
        k: v for k, v in stored.items() if k not in {"recipe"} | lab}
    assert all(written[k] == stored[k] for k in lab & stored.keys())
