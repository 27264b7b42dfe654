"""The time-to-accuracy targets, measured: the whole `python -m vit_course train NAME` command, timed from outside.

MNIST: >= 99.3% test accuracy within 300 s; CIFAR-10: >= 80% within 1800 s (whole command, start-up and data
loading included). Runs the CLI with seeds 0..runs-1, one after another, and records for each run its accuracy,
wall seconds (process start to exit), epochs done, threads and the 1-minute load average before it, with the
machine (CPU, vector ISA, native bf16). ``--record`` stores them in benchmarks/results/targets.json as one variant
(by default named after the recipe: the recipe as it stands; an earlier version or another machine gets its own
``--variant`` name and a one-line ``--description``), which `python -m tools.results` turns into the README's and
the book's table of seeds. One run at a time: on a shared machine the load decides how many epochs fit in the
budget, so it is recorded with the numbers.

    python benchmarks/targets.py mnist --runs 3 --record
    python benchmarks/targets.py cifar10 --runs 3 --out runs/bench --record
    python benchmarks/targets.py cifar10 --seeds 1 2 --append --record   # more seeds beside the stored ones
    python benchmarks/targets.py cifar10 --seeds 0 --variant xeon-amx --description "one seed on ..." --record
"""

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from common import RESULTS, wait_for_quiet
from machine import recorded

from vit_course.files import write_json
from vit_course.results import one_view_accuracy

TARGETS = {"mnist": (0.993, 300), "cifar10": (0.80, 1800)}
WHAT = ("seed runs of the whole `python -m vit_course train RECIPE` command, timed from outside by "
        "benchmarks/targets.py; one entry per variant: the recipe as it stands (its name is the recipe's) or an "
        "earlier version of it, or the same one on another machine, kept for comparison")


def run_once(name, seed, out):
    """One whole command, timed from outside, once the load of the last one has faded from the load average (which
    the command reads to choose its threads): -> a dict of what the run reports."""
    waited = wait_for_quiet()
    started, path = time.perf_counter(), Path(out) / "metrics.json"

    def command():
        subprocess.run([sys.executable, "-m", "vit_course", "train", name, "--seed", str(seed), "--out", str(out),
                        "--no-progress"], check=True)
        return json.loads(path.read_text())

    metrics = recorded(command, path)  # the run's metrics.json gets the machine and load too, should it ship
    wall = time.perf_counter() - started
    return {"seed": seed, "test_accuracy": metrics["test_accuracy"], "val_accuracy": metrics.get("val_accuracy"),
            "wall_seconds": round(wall, 1),
            "test_accuracy_one_view": one_view_accuracy(metrics),
            "epochs": metrics["epochs"], "precision": metrics.get("precision", "fp32"),
            "threads": metrics.get("threads"), "load_before": metrics["cpu_load_before"], "waited_seconds": waited,
            "machine": metrics["machine"]}


def summary(name, runs):
    """The targets and the runs' mean, spread and worst wall time."""
    accuracy_target, seconds_target = TARGETS[name]
    accuracies, walls = [r["test_accuracy"] for r in runs], [r["wall_seconds"] for r in runs]
    return {"recipe": name, "target": {"test_accuracy": accuracy_target, "wall_seconds": seconds_target},
            "mean_accuracy": statistics.mean(accuracies), "min_accuracy": min(accuracies),
            "max_accuracy": max(accuracies), "std_accuracy": statistics.stdev(accuracies) if len(runs) > 1 else 0.0,
            "max_wall_seconds": max(walls), "runs": runs}


def stored_variant(path, recipe, variant):
    """The variant (recipe, variant) stored in the targets file ``path``, or None."""
    variants = json.loads(path.read_text())["variants"] if path.is_file() else []
    return next((v for v in variants if (v["recipe"], v["name"]) == (recipe, variant)), None)


def record(path, entry):
    """Write ``entry`` (a variant: recipe, name, description, summary, runs) into the targets file ``path``, replacing
    the stored variant of the same recipe and name; the others keep their place."""
    stored = json.loads(path.read_text()) if path.is_file() else {"what": WHAT, "variants": []}
    key = (entry["recipe"], entry["name"])
    others = [v for v in stored["variants"] if (v["recipe"], v["name"]) != key]
    stored["variants"] = sorted(others + [entry], key=lambda v: (v["recipe"], v["name"] != v["recipe"], v["name"]))
    write_json(path, stored)


def main(argv=None, run=run_once):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("name", choices=sorted(TARGETS))
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", default="runs/bench", help="where the runs write their models")
    parser.add_argument("--record", action="store_true", help="store the runs in RESULTS/targets.json")
    parser.add_argument("--results", type=Path, default=RESULTS, help="where targets.json is")
    parser.add_argument("--variant", help="the name the runs are stored under (default: the recipe's)")
    parser.add_argument("--description", help="one line on what the variant is (a new variant needs one)")
    parser.add_argument("--seeds", type=int, nargs="+", help="these seeds instead of 0..runs-1")
    parser.add_argument("--append", action="store_true",
                        help="keep the variant's other seeds already stored (a seed run again is replaced)")
    args = parser.parse_args(argv)
    accuracy_target, seconds_target = TARGETS[args.name]
    path, variant = args.results / "targets.json", args.variant or args.name
    before = stored_variant(path, args.name, variant)
    description = args.description or (before or {}).get("description") or (
        "the recipe as it stands" if variant == args.name else None)
    if args.record and not description:
        parser.error(f"variant {variant!r} of {args.name} is not in {path} yet: say what it is with --description")
    if args.append and before is None:
        parser.error(f"--append: no variant {variant!r} of {args.name} in {path} to add seeds to")
    seeds = args.seeds if args.seeds is not None else range(args.runs)
    kept = [r for r in before["runs"] if r["seed"] not in seeds] if args.append else []
    runs = []
    for seed in seeds:
        result = run(args.name, seed, Path(args.out) / f"{args.name}-seed{seed}")
        runs.append(result)
        ok = result["test_accuracy"] >= accuracy_target and result["wall_seconds"] <= seconds_target
        print(f"seed {seed}: {result['test_accuracy']:.2%} in {result['wall_seconds']:.0f} s wall, "
              f"{result['epochs']:.2f} epochs, {result['threads']} threads, load {result['load_before']:.1f} -> "
              f"{'meets' if ok else 'misses'} the target", flush=True)
    result = summary(args.name, sorted(kept + runs, key=lambda r: r["seed"]))
    if args.record:
        record(path, {"recipe": args.name, "name": variant, "description": description, **result})
    print(f"{args.name}: accuracy mean {result['mean_accuracy']:.2%}, std {result['std_accuracy']:.2%} (min "
          f"{result['min_accuracy']:.2%}, max {result['max_accuracy']:.2%}); wall max {result['max_wall_seconds']:.0f}"
          f" s (target {accuracy_target:.1%} in {seconds_target} s)")
    return result


if __name__ == "__main__":
    main()
