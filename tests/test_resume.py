"""``--resume`` continues checkpoints that earlier versions of the course wrote, with the same schedule and settings.

f793782 is the commit before ``fit`` took a ``TrainConfig`` and mixed precision became a plain rule: the settings its
``train_recipe`` stored must still be accepted. ``BEFORE`` is the commit that started the last long run
(training/README.md), which wrote its checkpoint.pt after every epoch; the present code must carry it on.
"""

import os
import subprocess
import sys
import tarfile
import textwrap
from io import BytesIO
from pathlib import Path

import numpy as np
import pytest
import torch

from vit_course import ViT, load_checkpoint, recipes
from vit_course.checkpoint import save_checkpoint
from vit_course.loop import fit

from .markers import needs_data

ROOT = Path(__file__).resolve().parents[1]
BEFORE, LONG_RUN = "4b9291a", "cifar10-plain-mixup"  # the commit and recipe of the last long run

# run_info["settings"] as f793782's and BEFORE's train_recipe stored them in every checkpoint, written out by hand
SETTINGS_BEFORE = {
    "cifar10-plain-mixup": {"epochs": 150, "lr": 2e-3, "weight_decay": 0.05, "warmup_epochs": 5,
                            "label_smoothing": 0.1, "min_lr": 1e-5, "batch_size": 128,
                            "augment": {"padding": 4, "rand_ops": 2, "magnitude": 9, "rand_prob": 0.5},
                            "mix": {"cutmix": 0.0, "mixup": 0.8}, "seed": 0},
    "cifar10": {"epochs": None, "lr": 1.5e-3, "weight_decay": 0.05, "warmup_epochs": 0.5, "label_smoothing": 0.1,
                "min_lr": 1e-5, "amp": "native", "test_flips": True, "batch_size": 64, "augment": {"padding": 0},
                "seed": 0},
    "mnist": {"epochs": None, "lr": 2e-3, "weight_decay": 0.05, "warmup_epochs": 0.5, "label_smoothing": 0.1,
              "min_lr": 1e-5, "batch_size": 128, "augment": {"max_shift": 1}, "seed": 0},
}
# what each recipe changed since: a checkpoint of the recipe as it was is refused, one with the change accepted
CHANGED_SINCE = {"cifar10": {"augment": {"padding": 4}}}  # the crop, chosen on the validation split


class Accepted(Exception):
    """Raised where train_recipe goes on after its resume check: the checkpoint was accepted."""


@pytest.mark.parametrize("name", sorted(SETTINGS_BEFORE))
def test_the_settings_stored_before_are_accepted_and_others_refused(tmp_path, monkeypatch, name):
    def accepted(threads=None):
        raise Accepted

    monkeypatch.setattr(recipes, "pick_threads", accepted)  # the first thing train_recipe does after the check
    model = ViT(**recipes.RECIPES[name]["model"])
    before = {**SETTINGS_BEFORE[name], **CHANGED_SINCE.get(name, {})}
    cases = [(before, Accepted), ({**before, "seed": 1}, ValueError)]
    if name in CHANGED_SINCE:
        cases.append((SETTINGS_BEFORE[name], ValueError))  # trained without the change: not this recipe's run
    for settings, expected in cases:
        save_checkpoint(tmp_path / "checkpoint.pt", model, recipe=name, settings=settings)
        with pytest.raises(expected):
            recipes.train_recipe(name, out=tmp_path, resume=True, progress=False, device="cpu")
    save_checkpoint(tmp_path / "checkpoint.pt", model, recipe=name, settings={**before, "amp": "bf16"})
    with pytest.raises(ValueError, match="settings differ"):  # only "native", the default it became, is let through
        recipes.train_recipe(name, out=tmp_path, resume=True, progress=False, device="cpu")


OLD_RUNS = """
import sys
import vit_course.loop
from vit_course.recipes import train_recipe

out = sys.argv[1]
arguments = dict(epochs=2, subset=128, device="cpu", threads=1, progress=False)
train_recipe(sys.argv[2], out=out + "/whole", **arguments)
save = vit_course.loop.save_checkpoint


def save_then_stop(*args, **kwargs):  # Ctrl-C right after the first epoch's checkpoint
    save(*args, **kwargs)
    raise KeyboardInterrupt


vit_course.loop.save_checkpoint = save_then_stop
try:
    train_recipe(sys.argv[2], out=out + "/stopped", **arguments)
except KeyboardInterrupt:
    pass
"""


def _old_package(folder):
    """vit_course as it was at ``BEFORE``, unpacked into ``folder`` from the repository; None without git or it."""
    try:
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", BEFORE, "vit_course"], capture_output=True,
                                 check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(folder, filter="data")
    return folder


