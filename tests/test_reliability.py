"""The learner's session survives mistakes: Ctrl-C during training, and nothing written where it should not be.

- KeyboardInterrupt in the middle of `fit` (raised from a patched step, as Jupyter's interrupt arrives between
  Python bytecodes) leaves the model in eval mode with finite weights that predict, the checkpoint at its last
  finished epoch, no half-written files, and the run resumable or restartable in the same process.
- An interrupt while the checkpoint is being written leaves the previous checkpoint whole.
- The training command writes only its run directory (and the data root): run with HOME, cwd and TMPDIR in a
  temporary folder and a private copy of the package, every tree is compared before and after.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from vit_course import ViT, loop
from vit_course.checkpoint import load_checkpoint

ROOT = Path(__file__).resolve().parents[1]
CONFIG = dict(image_size=8, patch_size=4, in_channels=1, num_classes=3, dim=16, depth=1, num_heads=2)
RECIPE = dict(epochs=3, lr=1e-3, weight_decay=0.05, warmup_epochs=0.5, label_smoothing=0.0, device="cpu",
              amp="off", progress=False)


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models run on one thread: with two on a busy machine, OpenMP's hand-offs cost far more than the
    work (a 12-step fit measured 7-10 s on 2 threads, 0.14 s on 1)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def batches(n=4, size=8, seed=0):
    """n batches of (x (size, 1, 8, 8), y (size,)): a list, so it has a len() like the course's loaders."""
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(size, 1, 8, 8, generator=g), torch.randint(0, 3, (size,), generator=g)) for _ in range(n)]


def snapshot(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def interrupting_step(monkeypatch, after, seen):
    """Patch loop.train_step to raise KeyboardInterrupt on call number `after` + 1; seen[n] = weights before call n."""
    real = loop.train_step
    calls = 0

    def step(model, *args, **kwargs):
        nonlocal calls
        calls += 1
        seen[calls] = snapshot(model)
        if calls > after:
            raise KeyboardInterrupt
        return real(model, *args, **kwargs)

    monkeypatch.setattr(loop, "train_step", step)


def test_interrupt_during_fit_leaves_a_usable_model_and_the_last_checkpoint(tmp_path, monkeypatch):
    torch.manual_seed(0)
    model, data, ckpt = ViT(**CONFIG), batches(), tmp_path / "run" / "checkpoint.pt"
    seen = {}
    interrupting_step(monkeypatch, after=6, seen=seen)  # 4 steps per epoch: interrupted in epoch 2, 3rd step
    with pytest.raises(KeyboardInterrupt):
        loop.fit(model, data, data[:1], checkpoint=ckpt, **RECIPE)

    # the model: eval mode, the weights of the last step taken (not rolled back, not half-updated), usable
    assert not model.training, "an interrupted fit left the model in train mode (dropout on in later cells)"
    assert all(torch.equal(v, seen[7][k]) for k, v in model.state_dict().items())
    assert all(torch.isfinite(p).all() for p in model.parameters())
    with torch.no_grad():
        logits = model(data[0][0])  # (8, 3)
    assert logits.shape == (8, 3) and torch.isfinite(logits).all()

    # the checkpoint: whole, at the end of epoch 1 (the weights before epoch 2's first step), nothing else left
    assert sorted(p.name for p in ckpt.parent.iterdir()) == ["checkpoint.pt"]
    restored, state = load_checkpoint(ckpt)
    assert state["epoch"] == 1 and state["history"]["epoch"] == [1.0]
    assert all(torch.equal(v, seen[5][k]) for k, v in restored.state_dict().items())

    # resuming in the same process continues after epoch 1 and finishes
    monkeypatch.undo()
    history = loop.fit(model, data, data[:1], checkpoint=ckpt, resume=True, **RECIPE)
    assert history["epoch"] == [1.0, 2.0, 3.0] and load_checkpoint(ckpt)[1]["epoch"] == 3


def test_rerunning_after_an_interrupt_trains_from_scratch_the_same_way(tmp_path, monkeypatch):
    """Rerunning the notebook from the top, without restarting the kernel, gives the same run as a fresh kernel."""
    data = batches()
    torch.manual_seed(0)
    reference = ViT(**CONFIG)
    expected = loop.fit(reference, data, data[:1], seed=1, **RECIPE)
    interrupting_step(monkeypatch, after=5, seen={})
    torch.manual_seed(0)
    with pytest.raises(KeyboardInterrupt):
        loop.fit(ViT(**CONFIG), data, data[:1], seed=1, **RECIPE)
    monkeypatch.undo()
    torch.manual_seed(0)
    model = ViT(**CONFIG)
    history = loop.fit(model, data, data[:1], seed=1, **RECIPE)
    assert history["train_loss"] == expected["train_loss"] and history["val_acc"] == expected["val_acc"]
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), reference.parameters(), strict=True))


