"""A run's results as the chapters read them (chapters 07 to 09): a stored benchmark measurement, and how a run's
accuracy and precision are written. The README's and the book's tables are written from the same records by the
repository's own tooling (``python -m tools.results``), which is not part of this package.
"""

import json
from pathlib import Path

from .kernel import ROOT

BENCHMARKS = ROOT / "benchmarks" / "results"  # each benchmarks/NAME.py writes its NAME*.json there


def measurement(name):
    """The stored result of ``benchmarks/NAME.py``, ``benchmarks/results/NAME.json`` (chapters 07 to 09 read theirs).

    Read from the repository when there is one, else from the copy installed with the package (pip puts
    benchmarks/results into vit_course/benchmark_results). -> the parsed JSON.
    """
    for folder in (BENCHMARKS, Path(__file__).resolve().parent / "benchmark_results"):
        if (folder / f"{name}.json").is_file():
            return json.loads((folder / f"{name}.json").read_text())
    scripts = sorted(BENCHMARKS.parent.glob("*.py"), key=lambda path: -len(path.stem))  # NAME_bf16: NAME.py's
    script = next((path.stem for path in scripts if name.startswith(path.stem)), name)
    raise FileNotFoundError(f"no {name}.json in {BENCHMARKS} or in the installed package: "
                            f"`python benchmarks/{script}.py` writes it (benchmarks/README.md)")


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


__all__ = ["BENCHMARKS", "accuracy_cell", "measurement", "one_view_accuracy", "per_seed", "precision"]
