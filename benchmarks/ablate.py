"""A recipe with some settings changed, trained under a (short) time budget: how the recipes' choices were made.

Each --set is SECTION.KEY=VALUE, SECTION one of model, train, augment, mix (VALUE is read as a Python literal).
Runs one ``train_recipe`` in this process and prints the settings changed, accuracy, epochs and wall seconds.
Compare candidates one after another on an otherwise idle machine, at the same budget. With --record the run
is appended to benchmarks/results/ablate_NAME.json (with the machine and its load), so a comparison that chose a
recipe setting is committed beside the recipe.

    python benchmarks/ablate.py cifar10 --budget 330 --set augment.padding=4
    python benchmarks/ablate.py cifar10 --budget 330 --set augment.padding=0
    python benchmarks/ablate.py mnist --budget 140 --set model.depth=4 --set model.dim=64
    python benchmarks/ablate.py cifar10 --budget 1775 --set 'train.amp="bf16"' --record
"""

import argparse
import ast
import copy
import json
from pathlib import Path

from common import RESULTS
from machine import recorded

from vit_course import IMPORTED_AT, recipes
from vit_course.files import append_run
from vit_course.results import one_view_accuracy

SECTIONS = ("model", "train", "augment", "mix")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("name", choices=sorted(recipes.RECIPES))
    parser.add_argument("--budget", type=float, required=True, help="seconds for the whole run")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="default: runs/ablate/NAME")
    parser.add_argument("--threads", type=int, default=None, help="CPU threads (default: the free cores)")
    parser.add_argument("--record", action="store_true", help="append the run to RESULTS/ablate_NAME.json")
    parser.add_argument("--results", type=Path, default=RESULTS, help="where --record writes")
    args = parser.parse_args(argv)
    recipe = copy.deepcopy(recipes.RECIPES[args.name])
    changes = {}
    for item in args.set:
        key, _, text = item.partition("=")
        section, _, field = key.partition(".")
        if section not in SECTIONS or not field or not text:
            parser.error(f"--set {item!r}: expected SECTION.KEY=VALUE with SECTION one of {', '.join(SECTIONS)}")
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            parser.error(f"--set {item!r}: {text!r} is not a Python literal (a number, string, tuple, ...)")
        recipe.setdefault(section, {})
        recipe[section] = {**(recipe[section] or {}), field: tuple(value) if isinstance(value, list) else value}
        changes[key] = value
    original, recipes.RECIPES[args.name] = recipes.RECIPES[args.name], recipe  # for this run only
    try:
        metrics = recorded(lambda: recipes.train_recipe(  # the budget counts from the package's import
            args.name, out=args.out or f"runs/ablate/{args.name}", seed=args.seed, time_budget=args.budget,
            started=IMPORTED_AT, progress=False, threads=args.threads))
    finally:
        recipes.RECIPES[args.name] = original
    run = {"recipe": args.name, "set": changes, "seed": args.seed, "budget": args.budget,
           **{key: metrics[key] for key in ("test_accuracy", "epochs", "wall_seconds", "threads", "cpu_load_before",
                                            "cpu_load_after", "machine")},
           "val_accuracy": metrics.get("val_accuracy"),  # what a choice is made on (runs before the split: None)
           "thread_changes": [],  # a run keeps its threads; earlier records list (seconds, threads) changes here
           "test_accuracy_one_view": one_view_accuracy(metrics),
           # the whole recipe the run trained, so the record still says what it measured once the recipe changes
           "settings": {section: recipe.get(section) for section in SECTIONS}}
    print(json.dumps(run))
    if args.record:
        path = args.results / f"ablate_{args.name}.json"
        append_run(path, run, recipe=args.name)
    return run


if __name__ == "__main__":
    main()
