"""Checkpoints (chapters 06-08): one file holding a model's config, weights, history and metrics.

The file is read with ``torch.load(weights_only=True)``, which unpickles nothing but tensors, dicts, lists,
tuples, numbers and strings: a checkpoint from the internet cannot run code. So only those go in, and the
model is rebuilt from its config, the ``ViT`` constructor's keyword arguments that every ``ViT`` keeps in
``model.config``.
"""

import pickle
from importlib import resources
from pathlib import Path

import torch

from .files import atomic_write
from .vit import ViT

PRETRAINED = ("mnist", "cifar10", "cifar10-plain", "cifar10-plain-basic")


def save_checkpoint(path, model, *, history=None, metrics=None, optimizer=None, **extra):
    """Save everything needed to rebuild, inspect or resume a run in one file, atomically.

    Args:
        model: a ``ViT`` (its ``config`` and ``state_dict`` are stored, on the CPU)
        history: dict of lists (epoch, train_loss, test_acc, ...); metrics: dict of numbers/strings
        optimizer: stored too when given (a resumable checkpoint; about 3x the size)
        extra: further plain values (e.g. ``epoch``, ``step``, ``rng``, ``recipe``) kept at the top level
    """
    config = getattr(model, "config", None)
    if not isinstance(config, dict):
        raise ValueError(f"save_checkpoint needs a model that keeps its constructor's arguments in .config (every "
                         f"vit_course.ViT does); got a {type(model).__name__} without one")
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    checkpoint = {"format": 1, "config": dict(config), "model": state, "history": history or {},
                  "metrics": metrics or {}, **extra}
    if optimizer is not None:
        checkpoint["optimizer"] = optimizer.state_dict()
    _check_plain(checkpoint, "checkpoint")
    return atomic_write(path, lambda f: torch.save(checkpoint, f))


def _check_plain(value, where):
    """Raise a TypeError naming the first value that ``torch.load(weights_only=True)`` would refuse to read back."""
    if isinstance(value, dict):
        for key, item in value.items():
            _check_plain(item, f"{where}[{key!r}]")
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _check_plain(item, f"{where}[{i}]")
    elif not (isinstance(value, (torch.Tensor, torch.dtype, torch.device))  # NumPy's float64 is a float subclass:
              or type(value) in (bool, int, float, str, type(None))):  # exact types, as the safe loader wants
        raise TypeError(f"{where} is a {type(value).__module__}.{type(value).__name__}; a checkpoint holds only "
                        f"tensors, dicts, lists, tuples, numbers, strings and None, so that it loads safely: "
                        f"convert it first (float(x), str(path))")


def read_checkpoint(path, device="cpu"):
    """The checkpoint dict in ``path`` (config, model state, history, ...), checked to be one of ours."""
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"{path} is a folder; a checkpoint is a file, such as {path / 'model.pt'} (what "
                                f"`python -m vit_course train` writes there)")
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path}")
    try:
        checkpoint = torch.load(path, map_location=device, weights_only=True)
    except (RuntimeError, EOFError, OSError, KeyError, pickle.UnpicklingError) as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else "no message"
        raise ValueError(f"{path} ({path.stat().st_size:,} bytes) cannot be read as a checkpoint: truncated, or not "
                         f"written by save_checkpoint, which stores only tensors and plain values "
                         f"({type(error).__name__}: {first})") from error
    if not isinstance(checkpoint, dict) or "config" not in checkpoint or "model" not in checkpoint:
        raise ValueError(f"{path} is not a vit_course checkpoint (it lacks 'config' and 'model')")
    return checkpoint


def load_checkpoint(path, device="cpu"):
    """Rebuild the model saved in ``path``: -> (model in eval mode on ``device``, checkpoint dict)."""
    checkpoint = read_checkpoint(path, device)
    model = ViT(**checkpoint["config"]).to(device)
    model.load_state_dict(checkpoint["model"])
    return model.eval(), checkpoint


def pretrained_path(name):
    """The shipped checkpoint file of ``name`` (one of ``PRETRAINED``) inside the package."""
    if name not in PRETRAINED:
        raise ValueError(f"no shipped checkpoint named {name!r}; there are {', '.join(PRETRAINED)}")
    return Path(str(resources.files("vit_course") / "checkpoints" / name / "model.pt"))


def load_pretrained(name, device="cpu"):
    """The ViT trained by ``python -m vit_course train NAME`` that ships with the package.

    -> (model in eval mode, checkpoint dict with config, history and metrics). Loads in well under a second.
    The metrics name the recipe it ships as, and ``trained_as`` the name it trained under if that differs (a run
    written before its recipe was renamed keeps the old name inside its metrics: the shipped names win).
    """
    path = pretrained_path(name)
    if not path.is_file():
        raise FileNotFoundError(f"the {name} model does not ship with this copy of the package (no {path}): "
                                f"train it with `python -m vit_course train {name}`")
    model, checkpoint = load_checkpoint(path, device=device)
    names = {key: checkpoint[key] for key in ("recipe", "trained_as") if checkpoint.get(key) is not None}
    metrics = {key: value for key, value in checkpoint.get("metrics", {}).items() if key != "trained_as"}
    return model, {**checkpoint, "metrics": {**metrics, **names}}


__all__ = ["PRETRAINED", "load_checkpoint", "load_pretrained", "pretrained_path", "read_checkpoint", "save_checkpoint"]
