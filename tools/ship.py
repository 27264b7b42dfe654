"""Ship a finished run as the package's checkpoint NAME (repository tooling, not installed with the course).

    python -m tools.ship RUN NAME     # RUN: a folder with the model.pt and metrics.json a finished run wrote

Checks that the run trained exactly what recipe NAME trains (model config and settings, seed 0: what
``python -m vit_course train NAME`` does), then writes ``vit_course/checkpoints/NAME/``: model.pt and metrics.json
with ``recipe`` set to NAME, and curves.png drawn again from the run's history. A run trained while the recipe had
another name keeps that name as ``trained_as``, so a recipe can be renamed without retraining or hiding it.
Afterwards ``python -m tools.results`` brings the README's table up to date.
"""

import argparse
import json
import sys
from pathlib import Path

import torch

from vit_course.checkpoint import read_checkpoint
from vit_course.files import atomic_write, write_json
from vit_course.kernel import ROOT
from vit_course.recipes import RECIPES, differences, run_info

CHECKPOINTS = ROOT / "vit_course" / "checkpoints"


def ship(run, name, checkpoints=CHECKPOINTS):
    """Copy the finished run in folder ``run`` into ``checkpoints/NAME`` as recipe ``name``; -> that folder."""
    run = Path(run)
    if name not in RECIPES:
        raise ValueError(f"unknown recipe {name!r}; choose one of {', '.join(RECIPES)}")
    state = read_checkpoint(run / "model.pt")
    if "optimizer" in state:
        raise ValueError(f"{run / 'model.pt'} holds an optimizer state: ship a finished run's model.pt")
    metrics = json.loads((run / "metrics.json").read_text())
    differ, theirs, ours = differences(state, RECIPES[name]["model"], run_info(name))
    differ = [key for key in differ if key != "recipe"]
    if differ:
        raise ValueError(f"{run} did not train recipe {name!r}: its {', '.join(differ)} differ. Run: "
                         + "; ".join(f"{k} {theirs[k]!r}" for k in differ) + f". Recipe {name!r}: "
                         + "; ".join(f"{k} {ours[k]!r}" for k in differ))
    trained_as = state.get("trained_as") or state.get("recipe")
    names = {"recipe": name, **({"trained_as": trained_as} if trained_as not in (None, name) else {})}
    state = {**{k: v for k, v in state.items() if k != "trained_as"}, **names}
    metrics = {**{k: v for k, v in metrics.items() if k != "trained_as"}, **names}
    out = Path(checkpoints) / name
    atomic_write(out / "model.pt", lambda f: torch.save(state, f))
    write_json(out / "metrics.json", metrics)
    from vit_course.plots import plot_curves  # the figure module loads slowly

    plot_curves(state["history"], out / "curves.png", title=f"{name}: {metrics['test_accuracy']:.2%} test accuracy")
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="the folder of a finished run (model.pt, metrics.json)")
    parser.add_argument("name", help="the recipe it ships as")
    args = parser.parse_args(argv)
    print(ship(args.run, args.name))
    return 0


if __name__ == "__main__":
    sys.exit(main())
