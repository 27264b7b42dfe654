"""A run's results as the chapters read them (chapters 07 to 09): a stored benchmark measurement, and how a run's
accuracy and precision are written. The README's and the book's tables are written from the same records by the
repository's own tooling (``python -m tools.results``), which is not part of this package.
"""

import json
from pathlib import Path

MEASUREMENTS = Path(__file__).resolve().parent / "measurements"  # package data: the results the chapters show


def measurement(name):
    """A benchmark's stored result that a chapter shows (chapters 07 to 09): ``vit_course/measurements/NAME.json``,
    shipped with the package. -> the parsed JSON.

    Each is a copy of the lab's ``benchmarks/results/NAME.json`` (written by ``benchmarks/NAME.py``), which the
    maintainers' ``python -m tools.results`` makes and its ``--check`` keeps equal; the package reads nothing
    outside itself, so a pip-installed course (Colab) shows the same numbers as a checkout.
    """
    path = MEASUREMENTS / f"{name}.json"
    if not path.is_file():
        shipped = ", ".join(sorted(p.stem for p in MEASUREMENTS.glob("*.json"))) or "none"
        raise FileNotFoundError(f"no measurement {name!r} in the package (vit_course/measurements/ holds {shipped}): "
                                f"in a checkout, `python -m tools.results` copies the results the chapters read "
                                f"from benchmarks/results/")
    return json.loads(path.read_text())


def per_seed(runs, key="test_accuracy"):
    """``benchmarks/data_scaling.py``'s runs arranged for chapter 07: {model: {images: {seed: run[key]}}}, models
    in the order they first appear, sizes and seeds ascending."""
    table = {}
    for run in sorted(runs, key=lambda run: (run["images"], run["seed"])):
        table.setdefault(run["model"], {}).setdefault(run["images"], {})[run["seed"]] = run[key]
    return table


def accuracy_cell(metrics, percent="{:.2%}".format):
    """'81.56%', or for a run whose final evaluation averaged each test image with its mirror image (the cifar10
    recipe's ``test_flips``) '81.56% with test-time flips (81.08% one view)'. ``percent`` formats a fraction."""
    cell = percent(metrics["test_accuracy"])
    if metrics.get("test_flips"):
        cell += f" with test-time flips ({percent(metrics['test_accuracy_one_view'])} one view)"
    return cell


def one_view_accuracy(run):
    """A run's accuracy tested on each image alone; runs recorded before test-time flips have only that one."""
    return run.get("test_accuracy_one_view", run["test_accuracy"])


def precision(metrics):
    """How a run multiplied: 'float32', or 'bf16 autocast' / 'fp16 autocast' (runs recorded before it: float32)."""
    kind = metrics.get("precision", "fp32")
    return "float32" if kind == "fp32" else f"{kind} autocast"


__all__ = ["MEASUREMENTS", "accuracy_cell", "measurement", "one_view_accuracy", "per_seed", "precision"]
