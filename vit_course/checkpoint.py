"""Checkpoints (chapters 06-07): one file holding config, weights, history and metrics, written atomically.

The file is read with ``torch.load(weights_only=True)``, which unpickles nothing but tensors, dicts, lists,
tuples, numbers and strings: a checkpoint from the internet cannot run code. So only those go in, and the
model is rebuilt from its config (the ``ViT`` constructor's keyword arguments).
"""

import json
import os
import tempfile
from importlib import resources
from pathlib import Path

import torch

from .vit import ViT

PRETRAINED = ("mnist", "cifar10")


def create_model(config):
    """``ViT(**config)`` that remembers its config (``model.config``), so checkpoints can rebuild it."""
    if not isinstance(config, dict):
        raise ValueError(f"config must be a dict of ViT keyword arguments, got {type(config).__name__}")
    model = ViT(**config)
    model.config = dict(config)
    return model


def atomic_write(path, write):
    """Call ``write(file_object)`` on a temporary file beside ``path``, then rename it onto ``path``.

    A crash or an exception inside ``write`` leaves the old file (or none) in place, never half a file.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".partial", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes it private; a checkpoint or a figure is meant to be shared
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json(path, data):
    """Write ``data`` as indented JSON, atomically."""
    atomic_write(path, lambda f: f.write((json.dumps(data, indent=2) + "\n").encode()))


def save_checkpoint(path, model, config, history, metrics, optimizer=None, **extra):
    """Save everything needed to rebuild, inspect or resume a run in one file, atomically.

    Args:
        model: the trained module; its ``state_dict`` is stored (moved to the CPU)
        config: ``ViT`` keyword arguments, so ``load_checkpoint`` can rebuild the model
        history: dict of lists (epoch, train_loss, test_acc, ...); metrics: dict of numbers/strings
        optimizer: stored too when given (a resumable checkpoint; about 3x the size)
        extra: further plain values (e.g. ``epoch``, ``step``, ``rng``) kept at the top level
    """
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    checkpoint = {"format": 1, "config": dict(config or {}), "model": state, "history": history,
                  "metrics": metrics, **extra}
    if optimizer is not None:
        checkpoint["optimizer"] = optimizer.state_dict()
    atomic_write(path, lambda f: torch.save(checkpoint, f))


def load_checkpoint(path, device="cpu"):
    """Rebuild the model saved in ``path``: -> (model in eval mode on ``device``, checkpoint dict)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path}")
    checkpoint = torch.load(path, map_location=device, weights_only=True)
    if not isinstance(checkpoint, dict) or "config" not in checkpoint or "model" not in checkpoint:
        raise ValueError(f"{path} is not a vit_course checkpoint (it lacks 'config' and 'model')")
    model = create_model(checkpoint["config"]).to(device)
    model.load_state_dict(checkpoint["model"])
    return model.eval(), checkpoint


def pretrained_path(name):
    """The shipped checkpoint file of ``name`` ("mnist" or "cifar10") inside the package."""
    if name not in PRETRAINED:
        raise ValueError(f"no shipped checkpoint named {name!r}; there are {', '.join(PRETRAINED)}")
    return Path(str(resources.files("vit_course") / "checkpoints" / name / "model.pt"))


def load_pretrained(name, device="cpu"):
    """The ViT trained by ``python -m vit_course train NAME`` that ships with the package.

    -> (model in eval mode, checkpoint dict with config, history and metrics). Loads in well under a second.
    """
    return load_checkpoint(pretrained_path(name), device=device)


__all__ = ["atomic_write", "create_model", "load_checkpoint", "load_pretrained", "pretrained_path",
           "save_checkpoint", "write_json"]