@needs_data
def test_a_run_stopped_under_the_earlier_code_resumes_to_the_same_weights(tmp_path):
    """BEFORE trains two epochs of the long run's recipe whole, and again stopped after the first; this code
    resumes the stopped one. The schedule must come out as the whole run's: the same epochs and learning rates, and
    the first epoch's record as it was. (Not the same weights: since BEFORE, RandAugment draws every op for every
    image and the mixing draws on the host, so that no step waits for the device, and AdamW runs fused; the second
    epoch's random draws and rounding differ.)"""
    old = _old_package(tmp_path / "old")
    if old is None:
        pytest.skip(f"needs git and commit {BEFORE}")
    env = {**os.environ, "PYTHONPATH": str(old)}
    subprocess.run([sys.executable, "-c", textwrap.dedent(OLD_RUNS), str(tmp_path), LONG_RUN], env=env, check=True,
                   cwd=tmp_path)
    stopped = torch.load(tmp_path / "stopped" / "checkpoint.pt", weights_only=True)
    assert stopped["epoch"] == 1 and stopped["settings"] == {**SETTINGS_BEFORE[LONG_RUN], "epochs": 2}
    threads = torch.get_num_threads()
    try:
        recipes.train_recipe(LONG_RUN, out=tmp_path / "stopped", resume=True, epochs=2, subset=128,
                             device="cpu", threads=1, progress=False)
    finally:
        torch.set_num_threads(threads)
    whole, whole_state = load_checkpoint(tmp_path / "whole" / "model.pt")
    resumed, resumed_state = load_checkpoint(tmp_path / "stopped" / "model.pt")
    for key in ("epoch", "lr"):
        assert resumed_state["history"][key] == whole_state["history"][key], key
    for key in ("train_loss", "test_loss", "test_acc"):  # the earlier code evaluated on the test set every epoch
        assert resumed_state["history"][key][0] == whole_state["history"][key][0], key
    assert resumed_state["history"]["val_acc"][0] is None and 0 <= resumed_state["history"]["val_acc"][1] <= 1
    for (name, a), b in zip(whole.state_dict().items(), resumed.state_dict().values(), strict=True):
        assert a.shape == b.shape and torch.isfinite(b).all(), name


def test_a_run_resumed_under_a_budget_counts_the_seconds_it_already_spent(tmp_path):
    """The checkpoint's ``seconds`` start the resumed run's clock: a run that spent its 100 s budget before it was
    stopped takes one more step, is evaluated and ends, instead of starting its 100 s afresh."""
    path, batches = tmp_path / "checkpoint.pt", [(torch.randn(2, 1, 8, 8), torch.tensor([0, 1]))] * 4
    settings = dict(lr=1e-3, weight_decay=0.0, warmup_epochs=0, label_smoothing=0.0, amp="off", progress=False)
    model = ViT(image_size=8, patch_size=4, in_channels=1, num_classes=2, dim=8, depth=1, num_heads=2)
    fit(model, batches, batches, epochs=1, checkpoint=path, **settings)
    state = torch.load(path, weights_only=True)
    torch.save({**state, "seconds": 100.0}, path)  # as if the first epoch had taken 100 s
    history = fit(model, batches, batches, epochs=3, time_budget=100.0, checkpoint=path, resume=True, **settings)
    assert history["epoch"] == [1, 1.25]  # one step of epoch 2 (4 steps an epoch), then the budget was used
    assert history["seconds"][-1] >= 100.0


def test_a_damaged_or_foreign_checkpoint_is_named_as_such(tmp_path):
    """Truncated, empty, not a checkpoint at all, a whole pickled model, a folder: each gets our message with the
    path, not a bare EOFError or torch's advice to unpickle with weights_only=False."""
    model = ViT(image_size=8, patch_size=4, in_channels=1, num_classes=2, dim=8, depth=1, num_heads=2)
    good = tmp_path / "good.pt"
    save_checkpoint(good, model)
    whole = good.read_bytes()
    (tmp_path / "truncated.pt").write_bytes(whole[:len(whole) // 2])
    (tmp_path / "empty.pt").write_bytes(b"")
    (tmp_path / "page.pt").write_text("<html>not found</html>")
    torch.save(model, tmp_path / "module.pt")
    for name in ("truncated", "empty", "page", "module"):
        with pytest.raises(ValueError, match=f"{name}.pt .* bytes\\) cannot be read as a checkpoint"):
            load_checkpoint(tmp_path / f"{name}.pt")
    with pytest.raises(IsADirectoryError, match="is a folder; a checkpoint is a file, such as .*model.pt"):
        load_checkpoint(tmp_path)
    assert load_checkpoint(good)[0].config == model.config


def test_save_checkpoint_refuses_what_the_safe_loader_could_not_read_back(tmp_path):
    """NumPy's float64 (a float subclass) or a Path would save, then fail torch.load(weights_only=True) later."""
    model = ViT(image_size=8, patch_size=4, in_channels=1, num_classes=2, dim=8, depth=1, num_heads=2)
    for metrics, where in [({"acc": np.float64(0.5)}, r"\['acc'\] is a numpy.float64"),
                           ({"runs": [{"out": tmp_path}]}, r"\['runs'\]\[0\]\['out'\] is a pathlib.\w*Path")]:
        with pytest.raises(TypeError, match=where + ".*convert it first"):
            save_checkpoint(tmp_path / "run.pt", model, metrics=metrics)
        assert not list(tmp_path.iterdir())  # nothing written
    save_checkpoint(tmp_path / "run.pt", model, metrics={"acc": 0.5, "dtype": torch.float32, "steps": [1, 2]})
    assert load_checkpoint(tmp_path / "run.pt")[1]["metrics"]["dtype"] == torch.float32