def test_interrupt_while_saving_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    torch.manual_seed(0)
    model, data, ckpt = ViT(**CONFIG), batches(), tmp_path / "checkpoint.pt"
    real_save, saves = torch.save, []

    def save(obj, f, *args, **kwargs):  # the second save dies halfway through writing
        saves.append(1)
        if len(saves) == 2:
            f.write(b"half a checkpoint")
            raise KeyboardInterrupt
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", save)
    with pytest.raises(KeyboardInterrupt):
        loop.fit(model, data, data[:1], checkpoint=ckpt, **RECIPE)
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.pt"], "a temporary file was left behind"
    assert load_checkpoint(ckpt)[1]["epoch"] == 1
    assert not model.training


# ---- what the course writes ----------------------------------------------------------------------------------

def tree(folder):
    """{relative path: (size, mtime_ns)} of every file under folder; bytecode caches left out (Python's own)."""
    folder = Path(folder)
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts}


def changes(before, after):
    return sorted(k for k in after.keys() | before.keys() if before.get(k) != after.get(k))


def test_training_command_writes_only_its_run_directory(tmp_path):
    data = Path(os.environ.get("VIT_COURSE_DATA", ROOT / ".data"))
    if not (data / "MNIST").is_dir() and not any(data.glob("*mnist*")):
        pytest.skip(f"no MNIST under {data} (set VIT_COURSE_DATA)")
    package, home, cwd, tmp = tmp_path / "pkg", tmp_path / "home", tmp_path / "cwd", tmp_path / "tmp"
    # a private copy of the package: nobody else edits it while we watch
    shutil.copytree(ROOT / "vit_course", package / "vit_course", ignore=shutil.ignore_patterns("__pycache__"))
    for folder in (home, cwd, tmp):
        folder.mkdir()
    watched = {"package": package, "home": home, "cwd": cwd, "tmp": tmp}
    before = {name: tree(folder) for name, folder in watched.items()}
    env = dict(os.environ, HOME=str(home), TMPDIR=str(tmp), PYTHONPATH=str(package), VIT_COURSE_DATA=str(data),
               MPLCONFIGDIR=str(home / ".config" / "matplotlib"), PYTHONDONTWRITEBYTECODE="1")
    where = subprocess.run([sys.executable, "-c", "import vit_course; print(vit_course.__file__)"], cwd=cwd, env=env,
                           capture_output=True, text=True)
    assert where.stdout.strip() == str(package / "vit_course" / "__init__.py"), where.stdout + where.stderr
    run = subprocess.run([sys.executable, "-m", "vit_course", "train", "mnist", "--epochs", "1", "--subset", "256",
                          "--time-budget", "0", "--no-progress", "--device", "cpu"],
                         cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    written = {name: changes(before[name], tree(folder)) for name, folder in watched.items()}
    assert written["package"] == [] and written["tmp"] == [], written
    # the default run directory, runs/mnist under the cwd (the resumable checkpoint.pt is gone once done)
    assert written["cwd"] == ["runs/mnist/curves.png", "runs/mnist/metrics.json", "runs/mnist/model.pt"], \
        written["cwd"]
    # matplotlib's font cache is matplotlib's, in the folder it was given; the course itself writes nothing there
    assert [p for p in written["home"] if not p.startswith(".config/matplotlib/")] == [], written["home"]
